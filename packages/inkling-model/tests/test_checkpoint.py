"""The release <-> transformers tensor-name map, checked against transformers' own loader.

The independent check writes a random tiny Inkling (transformers ``InklingForCausalLM``,
every feature on) in the release layout with :func:`transformers_to_release`, loads the
folder with transformers' ``InklingForConditionalGeneration`` (which applies
transformers' own ``inkling_mm_model`` conversion rules) and compares the text logits.
A deliberately wrong inverse map (no interleave, gate/up swapped) must fail it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForImageTextToText, InklingForCausalLM, InklingTextConfig
from transformers.models.inkling.configuration_inkling import InklingConfig
from transformers.models.inkling.modeling_inkling import InklingForConditionalGeneration

from inkling_cache import text_spec
from inkling_model import (
    iter_text_weights,
    release_to_transformers,
    transformers_to_release,
    weight_kind,
)

# every feature on: dense first layer then MoE, both attention kinds, relative logits
# reaching past the window, log scaling, a padded vocabulary, MTP
TEXT: dict[str, Any] = dict(
    vocab_size=96,
    unpadded_vocab_size=80,
    hidden_size=32,
    num_hidden_layers=4,
    layer_types=["hybrid_sliding", "hybrid", "hybrid_sliding", "hybrid"],
    mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    swa_num_attention_heads=4,
    swa_num_key_value_heads=4,
    swa_head_dim=8,
    sliding_window_size=6,
    rel_extent=12,
    d_rel=4,
    log_scaling_n_floor=2,
    log_scaling_alpha=0.5,
    intermediate_size=48,
    moe_intermediate_size=16,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_shared_experts=2,
    route_scale=2.0,
    logits_mup_width_multiplier=2.0,
    num_mtp_layers=1,
)
# transformers' towers, as small as they build
VISION = {"patch_size": 2, "temporal_patch_size": 2, "num_hidden_layers": 3, "num_channels": 1}
AUDIO = {"n_mel_bins": 2, "mel_vocab_size": 4}


def _randomize(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("global_scale"):
                p.copy_(1.0 + 0.5 * torch.rand(p.shape, generator=gen))
            elif p.dim() == 1:  # norms
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.3 * torch.randn(b.shape, generator=gen))


@pytest.fixture(scope="module")
def original() -> InklingForCausalLM:
    config = InklingTextConfig(**TEXT)
    config._attn_implementation = "eager"
    model = InklingForCausalLM(config).eval()
    _randomize(model, seed=1)
    return model


def _tower_tensors(seed: int) -> dict[str, torch.Tensor]:
    """Random vision/audio tensors under release names, shaped for transformers' towers."""
    config = InklingConfig(text_config={**TEXT, "num_hidden_layers": 1, "layer_types": ["hybrid"],
                                        "mlp_layer_types": ["dense"]},
                           vision_config=VISION, audio_config=AUDIO)
    towers = InklingForConditionalGeneration(config).model
    _randomize(towers, seed)
    state = {f"model.{k}": v for k, v in towers.state_dict().items()
             if k.startswith(("vision_tower.", "audio_tower."))}
    return transformers_to_release(state)


def _mtp_tensors(hidden: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    return {
        "model.mtp.chain_norm.weight": torch.ones(hidden),
        "model.mtp.layers.0.input_proj.weight": torch.randn(hidden, 2 * hidden, generator=gen),
        "model.mtp.layers.0.hidden_norm.weight": torch.ones(hidden),
        "model.mtp.layers.0.transformer_block.attn.wq_du.weight": torch.randn(hidden, hidden,
                                                                             generator=gen),
    }


def _write_release(path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    spec = text_spec({**TEXT, "model_type": "inkling_text"})
    config = {
        "model_type": "inkling_mm_model",
        "architectures": ["InklingForConditionalGeneration"],
        "text_config": spec.to_release_config(),
        "mtp_config": {"num_nextn_predict_layers": spec.num_mtp_layers},
        "vision_config": VISION,
        "audio_config": AUDIO,
    }
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))
    return path


@pytest.fixture(scope="module")
def release_tensors(original: InklingForCausalLM) -> dict[str, torch.Tensor]:
    return {**transformers_to_release(original.state_dict()), **_tower_tensors(seed=2),
            **_mtp_tensors(TEXT["hidden_size"])}


@pytest.fixture(scope="module")
def release_dir(tmp_path_factory: pytest.TempPathFactory,
                release_tensors: dict[str, torch.Tensor]) -> Path:
    return _write_release(tmp_path_factory.mktemp("release"), release_tensors)


def _ids() -> torch.Tensor:
    # longer than rel_extent and the window, so every feature acts
    return torch.randint(0, TEXT["unpadded_vocab_size"], (2, 40),
                         generator=torch.Generator().manual_seed(3))


def _load_transformers(path: Path) -> InklingForConditionalGeneration:
    model, info = AutoModelForImageTextToText.from_pretrained(str(path), output_loading_info=True)
    assert isinstance(model, InklingForConditionalGeneration)
    assert not info["unexpected_keys"] and not info["mismatched_keys"]
    assert not [k for k in info["missing_keys"] if weight_kind(k) == "text"], info["missing_keys"]
    model.config.text_config._attn_implementation = "eager"
    return model.eval()


# --- the map itself -----------------------------------------------------------------


def test_round_trip_from_transformers(original: InklingForCausalLM) -> None:
    state = original.state_dict()
    release = transformers_to_release(state)
    assert all(k.startswith("model.llm.") for k in release)
    assert len(release) < len(state)  # the gate/up pairs fused
    back = dict(pair for name, tensor in release.items()
                for pair in release_to_transformers(name, tensor))
    assert back.keys() == state.keys()
    for name, tensor in state.items():
        assert torch.equal(back[name], tensor), name


def test_round_trip_from_release(release_tensors: dict[str, torch.Tensor]) -> None:
    gen = torch.Generator().manual_seed(5)
    text = {k: torch.randn(v.shape, generator=gen) for k, v in release_tensors.items()
            if weight_kind(k) == "text"}
    mapped = dict(pair for name, tensor in text.items()
                  for pair in release_to_transformers(name, tensor))
    again = transformers_to_release(mapped)
    assert again.keys() == text.keys()
    for name, tensor in text.items():
        assert torch.equal(again[name], tensor), name


def test_release_names_cover_every_kind() -> None:
    layer = "model.llm.layers.3."
    expected = {
        "model.llm.embed.weight": "model.embed_tokens.weight",
        "model.llm.embed_norm.weight": "model.embed_tokens.embed_norm.weight",
        "model.llm.norm.weight": "model.norm.weight",
        "model.llm.unembed.weight": "lm_head.weight",
        layer + "attn_norm.weight": "model.layers.3.input_layernorm.weight",
        layer + "mlp_norm.weight": "model.layers.3.post_attention_layernorm.weight",
        layer + "attn.wq_du.weight": "model.layers.3.self_attn.q_proj.weight",
        layer + "attn.wk_dv.weight": "model.layers.3.self_attn.k_proj.weight",
        layer + "attn.wv_dv.weight": "model.layers.3.self_attn.v_proj.weight",
        layer + "attn.wr_du.weight": "model.layers.3.self_attn.r_proj.weight",
        layer + "attn.wo_ud.weight": "model.layers.3.self_attn.o_proj.weight",
        layer + "attn.k_sconv.weight": "model.layers.3.self_attn.k_sconv.conv1d.weight",
        layer + "attn.rel_logits_proj.proj": "model.layers.3.self_attn.rel_logits_proj.proj",
        layer + "mlp_sconv.weight": "model.layers.3.mlp_sconv.conv1d.weight",
        layer + "mlp.gate.bias": "model.layers.3.mlp.gate.e_score_correction_bias",
        layer + "mlp.gate.global_scale": "model.layers.3.mlp.gate.global_scale",
        layer + "mlp.experts.w2_weight": "model.layers.3.mlp.experts.down_proj",
        layer + "mlp.shared_experts.shared_w2_weight": "model.layers.3.mlp.shared_experts.down_proj",
        layer + "mlp.w2_md.weight": "model.layers.3.mlp.down_proj.weight",
    }
    t = torch.zeros(2)
    for release, transformers_name in expected.items():
        assert release_to_transformers(release, t) == [(transformers_name, t)]


def test_fused_w13_is_deinterleaved() -> None:
    i, h, e = 3, 2, 4
    gate = torch.arange(i * h, dtype=torch.float32).reshape(i, h)
    up = -gate - 100
    interleaved = torch.stack([gate, up], dim=1).reshape(2 * i, h)  # g0, u0, g1, u1, ...
    dense = dict(release_to_transformers("model.llm.layers.0.mlp.w13_dn.weight", interleaved))
    assert torch.equal(dense["model.layers.0.mlp.gate_proj.weight"], gate)
    assert torch.equal(dense["model.layers.0.mlp.up_proj.weight"], up)

    experts = torch.stack([interleaved + 1000 * k for k in range(e)])  # [E, 2I, H]
    (name, gate_up), = release_to_transformers("model.llm.layers.1.mlp.experts.w13_weight", experts)
    assert name == "model.layers.1.mlp.experts.gate_up_proj" and gate_up.shape == (e, 2 * i, h)
    for k in range(e):  # gate rows first, then up rows (transformers' chunk(2) order)
        assert torch.equal(gate_up[k, :i], gate + 1000 * k)
        assert torch.equal(gate_up[k, i:], up + 1000 * k)

    shared = dict(release_to_transformers(
        "model.llm.layers.1.mlp.shared_experts.shared_w13_weight", experts[:2]))
    assert torch.equal(shared["model.layers.1.mlp.shared_experts.gate_proj"][1], gate + 1000)
    assert torch.equal(shared["model.layers.1.mlp.shared_experts.up_proj"][1], up + 1000)

    with pytest.raises(ValueError, match="even count"):
        release_to_transformers("model.llm.layers.0.mlp.w13_dn.weight", torch.zeros(3, 2))


def test_kinds_and_unknown_names() -> None:
    t = torch.zeros(1)
    for name, kind in [("model.mtp.layers.0.input_proj.weight", "mtp"),
                       ("model.visual.layers.linear_0.weight", "vision"),
                       ("model.vision_tower.final_norm.weight", "vision"),
                       ("model.audio.encoder.weight", "audio"),
                       ("model.audio_tower.norm.weight", "audio")]:
        assert weight_kind(name) == kind
        assert release_to_transformers(name, t) == []
    assert weight_kind("model.llm.layers.0.attn_norm.weight") == "text"
    assert weight_kind("model.language_model.norm.weight") == "text"
    assert weight_kind("lm_head.weight") == "text"
    assert weight_kind("foo.bar") == "unknown"
    with pytest.raises(ValueError, match="unknown release tensor"):
        release_to_transformers("model.llm.layers.0.mlp.experts.w13_weight.scale", t)
    with pytest.raises(ValueError, match="not a release-layout text tensor"):
        release_to_transformers("model.layers.0.input_layernorm.weight", t)
    with pytest.raises(ValueError, match="not an Inkling transformers tensor"):
        transformers_to_release({"model.layers.0.mlp.fc1.weight": t})
    with pytest.raises(ValueError, match="no matching"):
        transformers_to_release({"model.layers.0.mlp.gate_proj.weight": t})
    for release_name in ("model.visual.layers.linear_0.weight", "model.audio.final_norm.weight"):
        with pytest.raises(ValueError, match="tower tensor in the release layout"):
            transformers_to_release({"model.vision_tower.patch_embed.weight": t, release_name: t})


def test_iter_text_weights_counts_what_it_skips(release_tensors: dict[str, torch.Tensor],
                                                original: InklingForCausalLM) -> None:
    weights = iter_text_weights(release_tensors.items(), "release")
    got = dict(weights)
    assert got.keys() == original.state_dict().keys()
    n_vision = sum(weight_kind(k) == "vision" for k in release_tensors)
    n_audio = sum(weight_kind(k) == "audio" for k in release_tensors)
    assert dict(weights.skipped) == {"mtp": 4, "vision": n_vision, "audio": n_audio}
    assert n_vision > 0 and n_audio > 0
    assert weights.yielded == len(got)
    lines = weights.summary()
    assert len(lines) == 3 and lines[1].startswith("skipped 4 mtp tensors (e.g. model.mtp.")

    # transformers names pass through, the multimodal model's text names are folded in
    state = original.state_dict()
    mm = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v
          for k, v in state.items()}
    for layout in ("transformers", "auto"):
        assert dict(iter_text_weights(state.items(), layout)).keys() == state.keys()
        assert dict(iter_text_weights(mm.items(), layout)).keys() == state.keys()
    assert dict(iter_text_weights(release_tensors.items(), "auto")).keys() == state.keys()
    with pytest.raises(ValueError, match="release-layout name"):
        list(iter_text_weights(release_tensors.items(), "transformers"))
    with pytest.raises(ValueError, match="unknown transformers tensor"):
        list(iter_text_weights([("model.layers.0.mlp.fc1.weight", torch.zeros(1))]))
    with pytest.raises(ValueError, match="layout must be"):
        iter_text_weights([], "sglang")


# --- the independent check: transformers' own loader --------------------------------


def test_transformers_loads_the_release_folder_to_the_same_model(
    original: InklingForCausalLM, release_dir: Path
) -> None:
    loaded = _load_transformers(release_dir)
    text = {("model." + k[len("model.language_model."):]
             if k.startswith("model.language_model.") else k): v
            for k, v in loaded.state_dict().items() if weight_kind(k) == "text"}
    state = original.state_dict()
    assert text.keys() == state.keys()
    for name, tensor in state.items():
        assert torch.equal(text[name], tensor), name
    ids = _ids()
    with torch.no_grad():
        want = original(ids).logits
        got = loaded(input_ids=ids).logits
    assert got.shape == want.shape == (2, 40, TEXT["unpadded_vocab_size"])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_own_loader_builds_the_same_model(original: InklingForCausalLM, release_dir: Path) -> None:
    spec = text_spec(release_dir)
    assert spec.layout == "release"
    config = InklingTextConfig(**spec.to_transformers_config())
    config._attn_implementation = "eager"
    model = InklingForCausalLM(config).eval()
    weights = iter_text_weights(load_file(str(release_dir / "model.safetensors")).items(),
                                spec.layout)
    model.load_state_dict(dict(weights), strict=True)
    assert weights.skipped["mtp"] == 4
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, original(ids).logits, rtol=0, atol=1e-6)


def test_spec_agrees_with_transformers_reading_of_the_release_config(
    original: InklingForCausalLM, release_dir: Path
) -> None:
    from transformers import AutoConfig

    ours = text_spec(release_dir)
    theirs = text_spec(AutoConfig.from_pretrained(str(release_dir)))
    assert theirs.layout == "transformers"  # transformers rewrote it into its own names
    assert replace(theirs, name="", layout="release") == replace(ours, name="")
    assert replace(text_spec(original.config), name="") == replace(ours, name="",
                                                                   layout="transformers")


def _fuse_concatenated(gate: torch.Tensor, up: torch.Tensor, axis: int) -> torch.Tensor:
    return torch.cat([gate, up], dim=axis)  # the mistake: no interleave


def _fuse_swapped(gate: torch.Tensor, up: torch.Tensor, axis: int) -> torch.Tensor:
    return torch.stack([up, gate], dim=axis + 1).flatten(axis, axis + 1)  # up rows first


def _wrong_release(state: dict[str, torch.Tensor], which: str,
                   fuse: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]
                   ) -> dict[str, torch.Tensor]:
    """transformers_to_release, except the ``which`` fused tensors are built by ``fuse``."""
    release = transformers_to_release(state)
    for name in list(release):
        if not name.endswith(which):
            continue
        parts = dict(release_to_transformers(name, release[name]))
        if len(parts) == 2:
            (_, gate), (_, up) = parts.items()
            axis = 0 if which == "mlp.w13_dn.weight" else 1
        else:
            (gate_up,) = parts.values()
            gate, up = gate_up.chunk(2, dim=1)
            axis = 1
        release[name] = fuse(gate, up, axis)
    return release


@pytest.mark.parametrize("fuse", [_fuse_concatenated, _fuse_swapped], ids=["no-interleave", "swapped"])
@pytest.mark.parametrize("which", ["mlp.w13_dn.weight", "mlp.experts.w13_weight",
                                   "mlp.shared_experts.shared_w13_weight"])
def test_a_wrong_map_fails_the_check(
    tmp_path: Path, original: InklingForCausalLM, which: str,
    fuse: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor],
) -> None:
    wrong = _wrong_release(original.state_dict(), which, fuse)
    assert any(not torch.equal(wrong[k], v) for k, v in transformers_to_release(
        original.state_dict()).items())
    loaded = _load_transformers(_write_release(tmp_path, wrong))
    ids = _ids()
    with torch.no_grad():
        gap = (loaded(input_ids=ids).logits - original(ids).logits).abs().max().item()
    assert gap > 1e-2, f"a wrong {which} map went unnoticed (max logit gap {gap})"


# --- the shapes a config implies, against the tensors transformers builds from it ---

_OTHER_TEXT = {**TEXT, "num_key_value_heads": 1, "swa_num_attention_heads": 8, "swa_head_dim": 16,
               "d_rel": 2, "rel_extent": 20, "moe_intermediate_size": 24, "n_routed_experts": 4,
               "n_shared_experts": 1, "mlp_layer_types": ["dense", "dense", "sparse", "sparse"]}


@pytest.mark.parametrize("fields", [TEXT, _OTHER_TEXT], ids=["every-feature", "other-widths"])
def test_expected_shapes_are_what_transformers_builds(fields: dict[str, Any]) -> None:
    from inkling_model.checkpoint import check_text_shapes, expected_text_shapes

    model = InklingForCausalLM(InklingTextConfig(**fields))
    built = {n: tuple(t.shape) for n, t in model.state_dict().items() if weight_kind(n) == "text"}
    spec = text_spec({**fields, "model_type": "inkling_text"})
    assert expected_text_shapes(spec, "transformers") == built
    release = {n: tuple(t.shape) for n, t in transformers_to_release(model.state_dict()).items()
               if weight_kind(n) == "text"}
    assert expected_text_shapes(spec, "release") == release
    assert check_text_shapes(built, spec).ok
    assert check_text_shapes(release, text_spec(spec.to_release_config() | {"model_type": "inkling_model"})).ok


def test_check_text_shapes_names_missing_wrong_and_unknown(release_tensors: dict[str, torch.Tensor]) -> None:
    from inkling_model.checkpoint import check_text_shapes

    spec = text_spec(_write_release_config())
    shapes = {n: list(t.shape) for n, t in release_tensors.items()}
    assert check_text_shapes(shapes, spec).ok  # tower and MTP tensors are not counted
    shapes.pop("model.llm.layers.2.attn.wr_du.weight")
    shapes["model.llm.layers.0.mlp.w13_dn.weight"] = [48, 32]  # gate and up: 2 * 48 rows
    shapes["model.llm.layers.0.attn.wq_du.weight_scale"] = [1]
    check = check_text_shapes(shapes, spec)
    # tensors count by their shapes (not by iterating their values)
    as_tensors = {n: torch.zeros(s) for n, s in shapes.items() if weight_kind(n) == "text"}
    assert check_text_shapes(as_tensors, spec) == check
    assert check.missing == [("model.llm.layers.2.attn.wr_du.weight", (16, 32))]
    assert check.wrong == [("model.llm.layers.0.mlp.w13_dn.weight", (48, 32), (96, 32))]
    assert check.unknown == ["model.llm.layers.0.attn.wq_du.weight_scale"]
    # transformers-layout names of InklingForConditionalGeneration count as the text model's
    folded = {"model.language_model." + n[len("model."):] if n.startswith("model.") else n: s
              for n, s in expected_shapes_tf().items()}
    assert check_text_shapes(folded, text_spec({**TEXT, "model_type": "inkling_text"})).ok


def _write_release_config() -> dict[str, Any]:
    spec = text_spec({**TEXT, "model_type": "inkling_text"})
    return {"model_type": "inkling_mm_model", "text_config": spec.to_release_config()}


def expected_shapes_tf() -> dict[str, tuple[int, ...]]:
    from inkling_model.checkpoint import expected_text_shapes

    return expected_text_shapes(text_spec({**TEXT, "model_type": "inkling_text"}))


# --- argument checks: a clear error, naming what to change ---------------------------


def test_iter_text_weights_takes_a_state_dict_as_well_as_pairs() -> None:
    state = {"model.llm.norm.weight": torch.ones(2), "model.mtp.chain_norm.weight": torch.ones(2),
             "model.llm.layers.0.mlp.w13_dn.weight": torch.arange(8.0).reshape(4, 2)}
    from_dict = iter_text_weights(state)
    got = list(from_dict)
    want = list(iter_text_weights(state.items()))
    assert [n for n, _ in got] == [n for n, _ in want] == [
        "model.norm.weight", "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(got, want))
    assert from_dict.skipped == {"mtp": 1}
    with pytest.raises(TypeError, match="weights must be"):
        iter_text_weights(5)
    with pytest.raises(TypeError, match=r"weights must yield \(name, tensor\) pairs, got str 'model.llm.norm.weight'"):
        list(iter_text_weights(list(state)))  # names without their tensors


def test_weight_kind_wants_a_name() -> None:
    with pytest.raises(TypeError, match="a tensor name must be a str, got NoneType"):
        weight_kind(None)  # type: ignore[arg-type]


def test_transformers_to_release_refuses_pairs_and_an_odd_gate_up_axis() -> None:
    with pytest.raises(TypeError, match=r"state_dict must be a mapping.*dict\(pairs\).*got list"):
        transformers_to_release([("model.norm.weight", torch.zeros(1))])
    with pytest.raises(ValueError, match=r"mlp\.experts\.gate_up_proj has shape \(2, 3, 4\).*axis 1.*even"):
        transformers_to_release({"model.layers.0.mlp.experts.gate_up_proj": torch.zeros(2, 3, 4)})


def test_shape_check_wants_a_text_spec_not_dims() -> None:
    from inkling_cache import load_config

    from inkling_model.checkpoint import check_text_shapes, expected_text_shapes

    fields = {**TEXT, "model_type": "inkling_text"}
    dims = load_config(fields)
    for call in (lambda: check_text_shapes({}, dims), lambda: expected_text_shapes(dims)):
        with pytest.raises(TypeError, match=r"InklingTextSpec.*InklingDims.*inkling_cache\.text_spec"):
            call()
    assert not check_text_shapes({}, text_spec(fields)).ok  # the spec it names works

"""InklingTextSpec: one reading of every config form (transformers, release, vLLM objects)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inkling_cache import (
    InklingTextSpec,
    conv_kernel_size,
    layer_layouts,
    load_config,
    text_spec,
)

DATA = Path(__file__).parent / "data"

# One small model with every feature on, in transformers' names ...
HF: dict[str, Any] = {
    "model_type": "inkling_text",
    "vocab_size": 320,
    "unpadded_vocab_size": 272,
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "layer_types": ["hybrid_sliding", "hybrid", "hybrid_sliding", "hybrid"],
    "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "swa_num_attention_heads": 4,
    "swa_num_key_value_heads": 4,
    "swa_head_dim": 64,
    "sliding_window_size": 24,
    "d_rel": 4,
    "rel_extent": 64,
    "log_scaling_n_floor": 4,
    "log_scaling_alpha": 0.5,
    "conv_kernel_size": 3,
    "intermediate_size": 256,
    "moe_intermediate_size": 64,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 2,
    "route_scale": 2.0,
    "rms_norm_eps": 1e-6,
    "logits_mup_width_multiplier": 2.5,
    "hidden_act": "silu",
    "num_mtp_layers": 1,
    "max_position_embeddings": 1024,
}
# ... and the same model in the release convention (text_config of inkling_mm_model).
RELEASE_TEXT: dict[str, Any] = {
    **{k: v for k, v in HF.items() if k not in (
        "model_type", "layer_types", "mlp_layer_types", "conv_kernel_size",
        "intermediate_size", "moe_intermediate_size", "num_mtp_layers")},
    "intermediate_size": 64,  # the expert width
    "dense_intermediate_size": 256,
    "sconv_kernel_size": 3,
    "local_layer_ids": [0, 2],
    "dense_mlp_idx": 1,
    "num_nextn_predict_layers": 1,
    "use_sconv": True,
    "use_embed_norm": True,
    "shared_expert_sink": True,
    "gate_activation": "sigmoid",
    "norm_after_topk": True,
    "inference_moe_w13_interleaved": True,
    "use_gate_bias": True,
    "use_global_scale": True,
    "tie_word_embeddings": False,
}
RELEASE_MM: dict[str, Any] = {
    "model_type": "inkling_mm_model",
    "architectures": ["InklingForConditionalGeneration"],
    "text_config": RELEASE_TEXT,
    "vision_config": {"patch_size": 2},
    "audio_config": {"n_mel_bins": 2},
}


class FakeVllmTextConfig:
    """Attributes as vLLM's InklingModelConfig leaves them (vocab_size rewritten)."""

    model_type = "inkling_model"

    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


class FakeTransformersConfig:
    """Attribute access like transformers' PreTrainedConfig: attribute_map aliases,
    AttributeError for anything unknown."""

    _aliases = {"sliding_window": "sliding_window_size", "sconv_kernel_size": "conv_kernel_size",
                "num_local_experts": "n_routed_experts"}

    def __init__(self, model_type: str, **kw: Any) -> None:
        self.model_type = model_type
        self.__dict__.update(kw)

    def __getattr__(self, name: str) -> Any:
        if name in self._aliases:
            return getattr(self, self._aliases[name])
        raise AttributeError(name)


def _vllm_object() -> FakeVllmTextConfig:
    kw = {**RELEASE_TEXT, "vocab_size": 272, "padded_vocab_size": 320, "unpadded_vocab_size": 272,
          "v_head_dim": 64, "swa_v_head_dim": 64, "q_bias": False, "o_bias": False,
          "final_logit_softcapping": None}
    return FakeVllmTextConfig(**kw)


def test_transformers_dict_reads_every_field() -> None:
    spec = text_spec(HF)
    assert spec.layout == "transformers"
    assert (spec.vocab_size, spec.unpadded_vocab_size, spec.padded) == (320, 272, True)
    assert (spec.intermediate_size, spec.moe_intermediate_size) == (256, 64)
    assert spec.mlp_layer_types == ("dense", "sparse", "sparse", "sparse")
    assert spec.moe_layers == (1, 2, 3) and spec.dense_layers == (0,)
    assert spec.sliding_layers == (0, 2) and spec.global_layers == (1, 3)
    assert (spec.conv_kernel_size, spec.sliding_window, spec.num_mtp_layers) == (3, 24, 1)
    assert spec.log_scaling_n_floor == 4 and spec.log_scaling_alpha == 0.5
    assert isinstance(spec.route_scale, float) and spec.route_scale == 2.0
    assert spec.tie_word_embeddings is False and spec.hidden_act == "silu"


def test_per_layer_helpers() -> None:
    spec = text_spec({**HF, "num_key_value_heads": 1, "swa_num_attention_heads": 8,
                      "swa_head_dim": 32})
    assert [spec.is_sliding(i) for i in range(4)] == [True, False, True, False]
    assert [spec.is_moe(i) for i in range(4)] == [False, True, True, True]
    assert [spec.heads_of(i) for i in range(4)] == [8, 4, 8, 4]
    assert [spec.kv_heads_of(i) for i in range(4)] == [4, 1, 4, 1]
    assert [spec.head_dim_of(i) for i in range(4)] == [32, 64, 32, 64]
    # the relative logits reach the window on sliding layers, rel_extent on global ones
    assert [spec.rel_extent_of(i) for i in range(4)] == [24, 64, 24, 64]
    assert [spec.window_of(i) for i in range(4)] == [24, None, 24, None]
    assert [spec.log_scaling_of(i) for i in range(4)] == [False, True, False, True]
    assert not any(text_spec({**HF, "log_scaling_n_floor": None}).log_scaling_of(i) for i in range(4))


@pytest.mark.parametrize(
    "source",
    [
        pytest.param(RELEASE_MM, id="release-mm-dict"),
        pytest.param({**RELEASE_TEXT, "model_type": "inkling_model"}, id="release-text-only"),
        pytest.param({**RELEASE_MM, "text_config": {**RELEASE_TEXT, "model_type": "inkling_model"}},
                     id="release-mm-typed-text"),
        pytest.param(
            {**RELEASE_MM, "text_config": {k: v for k, v in RELEASE_TEXT.items()
                                           if k != "num_nextn_predict_layers"},
             "mtp_config": {"num_nextn_predict_layers": 1}},
            id="release-top-level-mtp_config"),
    ],
)
def test_release_forms_mean_the_same_model(source: dict[str, Any]) -> None:
    spec = text_spec(source)
    assert spec.layout == "release"
    assert replace(spec, layout="transformers") == text_spec(HF)


def test_vllm_object_with_rewritten_vocab() -> None:
    obj = _vllm_object()
    spec = text_spec(obj)
    assert spec.layout == "release"
    assert (spec.vocab_size, spec.unpadded_vocab_size) == (320, 272)
    assert replace(spec, layout="transformers") == text_spec(HF)
    outer = FakeVllmTextConfig(model_type="inkling_mm_model", text_config=obj)
    assert text_spec(outer) == spec
    assert conv_kernel_size(obj) == conv_kernel_size(outer) == 3


def test_vllm_object_null_mup_means_no_division() -> None:
    obj = _vllm_object()
    obj.logits_mup_width_multiplier = None
    assert text_spec(obj).logits_mup_width_multiplier == 1.0


def test_transformers_objects() -> None:
    kw = {k: v for k, v in HF.items() if k != "model_type"}
    text = FakeTransformersConfig("inkling_text", local_layer_ids=None, **kw)
    assert text_spec(text) == text_spec(HF)
    mm = FakeTransformersConfig("inkling_mm_model", text_config=text)
    assert text_spec(mm) == text_spec(HF)
    assert conv_kernel_size(mm) == 3


def test_objects_without_config_attributes_are_refused() -> None:
    with pytest.raises(TypeError, match="none of an Inkling config's attributes"):
        text_spec(object())
    with pytest.raises(TypeError):
        text_spec(42)


def test_paths_and_folders(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(RELEASE_MM))
    by_folder, by_file = text_spec(tmp_path), text_spec(tmp_path / "config.json")
    assert by_folder == by_file and by_folder.name == str(tmp_path / "config.json")
    assert conv_kernel_size(tmp_path) == 3


def test_dims_and_spec_share_one_reading() -> None:
    for source in (HF, RELEASE_MM, _vllm_object()):
        spec = text_spec(source)
        assert load_config(spec) == spec.dims
        if isinstance(source, dict):
            assert load_config(source) == spec.dims
        assert conv_kernel_size(source) == spec.conv_kernel_size == spec.dims.conv_kernel_size
    assert layer_layouts(text_spec(HF)) == layer_layouts(HF)
    assert text_spec(text_spec(HF)) == text_spec(HF)
    with pytest.raises(TypeError, match="InklingDims"):
        text_spec(load_config(HF))


def test_defaults_are_transformers_975b() -> None:
    spec = text_spec({})
    assert spec.dims == replace(load_config("inkling-975b"), name="")
    assert (spec.vocab_size, spec.unpadded_vocab_size, spec.padded) == (201024, 201024, False)
    assert (spec.intermediate_size, spec.moe_intermediate_size) == (24576, 3072)
    assert (spec.n_routed_experts, spec.num_experts_per_tok, spec.n_shared_experts) == (256, 6, 2)
    assert spec.moe_layers == tuple(range(66)) and spec.num_mtp_layers == 0
    assert (spec.route_scale, spec.logits_mup_width_multiplier, spec.d_rel) == (8.0, 24.0, 16)
    assert text_spec(DATA / "transformers_inkling_text_default.json") == replace(
        spec, name=str(DATA / "transformers_inkling_text_default.json"))
    assert text_spec("inkling-975b").dims == load_config("inkling-975b")


def test_transformers_rules_for_intermediate_sizes() -> None:
    # transformers honours dense_intermediate_size in its own format too
    spec = text_spec({"model_type": "inkling_text", "intermediate_size": 64,
                      "dense_intermediate_size": 256})
    assert (spec.intermediate_size, spec.moe_intermediate_size) == (256, 64)
    # a release config with only dense layers needs no expert width
    dense_only = {**RELEASE_TEXT, "model_type": "inkling_model", "dense_mlp_idx": 4,
                  "intermediate_size": 256}
    del dense_only["dense_intermediate_size"]
    assert text_spec(dense_only).intermediate_size == 256
    assert text_spec(dense_only).moe_layers == ()


def test_tiny_nested_fixture_is_an_impossible_moe() -> None:
    # transformers wrote it with num_experts_per_tok 6 over 4 routed experts: its
    # dimensions load, the model itself could not route
    assert load_config(DATA / "transformers_inkling_tiny_nested.json").hidden_size == 256
    with pytest.raises(ValueError, match="num_experts_per_tok 6"):
        text_spec(DATA / "transformers_inkling_tiny_nested.json")


def _without(d: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k not in keys}


RELEASE_T = {**RELEASE_TEXT, "model_type": "inkling_model"}


@pytest.mark.parametrize(
    ("cfg", "words"),
    [
        ({**HF, "model_type": "llama"}, "unknown model_type 'llama'"),
        ({**RELEASE_MM, "text_config": {**RELEASE_TEXT, "model_type": "qwen"}},
         "unknown text_config.model_type"),
        ({**HF, "layer_types": ["hybrid"] * 3}, "layer_types has 3 entries"),
        ({**HF, "layer_types": ["hybrid", "mamba", "hybrid", "hybrid"]}, r"layer_types\[1\]"),
        ({**HF, "mlp_layer_types": ["dense"] * 5}, "mlp_layer_types has 5 entries"),
        ({**HF, "mlp_layer_types": ["dense", "moe", "sparse", "sparse"]},
         r"mlp_layer_types\[1\] is 'moe'"),
        ({**HF, "dense_mlp_idx": 2}, "mlp_layer_types and dense_mlp_idx disagree"),
        ({**HF, "dense_mlp_idx": 9, "mlp_layer_types": None}, "dense_mlp_idx 9 exceeds"),
        ({**HF, "num_key_value_heads": 3}, "num_attention_heads 4 is not a multiple of num_key_value"),
        ({**HF, "swa_num_key_value_heads": 3}, "swa_num_attention_heads 4 is not a multiple"),
        ({**HF, "d_rel": 0}, "d_rel must be >= 1"),
        ({**HF, "rel_extent": 0}, "rel_extent must be >= 1"),
        ({**HF, "sliding_window_size": 0}, "sliding_window must be >= 1"),
        ({**HF, "log_scaling_n_floor": 0}, "log_scaling_n_floor must be >= 1"),
        ({**HF, "num_experts_per_tok": 9}, r"num_experts_per_tok 9 must be in \[1, n_routed"),
        ({**HF, "n_routed_experts": 0}, "n_routed_experts is 0"),
        ({**HF, "n_shared_experts": 0}, "n_shared_experts is 0"),
        ({**HF, "unpadded_vocab_size": 400}, "unpadded_vocab_size 400 > vocab_size 320"),
        ({**HF, "hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({**HF, "tie_word_embeddings": True}, "tie_word_embeddings"),
        ({**HF, "rms_norm_eps": 0.0}, "rms_norm_eps must be > 0"),
        ({**HF, "conv_kernel_size": 4, "sconv_kernel_size": 3}, "conflicting"),
        ({**HF, "num_nextn_predict_layers": 2}, "conflicting"),
        ({**RELEASE_MM, "mtp_config": {"num_nextn_predict_layers": 3}}, "conflicting"),
        (_without(RELEASE_T, "head_dim"), "does not give head_dim"),
        (_without(RELEASE_T, "swa_num_key_value_heads"), "does not give swa_num_key_value_heads"),
        (_without(RELEASE_T, "n_routed_experts"), "does not give n_routed_experts"),
        (_without(RELEASE_T, "logits_mup_width_multiplier"),
         "does not give logits_mup_width_multiplier"),
        (_without(RELEASE_T, "local_layer_ids"), "neither local_layer_ids nor layer_types"),
        (_without(RELEASE_T, "dense_intermediate_size"), "add dense_intermediate_size"),
        ({**RELEASE_T, "moe_intermediate_size": 32}, "drop moe_intermediate_size"),
        ({**RELEASE_T, "gate_activation": "softmax"}, "gate_activation is 'softmax'"),
        ({**RELEASE_T, "shared_expert_sink": False}, "shared_expert_sink is False"),
        ({**RELEASE_T, "inference_moe_w13_interleaved": False}, "inference_moe_w13_interleaved"),
        ({**RELEASE_T, "use_embed_norm": False}, "use_embed_norm is False"),
        ({**RELEASE_T, "final_logit_softcapping": 30.0}, "final_logit_softcapping"),
        ({**RELEASE_T, "v_head_dim": 32}, "v_head_dim 32 differs from head_dim 64"),
        ({**RELEASE_T, "padded_vocab_size": 320, "vocab_size": 272, "unpadded_vocab_size": 270},
         "must agree"),
    ],
)
def test_bad_configs_name_the_field(cfg: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        text_spec(cfg)


def test_wrong_types() -> None:
    with pytest.raises(TypeError, match="route_scale"):
        text_spec({**HF, "route_scale": "8"})
    with pytest.raises(TypeError, match="d_rel"):
        text_spec({**HF, "d_rel": 4.0})
    with pytest.raises(TypeError, match="mlp_layer_types"):
        text_spec({**HF, "mlp_layer_types": "dense"})
    # a text_config that is no object is refused (not read as the default model)
    for bad in ("oops", 5, ["hybrid"]):
        with pytest.raises(TypeError, match="text_config must be an object"):
            text_spec({**HF, "text_config": bad})
    with pytest.raises(TypeError, match="model_type must be a string"):
        text_spec({**HF, "model_type": ["inkling_text"]})
    with pytest.raises(TypeError, match="text_config.model_type must be a string"):
        text_spec({"model_type": "inkling_mm_model", "text_config": {**HF, "model_type": 3}})
    with pytest.raises(ValueError, match=r"layer_types\[1\] is \['hybrid'\]"):
        text_spec({**HF, "layer_types": ["hybrid", ["hybrid"]] + ["hybrid"] * (HF["num_hidden_layers"] - 2)})


def test_moe_fields_are_free_without_moe_layers() -> None:
    spec = text_spec({**HF, "mlp_layer_types": ["dense"] * 4, "n_routed_experts": 0,
                      "n_shared_experts": 0})
    assert spec.moe_layers == () and spec.n_routed_experts == 0


def test_to_dict_is_json_ready() -> None:
    spec = text_spec(RELEASE_MM)
    data = json.loads(json.dumps(spec.to_dict()))
    assert data["layout"] == "release" and data["mlp_layer_types"][0] == "dense"
    assert InklingTextSpec(**{**data, "layer_types": tuple(data["layer_types"]),
                              "mlp_layer_types": tuple(data["mlp_layer_types"])}) == spec


@given(
    layers=st.lists(st.sampled_from(["hybrid", "hybrid_sliding"]), min_size=1, max_size=8),
    dense=st.integers(0, 8),
    kv=st.sampled_from([1, 2, 4]),
    group=st.integers(1, 3),
    experts=st.integers(1, 16),
    data=st.data(),
)
def test_transformers_config_round_trip(
    layers: list[str], dense: int, kv: int, group: int, experts: int, data: st.DataObject
) -> None:
    n = len(layers)
    vocab = data.draw(st.integers(1, 512))
    cfg = {
        **HF,
        "num_hidden_layers": n,
        "layer_types": layers,
        "mlp_layer_types": ["dense" if i < dense else "sparse" for i in range(n)],
        "num_key_value_heads": kv,
        "num_attention_heads": kv * group,
        "n_routed_experts": experts,
        "num_experts_per_tok": data.draw(st.integers(1, experts)),
        "vocab_size": vocab,
        "unpadded_vocab_size": data.draw(st.integers(1, vocab)),
        "num_mtp_layers": data.draw(st.sampled_from([None, 0, 1, 2])),
        "log_scaling_n_floor": data.draw(st.sampled_from([None, 1, 4, 100])),
    }
    spec = text_spec(cfg)
    again = text_spec(spec.to_transformers_config())
    assert again == spec
    assert spec.num_mtp_layers == (cfg["num_mtp_layers"] or 0)
    assert len(spec.moe_layers) == max(0, n - dense)

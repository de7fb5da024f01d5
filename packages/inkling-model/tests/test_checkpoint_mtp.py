"""The MTP head's tensor names (``model.mtp.*``) in both checkpoint layouts.

Each MTP depth block is a dense Inkling decoder layer. The check builds one with
transformers (``InklingDecoderLayer``), writes it under MTP names in the release layout
(through the text map, itself checked against transformers' loader in
test_checkpoint.py) and in transformers' names, reads both back with
:func:`iter_mtp_weights` into a fresh transformers layer, and compares outputs.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import InklingTextConfig
from transformers.models.inkling.modeling_inkling import InklingDecoderLayer, InklingTextModel

from inkling_model.checkpoint import (
    MTP_HEAD_PARTS,
    iter_mtp_weights,
    missing_mtp_tensors,
    mtp_depths_stored,
    transformers_to_release,
)

CONFIG: dict[str, Any] = dict(
    vocab_size=64, hidden_size=32, num_hidden_layers=1, layer_types=["hybrid"], mlp_layer_types=["dense"],
    num_attention_heads=4, num_key_value_heads=2, head_dim=8, swa_num_attention_heads=4,
    swa_num_key_value_heads=4, swa_head_dim=8, sliding_window_size=6, rel_extent=12, d_rel=4,
    intermediate_size=48, moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2,
    n_shared_experts=1, conv_kernel_size=4,
)


def _block(seed: int) -> InklingDecoderLayer:
    torch.manual_seed(seed)
    block = InklingDecoderLayer(InklingTextConfig(**CONFIG), 0).to(torch.float32)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn_like(p) / max(1, p.shape[-1]) ** 0.5)
    return block.eval()


def _head(block: InklingDecoderLayer, layout: str, depth: int = 0) -> dict[str, torch.Tensor]:
    state = {f"model.layers.{depth}.{k}": v for k, v in block.state_dict().items()}
    prefix = f"model.layers.{depth}."
    if layout == "release":
        state, prefix = transformers_to_release(state), f"model.llm.layers.{depth}."
    head = f"model.mtp.layers.{depth}."
    out = {head + "transformer_block." + k[len(prefix):]: v for k, v in state.items()}
    hidden = CONFIG["hidden_size"]
    out[head + "hidden_norm.weight"] = torch.full((hidden,), 1.5)
    out[head + "embed_norm.weight"] = torch.full((hidden,), 0.5)
    out[head + "input_proj.weight"] = torch.randn(hidden, 2 * hidden)
    return out


def _outputs(block: InklingDecoderLayer, x: torch.Tensor) -> torch.Tensor:
    """The layer run through transformers' text model (masks, positions), on ``x``."""
    model = InklingTextModel(InklingTextConfig(**CONFIG)).to(torch.float32).eval()
    model.layers[0] = block
    with torch.no_grad():
        return model(inputs_embeds=x).last_hidden_state


@pytest.mark.parametrize("layout", ["release", "transformers"])
def test_mtp_block_read_back_computes_what_was_written(layout: str) -> None:
    original = _block(0)
    tensors = _head(original, layout)
    read = list(iter_mtp_weights(tensors.items()))
    assert [(d, n) for d, n, _ in iter_mtp_weights(tensors)] == [(d, n) for d, n, _ in read]  # a mapping too
    assert {d for d, _, _ in read} == {0}
    parts = {n: t for _, n, t in read}
    assert all(p in parts for p in MTP_HEAD_PARTS)
    fresh = _block(1)
    fresh.load_state_dict({n[len("transformer_block."):]: t for n, t in parts.items()
                           if n.startswith("transformer_block.")})
    x = torch.randn(1, 9, CONFIG["hidden_size"])
    assert _outputs(fresh, x).equal(_outputs(original, x))


def test_both_layouts_give_the_same_tensors() -> None:
    block = _block(2)
    release = {(d, n): t for d, n, t in iter_mtp_weights(_head(block, "release").items())}
    ours = {(d, n): t for d, n, t in iter_mtp_weights(_head(block, "transformers").items())}
    assert release.keys() == ours.keys()
    assert all(torch.equal(release[k], ours[k]) for k in release if k[1].startswith("transformer_block."))


def test_a_swapped_gate_and_up_would_be_caught() -> None:
    """The round trip above fails for a map that keeps the release w13 rows in order."""
    original = _block(3)
    tensors = _head(original, "release")
    key = "model.mtp.layers.0.transformer_block.mlp.w13_dn.weight"
    tensors[key] = torch.cat([tensors[key][1::2], tensors[key][0::2]])  # up rows where gate rows belong
    parts = {n: t for _, n, t in iter_mtp_weights(tensors.items())}
    fresh = _block(4)
    fresh.load_state_dict({n[len("transformer_block."):]: t for n, t in parts.items()
                           if n.startswith("transformer_block.")})
    x = torch.randn(1, 9, CONFIG["hidden_size"])
    assert not torch.allclose(_outputs(fresh, x), _outputs(original, x), atol=1e-3)


def test_other_tensors_pass_over_and_chain_norm_has_no_depth() -> None:
    tensors = {"model.llm.embed.weight": torch.zeros(2), "model.layers.0.input_layernorm.weight": torch.zeros(2),
               "model.mtp.chain_norm.weight": torch.ones(3)}
    assert [(d, n) for d, n, _ in iter_mtp_weights(tensors.items())] == [(None, "chain_norm.weight")]


@pytest.mark.parametrize("name", ["model.mtp.layers.0.transformer_block.mlp.experts.w13_weight",
                                  "model.mtp.layers.0.shared_head.norm.weight", "model.mtp.extra.weight"])
def test_unknown_mtp_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="unknown MTP tensor"):
        list(iter_mtp_weights([(name, torch.zeros(2))]))


@pytest.mark.parametrize("layout", ["release", "transformers"])
def test_missing_mtp_tensors_names_what_a_depth_lacks(layout: str) -> None:
    names = set(_head(_block(5), layout))
    assert missing_mtp_tensors(names, 1) == []
    assert mtp_depths_stored(names) == [0]
    attn = "attn.wq_du.weight" if layout == "release" else "self_attn.q_proj.weight"
    gone = f"model.mtp.layers.0.transformer_block.{attn}"
    assert missing_mtp_tensors(names - {gone, "model.mtp.layers.0.input_proj.weight"}, 1) == [
        "model.mtp.layers.0.input_proj.weight", gone]
    second = missing_mtp_tensors(names, 2)
    assert "model.mtp.layers.1.hidden_norm.weight" in second
    assert "model.mtp.layers.1.transformer_block.attn.wq_du.weight" in second  # release names when none stored

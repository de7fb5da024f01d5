"""A tiny transformers ``InklingTextConfig`` shared by the parity tests.

Global and sliding layers differ in KV heads and head_dim, so their conv-state
layouts differ; 8 sliding KV heads and 4 global ones both allow TP 1, 2 and 4.
"""

from __future__ import annotations

from typing import Any

from transformers.models.inkling.configuration_inkling import InklingTextConfig


def tiny_text_config(**overrides: Any) -> InklingTextConfig:
    """Two dense layers (sliding, then global), eager attention; ``overrides``
    replace any field."""
    fields: dict[str, Any] = dict(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=8,
        swa_num_attention_heads=8,
        swa_num_key_value_heads=8,
        swa_head_dim=4,
        sliding_window_size=16,
        rel_extent=16,
        d_rel=4,
        intermediate_size=48,
        layer_types=["hybrid_sliding", "hybrid"],
        mlp_layer_types=["dense", "dense"],
    )
    fields.update(overrides)
    cfg = InklingTextConfig(**fields)
    cfg._attn_implementation = "eager"
    return cfg

"""Config loading (transformers and checkpoint names), presets and per-layer layouts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from inkling_cache import PRESETS, InklingDims, layer_layouts, load_config

DATA = Path(__file__).parent / "data"

TINY_HF: dict[str, Any] = {
    "hidden_size": 256,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "swa_num_attention_heads": 4,
    "swa_num_key_value_heads": 4,
    "swa_head_dim": 32,
    "sliding_window": 32,
    "conv_kernel_size": 3,
    "layer_types": ["hybrid_sliding", "hybrid", "hybrid_sliding", "hybrid_sliding", "hybrid_sliding",
                    "hybrid"],
}
TINY_CKPT: dict[str, Any] = {
    **{k: v for k, v in TINY_HF.items() if k not in ("sliding_window", "conv_kernel_size",
                                                      "layer_types")},
    "sliding_window_size": 32,
    "sconv_kernel_size": 3,
    "local_layer_ids": [0, 2, 3, 4],
}


def test_975b_preset() -> None:
    dims = load_config("inkling-975b")
    assert dims.name == "inkling-975b"
    assert dims.global_layers == tuple(range(5, 66, 6))
    assert len(dims.global_layers) == 11 and len(dims.sliding_layers) == 55
    assert (dims.hidden_size, dims.num_hidden_layers, dims.num_attention_heads) == (6144, 66, 64)
    assert (dims.num_key_value_heads, dims.swa_num_key_value_heads) == (8, 16)
    assert (dims.head_dim, dims.swa_head_dim, dims.conv_kernel_size) == (128, 128, 4)
    assert dims.sliding_window == 512
    assert dims.valid_tp_sizes() == (1, 2, 4, 8)


def test_transformers_and_checkpoint_names_agree() -> None:
    a, b = load_config(TINY_HF), load_config(TINY_CKPT)
    assert a == b
    assert a.conv_kernel_size == 3 and a.sliding_window == 32
    assert a.global_layers == (1, 5)


def test_default_layer_rule_every_sixth_is_global() -> None:
    dims = load_config({"num_hidden_layers": 13})
    assert dims.global_layers == (5, 11)


def test_empty_dict_gives_transformers_defaults() -> None:
    assert load_config({}).to_dict() == {**load_config("inkling-975b").to_dict(), "name": ""}


def test_transformers_generated_configs() -> None:
    # Written by transformers 5.24 InklingTextConfig().to_json_file(...) / InklingConfig(...)
    default = load_config(DATA / "transformers_inkling_text_default.json")
    assert default.to_dict() == {**load_config("inkling-975b").to_dict(), "name": default.name}
    tiny = load_config(DATA / "transformers_inkling_tiny_nested.json")
    assert tiny.hidden_size == 256 and tiny.num_key_value_heads == 2
    assert tiny.swa_num_key_value_heads == 4 and tiny.swa_head_dim == 32
    assert tiny.sliding_layers == (0, 1, 3, 4) and tiny.sliding_window == 32


def test_path_folder_and_text_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"text_config": TINY_CKPT, "model_type": "inkling_mm_model"}))
    assert load_config(tmp_path) == load_config(str(tmp_path / "config.json"))
    assert load_config(tmp_path).global_layers == (1, 5)


def test_per_layer_layouts() -> None:
    layouts = layer_layouts(TINY_HF, tp_size=2)
    assert len(layouts) == 6
    g, s = layouts[1], layouts[0]
    assert (g.num_kv_heads, g.num_heads, g.head_dim, g.hidden_per_head) == (2, 1, 64, 128)
    assert (s.num_kv_heads, s.num_heads, s.head_dim, s.hidden_per_head) == (4, 2, 32, 64)
    assert g.raw_head_size == 2 * 64 + 2 * 128 and g.head_size == 512
    assert s.raw_head_size == 2 * 32 + 2 * 64 and s.head_size == 256
    assert all(lay.kernel_size == 3 == lay.block_size == lay.sliding_window for lay in layouts)
    assert layouts[5] == g and layouts[2] == s


def test_975b_layouts_exact_at_tp8() -> None:
    layouts = layer_layouts("inkling-975b", tp_size=8)
    for i, lay in enumerate(layouts):
        if (i + 1) % 6 == 0:
            assert (lay.raw_head_size, lay.head_size, lay.num_heads) == (1792, 2048, 1)
        else:
            assert (lay.raw_head_size, lay.head_size, lay.num_heads) == (1024, 1024, 2)
        assert lay.page_bytes("bfloat16") == 131072 // 8


@pytest.mark.parametrize(
    ("cfg", "words"),
    [
        ({"num_hidden_layers": 3, "layer_types": ["hybrid"] * 2}, "one type per layer"),
        ({"num_hidden_layers": 2, "layer_types": ["hybrid", "mamba"]}, "layer_types\\[1\\]"),
        ({"num_hidden_layers": 2, "local_layer_ids": [2]}, "not a layer index"),
        ({"num_hidden_layers": 2, "layer_types": ["hybrid", "hybrid"], "local_layer_ids": [0]},
         "disagree"),
        ({"conv_kernel_size": 4, "sconv_kernel_size": 3}, "conflicting"),
        ({"sliding_window": 128, "sliding_window_size": 512}, "conflicting"),
        ({"hidden_size": 0}, "hidden_size must be >= 1"),
    ],
)
def test_bad_configs(cfg: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        load_config(cfg)


def test_layer_layouts_names_the_failing_layer_type() -> None:
    with pytest.raises(ValueError, match=r"global layers \(num_key_value_heads=8\).*exceeds"):
        layer_layouts("inkling-975b", tp_size=16)
    cfg = {**TINY_HF, "swa_num_key_value_heads": 3, "hidden_size": 384, "num_key_value_heads": 2}
    with pytest.raises(ValueError, match=r"sliding layers \(swa_num_key_value_heads=3\).*divide"):
        layer_layouts(cfg, tp_size=2)
    with pytest.raises(ValueError, match="kernel_size must be >= 2"):
        layer_layouts({**TINY_HF, "conv_kernel_size": 1})


def test_unknown_sources(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="neither a preset"):
        load_config("inkling-9000b")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read"):
        load_config(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        load_config(bad)
    with pytest.raises(TypeError):
        load_config(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        load_config({"hidden_size": "6144"})


def test_dims_pass_through_and_presets_are_valid() -> None:
    dims = load_config("inkling-975b")
    assert load_config(dims) is dims
    assert isinstance(dims, InklingDims)
    for name in PRESETS:
        assert len(layer_layouts(name)) == load_config(name).num_hidden_layers

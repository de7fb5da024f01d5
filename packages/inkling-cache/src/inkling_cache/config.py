"""Model dimensions from an Inkling config, and the per-layer conv-state layouts.

Accepted field names (the first is canonical; missing fields take the defaults of
transformers' ``InklingTextConfig``, i.e. the released 975B text model):

==========================  =========================================  =========
field                       also read from                             default
==========================  =========================================  =========
``hidden_size``                                                        6144
``num_hidden_layers``                                                  66
``num_attention_heads``                                                64
``num_key_value_heads``     (global layers)                            8
``head_dim``                (global layers)                            128
``swa_num_attention_heads``                                            64
``swa_num_key_value_heads`` (sliding layers)                           16
``swa_head_dim``            (sliding layers)                           128
``sliding_window``          ``sliding_window_size``                    512
``conv_kernel_size``        ``sconv_kernel_size``                      4
``max_position_embeddings`` ``model_max_length``                       131072
``layer_types``             ``local_layer_ids``; else every 6th layer  see text
==========================  =========================================  =========

``layer_types`` entries are ``"hybrid"`` (global) or ``"hybrid_sliding"``
(``"full_attention"`` / ``"sliding_attention"`` are accepted too). Without
``layer_types``, layers listed in ``local_layer_ids`` are sliding; without either,
layer ``i`` is global when ``(i + 1) % 6 == 0`` (transformers' rule). A config nested
under ``"text_config"`` (the multimodal checkpoint form) is read from there.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from .layout import ConvStateLayout, PaddingSpec

__all__ = [
    "PRESETS",
    "ConfigSource",
    "InklingDims",
    "layer_layouts",
    "load_config",
]

GLOBAL = "hybrid"
SLIDING = "hybrid_sliding"
_LAYER_TYPE_ALIASES = {
    "hybrid": GLOBAL,
    "full_attention": GLOBAL,
    "hybrid_sliding": SLIDING,
    "sliding_attention": SLIDING,
}

# transformers' InklingTextConfig defaults for the fields this package reads.
_DEFAULTS: dict[str, int] = {
    "hidden_size": 6144,
    "num_hidden_layers": 66,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "swa_num_attention_heads": 64,
    "swa_num_key_value_heads": 16,
    "swa_head_dim": 128,
    "sliding_window": 512,
    "conv_kernel_size": 4,
    "max_position_embeddings": 131072,
}

# canonical name -> alternative names found in checkpoints / transformers' attribute_map
_ALIASES: dict[str, tuple[str, ...]] = {
    "sliding_window": ("sliding_window_size",),
    "conv_kernel_size": ("sconv_kernel_size",),
    "max_position_embeddings": ("model_max_length",),
}

#: Bundled configs by name. ``inkling-975b`` is the released text model (design brief 1).
PRESETS: dict[str, dict[str, Any]] = {
    "inkling-975b": {
        "hidden_size": 6144,
        "num_hidden_layers": 66,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "swa_num_attention_heads": 64,
        "swa_num_key_value_heads": 16,
        "swa_head_dim": 128,
        "sliding_window_size": 512,
        "sconv_kernel_size": 4,
        "max_position_embeddings": 131072,
        "layer_types": [GLOBAL if (i + 1) % 6 == 0 else SLIDING for i in range(66)],
    },
}


@dataclass(frozen=True)
class InklingDims:
    """The model dimensions this package needs, normalized from any config form.

    ``layer_types[i]`` is ``"hybrid"`` (global attention: ``num_key_value_heads``,
    ``head_dim``) or ``"hybrid_sliding"`` (``swa_num_key_value_heads``,
    ``swa_head_dim``, window ``sliding_window``).
    """

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    swa_num_attention_heads: int
    swa_num_key_value_heads: int
    swa_head_dim: int
    sliding_window: int
    conv_kernel_size: int
    max_position_embeddings: int
    layer_types: tuple[str, ...]
    name: str = ""

    def __post_init__(self) -> None:
        for field in _DEFAULTS:
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"config field {field} must be an int, got {value!r}")
            if value < 1:
                raise ValueError(f"config field {field} must be >= 1, got {value}")
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(
                f"layer_types has {len(self.layer_types)} entries but num_hidden_layers is "
                f"{self.num_hidden_layers}: give one type per layer"
            )
        for i, kind in enumerate(self.layer_types):
            if kind not in (GLOBAL, SLIDING):
                raise ValueError(
                    f"layer_types[{i}] is {kind!r}: use 'hybrid' (global) or 'hybrid_sliding'"
                )

    def is_sliding(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` uses sliding-window attention."""
        return self.layer_types[layer] == SLIDING

    def kv_heads_of(self, layer: int) -> int:
        """KV heads of ``layer`` (``swa_num_key_value_heads`` on sliding layers)."""
        return self.swa_num_key_value_heads if self.is_sliding(layer) else self.num_key_value_heads

    def head_dim_of(self, layer: int) -> int:
        """Head dimension of ``layer`` (``swa_head_dim`` on sliding layers)."""
        return self.swa_head_dim if self.is_sliding(layer) else self.head_dim

    @property
    def global_layers(self) -> tuple[int, ...]:
        """Indices of the global-attention layers."""
        return tuple(i for i, t in enumerate(self.layer_types) if t == GLOBAL)

    @property
    def sliding_layers(self) -> tuple[int, ...]:
        """Indices of the sliding-window layers."""
        return tuple(i for i, t in enumerate(self.layer_types) if t == SLIDING)

    def valid_tp_sizes(self) -> tuple[int, ...]:
        """TP degrees for which every layer's conv layout is valid."""
        kinds = set(self.layer_types)
        heads = [self.num_key_value_heads] if GLOBAL in kinds else []
        heads += [self.swa_num_key_value_heads] if SLIDING in kinds else []
        limit = min(heads)
        return tuple(t for t in range(1, limit + 1) if all(h % t == 0 for h in heads))

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form, canonical field names (JSON-ready)."""
        out: dict[str, Any] = {field: getattr(self, field) for field in _DEFAULTS}
        out["layer_types"] = list(self.layer_types)
        out["name"] = self.name
        return out


#: Anything :func:`load_config` accepts.
ConfigSource = Union[InklingDims, Mapping[str, Any], str, "os.PathLike[str]"]


def _pick(cfg: Mapping[str, Any], field: str) -> Any:
    names = (field, *_ALIASES.get(field, ()))
    present = [(n, cfg[n]) for n in names if cfg.get(n) is not None]
    if not present:
        return _DEFAULTS[field]
    values = {repr(v) for _, v in present}
    if len(values) > 1:
        shown = ", ".join(f"{n}={v!r}" for n, v in present)
        raise ValueError(f"config gives conflicting values {shown}: keep one")
    return present[0][1]


def _layer_types(cfg: Mapping[str, Any], num_layers: int) -> tuple[str, ...]:
    local_ids = cfg.get("local_layer_ids")
    local: set[int] | None = None
    if local_ids is not None:
        if isinstance(local_ids, (str, bytes)) or not isinstance(local_ids, (list, tuple)):
            raise TypeError(f"local_layer_ids must be a list of ints, got {local_ids!r}")
        for i in local_ids:
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < num_layers:
                raise ValueError(
                    f"local_layer_ids entry {i!r} is not a layer index in [0, {num_layers})"
                )
        local = set(local_ids)
    raw = cfg.get("layer_types")
    if raw is None:
        if local is None:
            return tuple(GLOBAL if (i + 1) % 6 == 0 else SLIDING for i in range(num_layers))
        return tuple(SLIDING if i in local else GLOBAL for i in range(num_layers))
    if isinstance(raw, (str, bytes)) or not isinstance(raw, (list, tuple)):
        raise TypeError(f"layer_types must be a list of strings, got {raw!r}")
    kinds = []
    for i, kind in enumerate(raw):
        if kind not in _LAYER_TYPE_ALIASES:
            raise ValueError(
                f"layer_types[{i}] is {kind!r}: use 'hybrid' (global) or 'hybrid_sliding'"
            )
        kinds.append(_LAYER_TYPE_ALIASES[kind])
    if local is not None:
        from_ids = [SLIDING if i in local else GLOBAL for i in range(len(kinds))]
        if from_ids != kinds:
            raise ValueError("layer_types and local_layer_ids disagree: keep one of them")
    return tuple(kinds)


def _from_mapping(cfg: Mapping[str, Any], name: str) -> InklingDims:
    text = cfg.get("text_config")
    if isinstance(text, Mapping):
        cfg = text
    values = {field: _pick(cfg, field) for field in _DEFAULTS}
    num_layers = values["num_hidden_layers"]
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise ValueError(f"num_hidden_layers must be a positive int, got {num_layers!r}")
    return InklingDims(**values, layer_types=_layer_types(cfg, num_layers), name=name)


def load_config(source: ConfigSource) -> InklingDims:
    """Normalize a config into :class:`InklingDims`.

    Args:
        source: an :class:`InklingDims`; a dict (transformers or checkpoint field names,
            optionally nested under ``"text_config"``); a preset name from
            :data:`PRESETS`; or a path to a ``config.json`` (or a folder holding one).

    Raises:
        ValueError: unknown preset or missing file, unreadable JSON, or invalid fields.
    """
    if isinstance(source, InklingDims):
        return source
    if isinstance(source, Mapping):
        return _from_mapping(source, name=str(source.get("name", "")))
    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        if isinstance(source, str) and text in PRESETS:
            return _from_mapping(PRESETS[text], name=text)
        path = Path(text)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            presets = ", ".join(sorted(PRESETS))
            raise ValueError(
                f"{text!r} is neither a preset ({presets}) nor a config.json file"
            )
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read {str(path)!r} as JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{str(path)!r} does not hold a JSON object")
        return _from_mapping(data, name=str(path))
    raise TypeError(
        f"config must be a dict, a preset name or a path, got {type(source).__name__}"
    )


def layer_layouts(
    config: ConfigSource,
    *,
    tp_size: int = 1,
    padding: PaddingSpec = "pow2",
    block_size: int | None = None,
) -> list[ConvStateLayout]:
    """One :class:`ConvStateLayout` per decoder layer.

    Global layers use ``num_key_value_heads`` / ``head_dim``, sliding layers
    ``swa_num_key_value_heads`` / ``swa_head_dim``. ``block_size`` (default ``W``)
    and the conv sliding window (``W``) are the same on every layer.

    Raises:
        ValueError: naming the layer type whose dimensions reject ``tp_size`` etc.
    """
    dims = load_config(config)
    by_kind: dict[str, ConvStateLayout] = {}
    for kind in sorted(set(dims.layer_types)):
        sliding = kind == SLIDING
        heads = dims.swa_num_key_value_heads if sliding else dims.num_key_value_heads
        head_dim = dims.swa_head_dim if sliding else dims.head_dim
        try:
            by_kind[kind] = ConvStateLayout.build(
                num_kv_heads=heads,
                head_dim=head_dim,
                hidden_size=dims.hidden_size,
                kernel_size=dims.conv_kernel_size,
                tp_size=tp_size,
                block_size=block_size,
                padding=padding,
            )
        except ValueError as exc:
            which = "sliding layers (swa_num_key_value_heads" if sliding else (
                "global layers (num_key_value_heads"
            )
            raise ValueError(f"{which}={heads}): {exc}") from None
    return [by_kind[kind] for kind in dims.layer_types]

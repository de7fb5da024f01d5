"""Inkling config adapters: model dimensions (:class:`InklingDims`), the full text-model
spec (:class:`InklingTextSpec`) and the per-layer conv-state layouts.

Every reader goes through one resolver that accepts a dict, a ``config.json`` path or
folder, a preset name, or a config object read by attribute (transformers'
``InklingTextConfig`` / ``InklingConfig``, vLLM's ``InklingModelConfig`` /
``InklingMMConfig``; nothing is imported to do so). Two field conventions exist:

* ``layout="transformers"`` (``model_type: inkling_text``, or ``inkling_mm_model``
  whose ``text_config`` says ``inkling_text``; also any dict without a model_type):
  ``intermediate_size`` is the dense MLP width, ``moe_intermediate_size`` the expert
  width, ``layer_types`` / ``mlp_layer_types`` list the layers, ``num_mtp_layers``.
* ``layout="release"`` (the released checkpoints: ``model_type: inkling_mm_model`` with
  a ``text_config`` that is not ``inkling_text``, or the text-only ``inkling_model``):
  ``intermediate_size`` is the EXPERT width and ``dense_intermediate_size`` the dense
  width, ``sconv_kernel_size``, ``local_layer_ids`` (sliding layers),
  ``dense_mlp_idx`` (layers below it are dense), ``num_nextn_predict_layers`` (in the
  text config or a top-level ``mtp_config``). vLLM's config object also rewrites
  ``vocab_size`` to the unpadded size and keeps the row count in ``padded_vocab_size``.

Values always come out in transformers' meaning. Field names read for the dimensions
(the first is canonical; missing fields take the defaults of transformers'
``InklingTextConfig``, i.e. the released 975B text model):

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
layer ``i`` is global when ``(i + 1) % 6 == 0`` (transformers' rule). A release config
must state the fields whose defaults differ between transformers and vLLM (the head
counts and sizes, the layer kinds, the MLP widths, the MoE counts, the logit
multiplier): reading it raises a ValueError naming the missing field otherwise.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal, Union

from .layout import ConvStateLayout, PaddingSpec

__all__ = [
    "DENSE",
    "GLOBAL",
    "PRESETS",
    "SLIDING",
    "SPARSE",
    "ConfigSource",
    "InklingDims",
    "InklingTextSpec",
    "Layout",
    "conv_kernel_size",
    "layer_layouts",
    "load_config",
    "text_spec",
]

GLOBAL = "hybrid"
SLIDING = "hybrid_sliding"
_LAYER_TYPE_ALIASES = {
    "hybrid": GLOBAL,
    "full_attention": GLOBAL,
    "hybrid_sliding": SLIDING,
    "sliding_attention": SLIDING,
}
DENSE = "dense"
SPARSE = "sparse"

#: Which field convention a config came in (see the module docstring).
Layout = Literal["transformers", "release"]
_TRANSFORMERS: Layout = "transformers"
_RELEASE: Layout = "release"
_MM_MODEL_TYPE = "inkling_mm_model"
_TEXT_MODEL_TYPES: dict[str, Layout] = {"inkling_text": _TRANSFORMERS, "inkling_model": _RELEASE}

# transformers' InklingTextConfig defaults for the fields InklingDims holds.
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

# transformers' defaults for the rest of the text model (None: off / not given).
_SPEC_DEFAULTS: dict[str, Any] = {
    "vocab_size": 201024,
    "d_rel": 16,
    "rel_extent": 1024,
    "log_scaling_n_floor": None,
    "log_scaling_alpha": 0.1,
    "intermediate_size": 24576,
    "moe_intermediate_size": 3072,
    "n_routed_experts": 256,
    "num_experts_per_tok": 6,
    "n_shared_experts": 2,
    "route_scale": 8.0,
    "rms_norm_eps": 1e-6,
    "logits_mup_width_multiplier": 24.0,
    "hidden_act": "silu",
}

# canonical name -> alternative names found in checkpoints / transformers' attribute_map
_ALIASES: dict[str, tuple[str, ...]] = {
    "sliding_window": ("sliding_window_size",),
    "conv_kernel_size": ("sconv_kernel_size",),
    "max_position_embeddings": ("model_max_length",),
    "num_mtp_layers": ("num_nextn_predict_layers",),
    "n_routed_experts": ("num_local_experts",),
}

# Fields a release config must state: transformers and vLLM default them differently.
_RELEASE_REQUIRED = frozenset({
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "head_dim", "swa_num_attention_heads", "swa_num_key_value_heads", "swa_head_dim",
    "intermediate_size", "logits_mup_width_multiplier",
    "n_routed_experts", "num_experts_per_tok", "n_shared_experts", "route_scale",
})

# Release/vLLM switches for variants transformers' Inkling cannot express: name -> the
# only value it implements (checked when present). vLLM ignores ``use_sconv``.
_FIXED_SWITCHES: dict[str, Any] = {
    "use_embed_norm": True,
    "q_bias": False,
    "o_bias": False,
    "final_logit_softcapping": None,
}
# The same, for MoE layers only.
_FIXED_MOE_SWITCHES: dict[str, Any] = {
    "gate_activation": "sigmoid",
    "norm_after_topk": True,
    "shared_expert_sink": True,
    "inference_moe_w13_interleaved": True,
}

# Attributes read from a config object (it is not a Mapping).
_OBJECT_FIELDS: tuple[str, ...] = (
    "model_type", "text_config", "mtp_config", "name_or_path",
    *_DEFAULTS, *_SPEC_DEFAULTS, *(a for names in _ALIASES.values() for a in names),
    "num_mtp_layers", "layer_types", "local_layer_ids", "mlp_layer_types", "dense_mlp_idx",
    "dense_intermediate_size", "unpadded_vocab_size", "padded_vocab_size",
    "tie_word_embeddings", "v_head_dim", "swa_v_head_dim",
    *_FIXED_SWITCHES, *_FIXED_MOE_SWITCHES,
)

#: Bundled configs by name. ``inkling-975b`` is the released text model (docs/design.md §1).
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


@dataclass(frozen=True, kw_only=True)
class _LayerShapes:
    """The attention shape fields of :class:`InklingDims` and :class:`InklingTextSpec`
    and their per-layer accessors (keyword-only: each subclass keeps its own
    positional order)."""

    layer_types: tuple[str, ...]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    swa_num_attention_heads: int
    swa_num_key_value_heads: int
    swa_head_dim: int

    def is_sliding(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` uses sliding-window attention."""
        return self.layer_types[layer] == SLIDING

    def heads_of(self, layer: int) -> int:
        """Query heads of ``layer`` (``swa_num_attention_heads`` on sliding layers)."""
        return self.swa_num_attention_heads if self.is_sliding(layer) else self.num_attention_heads

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


@dataclass(frozen=True)
class InklingDims(_LayerShapes):
    """The model dimensions the conv-state cache needs, normalized from any config form.

    ``layer_types[i]`` is ``"hybrid"`` (global attention: ``num_key_value_heads``,
    ``head_dim``) or ``"hybrid_sliding"`` (``swa_num_key_value_heads``,
    ``swa_head_dim``, window ``sliding_window``).
    """

    hidden_size: int
    num_hidden_layers: int
    sliding_window: int
    conv_kernel_size: int
    max_position_embeddings: int
    name: str = ""

    def __post_init__(self) -> None:
        for field in _DEFAULTS:
            _check_int(field, getattr(self, field), minimum=1)
        _check_layer_types(self.layer_types, self.num_hidden_layers)

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


@dataclass(frozen=True)
class InklingTextSpec(_LayerShapes):
    """Every hyperparameter of the served Inkling text model, in transformers' meaning.

    ``vocab_size`` is the row count of the embedding and the unembedding;
    ``unpadded_vocab_size`` (<= ``vocab_size``) the logit columns kept.
    ``intermediate_size`` is the dense MLP width, ``moe_intermediate_size`` the width
    of every routed and shared expert. ``mlp_layer_types[i]`` is ``"dense"`` or
    ``"sparse"`` (MoE). ``log_scaling_n_floor`` None turns log scaling off.
    ``num_mtp_layers`` counts the multi-token-prediction layers (0: none).
    ``layout`` is the convention the config came in (``"transformers"`` or
    ``"release"``); ``name`` where it came from.
    """

    vocab_size: int
    unpadded_vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    mlp_layer_types: tuple[str, ...]
    sliding_window: int
    d_rel: int
    rel_extent: int
    log_scaling_n_floor: int | None
    log_scaling_alpha: float
    conv_kernel_size: int
    intermediate_size: int
    moe_intermediate_size: int
    n_routed_experts: int
    num_experts_per_tok: int
    n_shared_experts: int
    route_scale: float
    rms_norm_eps: float
    logits_mup_width_multiplier: float
    hidden_act: str
    num_mtp_layers: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    layout: Layout
    name: str = ""

    def __post_init__(self) -> None:
        _ = self.dims  # InklingDims validates the shared fields and the layer kinds
        for field in ("vocab_size", "unpadded_vocab_size", "d_rel", "rel_extent",
                      "intermediate_size", "moe_intermediate_size"):
            _check_int(field, getattr(self, field), minimum=1)
        for field in ("n_routed_experts", "num_experts_per_tok", "n_shared_experts",
                      "num_mtp_layers"):
            _check_int(field, getattr(self, field), minimum=0)
        if self.log_scaling_n_floor is not None:
            _check_int("log_scaling_n_floor", self.log_scaling_n_floor, minimum=1,
                       hint="or null to turn log scaling off")
        for field in ("log_scaling_alpha", "route_scale", "rms_norm_eps",
                      "logits_mup_width_multiplier"):
            _check_float(field, getattr(self, field))
        for field in ("rms_norm_eps", "logits_mup_width_multiplier"):
            if getattr(self, field) <= 0:
                raise ValueError(f"{field} must be > 0, got {getattr(self, field)}")
        if self.layout not in (_TRANSFORMERS, _RELEASE):
            raise ValueError(f"layout must be 'transformers' or 'release', got {self.layout!r}")
        if self.unpadded_vocab_size > self.vocab_size:
            raise ValueError(
                f"unpadded_vocab_size {self.unpadded_vocab_size} > vocab_size "
                f"{self.vocab_size}: vocab_size counts the (padded) embedding rows, so make "
                "it at least unpadded_vocab_size"
            )
        for label, heads, kv in (
            ("", self.num_attention_heads, self.num_key_value_heads),
            ("swa_", self.swa_num_attention_heads, self.swa_num_key_value_heads),
        ):
            if heads % kv:
                raise ValueError(
                    f"{label}num_attention_heads {heads} is not a multiple of "
                    f"{label}num_key_value_heads {kv}: each KV head serves a whole group of "
                    "query heads"
                )
        if self.hidden_act != "silu":
            raise ValueError(
                f"hidden_act {self.hidden_act!r} is not supported: Inkling's MLPs are SwiGLU, "
                "set hidden_act to 'silu'"
            )
        if self.tie_word_embeddings:
            raise ValueError(
                "tie_word_embeddings is true, but Inkling keeps separate embedding and "
                "unembedding matrices (transformers never ties them): set it to false"
            )
        _check_mlp_layer_types(self.mlp_layer_types, self.num_hidden_layers)
        if self.moe_layers:
            _check_moe(self.n_routed_experts, self.num_experts_per_tok, self.n_shared_experts)

    @property
    def dims(self) -> InklingDims:
        """The conv-state dimensions of this model."""
        return InklingDims(
            **{field: getattr(self, field) for field in _DEFAULTS},
            layer_types=self.layer_types,
            name=self.name,
        )

    @property
    def padded(self) -> bool:
        """Whether the embedding/unembedding has rows past ``unpadded_vocab_size``."""
        return self.vocab_size > self.unpadded_vocab_size

    def is_moe(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` has a MoE (``"sparse"``) MLP."""
        return self.mlp_layer_types[layer] == SPARSE

    def window_of(self, layer: int) -> int | None:
        """Attention window of ``layer``: ``sliding_window`` on sliding layers, else None."""
        return self.sliding_window if self.is_sliding(layer) else None

    def rel_extent_of(self, layer: int) -> int:
        """Backward reach of the relative logits of ``layer``: the window on sliding
        layers, ``rel_extent`` on global ones (the ``proj`` width of that layer)."""
        return self.sliding_window if self.is_sliding(layer) else self.rel_extent

    def log_scaling_of(self, layer: int) -> bool:
        """Whether ``layer`` scales its logits with log scaling (global layers only)."""
        return self.log_scaling_n_floor is not None and not self.is_sliding(layer)

    @property
    def moe_layers(self) -> tuple[int, ...]:
        """Indices of the MoE (``"sparse"``) layers."""
        return tuple(i for i, t in enumerate(self.mlp_layer_types) if t == SPARSE)

    @property
    def dense_layers(self) -> tuple[int, ...]:
        """Indices of the dense-MLP layers."""
        return tuple(i for i, t in enumerate(self.mlp_layer_types) if t == DENSE)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form, canonical field names (JSON-ready)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["layer_types"] = list(self.layer_types)
        out["mlp_layer_types"] = list(self.mlp_layer_types)
        return out

    def to_transformers_config(self) -> dict[str, Any]:
        """``InklingTextConfig`` keyword arguments (``model_type: inkling_text``) that
        describe this model."""
        out: dict[str, Any] = {
            "model_type": "inkling_text",
            **{field: getattr(self, field) for field in _DEFAULTS if field != "sliding_window"},
            **{field: getattr(self, field) for field in _SPEC_DEFAULTS},
            "sliding_window_size": self.sliding_window,
            "layer_types": list(self.layer_types),
            "mlp_layer_types": list(self.mlp_layer_types),
            "unpadded_vocab_size": self.unpadded_vocab_size if self.padded else None,
            "num_mtp_layers": self.num_mtp_layers or None,
        }
        return out

    def to_release_config(self) -> dict[str, Any]:
        """The release convention's text config (the ``text_config`` of an
        ``inkling_mm_model`` config.json; add ``"model_type": "inkling_model"`` for a
        text-only one) describing this model, readable by vLLM and transformers alike.

        Raises:
            ValueError: the dense layers are not a leading run (the release form can
                only say ``dense_mlp_idx``).
        """
        n_dense = len(self.dense_layers)
        if self.dense_layers != tuple(range(n_dense)):
            raise ValueError(
                f"dense layers {self.dense_layers} are not layers 0..k-1: the release config "
                "can only express a leading run of dense layers (dense_mlp_idx)"
            )
        return {
            "vocab_size": self.vocab_size,
            "unpadded_vocab_size": self.unpadded_vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "local_layer_ids": list(self.sliding_layers),
            "dense_mlp_idx": n_dense,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "swa_num_attention_heads": self.swa_num_attention_heads,
            "swa_num_key_value_heads": self.swa_num_key_value_heads,
            "swa_head_dim": self.swa_head_dim,
            "sliding_window_size": self.sliding_window,
            "d_rel": self.d_rel,
            "rel_extent": self.rel_extent,
            "log_scaling_n_floor": self.log_scaling_n_floor,
            "log_scaling_alpha": self.log_scaling_alpha,
            "sconv_kernel_size": self.conv_kernel_size,
            "intermediate_size": self.moe_intermediate_size,
            "dense_intermediate_size": self.intermediate_size,
            "n_routed_experts": self.n_routed_experts,
            "num_experts_per_tok": self.num_experts_per_tok,
            "n_shared_experts": self.n_shared_experts,
            "route_scale": self.route_scale,
            "rms_norm_eps": self.rms_norm_eps,
            "hidden_act": self.hidden_act,
            "logits_mup_width_multiplier": self.logits_mup_width_multiplier,
            "num_nextn_predict_layers": self.num_mtp_layers,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": False,
            "use_sconv": True,
            "use_embed_norm": True,
            "use_gate_bias": True,
            "use_global_scale": True,
            "shared_expert_sink": True,
            "gate_activation": "sigmoid",
            "norm_after_topk": True,
            "inference_moe_w13_interleaved": True,
        }


#: Anything :func:`load_config` accepts.
ConfigSource = Union[InklingDims, Mapping[str, Any], str, "os.PathLike[str]"]


# --- resolving a source into the text config and its layout -------------------------


@dataclass(frozen=True)
class _Resolved:
    text: Mapping[str, Any]  # the text model's fields
    outer: Mapping[str, Any]  # the top level (the same as text for text-only configs)
    layout: Layout
    name: str


def _read_object(obj: object) -> dict[str, Any]:
    """A config object's fields by attribute (transformers / vLLM config classes)."""
    out: dict[str, Any] = {}
    for attr in _OBJECT_FIELDS:
        try:
            value = getattr(obj, attr)
        except Exception:  # absent (AttributeError) or a property that cannot answer
            continue
        if callable(value):
            continue
        out[attr] = value
    text = out.get("text_config")
    if text is not None and not isinstance(text, Mapping):
        out["text_config"] = _read_object(text)
    return out


def _load_json(text: str) -> tuple[dict[str, Any], str]:
    path = Path(text)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        presets = ", ".join(sorted(PRESETS))
        raise ValueError(f"{text!r} is neither a preset ({presets}) nor a config.json file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {str(path)!r} as JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{str(path)!r} does not hold a JSON object")
    return data, str(path)


def _resolve(source: object) -> _Resolved:
    cfg: Mapping[str, Any]
    if isinstance(source, str) and source in PRESETS:
        cfg, name = PRESETS[source], source
    elif isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        if not isinstance(text, str):
            raise TypeError("a config path must be a str path, not bytes")
        cfg, name = _load_json(text)
    elif isinstance(source, Mapping):
        cfg, name = source, str(source.get("name", ""))
    elif source is None or isinstance(source, (int, float, bytes, list, tuple, set)):
        raise TypeError(
            "config must be a dict, a preset name, a path or a config object, got "
            f"{type(source).__name__}"
        )
    else:
        cfg = _read_object(source)
        if not set(cfg) - {"name_or_path"}:
            raise TypeError(
                f"a {type(source).__name__} has none of an Inkling config's attributes "
                "(model_type, text_config, hidden_size, ...): pass the model's config"
            )
        name = str(cfg.get("name_or_path") or "")
    model_type = cfg.get("model_type")
    text_cfg = cfg.get("text_config")
    if model_type is not None and not isinstance(model_type, str):
        raise TypeError(f"model_type must be a string, got {model_type!r}")
    if text_cfg is not None and isinstance(text_cfg, (str, bytes, int, float, list, tuple)):
        raise TypeError(f"text_config must be an object of the text model's fields, got {text_cfg!r}")
    if model_type is not None and model_type != _MM_MODEL_TYPE and model_type not in _TEXT_MODEL_TYPES:
        raise ValueError(
            f"unknown model_type {model_type!r}: expected 'inkling_text' (transformers), "
            "'inkling_mm_model' (with a text_config) or 'inkling_model' (release, text only)"
        )
    if model_type == _MM_MODEL_TYPE or (model_type is None and text_cfg is not None):
        if text_cfg is None:
            text_cfg = {}  # transformers' InklingConfig: the default text model
        elif not isinstance(text_cfg, Mapping):
            text_cfg = _read_object(text_cfg)
        inner = text_cfg.get("model_type")
        if inner is not None and not isinstance(inner, str):
            raise TypeError(f"text_config.model_type must be a string, got {inner!r}")
        if inner is None:
            layout = _RELEASE if text_cfg else _TRANSFORMERS
        elif inner in _TEXT_MODEL_TYPES:
            layout = _TEXT_MODEL_TYPES[inner]
        else:
            raise ValueError(
                f"unknown text_config.model_type {inner!r}: expected 'inkling_text' "
                "(transformers) or 'inkling_model' (release)"
            )
        return _Resolved(text=text_cfg, outer=cfg, layout=layout, name=name)
    layout = _TEXT_MODEL_TYPES[model_type] if model_type is not None else _TRANSFORMERS
    return _Resolved(text=cfg, outer=cfg, layout=layout, name=name)


# --- reading fields -------------------------------------------------------------------


def _present(cfg: Mapping[str, Any], field: str) -> list[tuple[str, Any]]:
    names = (field, *_ALIASES.get(field, ()))
    return [(n, cfg[n]) for n in names if cfg.get(n) is not None]


def _pick(cfg: Mapping[str, Any], field: str, layout: Layout = _TRANSFORMERS) -> Any:
    present = _present(cfg, field)
    if not present:
        if layout == _RELEASE and field in _RELEASE_REQUIRED:
            raise ValueError(
                f"the release config does not give {field}: add it (transformers and vLLM "
                "default it differently, so the served model would be ambiguous)"
            )
        return _DEFAULTS[field] if field in _DEFAULTS else _SPEC_DEFAULTS[field]
    values = {repr(v) for _, v in present}
    if len(values) > 1:
        shown = ", ".join(f"{n}={v!r}" for n, v in present)
        raise ValueError(f"config gives conflicting values {shown}: keep one")
    return present[0][1]


def _check_int(field: str, value: Any, *, minimum: int, hint: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"config field {field} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"config field {field} must be >= {minimum}, got {value}" +
                         (f" ({hint})" if hint else ""))


def _check_float(field: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"config field {field} must be a finite number, got {value!r}")


def _check_layer_types(layer_types: tuple[str, ...], num_layers: int) -> None:
    if len(layer_types) != num_layers:
        raise ValueError(
            f"layer_types has {len(layer_types)} entries but num_hidden_layers is "
            f"{num_layers}: give one type per layer"
        )
    for i, kind in enumerate(layer_types):
        if kind not in (GLOBAL, SLIDING):
            raise ValueError(
                f"layer_types[{i}] is {kind!r}: use 'hybrid' (global) or 'hybrid_sliding'"
            )


def _check_mlp_layer_types(kinds: tuple[str, ...], num_layers: int) -> None:
    if len(kinds) != num_layers:
        raise ValueError(
            f"mlp_layer_types has {len(kinds)} entries but num_hidden_layers is "
            f"{num_layers}: give one MLP type per layer"
        )
    for i, kind in enumerate(kinds):
        if kind not in (DENSE, SPARSE):
            raise ValueError(
                f"mlp_layer_types[{i}] is {kind!r}: use 'dense' or 'sparse' (MoE)"
            )


def _check_moe(n_routed: int, top_k: int, n_shared: int) -> None:
    if n_routed < 1:
        raise ValueError(
            "mlp_layer_types has MoE ('sparse') layers but n_routed_experts is 0: give the "
            "expert count, or mark those layers 'dense'"
        )
    if not 1 <= top_k <= n_routed:
        raise ValueError(
            f"num_experts_per_tok {top_k} must be in [1, n_routed_experts={n_routed}]: "
            "a token cannot pick more experts than there are"
        )
    if n_shared < 1:
        raise ValueError(
            "n_shared_experts is 0, but Inkling's router scores its shared (sink) experts "
            "with the routed ones and needs at least one: set n_shared_experts >= 1"
        )


def _layer_types(cfg: Mapping[str, Any], num_layers: int, layout: Layout = _TRANSFORMERS) -> tuple[str, ...]:
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
            if layout == _RELEASE:
                raise ValueError(
                    "the release config gives neither local_layer_ids nor layer_types: add "
                    "local_layer_ids (vLLM reads its absence as all layers global, "
                    "transformers as every 6th layer global)"
                )
            return tuple(GLOBAL if (i + 1) % 6 == 0 else SLIDING for i in range(num_layers))
        return tuple(SLIDING if i in local else GLOBAL for i in range(num_layers))
    if isinstance(raw, (str, bytes)) or not isinstance(raw, (list, tuple)):
        raise TypeError(f"layer_types must be a list of strings, got {raw!r}")
    kinds = []
    for i, kind in enumerate(raw):
        if not isinstance(kind, str) or kind not in _LAYER_TYPE_ALIASES:
            raise ValueError(
                f"layer_types[{i}] is {kind!r}: use 'hybrid' (global) or 'hybrid_sliding'"
            )
        kinds.append(_LAYER_TYPE_ALIASES[kind])
    if local is not None:
        from_ids = [SLIDING if i in local else GLOBAL for i in range(len(kinds))]
        if from_ids != kinds:
            raise ValueError("layer_types and local_layer_ids disagree: keep one of them")
    return tuple(kinds)


def _mlp_layer_types(cfg: Mapping[str, Any], num_layers: int) -> tuple[str, ...]:
    dense_idx = cfg.get("dense_mlp_idx")
    if dense_idx is not None:
        _check_int("dense_mlp_idx", dense_idx, minimum=0)
        if dense_idx > num_layers:
            raise ValueError(
                f"dense_mlp_idx {dense_idx} exceeds num_hidden_layers {num_layers}: it counts "
                "the leading dense layers"
            )
    from_idx = tuple(DENSE if i < (dense_idx or 0) else SPARSE for i in range(num_layers))
    raw = cfg.get("mlp_layer_types")
    if raw is None:
        return from_idx
    if isinstance(raw, (str, bytes)) or not isinstance(raw, (list, tuple)):
        raise TypeError(f"mlp_layer_types must be a list of strings, got {raw!r}")
    kinds = tuple(raw)
    _check_mlp_layer_types(kinds, num_layers)
    if dense_idx is not None and kinds != from_idx:
        raise ValueError("mlp_layer_types and dense_mlp_idx disagree: keep one of them")
    return kinds


def _kernel_size(src: _Resolved) -> int:
    value = _pick(src.text, "conv_kernel_size", src.layout)
    _check_int("conv_kernel_size", value, minimum=1)
    return int(value)


def _dims_values(src: _Resolved) -> dict[str, Any]:
    """The :class:`InklingDims` fields of a resolved config (shared by both readers)."""
    values = {field: _pick(src.text, field, src.layout) for field in _DEFAULTS}
    values["conv_kernel_size"] = _kernel_size(src)
    num_layers = values["num_hidden_layers"]
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise ValueError(f"num_hidden_layers must be a positive int, got {num_layers!r}")
    values["layer_types"] = _layer_types(src.text, num_layers, src.layout)
    return values


def _vocab(cfg: Mapping[str, Any]) -> tuple[int, int]:
    """(rows, logit columns kept). vLLM's config object keeps the row count in
    ``padded_vocab_size`` and rewrites ``vocab_size`` (and ``unpadded_vocab_size``) to
    the kept size; transformers and the release config.json hold the rows in
    ``vocab_size`` and the kept size in ``unpadded_vocab_size``."""
    padded = cfg.get("padded_vocab_size")
    unpadded = cfg.get("unpadded_vocab_size")
    vocab = cfg.get("vocab_size")
    if padded is not None:
        if unpadded is not None and vocab is not None and unpadded != vocab:
            raise ValueError(
                f"config gives padded_vocab_size={padded!r} with vocab_size={vocab!r} and "
                f"unpadded_vocab_size={unpadded!r}: with padded_vocab_size, vocab_size is the "
                "unpadded size, so they must agree"
            )
        rows, kept = padded, (unpadded if unpadded is not None else vocab)
        if kept is None:
            kept = rows
    else:
        rows = vocab if vocab is not None else _SPEC_DEFAULTS["vocab_size"]
        kept = unpadded if unpadded is not None else rows
    _check_int("vocab_size" if padded is None else "padded_vocab_size", rows, minimum=1)
    _check_int("unpadded_vocab_size", kept, minimum=1)
    return int(rows), int(kept)


def _mlp_widths(src: _Resolved, moe: bool) -> tuple[int, int]:
    """(dense MLP width, expert width) in transformers' meaning."""
    cfg = src.text
    inter = cfg.get("intermediate_size")
    dense = cfg.get("dense_intermediate_size")
    expert = cfg.get("moe_intermediate_size")
    if dense is not None:
        # release convention (transformers applies it too): intermediate_size = experts
        if inter is None:
            raise ValueError(
                "config gives dense_intermediate_size without intermediate_size (the expert "
                "width in that convention): add intermediate_size"
            )
        if expert is not None and expert != inter:
            raise ValueError(
                f"config gives dense_intermediate_size={dense!r}, intermediate_size={inter!r} "
                f"and moe_intermediate_size={expert!r}: with dense_intermediate_size, "
                "intermediate_size is the expert width, so drop moe_intermediate_size"
            )
        return dense, inter
    if src.layout == _RELEASE and expert is None and moe:
        raise ValueError(
            "the release config gives intermediate_size but neither dense_intermediate_size "
            "nor moe_intermediate_size: add dense_intermediate_size (vLLM reads "
            "intermediate_size as the expert width, transformers as the dense width)"
        )
    dense = _pick(cfg, "intermediate_size", src.layout)
    if expert is None:
        expert = dense if src.layout == _RELEASE else _SPEC_DEFAULTS["moe_intermediate_size"]
    return dense, expert


def _num_mtp_layers(src: _Resolved) -> int:
    present = _present(src.text, "num_mtp_layers")
    mtp = src.outer.get("mtp_config")
    if isinstance(mtp, Mapping) and mtp.get("num_nextn_predict_layers") is not None:
        present.append(("mtp_config.num_nextn_predict_layers", mtp["num_nextn_predict_layers"]))
    if not present:
        return 0
    if len({repr(v) for _, v in present}) > 1:
        shown = ", ".join(f"{n}={v!r}" for n, v in present)
        raise ValueError(f"config gives conflicting values {shown}: keep one")
    _check_int(present[0][0], present[0][1], minimum=0)
    return int(present[0][1])


def _check_switches(cfg: Mapping[str, Any], switches: Mapping[str, Any]) -> None:
    for field, wanted in switches.items():
        if field in cfg and cfg[field] != wanted:
            raise ValueError(
                f"{field} is {cfg[field]!r}, but transformers' Inkling (the reference this "
                f"model is served against) implements only {field}={wanted!r}"
            )


def _spec(src: _Resolved) -> InklingTextSpec:
    cfg, layout = src.text, src.layout
    dims = _dims_values(src)
    num_layers = dims["num_hidden_layers"]
    mlp_types = _mlp_layer_types(cfg, num_layers)
    moe = SPARSE in mlp_types
    _check_switches(cfg, _FIXED_SWITCHES)
    if moe:
        _check_switches(cfg, _FIXED_MOE_SWITCHES)
    for v_field, field in (("v_head_dim", "head_dim"), ("swa_v_head_dim", "swa_head_dim")):
        if cfg.get(v_field) is not None and cfg[v_field] != dims[field]:
            raise ValueError(
                f"{v_field} {cfg[v_field]!r} differs from {field} {dims[field]!r}: "
                f"transformers' Inkling uses {field} for the values too"
            )
    rows, kept = _vocab(cfg)
    dense_width, expert_width = _mlp_widths(src, moe)
    values: dict[str, Any] = {}
    for field in ("d_rel", "rel_extent", "log_scaling_n_floor", "log_scaling_alpha",
                  "rms_norm_eps", "hidden_act"):
        values[field] = _pick(cfg, field)
    if layout == _RELEASE and "logits_mup_width_multiplier" in cfg and (
        cfg["logits_mup_width_multiplier"] is None
    ):
        values["logits_mup_width_multiplier"] = 1.0  # release/vLLM: null means no division
    else:
        values["logits_mup_width_multiplier"] = _pick(cfg, "logits_mup_width_multiplier", layout)
    moe_layout = layout if moe else _TRANSFORMERS  # counts only matter with MoE layers
    for field in ("n_routed_experts", "num_experts_per_tok", "n_shared_experts", "route_scale"):
        values[field] = _pick(cfg, field, moe_layout)
    for field in ("log_scaling_alpha", "route_scale", "rms_norm_eps", "logits_mup_width_multiplier"):
        _check_float(field, values[field])
        values[field] = float(values[field])
    tie = cfg.get("tie_word_embeddings")
    return InklingTextSpec(
        vocab_size=rows,
        unpadded_vocab_size=kept,
        mlp_layer_types=mlp_types,
        intermediate_size=dense_width,
        moe_intermediate_size=expert_width,
        num_mtp_layers=_num_mtp_layers(src),
        tie_word_embeddings=bool(tie) if tie is not None else False,
        layout=layout,
        **dims,
        **values,
        name=src.name,
    )


# --- public readers -------------------------------------------------------------------


def load_config(source: ConfigSource) -> InklingDims:
    """Normalize a config into :class:`InklingDims`.

    Args:
        source: an :class:`InklingDims` or :class:`InklingTextSpec`; a dict
            (transformers or release field names, optionally nested under
            ``"text_config"``); a preset name from :data:`PRESETS`; a path to a
            ``config.json`` (or a folder holding one); or a config object.

    Raises:
        ValueError: unknown preset, model_type or missing file, unreadable JSON, or
            invalid fields.
    """
    if isinstance(source, InklingDims):
        return source
    if isinstance(source, InklingTextSpec):
        return source.dims
    src = _resolve(source)
    return InklingDims(**_dims_values(src), name=src.name)


def text_spec(source: object) -> InklingTextSpec:
    """Normalize any Inkling config into an :class:`InklingTextSpec` (transformers'
    meaning of every field).

    Args:
        source: an :class:`InklingTextSpec`; a transformers ``InklingTextConfig`` /
            ``InklingConfig`` or a vLLM ``InklingModelConfig`` / ``InklingMMConfig``
            (read by attribute); a dict, a ``config.json`` path or a folder holding one,
            in the transformers (``inkling_text``, or ``inkling_mm_model`` around one) or
            the release (``inkling_mm_model`` with a release ``text_config``,
            ``inkling_model``) form; or a preset name.

    Raises:
        ValueError: naming the field and what to change, for an unknown model_type,
            inconsistent layer lists, head counts that do not divide, sizes below 1,
            an impossible MoE setup, an unpadded vocabulary larger than the rows, an
            activation other than silu, a release config missing a field whose default
            differs between transformers and vLLM, and the like.
        TypeError: a field of the wrong type, or a source of an unsupported kind.
    """
    if isinstance(source, InklingTextSpec):
        return source
    if isinstance(source, InklingDims):
        raise TypeError("an InklingDims lacks the text model's fields: pass its config instead")
    return _spec(_resolve(source))


def conv_kernel_size(source: object) -> int:
    """The short-convolution kernel size ``W`` of a config (``conv_kernel_size`` or the
    release ``sconv_kernel_size``; default 4). Every reader in this package takes it
    from here. Accepts whatever :func:`text_spec` does, and an :class:`InklingDims`."""
    if isinstance(source, (InklingDims, InklingTextSpec)):
        return source.conv_kernel_size
    return _kernel_size(_resolve(source))


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

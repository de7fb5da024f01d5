"""Tensor names of Inkling checkpoints: the release layout and transformers' layout.

The released checkpoints (``config.json`` ``model_type: inkling_mm_model`` or the
text-only ``inkling_model``) store the text model under ``model.llm.*``, with fused,
row-interleaved gate/up projections; the vision tower under ``model.visual.*``, the
audio tower under ``model.audio.*`` and the multi-token-prediction head under
``model.mtp.*``. transformers' ``InklingForCausalLM`` names the text model
``model.*`` / ``lm_head.weight`` and keeps gate and up apart. This module is the one
map between the two (it agrees with transformers' own conversion rules for
``inkling_mm_model``; the test suite loads a release-layout folder with transformers
to prove it).

Release name (``model.llm.`` + ...) -> transformers name (``InklingForCausalLM``):

* ``embed.weight`` -> ``model.embed_tokens.weight``;
  ``embed_norm.weight`` -> ``model.embed_tokens.embed_norm.weight``;
  ``norm.weight`` -> ``model.norm.weight``; ``unembed.weight`` -> ``lm_head.weight``.
* In ``layers.{i}.`` -> ``model.layers.{i}.``: ``attn_norm`` -> ``input_layernorm``,
  ``mlp_norm`` -> ``post_attention_layernorm``; ``attn.wq_du`` / ``wk_dv`` / ``wv_dv`` /
  ``wr_du`` / ``wo_ud`` -> ``self_attn.q_proj`` / ``k_proj`` / ``v_proj`` / ``r_proj`` /
  ``o_proj``; ``attn.q_norm`` / ``k_norm`` -> ``self_attn.q_norm`` / ``k_norm``;
  ``attn.k_sconv`` / ``v_sconv`` -> ``self_attn.k_sconv.conv1d`` / ``v_sconv.conv1d``;
  ``attn.rel_logits_proj.proj`` -> ``self_attn.rel_logits_proj.proj``;
  ``attn_sconv`` / ``mlp_sconv`` -> ``attn_sconv.conv1d`` / ``mlp_sconv.conv1d``.
* Dense MLP: ``mlp.w13_dn.weight`` [2I, H] -> ``mlp.gate_proj.weight`` +
  ``mlp.up_proj.weight`` [I, H]; ``mlp.w2_md.weight`` -> ``mlp.down_proj.weight``;
  ``mlp.global_scale`` unchanged.
* MoE: ``mlp.gate.weight`` / ``mlp.gate.global_scale`` unchanged; ``mlp.gate.bias`` ->
  ``mlp.gate.e_score_correction_bias``; ``mlp.experts.w13_weight`` [E, 2I, H] ->
  ``mlp.experts.gate_up_proj`` [E, 2I, H]; ``mlp.experts.w2_weight`` ->
  ``mlp.experts.down_proj``; ``mlp.shared_experts.shared_w13_weight`` [S, 2I, H] ->
  ``mlp.shared_experts.gate_proj`` + ``up_proj`` [S, I, H];
  ``mlp.shared_experts.shared_w2_weight`` -> ``mlp.shared_experts.down_proj``.

The multi-token-prediction head (``model.mtp.*``, the same prefix in both layouts):
per depth ``j``, ``model.mtp.layers.{j}.`` + ``hidden_norm.weight``,
``embed_norm.weight``, ``input_proj.weight`` and ``transformer_block.`` + one dense
decoder layer, its tensors in release names (``attn.wq_du.weight``, ...) or in
transformers' (``self_attn.q_proj.weight``, ...); optionally one shared
``model.mtp.chain_norm.weight``. :func:`iter_mtp_weights` maps them to transformers'
names.

A fused release ``w13`` holds gate and up rows alternately (gate row ``j`` at
``2j``, up row ``j`` at ``2j + 1``) along its ``2I`` axis; transformers' experts
``gate_up_proj`` holds all gate rows first, then all up rows.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import torch

if TYPE_CHECKING:
    from inkling_cache import InklingTextSpec

__all__ = [
    "MTP_HEAD_PARTS",
    "TextShapeCheck",
    "TextWeights",
    "WeightKind",
    "check_text_shapes",
    "expected_text_shapes",
    "iter_mtp_weights",
    "iter_text_weights",
    "missing_mtp_tensors",
    "mtp_depths_stored",
    "release_to_transformers",
    "transformers_to_release",
    "weight_kind",
]

#: What a checkpoint tensor belongs to.
WeightKind = Literal["text", "mtp", "vision", "audio", "unknown"]

_RELEASE_TEXT = "model.llm."

# release name inside a decoder layer -> transformers name (plain renames)
_LAYER_RENAMES: dict[str, str] = {
    "attn_norm.weight": "input_layernorm.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    "attn.wq_du.weight": "self_attn.q_proj.weight",
    "attn.wk_dv.weight": "self_attn.k_proj.weight",
    "attn.wv_dv.weight": "self_attn.v_proj.weight",
    "attn.wr_du.weight": "self_attn.r_proj.weight",
    "attn.wo_ud.weight": "self_attn.o_proj.weight",
    "attn.q_norm.weight": "self_attn.q_norm.weight",
    "attn.k_norm.weight": "self_attn.k_norm.weight",
    "attn.k_sconv.weight": "self_attn.k_sconv.conv1d.weight",
    "attn.v_sconv.weight": "self_attn.v_sconv.conv1d.weight",
    "attn.rel_logits_proj.proj": "self_attn.rel_logits_proj.proj",
    "attn_sconv.weight": "attn_sconv.conv1d.weight",
    "mlp_sconv.weight": "mlp_sconv.conv1d.weight",
    "mlp.w2_md.weight": "mlp.down_proj.weight",
    "mlp.global_scale": "mlp.global_scale",
    "mlp.gate.weight": "mlp.gate.weight",
    "mlp.gate.bias": "mlp.gate.e_score_correction_bias",
    "mlp.gate.global_scale": "mlp.gate.global_scale",
    "mlp.experts.w2_weight": "mlp.experts.down_proj",
    "mlp.shared_experts.shared_w2_weight": "mlp.shared_experts.down_proj",
}
# fused release tensors: release name -> (interleaved axis, transformers gate name, up name);
# an up name of None means transformers keeps the pair fused, gate rows first
_LAYER_FUSED: dict[str, tuple[int, str, str | None]] = {
    "mlp.w13_dn.weight": (0, "mlp.gate_proj.weight", "mlp.up_proj.weight"),
    "mlp.experts.w13_weight": (1, "mlp.experts.gate_up_proj", None),
    "mlp.shared_experts.shared_w13_weight": (
        1, "mlp.shared_experts.gate_proj", "mlp.shared_experts.up_proj"),
}
_TOP_RENAMES: dict[str, str] = {
    "embed.weight": "model.embed_tokens.weight",
    "embed_norm.weight": "model.embed_tokens.embed_norm.weight",
    "norm.weight": "model.norm.weight",
    "unembed.weight": "lm_head.weight",
}

_LAYER_RE = re.compile(r"^layers\.(\d+)\.(.+)$")
_TF_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")

# transformers names of the layer tensors, and of the top-level ones
_TF_LAYER_NAMES = frozenset(
    [*_LAYER_RENAMES.values()]
    + [n for _, gate, up in _LAYER_FUSED.values() for n in (gate, up) if n is not None]
)
_TF_TOP_NAMES = frozenset(_TOP_RENAMES.values())

# transformers InklingForConditionalGeneration tower names -> release names (towers are
# never loaded into the text model; the inverse map writes them for test checkpoints)
_TOWER_INVERSE: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^model\.vision_tower\.encoder_layers\.(\d+)\.projection\."),
     r"model.visual.layers.linear_\1."),
    (re.compile(r"^model\.vision_tower\.encoder_layers\.(\d+)\.layer_norm\."),
     r"model.visual.layers.norm_\1."),
    (re.compile(r"^model\.vision_tower\."), "model.visual."),
    (re.compile(r"^model\.audio_tower\.embed_audio_tokens\.embed_audio_tokens\.weight$"),
     "model.audio.encoder.weight"),
    (re.compile(r"^model\.audio_tower\.norm\.weight$"), "model.audio.final_norm.weight"),
    (re.compile(r"^model\.audio_tower\."), "model.audio."),
)


def weight_kind(name: str) -> WeightKind:
    """What the tensor ``name`` (release or transformers layout) belongs to: the text
    model, the multi-token-prediction head (``model.mtp.*``), the vision tower
    (``model.visual.*`` / ``model.vision_tower.*``), the audio tower
    (``model.audio.*`` / ``model.audio_tower.*``), or nothing known."""
    if not isinstance(name, str):
        raise TypeError(f"a tensor name must be a str, got {type(name).__name__} {name!r}")
    if name.startswith("model.mtp."):
        return "mtp"
    if name.startswith(("model.visual.", "model.vision_tower.")):
        return "vision"
    if name.startswith(("model.audio.", "model.audio_tower.")):
        return "audio"
    if name.startswith((_RELEASE_TEXT, "model.language_model.", "model.layers.",
                        "model.embed_tokens.", "lm_head.")) or name == "model.norm.weight":
        return "text"
    return "unknown"


def _deinterleave(tensor: torch.Tensor, axis: int, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    if tensor.dim() <= axis or tensor.shape[axis] % 2:
        raise ValueError(
            f"{name} has shape {tuple(tensor.shape)}: its axis {axis} must hold gate and up "
            "rows alternately (an even count)"
        )
    index = [slice(None)] * tensor.dim()
    index[axis] = slice(0, None, 2)
    gate = tensor[tuple(index)].contiguous()
    index[axis] = slice(1, None, 2)
    up = tensor[tuple(index)].contiguous()
    return gate, up


def _interleave(gate: torch.Tensor, up: torch.Tensor, axis: int) -> torch.Tensor:
    if gate.shape != up.shape:
        raise ValueError(f"gate {tuple(gate.shape)} and up {tuple(up.shape)} shapes differ")
    pair = torch.stack([gate, up], dim=axis + 1)
    shape = list(gate.shape)
    shape[axis] *= 2
    return pair.reshape(shape).contiguous()


def release_to_transformers(name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """Map one release-layout tensor to transformers ``InklingForCausalLM`` tensors.

    A fused ``w13`` comes back split (dense MLP, shared experts: ``gate_proj`` and
    ``up_proj``) or reordered gate-rows-first (routed experts: ``gate_up_proj``);
    every other text tensor is renamed and returned as is. Tensors the text model
    does not use (``model.mtp.*``, ``model.visual.*``, ``model.audio.*``) give ``[]``.

    Raises:
        ValueError: a ``model.llm.*`` or other name this map does not know (quantized
            checkpoints' scale tensors, say), or a fused tensor of odd width.
    """
    kind = weight_kind(name)
    if kind in ("mtp", "vision", "audio"):
        return []
    if not name.startswith(_RELEASE_TEXT):
        raise ValueError(
            f"{name!r} is not a release-layout text tensor (model.llm.*, model.mtp.*, "
            "model.visual.*, model.audio.*): is the checkpoint in transformers' layout?"
        )
    rest = name[len(_RELEASE_TEXT):]
    if rest in _TOP_RENAMES:
        return [(_TOP_RENAMES[rest], tensor)]
    match = _LAYER_RE.match(rest)
    if match is not None:
        prefix, inner = f"model.layers.{match.group(1)}.", match.group(2)
        if inner in _LAYER_RENAMES:
            return [(prefix + _LAYER_RENAMES[inner], tensor)]
        if inner in _LAYER_FUSED:
            axis, gate_name, up_name = _LAYER_FUSED[inner]
            gate, up = _deinterleave(tensor, axis, name)
            if up_name is None:
                return [(prefix + gate_name, torch.cat([gate, up], dim=axis))]
            return [(prefix + gate_name, gate), (prefix + up_name, up)]
    raise ValueError(f"unknown release tensor {name!r}: the Inkling name map has no rule for it")


def _transformers_text_name(name: str) -> str | None:
    """``name`` as an ``InklingForCausalLM`` name (``model.language_model.*`` of
    ``InklingForConditionalGeneration`` folded in), or None when it is not one."""
    if name.startswith("model.language_model."):
        name = "model." + name[len("model.language_model."):]
    if name in _TF_TOP_NAMES:
        return name
    match = _TF_LAYER_RE.match(name)
    if match is not None and match.group(2) in _TF_LAYER_NAMES:
        return name
    return None


def transformers_to_release(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse map: a transformers ``InklingForCausalLM`` (or
    ``InklingForConditionalGeneration``) state dict in the release layout.

    Gate/up pairs are fused row-interleaved; ``model.mtp.*`` passes through; the towers
    of ``InklingForConditionalGeneration`` get their release names (``model.visual.*``,
    ``model.audio.*``). Used to write release-layout test checkpoints.

    Raises:
        TypeError: ``state_dict`` is not a mapping (``name -> tensor``).
        ValueError: a name outside the map, a gate without its up (or the reverse), or a
            fused experts tensor whose gate/up axis is odd.
    """
    if not isinstance(state_dict, Mapping):
        raise TypeError(
            f"state_dict must be a mapping of name -> tensor (e.g. model.state_dict() or dict(pairs)), "
            f"got {type(state_dict).__name__}"
        )
    inverse_top = {v: k for k, v in _TOP_RENAMES.items()}
    inverse_layer = {v: k for k, v in _LAYER_RENAMES.items()}
    pairs: dict[str, tuple[int, str, str]] = {}  # transformers gate name -> fused info
    for release, (axis, gate, up) in _LAYER_FUSED.items():
        if up is not None:
            pairs[gate] = (axis, up, release)
    ups = {up: gate for gate, (_, up, _) in pairs.items()}
    experts = {gate: (axis, release) for release, (axis, gate, up) in _LAYER_FUSED.items()
               if up is None}

    out: dict[str, torch.Tensor] = {}
    for name, tensor in state_dict.items():
        kind = weight_kind(name)
        if kind == "mtp":
            out[name] = tensor
            continue
        if kind in ("vision", "audio"):
            for pattern, replacement in _TOWER_INVERSE:
                if pattern.match(name):
                    out[pattern.sub(replacement, name)] = tensor
                    break
            else:  # (a release name such as model.visual.*: dropping it would lose the tensor)
                raise ValueError(f"{name!r} is not an Inkling transformers tensor name (a {kind} tower "
                                 f"tensor in the release layout?)")
            continue
        text = _transformers_text_name(name)
        if text is None:
            raise ValueError(f"{name!r} is not an Inkling transformers tensor name")
        if text in inverse_top:
            out[_RELEASE_TEXT + inverse_top[text]] = tensor
            continue
        match = _TF_LAYER_RE.match(text)
        assert match is not None
        prefix, inner = f"{_RELEASE_TEXT}layers.{match.group(1)}.", match.group(2)
        if inner in inverse_layer:
            out[prefix + inverse_layer[inner]] = tensor
        elif inner in experts:
            axis, release = experts[inner]
            if tensor.dim() <= axis or tensor.shape[axis] % 2:
                raise ValueError(
                    f"{name} has shape {tuple(tensor.shape)}: its axis {axis} must hold all gate rows, then "
                    "all up rows (an even count)"
                )
            half = tensor.shape[axis] // 2
            gate, up = tensor.split(half, dim=axis)
            out[prefix + release] = _interleave(gate, up, axis)
        elif inner in pairs:
            axis, up_inner, release = pairs[inner]
            up_name = name[: len(name) - len(inner)] + up_inner
            if up_name not in state_dict:
                raise ValueError(f"{name!r} has no matching {up_name!r}")
            out[prefix + release] = _interleave(tensor, state_dict[up_name], axis)
        elif inner in ups:
            gate_name = name[: len(name) - len(inner)] + ups[inner]
            if gate_name not in state_dict:
                raise ValueError(f"{name!r} has no matching {gate_name!r}")
        else:  # pragma: no cover - _transformers_text_name admits only mapped names
            raise ValueError(f"{name!r} is not an Inkling transformers tensor name")
    return out


def _weight_pairs(
    weights: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor],
) -> Iterable[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` pairs as given, or a mapping's (a state dict's) items."""
    if isinstance(weights, Mapping):
        return weights.items()
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Iterable):
        raise TypeError(
            f"weights must be (name, tensor) pairs or a mapping name -> tensor, got {type(weights).__name__}"
        )
    return weights


class TextWeights:
    """Iterates a checkpoint's text-model tensors under transformers' names (see
    :func:`iter_text_weights`); after the iteration :attr:`skipped` counts what was left
    out, by kind (``"mtp"``, ``"vision"``, ``"audio"``), and :meth:`summary` gives one
    log line per kind."""

    def __init__(
        self, weights: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor], layout: str
    ) -> None:
        weights = _weight_pairs(weights)
        if layout not in ("release", "transformers", "auto"):
            raise ValueError(f"layout must be 'release', 'transformers' or 'auto', got {layout!r}")
        self._weights = weights
        self.layout = layout
        self.skipped: Counter[str] = Counter()
        self.examples: dict[str, str] = {}
        self.yielded = 0

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for item in self._weights:
            if not (isinstance(item, (tuple, list)) and len(item) == 2):
                raise TypeError(
                    f"weights must yield (name, tensor) pairs, got {type(item).__name__} {item!r:.80}: "
                    "pass state_dict.items() or the state dict itself"
                )
            name, tensor = item
            kind = weight_kind(name)
            if kind in ("mtp", "vision", "audio"):
                self.skipped[kind] += 1
                self.examples.setdefault(kind, name)
                continue
            release = name.startswith(_RELEASE_TEXT)
            if self.layout == "transformers" and release:
                raise ValueError(
                    f"{name!r} is a release-layout name but the layout is 'transformers'"
                )
            if self.layout == "release" or release:
                mapped = release_to_transformers(name, tensor)
            else:
                text = _transformers_text_name(name)
                if text is None:
                    raise ValueError(f"unknown transformers tensor {name!r} for the Inkling text model")
                mapped = [(text, tensor)]
            self.yielded += len(mapped)
            yield from mapped

    def summary(self) -> list[str]:
        """One line per skipped kind, e.g. ``"skipped 12 mtp tensors (e.g.
        model.mtp.chain_norm.weight): not part of the text model"``."""
        return [
            f"skipped {count} {kind} tensors (e.g. {self.examples[kind]}): not part of the "
            "text model"
            for kind, count in sorted(self.skipped.items())
        ]


def iter_text_weights(
    weights: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor], layout: str = "auto"
) -> TextWeights:
    """The text model's tensors of a checkpoint, under transformers ``InklingForCausalLM``
    names, in checkpoint order (a fused release ``w13`` yields its parts together).

    Args:
        weights: ``(name, tensor)`` pairs as stored, or a mapping ``name -> tensor``
            (a state dict: its items are iterated).
        layout: ``"release"`` (``model.llm.*`` names), ``"transformers"``
            (``InklingForCausalLM`` / ``InklingForConditionalGeneration`` names) or
            ``"auto"`` (each name decides: ``model.llm.*`` is release); e.g.
            ``text_spec(folder).layout``.

    Returns:
        an iterable :class:`TextWeights`; its ``skipped`` counter tells how many MTP,
        vision and audio tensors it passed over.

    Raises:
        TypeError: ``weights`` is neither pairs nor a mapping.
        ValueError (while iterating): a name no rule maps.
    """
    return TextWeights(weights, layout)


def _check_spec(spec: object) -> None:
    from inkling_cache import InklingDims, InklingTextSpec

    if isinstance(spec, InklingTextSpec):
        return
    hint = " (load_config gives an InklingDims, which lacks the text model's fields)" if isinstance(
        spec, InklingDims) else ""
    raise TypeError(
        f"spec must be an InklingTextSpec{hint}: pass inkling_cache.text_spec(config), "
        f"got {type(spec).__name__}"
    )


def expected_text_shapes(spec: InklingTextSpec, layout: str | None = None) -> dict[str, tuple[int, ...]]:
    """Every text-model tensor a checkpoint of ``spec`` holds, with the shape its
    config implies, under the names of ``layout`` (``"transformers"``:
    ``InklingForCausalLM`` names; ``"release"``: ``model.llm.*`` names, fused
    ``w13`` tensors; default ``spec.layout``). MTP and tower tensors are not listed.

    Per decoder layer ``i`` (``heads``, ``kv``, ``hd`` of its attention kind, ``H``
    hidden, ``W`` conv kernel): q/o projections ``[heads*hd, H]`` / ``[H, heads*hd]``,
    k/v projections and k/v short convs ``[kv*hd, H]`` / ``[kv*hd, 1, W]``, ``r_proj``
    ``[heads*d_rel, H]``, ``rel_logits_proj.proj`` ``[d_rel, rel_extent_of(i)]``, the
    sublayer convs ``[H, 1, W]``; a dense MLP ``[I, H]`` gate/up, ``[H, I]`` down and a
    ``[1]`` global scale; an MoE MLP a router ``[E + S, H]`` (the shared sink experts
    have router columns), selection bias ``[E]``, experts ``gate_up_proj``
    ``[E, 2*Ie, H]`` / ``down_proj`` ``[E, H, Ie]``, shared experts ``[S, Ie, H]`` /
    ``[S, H, Ie]``. Embedding and unembedding are ``[vocab_size, H]`` (the padded rows).
    """
    _check_spec(spec)
    layout = spec.layout if layout is None else layout
    if layout not in ("release", "transformers"):
        raise ValueError(f"layout must be 'release' or 'transformers', got {layout!r}")
    hidden, width = spec.hidden_size, spec.conv_kernel_size
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (spec.vocab_size, hidden),
        "model.embed_tokens.embed_norm.weight": (hidden,),
        "model.norm.weight": (hidden,),
        "lm_head.weight": (spec.vocab_size, hidden),
    }
    for i in range(spec.num_hidden_layers):
        heads, kv, hd = spec.heads_of(i), spec.kv_heads_of(i), spec.head_dim_of(i)
        layer = {
            "input_layernorm.weight": (hidden,),
            "post_attention_layernorm.weight": (hidden,),
            "attn_sconv.conv1d.weight": (hidden, 1, width),
            "mlp_sconv.conv1d.weight": (hidden, 1, width),
            "self_attn.q_proj.weight": (heads * hd, hidden),
            "self_attn.k_proj.weight": (kv * hd, hidden),
            "self_attn.v_proj.weight": (kv * hd, hidden),
            "self_attn.o_proj.weight": (hidden, heads * hd),
            "self_attn.r_proj.weight": (heads * spec.d_rel, hidden),
            "self_attn.q_norm.weight": (hd,),
            "self_attn.k_norm.weight": (hd,),
            "self_attn.k_sconv.conv1d.weight": (kv * hd, 1, width),
            "self_attn.v_sconv.conv1d.weight": (kv * hd, 1, width),
            "self_attn.rel_logits_proj.proj": (spec.d_rel, spec.rel_extent_of(i)),
        }
        if spec.is_moe(i):
            experts, shared, inner = spec.n_routed_experts, spec.n_shared_experts, spec.moe_intermediate_size
            layer.update({
                "mlp.gate.weight": (experts + shared, hidden),
                "mlp.gate.e_score_correction_bias": (experts,),
                "mlp.gate.global_scale": (1,),
                "mlp.experts.gate_up_proj": (experts, 2 * inner, hidden),
                "mlp.experts.down_proj": (experts, hidden, inner),
            })
            if shared:
                layer.update({
                    "mlp.shared_experts.gate_proj": (shared, inner, hidden),
                    "mlp.shared_experts.up_proj": (shared, inner, hidden),
                    "mlp.shared_experts.down_proj": (shared, hidden, inner),
                })
        else:
            inner = spec.intermediate_size
            layer.update({
                "mlp.gate_proj.weight": (inner, hidden),
                "mlp.up_proj.weight": (inner, hidden),
                "mlp.down_proj.weight": (hidden, inner),
                "mlp.global_scale": (1,),
            })
        shapes.update({f"model.layers.{i}.{name}": shape for name, shape in layer.items()})
    if layout == "transformers":
        return shapes
    return _release_shapes(shapes)


def _release_shapes(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """``expected_text_shapes`` under release names: the inverse of the name map, a
    gate/up pair fused along its interleaved axis."""
    inverse_top = {v: k for k, v in _TOP_RENAMES.items()}
    inverse_layer = {v: k for k, v in _LAYER_RENAMES.items()}
    fused = {gate: (axis, release, up is not None) for release, (axis, gate, up) in _LAYER_FUSED.items()}
    ups = {up for _, _, up in _LAYER_FUSED.values() if up is not None}
    out: dict[str, tuple[int, ...]] = {}
    for name, shape in shapes.items():
        if name in inverse_top:
            out[_RELEASE_TEXT + inverse_top[name]] = shape
            continue
        match = _TF_LAYER_RE.match(name)
        assert match is not None, name
        prefix, inner = f"{_RELEASE_TEXT}layers.{match.group(1)}.", match.group(2)
        if inner in inverse_layer:
            out[prefix + inverse_layer[inner]] = shape
        elif inner in fused:
            axis, release, pair = fused[inner]
            doubled = list(shape)
            if pair:  # gate and up apart in transformers: the fused tensor holds both
                doubled[axis] *= 2
            out[prefix + release] = tuple(doubled)
        elif inner not in ups:  # pragma: no cover - every expected name is mapped
            raise AssertionError(f"no release name for {name!r}")
    return out


@dataclass
class TextShapeCheck:
    """What :func:`check_text_shapes` found, in checkpoint names, sorted.

    ``missing``: ``(name, expected shape)`` of text tensors the checkpoint lacks;
    ``wrong``: ``(name, stored shape, expected shape)``; ``unknown``: stored names the
    text model has no place for (MTP and tower tensors are not counted)."""

    layout: str
    missing: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)
    wrong: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.wrong or self.unknown)


def check_text_shapes(stored: Mapping[str, Sequence[int] | torch.Tensor], spec: InklingTextSpec) -> TextShapeCheck:
    """Compare a checkpoint's tensor shapes (``name -> shape``, e.g. read from
    safetensors headers; no tensor data needed; a tensor value counts by its shape)
    with those ``spec`` implies, in the layout of ``spec`` (:func:`expected_text_shapes`).
    transformers-layout names of ``InklingForConditionalGeneration``
    (``model.language_model.*``) count as their ``InklingForCausalLM`` names."""
    expected = expected_text_shapes(spec)  # checks spec
    result = TextShapeCheck(layout=spec.layout)
    seen: set[str] = set()
    for name in sorted(stored):
        if weight_kind(name) in ("mtp", "vision", "audio"):
            continue
        key = name
        if spec.layout == "transformers":
            key = _transformers_text_name(name) or name
        if key not in expected:
            result.unknown.append(name)
            continue
        seen.add(key)
        value = stored[name]
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else tuple(int(n) for n in value)
        if shape != expected[key]:
            result.wrong.append((name, shape, expected[key]))
    result.missing = [(name, shape) for name, shape in sorted(expected.items()) if name not in seen]
    return result


# --- the multi-token-prediction head ------------------------------------------------
_MTP_LAYER_RE = re.compile(r"^model\.mtp\.layers\.(\d+)\.(.+)$")
_MTP_CHAIN_NORM = "model.mtp.chain_norm.weight"
_MTP_BLOCK = "transformer_block."
#: The per-depth tensors outside the decoder layer (same names in both layouts).
MTP_HEAD_PARTS = ("hidden_norm.weight", "embed_norm.weight", "input_proj.weight")
# a dense decoder layer's tensors (the MTP block's): release names and transformers' names
_DENSE_RELEASE = tuple(
    n for n in [*_LAYER_RENAMES, *_LAYER_FUSED]
    if not n.startswith(("mlp.gate.", "mlp.experts.", "mlp.shared_experts."))
)
_DENSE_TRANSFORMERS = tuple(sorted(
    {_LAYER_RENAMES[n] for n in _DENSE_RELEASE if n in _LAYER_RENAMES}
    | {x for n in _DENSE_RELEASE if n in _LAYER_FUSED for x in _LAYER_FUSED[n][1:] if x is not None}
))


def _mtp_block_tensors(name: str, inner: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """One MTP decoder-layer tensor (``inner``: its name inside ``transformer_block.``)
    under transformers' name(s)."""
    if inner in _DENSE_TRANSFORMERS:
        return [(inner, tensor)]
    if inner in _LAYER_RENAMES and inner in _DENSE_RELEASE:
        return [(_LAYER_RENAMES[inner], tensor)]
    if inner in _LAYER_FUSED and inner in _DENSE_RELEASE:
        axis, gate_name, up_name = _LAYER_FUSED[inner]
        gate, up = _deinterleave(tensor, axis, name)
        assert up_name is not None  # the dense MLP's pair is kept apart
        return [(gate_name, gate), (up_name, up)]
    raise ValueError(
        f"unknown MTP tensor {name!r}: an MTP block is a dense Inkling decoder layer "
        "(release or transformers names)"
    )


def iter_mtp_weights(
    weights: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor],
) -> Iterator[tuple[int | None, str, torch.Tensor]]:
    """The multi-token-prediction head's tensors of a checkpoint (either layout), as
    ``(depth, name, tensor)`` with ``name`` in transformers' terms: one of
    :data:`MTP_HEAD_PARTS`, or ``"transformer_block."`` + an ``InklingDecoderLayer``
    name (``self_attn.q_proj.weight``, ``mlp.gate_proj.weight``, ...; a release
    ``mlp.w13_dn.weight`` comes back as its gate and up halves). The shared
    ``model.mtp.chain_norm.weight`` comes as ``(None, "chain_norm.weight", t)``. Every
    other tensor (text model, towers) is passed over. ``weights``: ``(name, tensor)``
    pairs, or a mapping ``name -> tensor`` (its items are iterated).

    Raises:
        ValueError (while iterating): a ``model.mtp.*`` name no rule maps.
    """
    for name, tensor in _weight_pairs(weights):
        if weight_kind(name) != "mtp":
            continue
        if name == _MTP_CHAIN_NORM:
            yield None, "chain_norm.weight", tensor
            continue
        match = _MTP_LAYER_RE.match(name)
        if match is None:
            raise ValueError(f"unknown MTP tensor {name!r}: expected model.mtp.layers.{{j}}.* or {_MTP_CHAIN_NORM}")
        depth, rest = int(match.group(1)), match.group(2)
        if rest in MTP_HEAD_PARTS:
            yield depth, rest, tensor
        elif rest.startswith(_MTP_BLOCK):
            for inner, part in _mtp_block_tensors(name, rest[len(_MTP_BLOCK):], tensor):
                yield depth, _MTP_BLOCK + inner, part
        else:
            raise ValueError(f"unknown MTP tensor {name!r}: no rule for {rest!r} in an MTP depth block")


def mtp_depths_stored(names: Iterable[str]) -> list[int]:
    """The MTP depths (``j`` of ``model.mtp.layers.{j}.*``) that ``names`` hold any
    tensor for, sorted."""
    depths = set()
    for name in names:
        match = _MTP_LAYER_RE.match(name)
        if match is not None:
            depths.add(int(match.group(1)))
    return sorted(depths)


def missing_mtp_tensors(names: Iterable[str], depths: int) -> list[str]:
    """The MTP tensors a checkpoint holding ``names`` lacks for ``depths`` depth
    blocks, in checkpoint names (each depth in the layout most of its stored block
    tensors use; release names when it stores none). Empty when the head is complete.
    Shapes are not checked (the loader does)."""
    stored = set(names)
    missing: list[str] = []
    for depth in range(depths):
        head = f"model.mtp.layers.{depth}."
        block = head + _MTP_BLOCK
        release = sum(block + n in stored for n in _DENSE_RELEASE)
        ours = sum(block + n in stored for n in _DENSE_TRANSFORMERS)
        inner = _DENSE_TRANSFORMERS if ours > release else _DENSE_RELEASE
        missing += [head + n for n in MTP_HEAD_PARTS if head + n not in stored]
        missing += [block + n for n in inner if block + n not in stored]
    return missing

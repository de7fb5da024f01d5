"""The Inkling text model (``InklingForCausalLM``) for vLLM.

Built from vLLM's parallel linear / norm / embedding layers and fused MoE, and this
project's lower packages: ``inkling_model.InklingShortConv`` (four short convs per
layer over one paged conv-state cache per layer, :mod:`inkling_vllm.conv_state`) and
``inkling_model.InklingRelAttention`` (relative-logit attention over a paged KV cache,
:mod:`inkling_vllm.attention`); a layer's K and V convs run in one launch
(``inkling_model.short_conv_kv``). It loads both checkpoint layouts: transformers' format
(``model_type: inkling_text``) and the original release layout (``inkling_mm_model``
with the text model under ``text_config`` and ``model.llm.*`` tensors; the vision and
audio towers and the multi-token-prediction heads are skipped with one log line each).
The hyperparameters come from one adapter, ``inkling_cache.text_spec``; the tensor
names from one map, ``inkling_model.checkpoint``.

What transformers computes and this model reproduces, per decoder layer::

    a = input_layernorm(h)
    k = k_sconv(k_proj(a)); v = v_sconv(v_proj(a)); q = q_proj(a); r = r_proj(a)
    q, k = q_norm(q), k_norm(k)               (per-head RMSNorm; no rotary embedding)
    o = o_proj(rel_attention(q, k, v, r))     (relative-logit bias, log scaling on global
                                               layers, window on sliding layers)
    h = h + attn_sconv(o)
    h = h + mlp_sconv(mlp(post_attention_layernorm(h)))   (dense MLP x global_scale, or
                                                          MoE with sink experts)

Each sublayer's tail (its conv, the residual add and the RMSNorm that reads the result:
``post_attention_layernorm`` after attention, the next layer's ``input_layernorm`` or
the final norm after the MLP) runs fused by default (config key ``inkling_fused_conv_norm``,
settable through ``hf_overrides``; ``false`` selects the plain sequence):

* tp 1: one launch, ``inkling_model.paged_short_conv_add_rmsnorm`` (conv + add + norm);
* tp > 1: the residual stream stays sharded by hidden columns between sublayers. The
  row-parallel output is reduce-scattered, one launch convolves the shard and adds it
  to the residual shard (``inkling_model.paged_short_conv_add``), and the all-gather
  that follows feeds the RMSNorm of the full row. That is the plain sequence's
  collectives (reduce-scatter + all-gather) with the add moved into the conv launch, so
  the norm reads one tensor instead of two; fusing the norm itself on the shard would
  need one more collective per sublayer (an all-reduce of each token's sum of squares)
  and an all-gather of twice the bytes (residual and normed rows).

with the embedding RMS-normalised, the logits divided by ``logits_mup_width_multiplier``
and the padded unembedding columns (``unpadded_vocab_size < vocab_size``) masked to
``-inf`` so they are never sampled and carry no probability.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig
from vllm.distributed import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_gather,
    tensor_model_parallel_reduce_scatter,
)
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.sequence import IntermediateTensors

from inkling_cache import InklingTextSpec, Stream, text_spec
from inkling_kernels import gathered_rms_norm
from inkling_model import (
    InklingRelAttention,
    InklingShortConv,
    paged_short_conv_add,
    paged_short_conv_add_rmsnorm,
    short_conv_kv,
)
from inkling_model.checkpoint import iter_text_weights

from .attention import InklingAttentionLayer
from .compat import check_vllm_version
from .conv_state import InklingConvStateLayer, share_pages_without_padding
from .moe import InklingMoE
from .options import FUSED_KEY, PADDING_KEY, conv_padding, fused_tails

__all__ = [
    "InklingForCausalLM",
    "UnsupportedCheckpoint",
    "check_supported_config",
    "load_layer_tensor",
    "served_spec",
]

logger = logging.getLogger(__name__)

SLIDING = "hybrid_sliding"


class UnsupportedCheckpoint(ValueError):
    """The checkpoint uses a part of Inkling (or a format) this model does not implement."""


def _raw_config(model_config: Any) -> dict[str, Any] | None:
    """config.json of a local checkpoint folder, with the engine's dict
    ``hf_overrides`` on top; ``None`` when the model is not a local folder."""
    path = Path(str(getattr(model_config, "model", "") or ""))
    file = path / "config.json"
    if not file.is_file():
        return None
    data = json.loads(file.read_text(encoding="utf-8"))
    overrides = getattr(model_config, "hf_overrides", None)
    if isinstance(overrides, dict):
        data.update(overrides)
    return data if isinstance(data, dict) else None


def served_spec(vllm_config: VllmConfig, raw: dict[str, Any] | None = None) -> InklingTextSpec:
    """The text model's hyperparameters, through ``inkling_cache.text_spec``.

    Read from the checkpoint's own config.json when the model is a local folder
    (transformers < 5.20 and vLLM's own config classes rename or drop release-layout
    fields, such as the expert width), else from vLLM's parsed config object. ``raw``:
    that config.json when the caller has read it already."""
    model_config = vllm_config.model_config
    if raw is None:
        raw = _raw_config(model_config)
    try:
        return text_spec(raw if raw is not None else model_config.hf_config)
    except (ValueError, TypeError) as exc:
        raise UnsupportedCheckpoint(f"{getattr(model_config, 'model', '')}: {exc}") from None


def check_supported_config(spec: InklingTextSpec) -> None:
    """Refuse what the spec allows but this model does not implement."""
    if spec.hidden_act != "silu":
        raise UnsupportedCheckpoint(f"hidden_act {spec.hidden_act!r} is not supported (only 'silu')")
    if spec.tie_word_embeddings:
        raise UnsupportedCheckpoint("tie_word_embeddings is not supported: Inkling checkpoints keep separate tensors")


def _layer_dims(spec: InklingTextSpec, layer_idx: int) -> tuple[bool, int, int, int]:
    if spec.layer_types[layer_idx] == SLIDING:
        return True, spec.swa_num_attention_heads, spec.swa_num_key_value_heads, spec.swa_head_dim
    return False, spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim


def _reduce_scatter_columns(partial: torch.Tensor) -> torch.Tensor:
    """This rank's ``hidden / tp`` columns of a row-parallel output, summed over ranks:
    ``[T, hidden]`` -> ``[T, hidden / tp]``, contiguous.

    vLLM's reduce-scatter along the last dimension transposes the whole tensor
    element by element before the collective and again after it. Here the column
    blocks are laid out as row blocks instead (one copy of contiguous ``hidden / tp``
    runs), and the reduce-scatter along dim 0 returns the shard as it is; the
    collective moves the same bytes (inkling-kernels/benchmarks/RESULTS.md measures
    both)."""
    tp = get_tensor_model_parallel_world_size()
    t, hidden = partial.shape
    blocks = partial.reshape(t, tp, hidden // tp).transpose(0, 1).reshape(tp * t, hidden // tp)
    return tensor_model_parallel_reduce_scatter(blocks, dim=0)


def _sharded_conv(conv: InklingShortConv, partial: torch.Tensor) -> torch.Tensor:
    """Sum a row-parallel output over ranks, convolve this rank's hidden shard,
    and gather the full hidden vector (identity collectives at tp 1)."""
    if get_tensor_model_parallel_world_size() == 1:
        return conv(partial)
    return tensor_model_parallel_all_gather(conv(_reduce_scatter_columns(partial)), dim=-1)


class InklingAttention(nn.Module):
    def __init__(
        self,
        spec: InklingTextSpec,
        layer_idx: int,
        conv_state: InklingConvStateLayer,
        quant_config: Any,
        prefix: str,
    ) -> None:
        super().__init__()
        sliding, num_heads, num_kv_heads, head_dim = _layer_dims(spec, layer_idx)
        tp_size = get_tensor_model_parallel_world_size()
        if num_heads % tp_size:
            raise ValueError(f"{prefix}: tensor_parallel_size {tp_size} does not divide {num_heads} attention heads")
        self.head_dim = head_dim
        self.num_heads = num_heads // tp_size
        self.num_kv_heads = num_kv_heads // tp_size  # the conv layout already required whole heads
        self.q_size = self.num_heads * head_dim
        self.kv_size = self.num_kv_heads * head_dim
        kernel = spec.conv_kernel_size
        self.qkv_proj = QKVParallelLinear(
            hidden_size=spec.hidden_size,
            head_size=head_dim,
            total_num_heads=num_heads,
            total_num_kv_heads=num_kv_heads,
            bias=False,
            quant_config=quant_config,
            prefix=f"{prefix}.qkv_proj",
        )
        # relative states: d_rel per query head, split by heads like q
        self.r_proj = ColumnParallelLinear(
            input_size=spec.hidden_size,
            output_size=num_heads * spec.d_rel,
            bias=False,
            gather_output=False,
            quant_config=quant_config,
            prefix=f"{prefix}.r_proj",
        )
        self.o_proj = RowParallelLinear(
            input_size=num_heads * head_dim,
            output_size=spec.hidden_size,
            bias=False,
            reduce_results=False,  # summed by the conv's reduce-scatter
            quant_config=quant_config,
            prefix=f"{prefix}.o_proj",
        )
        owner = conv_state.owner
        self.k_sconv = InklingShortConv(self.kv_size, kernel, owner, Stream.K)
        self.v_sconv = InklingShortConv(self.kv_size, kernel, owner, Stream.V)
        self.q_norm = RMSNorm(head_dim, eps=spec.rms_norm_eps)
        self.k_norm = RMSNorm(head_dim, eps=spec.rms_norm_eps)
        log_scaling = None
        if not sliding and spec.log_scaling_n_floor is not None:
            log_scaling = (int(spec.log_scaling_n_floor), float(spec.log_scaling_alpha))
        self.kv_cache_layer = InklingAttentionLayer(
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=head_dim,
            window=spec.sliding_window if sliding else None,
            log_scaling=log_scaling,
            prefix=f"{prefix}.attn",
        )
        extent = spec.sliding_window if sliding else spec.rel_extent
        self.attn = InklingRelAttention(self.kv_cache_layer.owner, spec.d_rel, extent)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        r, _ = self.r_proj(hidden_states)
        # K and V straight from the projection output (column slices), both convs in
        # one launch (inkling_kernels.fused_sconv_kv); the weights stay on k_sconv/v_sconv.
        k, v = short_conv_kv(self.k_sconv, self.v_sconv, k, v)
        q = self.q_norm(q.reshape(-1, self.head_dim)).view(-1, self.q_size)
        k = self.k_norm(k.reshape(-1, self.head_dim)).view(-1, self.kv_size)
        out = self.attn(q, k, v, r, positions)
        partial, _ = self.o_proj(out)
        return partial


class InklingMLP(nn.Module):
    """Dense MLP: ``global_scale * down(silu(gate(x)) * up(x))`` (a partial sum per rank)."""

    def __init__(self, spec: InklingTextSpec, quant_config: Any, prefix: str) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            input_size=spec.hidden_size,
            output_sizes=[spec.intermediate_size] * 2,
            bias=False,
            quant_config=quant_config,
            prefix=f"{prefix}.gate_up_proj",
        )
        self.down_proj = RowParallelLinear(
            input_size=spec.intermediate_size,
            output_size=spec.hidden_size,
            bias=False,
            reduce_results=False,  # summed by the conv's reduce-scatter
            quant_config=quant_config,
            prefix=f"{prefix}.down_proj",
        )
        self.act_fn = SiluAndMul()
        self.global_scale = nn.Parameter(torch.ones(1), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up, _ = self.gate_up_proj(x)
        out, _ = self.down_proj(self.act_fn(gate_up))
        return out * self.global_scale.to(out.dtype)


class InklingDecoderLayer(nn.Module):
    def __init__(
        self, spec: InklingTextSpec, layer_idx: int, quant_config: Any, prefix: str, padding: str, fused: bool
    ) -> None:
        super().__init__()
        self.fused = fused
        self.tp_size = get_tensor_model_parallel_world_size()
        _, _, num_kv_heads, head_dim = _layer_dims(spec, layer_idx)
        kernel = spec.conv_kernel_size
        self.conv_state = InklingConvStateLayer(
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            hidden_size=spec.hidden_size,
            kernel_size=kernel,
            prefix=f"{prefix}.conv_state",
            padding=padding,
        )
        self.input_layernorm = RMSNorm(spec.hidden_size, eps=spec.rms_norm_eps)
        self.self_attn = InklingAttention(spec, layer_idx, self.conv_state, quant_config, f"{prefix}.self_attn")
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, eps=spec.rms_norm_eps)
        self.mlp: nn.Module
        if spec.mlp_layer_types[layer_idx] == "sparse":
            self.mlp = InklingMoE(
                hidden_size=spec.hidden_size,
                moe_intermediate_size=spec.moe_intermediate_size,
                n_routed_experts=spec.n_routed_experts,
                num_experts_per_tok=spec.num_experts_per_tok,
                n_shared_experts=spec.n_shared_experts,
                route_scale=spec.route_scale,
                quant_config=quant_config,
                prefix=f"{prefix}.mlp",
            )
        else:
            self.mlp = InklingMLP(spec, quant_config, f"{prefix}.mlp")
        shard = spec.hidden_size // self.tp_size
        owner = self.conv_state.owner
        self.attn_sconv = InklingShortConv(shard, kernel, owner, Stream.ATTN, tap_major=fused)
        self.mlp_sconv = InklingShortConv(shard, kernel, owner, Stream.MLP, tap_major=fused)

    def forward(
        self, positions: torch.Tensor, hidden_states: torch.Tensor, normed: torch.Tensor, next_norm: RMSNorm
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``hidden_states``: the residual stream (this rank's hidden shard on the fused
        path at tp > 1, else whole rows); ``normed``: ``input_layernorm`` of it, whole rows.
        Returns the new residual stream and ``next_norm`` of it (the next layer's
        ``input_layernorm``, or the model's final norm)."""
        attn = self.self_attn(positions, normed)
        hidden_states, normed = self._tail(self.attn_sconv, hidden_states, attn, self.post_attention_layernorm)
        mlp = self.mlp(normed)
        return self._tail(self.mlp_sconv, hidden_states, mlp, next_norm)

    def _tail(
        self, conv: InklingShortConv, hidden: torch.Tensor, partial: torch.Tensor, norm: RMSNorm
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A sublayer's conv + residual add + the norm that reads the sum; ``partial``:
        the sublayer's row-parallel output (this rank's partial sum)."""
        if not self.fused:
            hidden = hidden + _sharded_conv(conv, partial)
            return hidden, norm(hidden)
        owner, stream = conv.owner.name, int(conv.stream)
        if self.tp_size == 1:
            return paged_short_conv_add_rmsnorm(
                hidden, partial, conv.weight, norm.weight, owner, stream, norm.variance_epsilon
            )
        hidden = paged_short_conv_add(hidden, _reduce_scatter_columns(partial), conv.weight, owner, stream)
        # the ranks' new residual shards as the all-gather along dim 0 leaves them,
        # [tp, T, S]: the norm reads them there and writes whole rows (no layout copy)
        pieces = tensor_model_parallel_all_gather(hidden, dim=0).view(self.tp_size, *hidden.shape)
        return hidden, gathered_rms_norm(pieces, norm.weight, norm.variance_epsilon)


@support_torch_compile(
    dynamic_arg_dims={"input_ids": 0, "positions": 0, "inputs_embeds": 0, "intermediate_tensors": 0}
)
class InklingModel(nn.Module):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        raw = _raw_config(vllm_config.model_config)  # read once: spec and conv padding
        spec = served_spec(vllm_config, raw)
        check_supported_config(spec)
        quant_config = vllm_config.quant_config
        padding = _conv_padding(vllm_config, raw)
        self.fused = _fused_tails(vllm_config, raw)
        self.spec = spec
        self.embed_tokens = VocabParallelEmbedding(
            spec.vocab_size, spec.hidden_size, quant_config=quant_config, prefix=f"{prefix}.embed_tokens"
        )
        self.embed_norm = RMSNorm(spec.hidden_size, eps=spec.rms_norm_eps)
        self.layers = nn.ModuleList(
            InklingDecoderLayer(spec, i, quant_config, f"{prefix}.layers.{i}", padding, self.fused)
            for i in range(spec.num_hidden_layers)
        )
        self.norm = RMSNorm(spec.hidden_size, eps=spec.rms_norm_eps)
        # conv blocks sized so that no page is padded when vLLM unifies page sizes
        share_pages_without_padding(
            [layer.conv_state for layer in self.layers],
            [layer.self_attn.kv_cache_layer.get_kv_cache_spec(vllm_config).page_size_bytes for layer in self.layers],
        )

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_norm(self.embed_tokens(input_ids))

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if inputs_embeds is not None:
            hidden_states = inputs_embeds
        else:
            assert input_ids is not None  # vLLM passes one of the two
            hidden_states = self.embed_input_ids(input_ids)
        layers = self.layers
        normed = layers[0].input_layernorm(hidden_states)
        tp_size = get_tensor_model_parallel_world_size()
        if self.fused and tp_size > 1:  # the residual stream stays sharded from here on
            hidden_states = hidden_states.chunk(tp_size, dim=-1)[get_tensor_model_parallel_rank()].contiguous()
        for i, layer in enumerate(layers):
            next_norm = layers[i + 1].input_layernorm if i + 1 < len(layers) else self.norm
            hidden_states, normed = layer(positions, hidden_states, normed, next_norm)
        return normed


def _config_value(vllm_config: VllmConfig, raw: dict[str, Any] | None, key: str) -> Any:
    """``key`` from the checkpoint's config.json (with dict ``hf_overrides``), else from
    vLLM's parsed config object; ``None`` when neither has it."""
    if raw is not None and key in raw:
        return raw[key]
    return getattr(vllm_config.model_config.hf_config, key, None)


def _conv_padding(vllm_config: VllmConfig, raw: dict[str, Any] | None) -> str:
    try:
        return conv_padding(_config_value(vllm_config, raw, PADDING_KEY))
    except ValueError as exc:
        raise UnsupportedCheckpoint(str(exc)) from None


def _fused_tails(vllm_config: VllmConfig, raw: dict[str, Any] | None) -> bool:
    try:
        return fused_tails(_config_value(vllm_config, raw, FUSED_KEY))
    except ValueError as exc:
        raise UnsupportedCheckpoint(str(exc)) from None


# checkpoint (transformers) name fragment -> (vLLM parameter fragment, shard id)
_STACKED = (
    (".self_attn.q_proj.", ".self_attn.qkv_proj.", "q"),
    (".self_attn.k_proj.", ".self_attn.qkv_proj.", "k"),
    (".self_attn.v_proj.", ".self_attn.qkv_proj.", "v"),
    (".mlp.gate_proj.", ".mlp.gate_up_proj.", 0),
    (".mlp.up_proj.", ".mlp.gate_up_proj.", 1),
)
_CONV_SUFFIX = ".conv1d.weight"
_REL_PROJ_SUFFIX = ".self_attn.rel_logits_proj.proj"
_MOE_PARTS = (".mlp.gate.", ".mlp.experts.", ".mlp.shared_experts.")


class InklingForCausalLM(nn.Module):
    """vLLM entry class for Inkling text checkpoints (both layouts)."""

    packed_modules_mapping = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # Step aside for vLLM's in-tree Inkling when it can serve a checkpoint
        # this model cannot (see inkling_vllm.dispatch).
        from .dispatch import builtin_model_for

        builtin = builtin_model_for(kwargs.get("vllm_config"))
        if builtin is not None:
            return builtin(*args, **kwargs)
        return super().__new__(cls)

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        check_vllm_version()
        from .dispatch import unsupported_reasons

        reasons = unsupported_reasons(vllm_config.model_config)
        if reasons:
            raise UnsupportedCheckpoint(
                "inkling-vllm cannot serve this checkpoint: " + "; ".join(reasons)
                + " (no in-tree Inkling that runs here could take it instead)"
            )
        self.model = InklingModel(vllm_config=vllm_config, prefix=_join(prefix, "model"))
        spec = self.model.spec
        self.spec = spec
        self.lm_head = ParallelLMHead(
            spec.vocab_size,
            spec.hidden_size,
            quant_config=vllm_config.quant_config,
            prefix=_join(prefix, "lm_head"),
        )
        # logits / m == lm_head(h / m): transformers divides the hidden states.
        self.logits_processor = LogitsProcessor(spec.vocab_size, scale=1.0 / float(spec.logits_mup_width_multiplier))

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: object,
    ) -> torch.Tensor:
        return self.model(input_ids, positions, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        logits = self.logits_processor(self.lm_head, hidden_states)
        unpadded = self.spec.unpadded_vocab_size
        if logits is not None and unpadded < logits.shape[-1]:
            # padded unembedding rows: never sampled, no probability mass (in place: the
            # processor returns a fresh tensor; no index tensor per step)
            logits[..., unpadded:] = float("-inf")
        return logits

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load a checkpoint in either layout (names are mapped to transformers'
        by ``inkling_model.checkpoint``); returns the names of the parameters filled.
        Raises :class:`UnsupportedCheckpoint` naming the tensor on an unknown name or a
        wrong shape, and after the pass naming every parameter no tensor filled."""
        params = dict(self.named_parameters())
        modules = dict(self.named_modules())
        loaded: set[str] = set()
        tp_rank, tp_size = get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
        text_weights = iter_text_weights(weights, self.spec.layout)
        names = iter(text_weights)
        while True:
            try:  # the name map refuses names it has no rule for
                name, tensor = next(names)
            except StopIteration:
                break
            except ValueError as exc:
                raise UnsupportedCheckpoint(str(exc)) from None
            try:
                loaded |= self._load_one(name, tensor, params, modules, tp_rank, tp_size)
            except UnsupportedCheckpoint:
                raise
            except (AssertionError, RuntimeError, ValueError, KeyError) as exc:
                raise UnsupportedCheckpoint(
                    f"checkpoint tensor {name!r} {tuple(tensor.shape)} does not fit the model built from "
                    f"its config: {exc}"
                ) from None
        for kind, count in sorted(text_weights.skipped.items()):
            logger.info("inkling-vllm: skipped %d %s tensors (not part of the served text model)", count, kind)
        refuse_unfilled(params, loaded, "tensor")
        return loaded

    def _load_one(
        self,
        name: str,
        tensor: torch.Tensor,
        params: dict[str, nn.Parameter],
        modules: dict[str, nn.Module],
        tp_rank: int,
        tp_size: int,
    ) -> set[str]:
        if name == "model.embed_tokens.embed_norm.weight":
            name = "model.embed_norm.weight"
        return load_layer_tensor(name, tensor, params, modules, tp_rank, tp_size, "InklingForCausalLM")


def refuse_unfilled(params: dict[str, nn.Parameter], loaded: set[str], what: str) -> None:
    """Raise :class:`UnsupportedCheckpoint` naming (up to 8 of) the parameters no
    checkpoint ``what`` (e.g. ``"tensor"``, ``"MTP tensor"``) filled."""
    missing = sorted(n for n in params if n not in loaded)
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise UnsupportedCheckpoint(f"the checkpoint holds no {what} for {len(missing)} parameters: {shown}")


def load_layer_tensor(
    name: str,
    tensor: torch.Tensor,
    params: dict[str, nn.Parameter],
    modules: dict[str, nn.Module],
    tp_rank: int,
    tp_size: int,
    owner: str,
) -> set[str]:
    """Load one checkpoint tensor, under its transformers name (``name``, relative to
    the module whose ``named_parameters`` / ``named_modules`` are ``params`` /
    ``modules``), into this package's Inkling layers: short-conv weights, relative-logit
    projections, MoE parts, stacked q/k/v and gate/up projections, and plain
    parameters (through their ``weight_loader``, which shards for TP). Returns the
    parameter names filled; raises :class:`UnsupportedCheckpoint` (``owner`` names the
    model) for a name with no parameter or a wrong shape."""
    if name.endswith(_CONV_SUFFIX):
        module_name = name[: -len(_CONV_SUFFIX)]
        conv = modules.get(module_name)
        if not isinstance(conv, InklingShortConv):
            raise UnsupportedCheckpoint(f"checkpoint tensor {name!r}: no short conv {module_name!r} in the model")
        conv.load_weight(tensor, tp_rank, tp_size)
        return {f"{module_name}.weight"}
    if name.endswith(_REL_PROJ_SUFFIX):
        module_name = name[: -len(".rel_logits_proj.proj")] + ".attn"
        attn = modules.get(module_name)
        if not isinstance(attn, InklingRelAttention):
            raise UnsupportedCheckpoint(f"checkpoint tensor {name!r}: no attention {module_name!r} in the model")
        attn.load_rel_proj(tensor)
        return {f"{module_name}.rel_proj"}
    for part in _MOE_PARTS:
        if part in name:
            mlp_name, rest = name.split(".mlp.", 1)
            moe = modules.get(f"{mlp_name}.mlp")
            if not isinstance(moe, InklingMoE):
                raise UnsupportedCheckpoint(
                    f"checkpoint tensor {name!r} is an MoE weight but the config marks "
                    f"{mlp_name} as a dense layer (mlp_layer_types)"
                )
            return {f"{mlp_name}.mlp.{p}" for p in moe.load_weight(rest, tensor)}
    for ckpt, ours, shard in _STACKED:
        if ckpt in name:
            target = name.replace(ckpt, ours)
            param = params[target]
            param.weight_loader(param, tensor, shard)  # type: ignore[attr-defined]
            return {target}
    if name not in params:
        raise UnsupportedCheckpoint(f"checkpoint tensor {name!r} has no parameter in {owner}")
    param = params[name]
    if param.dim() == tensor.dim() and tuple(param.shape) != tuple(tensor.shape) and not hasattr(
        param, "weight_loader"
    ):
        raise UnsupportedCheckpoint(
            f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, the model expects {tuple(param.shape)}"
        )
    loader = getattr(param, "weight_loader", default_weight_loader)
    loader(param, tensor)
    return {name}


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


"""Inkling text model (``InklingForCausalLM``) for vLLM, dense relative-logit-free subset.

Built from vLLM's parallel linear / attention / norm layers and ``inkling_model``'s
:class:`~inkling_model.sconv.InklingShortConv` (four short convs per layer, all
reading one paged conv-state cache per layer through
:class:`~inkling_vllm.conv_state.InklingConvStateLayer`). Loads transformers-format
checkpoints (``config.json`` with ``model_type: inkling_text`` + safetensors).

What transformers computes and this model reproduces, per decoder layer::

    a = input_layernorm(h)
    k = k_sconv(k_proj(a)); v = v_sconv(v_proj(a)); q = q_proj(a)
    q, k = q_norm(q), k_norm(k)               (per-head RMSNorm; no rotary embedding)
    o = o_proj(attention(q, k, v, scale=1/head_dim, window=sliding_window_size
                         on "hybrid_sliding" layers, none on "hybrid" layers))
    h = h + attn_sconv(o)
    h = h + mlp_sconv(global_scale * down(silu(gate(b)) * up(b)))   b = post_attention_layernorm(h)

with the embedding RMS-normalized (``embed_tokens.embed_norm``) and the logits
divided by ``logits_mup_width_multiplier``.

Not supported (refused with a message): MoE layers, a non-zero relative-logit
projection, log scaling of the logits, an unembedding narrower than the vocabulary.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
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
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import (
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

from inkling_cache import Stream
from inkling_model import InklingShortConv

from .compat import check_vllm_version
from .conv_state import InklingConvStateLayer

__all__ = ["InklingForCausalLM", "UnsupportedCheckpoint", "check_supported_config"]

SLIDING = "hybrid_sliding"
GLOBAL = "hybrid"
#: The hf config key (also settable with ``hf_overrides``) choosing how the packed
#: conv head size ``D`` is padded: ``"pow2"`` (default, vLLM's choice), ``"none"``, ``k``.
PADDING_KEY = "inkling_conv_state_padding"


class UnsupportedCheckpoint(ValueError):
    """The checkpoint uses a part of Inkling this model does not implement."""


def _get(config: Any, name: str, default: Any = None) -> Any:
    return getattr(config, name, default)


def check_supported_config(config: Any) -> None:
    """Refuse configs outside the dense, relative-logit-free subset."""
    n = int(config.num_hidden_layers)
    layer_types = list(_get(config, "layer_types") or [])
    if len(layer_types) != n or any(t not in (SLIDING, GLOBAL) for t in layer_types):
        raise UnsupportedCheckpoint(
            f"layer_types must list {n} entries of {GLOBAL!r} or {SLIDING!r}, got {layer_types}"
        )
    mlp_types = list(_get(config, "mlp_layer_types") or [])
    sparse = [i for i, t in enumerate(mlp_types) if t != "dense"]
    if len(mlp_types) != n or sparse:
        raise UnsupportedCheckpoint(
            "inkling-vllm serves dense Inkling checkpoints only: mlp_layer_types marks layers "
            f"{sparse or 'all'} as MoE ('sparse'); MoE layers are not supported"
        )
    if _get(config, "log_scaling_n_floor") is not None:
        raise UnsupportedCheckpoint(
            "log scaling of the attention logits (log_scaling_n_floor="
            f"{config.log_scaling_n_floor}) is not supported; set it to null"
        )
    unpadded = _get(config, "unpadded_vocab_size")
    if unpadded is not None and int(unpadded) != int(config.vocab_size):
        raise UnsupportedCheckpoint(
            f"unpadded_vocab_size {unpadded} != vocab_size {config.vocab_size}: a padded "
            "unembedding is not supported"
        )
    act = _get(config, "hidden_act", "silu")
    if act != "silu":
        raise UnsupportedCheckpoint(f"hidden_act {act!r} is not supported (only 'silu')")


def _layer_dims(config: Any, layer_idx: int) -> tuple[bool, int, int, int]:
    sliding = config.layer_types[layer_idx] == SLIDING
    if sliding:
        return True, config.swa_num_attention_heads, config.swa_num_key_value_heads, config.swa_head_dim
    return False, config.num_attention_heads, config.num_key_value_heads, config.head_dim


def _conv_kernel_size(config: Any) -> int:
    return int(_get(config, "conv_kernel_size", None) or _get(config, "sconv_kernel_size"))


def _sharded_conv(conv: InklingShortConv, partial: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Sum a row-parallel output over ranks, convolve this rank's hidden shard,
    and gather the full hidden vector (identity collectives at tp 1)."""
    if get_tensor_model_parallel_world_size() == 1:
        return conv(partial, positions)
    shard = tensor_model_parallel_reduce_scatter(partial, dim=-1).contiguous()
    return tensor_model_parallel_all_gather(conv(shard, positions), dim=-1)


class InklingAttention(nn.Module):
    def __init__(
        self,
        config: Any,
        layer_idx: int,
        conv_state: InklingConvStateLayer,
        cache_config: Any,
        quant_config: Any,
        prefix: str,
    ) -> None:
        super().__init__()
        sliding, num_heads, num_kv_heads, head_dim = _layer_dims(config, layer_idx)
        tp_size = get_tensor_model_parallel_world_size()
        if num_heads % tp_size:
            raise ValueError(
                f"{prefix}: tensor_parallel_size {tp_size} does not divide {num_heads} attention heads"
            )
        self.head_dim = head_dim
        self.num_heads = num_heads // tp_size
        self.num_kv_heads = num_kv_heads // tp_size
        self.q_size = self.num_heads * head_dim
        self.kv_size = self.num_kv_heads * head_dim
        kernel = _conv_kernel_size(config)
        self.qkv_proj = QKVParallelLinear(
            hidden_size=config.hidden_size,
            head_size=head_dim,
            total_num_heads=num_heads,
            total_num_kv_heads=num_kv_heads,
            bias=False,
            quant_config=quant_config,
            prefix=f"{prefix}.qkv_proj",
        )
        self.o_proj = RowParallelLinear(
            input_size=num_heads * head_dim,
            output_size=config.hidden_size,
            bias=False,
            reduce_results=False,  # summed by the conv's reduce-scatter
            quant_config=quant_config,
            prefix=f"{prefix}.o_proj",
        )
        owner = conv_state.owner
        self.k_sconv = InklingShortConv(self.kv_size, kernel, owner, Stream.K)
        self.v_sconv = InklingShortConv(self.kv_size, kernel, owner, Stream.V)
        self.q_norm = RMSNorm(head_dim, eps=config.rms_norm_eps)
        self.k_norm = RMSNorm(head_dim, eps=config.rms_norm_eps)
        if sliding:
            window: int | None = int(config.sliding_window_size)
            layer_cache_config = cache_config
        else:
            # vLLM falls back to the model-wide sliding window (transformers maps
            # sliding_window to sliding_window_size): global layers must not.
            window = None
            layer_cache_config = copy.copy(cache_config) if cache_config is not None else None
            if layer_cache_config is not None:
                layer_cache_config.sliding_window = None
        self.attn = Attention(
            num_heads=self.num_heads,
            head_size=head_dim,
            scale=1.0 / head_dim,  # q and k are RMS-normalized per head
            num_kv_heads=self.num_kv_heads,
            cache_config=layer_cache_config,
            quant_config=quant_config,
            per_layer_sliding_window=window,
            prefix=f"{prefix}.attn",
        )

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        k = self.k_sconv(k.contiguous(), positions)
        v = self.v_sconv(v.contiguous(), positions)
        q = self.q_norm(q.reshape(-1, self.head_dim)).view(-1, self.q_size)
        k = self.k_norm(k.reshape(-1, self.head_dim)).view(-1, self.kv_size)
        out = self.attn(q, k, v)
        partial, _ = self.o_proj(out)
        return partial


class InklingMLP(nn.Module):
    def __init__(self, config: Any, quant_config: Any, prefix: str) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            input_size=config.hidden_size,
            output_sizes=[config.intermediate_size] * 2,
            bias=False,
            quant_config=quant_config,
            prefix=f"{prefix}.gate_up_proj",
        )
        self.down_proj = RowParallelLinear(
            input_size=config.intermediate_size,
            output_size=config.hidden_size,
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
    def __init__(self, config: Any, layer_idx: int, cache_config: Any, quant_config: Any, prefix: str) -> None:
        super().__init__()
        _, _, num_kv_heads, head_dim = _layer_dims(config, layer_idx)
        kernel = _conv_kernel_size(config)
        self.conv_state = InklingConvStateLayer(
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            hidden_size=config.hidden_size,
            kernel_size=kernel,
            prefix=f"{prefix}.conv_state",
            padding=str(_get(config, PADDING_KEY, None) or "pow2"),
        )
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = InklingAttention(
            config, layer_idx, self.conv_state, cache_config, quant_config, f"{prefix}.self_attn"
        )
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = InklingMLP(config, quant_config, f"{prefix}.mlp")
        shard = config.hidden_size // get_tensor_model_parallel_world_size()
        owner = self.conv_state.owner
        self.attn_sconv = InklingShortConv(shard, kernel, owner, Stream.ATTN)
        self.mlp_sconv = InklingShortConv(shard, kernel, owner, Stream.MLP)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        attn = self.self_attn(positions, self.input_layernorm(hidden_states))
        hidden_states = hidden_states + _sharded_conv(self.attn_sconv, attn, positions)
        mlp = self.mlp(self.post_attention_layernorm(hidden_states))
        return hidden_states + _sharded_conv(self.mlp_sconv, mlp, positions)


@support_torch_compile(
    dynamic_arg_dims={"input_ids": 0, "positions": 0, "inputs_embeds": 0, "intermediate_tensors": 0}
)
class InklingModel(nn.Module):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        check_supported_config(config)
        cache_config = vllm_config.cache_config
        quant_config = vllm_config.quant_config
        self.config = config
        self.embed_tokens = VocabParallelEmbedding(
            config.vocab_size, config.hidden_size, quant_config=quant_config, prefix=f"{prefix}.embed_tokens"
        )
        self.embed_norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList(
            InklingDecoderLayer(config, i, cache_config, quant_config, f"{prefix}.layers.{i}")
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

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
        for layer in self.layers:
            hidden_states = layer(positions, hidden_states)
        return self.norm(hidden_states)


# checkpoint name fragment -> (vLLM parameter fragment, shard id)
_STACKED = (
    (".self_attn.q_proj.", ".self_attn.qkv_proj.", "q"),
    (".self_attn.k_proj.", ".self_attn.qkv_proj.", "k"),
    (".self_attn.v_proj.", ".self_attn.qkv_proj.", "v"),
    (".mlp.gate_proj.", ".mlp.gate_up_proj.", 0),
    (".mlp.up_proj.", ".mlp.gate_up_proj.", 1),
)
_CONV_SUFFIX = ".conv1d.weight"
_MOE_FRAGMENTS = (".mlp.experts.", ".mlp.gate.", ".mlp.shared_experts.")


class InklingForCausalLM(nn.Module):
    """vLLM entry class for transformers' ``InklingForCausalLM`` checkpoints."""

    packed_modules_mapping = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        check_vllm_version()
        config = vllm_config.model_config.hf_config
        check_supported_config(config)
        self.config = config
        self.model = InklingModel(vllm_config=vllm_config, prefix=_join(prefix, "model"))
        self.lm_head = ParallelLMHead(
            config.vocab_size,
            config.hidden_size,
            quant_config=vllm_config.quant_config,
            prefix=_join(prefix, "lm_head"),
        )
        # logits / m == lm_head(h / m): transformers divides the hidden states.
        self.logits_processor = LogitsProcessor(
            config.vocab_size, scale=1.0 / float(config.logits_mup_width_multiplier)
        )

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
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load a transformers ``InklingForCausalLM`` state dict (names as in the
        checkpoint); returns the names of the parameters filled."""
        params = dict(self.named_parameters())
        modules = dict(self.named_modules())
        loaded: set[str] = set()
        for name, tensor in weights:
            if name.startswith("model.mtp."):
                continue  # multi-token-prediction heads are not served
            if any(f in name for f in _MOE_FRAGMENTS):
                raise UnsupportedCheckpoint(f"{name}: MoE weights are not supported (dense checkpoints only)")
            if name.endswith(".rel_logits_proj.proj"):
                if torch.count_nonzero(tensor).item():
                    raise UnsupportedCheckpoint(
                        f"{name} is non-zero: the relative-logit position bias is not "
                        "supported (only checkpoints whose relative-logit projection is zero)"
                    )
                continue
            if ".self_attn.r_proj." in name:
                continue  # only feeds the (zero) relative-logit bias
            if name == "model.embed_tokens.embed_norm.weight":
                name = "model.embed_norm.weight"
            if name.endswith(_CONV_SUFFIX):
                module_name = name[: -len(_CONV_SUFFIX)]
                conv = modules.get(module_name)
                if not isinstance(conv, InklingShortConv):
                    raise KeyError(f"{name}: no short conv {module_name!r} in the model")
                conv.load_weight(tensor, get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size())
                loaded.add(f"{module_name}.weight")
                continue
            for ckpt, ours, shard in _STACKED:
                if ckpt in name:
                    target = name.replace(ckpt, ours)
                    param = params[target]
                    param.weight_loader(param, tensor, shard)
                    loaded.add(target)
                    break
            else:
                if name not in params:
                    raise KeyError(f"checkpoint tensor {name!r} has no parameter in InklingForCausalLM")
                param = params[name]
                loader = getattr(param, "weight_loader", default_weight_loader)
                loader(param, tensor)
                loaded.add(name)
        return loaded


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name

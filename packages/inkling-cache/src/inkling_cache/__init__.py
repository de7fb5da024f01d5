"""inkling_cache: Inkling's short-conv state kept as a paged sliding-window KV cache.

Pure Python, no dependencies. The layout of the packed per-layer cache
(:class:`ConvStateLayout`), per-layer layouts from a model config
(:func:`layer_layouts`, :func:`load_config`), the whole text model's hyperparameters
(:class:`InklingTextSpec` from :func:`text_spec`, any config form), paging math (:func:`slot_of`,
:func:`admission_reserve_blocks`, :func:`unify_page_sizes`, ...) and capacity planning
(:func:`plan_capacity`), block allocation for a standalone runtime (:class:`BlockTables`,
:class:`BlockAllocator`), plus the ``inkling-cache plan`` command.
"""

from .allocator import BlockAllocator, BlockTables, OutOfBlocksError, ScheduledChunk, StepLayout, StepPlan
from .capacity import GIB_BYTES, AttentionLayout, CacheKind, CapacityPlan, Concurrency, plan_capacity
from .config import (
    PRESETS,
    ConfigSource,
    InklingDims,
    InklingTextSpec,
    Layout,
    conv_kernel_size,
    layer_layouts,
    load_config,
    text_spec,
)
from .dtypes import DTYPE_BYTES, canonical_dtype, dtype_bytes
from .layout import ConvStateLayout, PaddingPolicy, PaddingSpec, Stream
from .paging import (
    LOOKAHEAD_DRAFT_METHODS,
    TOKEN_DRAFT_METHODS,
    PageSpec,
    UnifiedPage,
    admission_reserve_blocks,
    tail_conv_admission_blocks,
    tail_conv_live_blocks,
    tail_conv_steady_blocks,
    speculative_lookahead_tokens,
    blocks_for_tokens,
    cdiv,
    conv_page_without_padding,
    first_live_block,
    freed_blocks,
    live_blocks,
    slot_of,
    slot_to_block_row,
    steady_state_blocks,
    unify_page_sizes,
)

__version__ = "0.1.0"

__all__ = [
    "DTYPE_BYTES",
    "GIB_BYTES",
    "PRESETS",
    "AttentionLayout",
    "BlockAllocator",
    "BlockTables",
    "CacheKind",
    "CapacityPlan",
    "Concurrency",
    "ConfigSource",
    "ConvStateLayout",
    "InklingDims",
    "InklingTextSpec",
    "LOOKAHEAD_DRAFT_METHODS",
    "Layout",
    "OutOfBlocksError",
    "PageSpec",
    "PaddingPolicy",
    "PaddingSpec",
    "ScheduledChunk",
    "StepLayout",
    "StepPlan",
    "Stream",
    "TOKEN_DRAFT_METHODS",
    "UnifiedPage",
    "admission_reserve_blocks",
    "tail_conv_admission_blocks",
    "tail_conv_live_blocks",
    "tail_conv_steady_blocks",
    "speculative_lookahead_tokens",
    "blocks_for_tokens",
    "canonical_dtype",
    "cdiv",
    "conv_page_without_padding",
    "conv_kernel_size",
    "dtype_bytes",
    "first_live_block",
    "freed_blocks",
    "layer_layouts",
    "live_blocks",
    "load_config",
    "plan_capacity",
    "slot_of",
    "slot_to_block_row",
    "steady_state_blocks",
    "text_spec",
    "unify_page_sizes",
]

"""inkling_model: PyTorch layers for Inkling's short convolutions over a paged
conv-state cache and its relative-logit attention over a paged KV cache, framework-neutral metadata, tensor-parallel weight loading and a
standalone paged runtime. Never imports vllm."""

from .attention import AttentionCacheOwner, InklingRelAttention, get_attention_owner, paged_rel_attention
from .checkpoint import (
    TextWeights,
    WeightKind,
    iter_text_weights,
    release_to_transformers,
    transformers_to_release,
    weight_kind,
)
from .fused_norm import InklingShortConvAddRMSNorm, paged_short_conv_add, paged_short_conv_add_rmsnorm
from .metadata import RelAttentionMetadata, SconvMetadata, SconvMetadataBuilder
from .runtime import BlockAllocator, OutOfBlocksError, PagedConvRuntime, RuntimeStep, ScheduledChunk
from .sconv import InklingShortConv, paged_short_conv, paged_short_conv_kv, short_conv_kv
from .state import (
    ConvStateOwner,
    MetadataProvider,
    NamedRegistry,
    current_metadata,
    current_metadata_of,
    forward_metadata,
    get_metadata_provider,
    get_owner,
    set_metadata_provider,
)

__version__ = "0.1.0"

__all__ = [
    "AttentionCacheOwner",
    "BlockAllocator",
    "ConvStateOwner",
    "InklingRelAttention",
    "InklingShortConv",
    "InklingShortConvAddRMSNorm",
    "MetadataProvider",
    "NamedRegistry",
    "OutOfBlocksError",
    "PagedConvRuntime",
    "RelAttentionMetadata",
    "RuntimeStep",
    "ScheduledChunk",
    "SconvMetadata",
    "SconvMetadataBuilder",
    "TextWeights",
    "WeightKind",
    "current_metadata",
    "current_metadata_of",
    "forward_metadata",
    "get_attention_owner",
    "get_metadata_provider",
    "get_owner",
    "iter_text_weights",
    "paged_rel_attention",
    "paged_short_conv",
    "paged_short_conv_add",
    "paged_short_conv_add_rmsnorm",
    "paged_short_conv_kv",
    "release_to_transformers",
    "set_metadata_provider",
    "short_conv_kv",
    "transformers_to_release",
    "weight_kind",
]

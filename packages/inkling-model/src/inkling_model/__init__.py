"""inkling_model: PyTorch layers for Inkling's short convolutions over a paged
conv-state cache, framework-neutral metadata, tensor-parallel weight loading and a
standalone paged runtime. Never imports vllm."""

from .fused_norm import InklingShortConvAddRMSNorm, paged_short_conv_add_rmsnorm
from .metadata import SconvMetadata, SconvMetadataBuilder
from .runtime import BlockAllocator, OutOfBlocksError, PagedConvRuntime, RuntimeStep, ScheduledChunk
from .sconv import InklingShortConv, paged_short_conv
from .state import (
    ConvStateOwner,
    MetadataProvider,
    current_metadata,
    forward_metadata,
    get_metadata_provider,
    get_owner,
    set_metadata_provider,
)

__version__ = "0.1.0"

__all__ = [
    "BlockAllocator",
    "ConvStateOwner",
    "InklingShortConv",
    "InklingShortConvAddRMSNorm",
    "MetadataProvider",
    "OutOfBlocksError",
    "PagedConvRuntime",
    "RuntimeStep",
    "ScheduledChunk",
    "SconvMetadata",
    "SconvMetadataBuilder",
    "current_metadata",
    "forward_metadata",
    "get_metadata_provider",
    "get_owner",
    "paged_short_conv",
    "paged_short_conv_add_rmsnorm",
    "set_metadata_provider",
]

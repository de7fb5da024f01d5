"""inkling_kernels: the fused paged short-conv and sequence-metadata ops.

Public API: :func:`fused_sconv`, :func:`sconv_seq_metadata`, :func:`sconv_tap_map`,
:func:`fused_sconv_add_rmsnorm` (torch custom ops ``torch.ops.inkling.*``; CPU
tensors run the PyTorch references, CUDA tensors the Triton kernels) and the
references in :mod:`inkling_kernels.reference`.
"""

from .ops import fused_sconv, sconv_seq_metadata, sconv_tap_map, uses_triton
from .rel_attention import paged_rel_attention, rel_attention_ref, write_kv
from .reference import causal_conv_ref, fused_sconv_ref, sconv_seq_metadata_ref, sconv_tap_map_ref
from .sconv_add_rmsnorm import fused_sconv_add_rmsnorm

__version__ = "0.1.0"

__all__ = [
    "causal_conv_ref",
    "fused_sconv",
    "fused_sconv_add_rmsnorm",
    "fused_sconv_ref",
    "paged_rel_attention",
    "rel_attention_ref",
    "sconv_seq_metadata",
    "sconv_seq_metadata_ref",
    "sconv_tap_map",
    "sconv_tap_map_ref",
    "uses_triton",
    "write_kv",
]

"""PyTorch reference of :func:`inkling_kernels.gathered_rms_norm`."""

from __future__ import annotations

import torch

from ..checks import check_gathered_rms_norm_args
from ..sconv_add_rmsnorm.reference import rms_norm_ref

__all__ = ["gathered_rms_norm_ref"]


def reference_gathered_rms_norm(shards: torch.Tensor, norm_weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The reference on checked arguments (the CPU path)."""
    tp, t, width = shards.shape
    return rms_norm_ref(shards.permute(1, 0, 2).reshape(t, tp * width), norm_weight, eps)


def gathered_rms_norm_ref(shards: torch.Tensor, norm_weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``rms_norm_ref`` of the rows that ``shards`` [tp, T, S] hold in pieces: row ``t``
    is ``shards[0, t], shards[1, t], ..., shards[tp-1, t]`` side by side. Returns
    [T, tp * S] in ``shards.dtype``. Checked as :func:`inkling_kernels.gathered_rms_norm`."""
    check_gathered_rms_norm_args(shards, norm_weight, eps)
    return reference_gathered_rms_norm(shards, norm_weight, eps)

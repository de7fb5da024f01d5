"""RMSNorm of rows that arrive in per-rank pieces (the all-gathered residual at tp > 1).

At tp > 1 the served model keeps the residual stream sharded by hidden columns; after a
sublayer's conv + residual add on the shard, every rank needs the next RMSNorm of the
whole row. An all-gather along dim 0 returns the pieces as ``[tp, T, S]`` (rank ``r``'s
``[T, S]`` shard at index ``r``); the row layout ``[T, tp * S]`` needs one more copy.
:func:`gathered_rms_norm` reads the pieces where the all-gather put them and writes the
normed rows in the row layout: the layout copy and the norm in one pass.
"""

from __future__ import annotations

import torch

from .._dispatch import run_op, uses_triton
from ..checks import check_gathered_rms_norm_args
from .reference import gathered_rms_norm_ref, reference_gathered_rms_norm

__all__ = ["gathered_rms_norm", "gathered_rms_norm_ref"]


@torch.library.custom_op("inkling::gathered_rms_norm", mutates_args=())
def _gathered_rms_norm_op(shards: torch.Tensor, norm_weight: torch.Tensor, eps: float) -> torch.Tensor:
    if not uses_triton(shards.device):
        return reference_gathered_rms_norm(shards, norm_weight, eps)
    from .kernel import launch_gathered_rms_norm  # Triton only off the CPU path

    return launch_gathered_rms_norm(shards, norm_weight, eps)


@_gathered_rms_norm_op.register_fake
def _gathered_rms_norm_fake(shards: torch.Tensor, norm_weight: torch.Tensor, eps: float) -> torch.Tensor:
    check_gathered_rms_norm_args(shards, norm_weight, eps)
    tp, t, width = shards.shape
    return shards.new_empty(t, tp * width)


def gathered_rms_norm(shards: torch.Tensor, norm_weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of the rows held in pieces: ``rmsnorm(cat(shards[:, t])) * norm_weight``.

    Args:
        shards: [tp, T, S] contiguous, bf16/fp16/fp32: row ``t`` is
            ``shards[0, t], ..., shards[tp-1, t]`` side by side (an all-gather along
            dim 0 of each rank's [T, S] shard, viewed as [tp, T, S]).
        norm_weight: [tp * S] weight of the whole row, a float dtype, contiguous, on
            shards' device.
        eps: added to the mean of squares (a finite float >= 0).

    Returns:
        [T, tp * S] in shards' dtype, rounded as transformers' ``InklingRMSNorm``
        (:func:`inkling_kernels.sconv_add_rmsnorm.rms_norm_ref`): the normalisation in
        fp32, rounded, then times the weight, rounded.

    Raises TypeError/ValueError (before any launch) saying what to change. CPU tensors run
    the reference, CUDA tensors the Triton kernel (one launch; CUDA-graph safe).
    """
    check_gathered_rms_norm_args(shards, norm_weight, eps)
    return run_op(_gathered_rms_norm_op, shards, norm_weight, float(eps))

"""Fused short conv + outer residual add (+ RMSNorm), for the ATTN and MLP streams.

In every Inkling decoder layer the attention and MLP outputs ``d`` pass through a
short conv and are added to the residual stream, which the next RMSNorm reads::

    new_hidden = hidden + (d + conv(d))       # conv: the paged causal conv of fused_sconv
    normed     = rmsnorm(new_hidden) * norm_weight

Two ops, one Triton kernel (a compile-time switch turns the norm off), the same
conv, rounding and cache writes: both store ``d``'s rows in their cache slots exactly
as :func:`inkling_kernels.fused_sconv` does, with the same semantics for pre-forward
taps (post-write: correct under same-step prefix hits in any batch order), with or
without the batch's tap map.

- :func:`fused_sconv_add_rmsnorm` does all of it in one pass over the rows (one
  launch on CUDA; a program owns whole rows, or a row's chunks meet through an atomic
  ticket, since RMSNorm needs the full row; prompt launches with the step's tap map
  take the row-register kernel, :mod:`.rows_kernel`). The norm needs the full hidden row, so
  the conv must see it: at ``tp == 1``, or wherever the conv's channels are the whole
  hidden row. The op checks that ``norm_weight`` covers all of ``d``'s channels; the
  model layer checks the layout.
- :func:`fused_sconv_add` returns ``new_hidden`` only. It is for tensor parallelism
  (tp > 1): the packed layout convolves the ATTN/MLP streams on the rank's hidden
  shard (``hidden/tp`` channels), so with a sharded residual stream each sublayer is
  reduce-scatter(partial ``d``) -> ``fused_sconv_add`` on the shard (``hidden`` the
  rank's shard of the residual stream) -> all-gather -> RMSNorm of the full row. No
  program needs a whole row: a row's channel chunks spread over programs freely.
"""

from __future__ import annotations

from typing import Any

import torch

from .._dispatch import run_op, uses_triton
from ..batch import OP_SCHEMA, SconvBatch
from ..checks import SconvProblem, check_add_extras, check_conv_call, check_norm_extras
from .reference import (
    fused_sconv_add_ref,
    fused_sconv_add_rmsnorm_ref,
    reference_sconv_add,
    reference_sconv_add_rmsnorm,
    rms_norm_ref,
)

__all__ = [
    "fused_sconv_add",
    "fused_sconv_add_ref",
    "fused_sconv_add_rmsnorm",
    "fused_sconv_add_rmsnorm_ref",
    "rms_norm_ref",
]


def check_sconv_add_rmsnorm_args(
    hidden: object,
    d: object,
    weight: object,
    cache: object,
    batch: object,
    stream_offset: object,
    stream_width: object,
    norm_weight: object,
    eps: object,
) -> SconvProblem:
    """Validate one launch; raise TypeError/ValueError saying what to change: the conv
    arguments exactly as for ``fused_sconv`` (``d`` in the role of ``x``), then
    ``hidden``, ``norm_weight`` and ``eps`` (:mod:`inkling_kernels.checks`)."""
    prob = check_conv_call(d, weight, cache, batch, stream_offset, stream_width)
    check_norm_extras(hidden, d, prob, norm_weight, eps)  # type: ignore[arg-type]
    return prob


# The batch travels as SconvBatch.op_args() (OP_SCHEMA).
@torch.library.custom_op(
    "inkling::fused_sconv_add_rmsnorm",
    mutates_args=("cache",),
    schema=f"(Tensor hidden, Tensor d, Tensor weight, Tensor(a!) cache, {OP_SCHEMA}, SymInt stream_offset, "
    "SymInt stream_width, Tensor norm_weight, float eps) -> (Tensor, Tensor)",
)
def _fused_sconv_add_rmsnorm_op(
    hidden: torch.Tensor, d: torch.Tensor, weight: torch.Tensor, cache: torch.Tensor, *args: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    batch, (stream_offset, stream_width, norm_weight, eps) = SconvBatch.split_op_args(args)
    prob = SconvProblem.of(d, weight, cache)  # checked by fused_sconv_add_rmsnorm
    call = (hidden, d, prob, cache, batch, stream_offset, stream_width, norm_weight, float(eps))
    if not uses_triton(d.device):  # the reference resolves taps itself: no map
        return reference_sconv_add_rmsnorm(*call)
    from .kernel import launch_sconv_add_rmsnorm  # Triton only off the CPU path

    return launch_sconv_add_rmsnorm(*call)


@_fused_sconv_add_rmsnorm_op.register_fake
def _fused_sconv_add_rmsnorm_fake(
    hidden: torch.Tensor, d: torch.Tensor, weight: torch.Tensor, cache: torch.Tensor, *args: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    batch, rest = SconvBatch.split_op_args(args, check=True)
    check_sconv_add_rmsnorm_args(hidden, d, weight, cache, batch, *rest)
    return torch.empty_like(d), torch.empty_like(d)


def fused_sconv_add_rmsnorm(
    hidden: torch.Tensor,
    d: torch.Tensor,
    weight: torch.Tensor,
    cache: torch.Tensor,
    batch: SconvBatch,
    stream_offset: int,
    stream_width: int,
    norm_weight: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(hidden + d + conv(d), rmsnorm(that) * norm_weight)`` in one pass.

    Args:
        hidden: [T, C] residual stream, bf16/fp16/fp32, contiguous (d's dtype).
        d: [T, C] sublayer output (attention after o_proj, or the MLP/MoE output),
            contiguous; ``C = H * stream_width`` must be the full hidden row.
        weight: (C, W) or (C, 1, W) conv weight, fp32 or d.dtype; ``weight[:, W-1]``
            multiplies the current token.
        cache, batch, stream_offset, stream_width: exactly as for
            :func:`inkling_kernels.fused_sconv`; ``cache`` is mutated (each valid
            slot's stream range receives its row of ``d``); the batch's tap map, when
            it has one, serves the CUDA kernel as it serves ``fused_sconv``.
        norm_weight: [C] the following RMSNorm's weight (any float dtype), applied
            as transformers' ``InklingRMSNorm`` does: ``w * dt(x * rsqrt(mean(x^2) + eps))``.
        eps: the norm's epsilon (``rms_norm_eps``).

    Returns:
        ``(new_hidden, normed)``, two new [T, C] tensors in d.dtype, rounded at the
        points where transformers rounds (see :mod:`.reference`).
    """
    check_sconv_add_rmsnorm_args(hidden, d, weight, cache, batch, stream_offset, stream_width, norm_weight, eps)
    return run_op(  # type: ignore[no-any-return]
        _fused_sconv_add_rmsnorm_op, hidden, d, weight, cache, *batch.op_args(), stream_offset, stream_width, norm_weight, float(eps)
    )


def check_sconv_add_args(
    hidden: object,
    d: object,
    weight: object,
    cache: object,
    batch: object,
    stream_offset: object,
    stream_width: object,
) -> SconvProblem:
    """Validate one ``fused_sconv_add`` launch; raise TypeError/ValueError saying what
    to change: the conv arguments exactly as for ``fused_sconv`` (``d`` in the role of
    ``x``), then ``hidden`` (:func:`inkling_kernels.checks.check_add_extras`)."""
    prob = check_conv_call(d, weight, cache, batch, stream_offset, stream_width)
    check_add_extras(hidden, d)  # type: ignore[arg-type]
    return prob


@torch.library.custom_op(
    "inkling::fused_sconv_add",
    mutates_args=("cache",),
    schema=f"(Tensor hidden, Tensor d, Tensor weight, Tensor(a!) cache, {OP_SCHEMA}, SymInt stream_offset, "
    "SymInt stream_width) -> Tensor",
)
def _fused_sconv_add_op(
    hidden: torch.Tensor, d: torch.Tensor, weight: torch.Tensor, cache: torch.Tensor, *args: Any
) -> torch.Tensor:
    batch, (stream_offset, stream_width) = SconvBatch.split_op_args(args)
    prob = SconvProblem.of(d, weight, cache)  # checked by fused_sconv_add
    call = (hidden, d, prob, cache, batch, stream_offset, stream_width)
    if not uses_triton(d.device):  # the reference resolves taps itself: no map
        return reference_sconv_add(*call)
    from .kernel import launch_sconv_add  # Triton only off the CPU path

    return launch_sconv_add(*call)


@_fused_sconv_add_op.register_fake
def _fused_sconv_add_fake(
    hidden: torch.Tensor, d: torch.Tensor, weight: torch.Tensor, cache: torch.Tensor, *args: Any
) -> torch.Tensor:
    batch, rest = SconvBatch.split_op_args(args, check=True)
    check_sconv_add_args(hidden, d, weight, cache, batch, *rest)
    return torch.empty_like(d)


def fused_sconv_add(
    hidden: torch.Tensor,
    d: torch.Tensor,
    weight: torch.Tensor,
    cache: torch.Tensor,
    batch: SconvBatch,
    stream_offset: int,
    stream_width: int,
) -> torch.Tensor:
    """``hidden + d + conv(d)`` in one pass, ``d``'s rows stored in the cache: the
    conv + residual add of :func:`fused_sconv_add_rmsnorm` without the norm, for a
    rank's channel shard at tp > 1 (then all-gather, then the norm).

    Args:
        hidden: [T, C] residual stream (the rank's shard of it at tp > 1),
            bf16/fp16/fp32, contiguous, d's dtype and device.
        d: [T, C] sublayer output (the shard after the reduce-scatter), contiguous;
            ``C = H * stream_width`` (any part of the hidden row: the conv is per
            channel).
        weight: (C, W) or (C, 1, W) conv weight (the rank's shard), fp32 or d.dtype;
            ``weight[:, W-1]`` multiplies the current token.
        cache, batch, stream_offset, stream_width: exactly as for
            :func:`inkling_kernels.fused_sconv`; ``cache`` is mutated (each valid
            slot's stream range receives its row of ``d``); the batch's tap map, when
            it has one, serves the CUDA kernel as it serves ``fused_sconv``.

    Returns:
        ``new_hidden``, a new [T, C] tensor in d.dtype: ``dt(hidden + dt(d + conv(d)))``
        (rounded where transformers rounds, as ``fused_sconv_add_rmsnorm``'s first
        output, bit for bit on the CPU path).
    """
    check_sconv_add_args(hidden, d, weight, cache, batch, stream_offset, stream_width)
    return run_op(  # type: ignore[no-any-return]
        _fused_sconv_add_op, hidden, d, weight, cache, *batch.op_args(), stream_offset, stream_width
    )

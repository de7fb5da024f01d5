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

from typing import Any, Optional

import torch

from .._dispatch import run_op, uses_triton
from ..batch import OP_SCHEMA, SconvBatch
from ..checks import SconvProblem, check_add_extras, check_conv_call, check_norm_extras, output_for, outputs_for
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


# The batch travels as SconvBatch.op_args() (OP_SCHEMA). Both ops write their results
# into outputs allocated by their Python functions or passed by the caller (``out=``),
# so they return nothing.
@torch.library.custom_op(
    "inkling::fused_sconv_add_rmsnorm",
    mutates_args=("cache", "hidden_out", "normed_out"),
    schema=f"(Tensor hidden, Tensor d, Tensor weight, Tensor(a!) cache, {OP_SCHEMA}, SymInt stream_offset, "
    "SymInt stream_width, Tensor norm_weight, float eps, Tensor(b!) hidden_out, Tensor(c!) normed_out) -> ()",
)
def _fused_sconv_add_rmsnorm_op(
    hidden: torch.Tensor, d: torch.Tensor, weight: torch.Tensor, cache: torch.Tensor, *args: Any
) -> None:
    batch, (stream_offset, stream_width, norm_weight, eps, hidden_out, normed_out) = SconvBatch.split_op_args(args)
    prob = SconvProblem.of(d, weight, cache)  # checked by fused_sconv_add_rmsnorm
    _run_norm((hidden, d, prob, cache, batch, stream_offset, stream_width, norm_weight, float(eps)), hidden_out, normed_out)


def _run_norm(call: tuple[Any, ...], hidden_out: torch.Tensor, normed_out: torch.Tensor) -> None:
    """The op's work on checked arguments: ``call`` is ``(hidden, d, prob, cache, batch,
    stream_offset, stream_width, norm_weight, eps)`` (``prob`` from the checks)."""
    if not uses_triton(call[1].device):  # the reference resolves taps itself: no map
        new_hidden, normed = reference_sconv_add_rmsnorm(*call)
        hidden_out.copy_(new_hidden)
        normed_out.copy_(normed)
        return
    from .kernel import launch_sconv_add_rmsnorm  # Triton only off the CPU path

    launch_sconv_add_rmsnorm(*call, outputs=(hidden_out, normed_out))


@_fused_sconv_add_rmsnorm_op.register_fake
def _fused_sconv_add_rmsnorm_fake(
    hidden: torch.Tensor, d: torch.Tensor, weight: torch.Tensor, cache: torch.Tensor, *args: Any
) -> None:
    batch, (*rest, hidden_out, normed_out) = SconvBatch.split_op_args(args, check=True)
    check_sconv_add_rmsnorm_args(hidden, d, weight, cache, batch, *rest)
    outputs_for("out", (hidden_out, normed_out), d)


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
    *,
    out: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
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
        norm_weight: [C] the following RMSNorm's weight (bf16, fp16 or fp32), applied
            as transformers' ``InklingRMSNorm`` does: ``w * dt(x * rsqrt(mean(x^2) + eps))``.
        eps: the norm's epsilon (``rms_norm_eps``).
        out: where to write the results: ``(new_hidden, normed)``, two distinct
            contiguous [T, C] tensors in d.dtype on d's device, sharing no memory with
            the inputs or each other (checked); by default two new ones.

    Returns:
        ``(new_hidden, normed)``, [T, C] tensors in d.dtype, rounded at the points
        where transformers rounds (see :mod:`.reference`).
    """
    prob = check_sconv_add_rmsnorm_args(hidden, d, weight, cache, batch, stream_offset, stream_width, norm_weight, eps)
    hidden_out, normed_out = outputs_for("out", out, d, (
        ("hidden", hidden), ("d", d), ("weight", weight), ("cache", cache), ("norm_weight", norm_weight)))
    call = (hidden, d, prob, cache, batch, stream_offset, stream_width, norm_weight, float(eps))
    run_op(
        _fused_sconv_add_rmsnorm_op, hidden, d, weight, cache, *batch.op_args(), stream_offset, stream_width,
        norm_weight, float(eps), hidden_out, normed_out,
        direct=lambda: _run_norm(call, hidden_out, normed_out),
    )
    return hidden_out, normed_out


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
    mutates_args=("cache", "out"),
    schema=f"(Tensor hidden, Tensor d, Tensor weight, Tensor(a!) cache, {OP_SCHEMA}, SymInt stream_offset, "
    "SymInt stream_width, Tensor(b!) out) -> ()",
)
def _fused_sconv_add_op(hidden: torch.Tensor, d: torch.Tensor, weight: torch.Tensor, cache: torch.Tensor, *args: Any) -> None:
    batch, (stream_offset, stream_width, out) = SconvBatch.split_op_args(args)
    prob = SconvProblem.of(d, weight, cache)  # checked by fused_sconv_add
    _run_add((hidden, d, prob, cache, batch, stream_offset, stream_width), out)


def _run_add(call: tuple[Any, ...], out: torch.Tensor) -> None:
    """The op's work on checked arguments: ``call`` is ``(hidden, d, prob, cache, batch,
    stream_offset, stream_width)`` (``prob`` from the checks)."""
    if not uses_triton(call[1].device):  # the reference resolves taps itself: no map
        out.copy_(reference_sconv_add(*call))
        return
    from .kernel import launch_sconv_add  # Triton only off the CPU path

    launch_sconv_add(*call, out=out)


@_fused_sconv_add_op.register_fake
def _fused_sconv_add_fake(hidden: torch.Tensor, d: torch.Tensor, weight: torch.Tensor, cache: torch.Tensor, *args: Any) -> None:
    batch, (*rest, out) = SconvBatch.split_op_args(args, check=True)
    check_sconv_add_args(hidden, d, weight, cache, batch, *rest)
    output_for("out", out, d)


def fused_sconv_add(
    hidden: torch.Tensor,
    d: torch.Tensor,
    weight: torch.Tensor,
    cache: torch.Tensor,
    batch: SconvBatch,
    stream_offset: int,
    stream_width: int,
    *,
    out: Optional[torch.Tensor] = None,
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
        out: where to write ``new_hidden``: a contiguous [T, C] tensor in d.dtype on
            d's device, sharing no memory with the inputs (checked); by default a new one.

    Returns:
        ``new_hidden``, [T, C] in d.dtype: ``dt(hidden + dt(d + conv(d)))``
        (rounded where transformers rounds, as ``fused_sconv_add_rmsnorm``'s first
        output, bit for bit on the CPU path).
    """
    prob = check_sconv_add_args(hidden, d, weight, cache, batch, stream_offset, stream_width)
    out = output_for("out", out, d, (("hidden", hidden), ("d", d), ("weight", weight), ("cache", cache)))
    call = (hidden, d, prob, cache, batch, stream_offset, stream_width)
    run_op(_fused_sconv_add_op, hidden, d, weight, cache, *batch.op_args(), stream_offset, stream_width, out,
           direct=lambda: _run_add(call, out))
    return out

"""``fused_sconv_kv``: the K and V short convs of an attention layer in one launch.

Inkling computes k and v with one fused QKV projection; each goes through the paged
causal conv of :func:`inkling_kernels.fused_sconv`, and both streams live in the same
packed per-layer cache (K at column offset 0, V at ``head_dim``; docs/design.md §2.2).
:func:`fused_sconv_kv` takes k and v as the column slices of the projection output
(no copy), stores both streams' rows into their slots and convolves both, in one
launch whose programs resolve each row's taps once for the two streams.

- :func:`fused_sconv_kv` — the op, on a step's :class:`~inkling_kernels.SconvBatch`;
- :mod:`.kernel` — the launcher (the kernel is :mod:`inkling_kernels.sconv`'s, with two
  streams); :mod:`.reference` — the reference: two ``fused_sconv`` reference calls.

Registered as ``torch.ops.inkling.fused_sconv_kv`` (mutating ``cache``) with a fake
implementation, so it sits inside torch.compile'd, CUDA-graph-captured models.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from .._dispatch import run_op, uses_triton
from ..batch import OP_SCHEMA, SconvBatch
from ..checks import SconvProblem, check_kv_call
from ..sconv import _interpreter_config
from .reference import fused_sconv_kv_ref, reference_fused_sconv_kv

__all__ = ["fused_sconv_kv", "fused_sconv_kv_ref"]


@torch.library.custom_op(
    "inkling::fused_sconv_kv",
    mutates_args=("cache",),
    schema=f"(Tensor k, Tensor v, Tensor k_weight, Tensor v_weight, Tensor(a!) cache, {OP_SCHEMA}, "
    "SymInt k_offset, SymInt v_offset, SymInt head_dim, str? activation, bool residual) -> (Tensor, Tensor)",
)
def _fused_sconv_kv_op(
    k: torch.Tensor, v: torch.Tensor, k_weight: torch.Tensor, v_weight: torch.Tensor, cache: torch.Tensor, *args: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    batch, (k_offset, v_offset, head_dim, activation, residual) = SconvBatch.split_op_args(args)
    probs = (SconvProblem.of(k, k_weight, cache), SconvProblem.of(v, v_weight, cache))  # checked by fused_sconv_kv
    if not uses_triton(k.device):
        return reference_fused_sconv_kv(k, v, cache, batch, probs, k_offset, v_offset, head_dim, activation, residual)
    from .kernel import launch_fused_sconv_kv  # Triton is only needed off the CPU path

    return launch_fused_sconv_kv(
        k, v, cache, batch, probs, k_offset, v_offset, head_dim, activation, residual,
        config=_interpreter_config(k),  # type: ignore[arg-type]
    )


@_fused_sconv_kv_op.register_fake
def _fused_sconv_kv_fake(
    k: torch.Tensor, v: torch.Tensor, k_weight: torch.Tensor, v_weight: torch.Tensor, cache: torch.Tensor, *args: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    batch, rest = SconvBatch.split_op_args(args, check=True)
    check_kv_call(k, v, k_weight, v_weight, cache, batch, *rest)
    return k.new_empty(k.shape), v.new_empty(v.shape)


def fused_sconv_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_weight: torch.Tensor,
    v_weight: torch.Tensor,
    cache: torch.Tensor,
    batch: SconvBatch,
    k_offset: int,
    v_offset: int,
    head_dim: int,
    *,
    activation: Optional[str] = None,
    residual: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The K and V paged short convs of one layer in one launch.

    Equal to ``fused_sconv(k.contiguous(), k_weight, cache, batch, k_offset, head_dim)``
    followed by the same for v at ``v_offset``, without the copies and with one launch.

    Args:
        k, v: [T, H*head_dim] each, bf16/fp16/fp32 (the cache's dtype), unit column
            stride and any row stride whose rows do not overlap: the column slices of
            the QKV projection output (``qkv.split([q, kv, kv], -1)``) as they are, or
            contiguous tensors. Row t is token t of ``batch``.
        k_weight, v_weight: (H*head_dim, W) or (H*head_dim, 1, W) each, fp32 or the
            activation dtype, one W (the batch's ``kernel_size`` when it names one).
        cache: [num_blocks, H, N, D], D stride 1 (page-strided views are fine);
            ``N = batch.block_size``. Mutated: each valid slot's ``[k_offset, +head_dim)``
            range receives its row of k and ``[v_offset, +head_dim)`` its row of v.
        batch: the step's :class:`~inkling_kernels.SconvBatch`, with or without its tap map.
        k_offset, v_offset: the streams' offsets inside D (the packed layout: 0 and
            ``head_dim``); the two ranges must not overlap.
        head_dim: the width of each stream per head.
        activation, residual: as for :func:`inkling_kernels.fused_sconv`, for both streams.

    Returns:
        ``(k_out, v_out)``: new contiguous [T, H*head_dim] tensors in the activation dtype.

    One host check of the whole launch (:func:`inkling_kernels.checks.check_kv_call`)
    before anything runs; the same semantics as ``fused_sconv`` for each stream,
    including the same-step hazard ("insert the whole batch, then convolve").
    """
    check_kv_call(k, v, k_weight, v_weight, cache, batch, k_offset, v_offset, head_dim, activation, residual)
    return run_op(  # type: ignore[no-any-return]
        _fused_sconv_kv_op, k, v, k_weight, v_weight, cache, *batch.op_args(), k_offset, v_offset, head_dim,
        activation, residual,
    )

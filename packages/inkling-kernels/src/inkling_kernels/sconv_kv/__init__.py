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
from ..checks import SconvProblem, check_kv_call, outputs_for
from ..sconv import _interpreter_config
from .reference import fused_sconv_kv_ref, reference_fused_sconv_kv

__all__ = ["fused_sconv_kv", "fused_sconv_kv_ref"]


# The op writes its results into ``k_out`` and ``v_out`` (allocated by fused_sconv_kv
# or passed by its caller), so it returns nothing.
@torch.library.custom_op(
    "inkling::fused_sconv_kv",
    mutates_args=("cache", "k_out", "v_out"),
    schema=f"(Tensor k, Tensor v, Tensor k_weight, Tensor v_weight, Tensor(a!) cache, {OP_SCHEMA}, "
    "SymInt k_offset, SymInt v_offset, SymInt head_dim, str? activation, bool residual, Tensor(b!) k_out, "
    "Tensor(c!) v_out) -> ()",
)
def _fused_sconv_kv_op(
    k: torch.Tensor, v: torch.Tensor, k_weight: torch.Tensor, v_weight: torch.Tensor, cache: torch.Tensor, *args: Any
) -> None:
    batch, (k_offset, v_offset, head_dim, activation, residual, k_out, v_out) = SconvBatch.split_op_args(args)
    probs = (SconvProblem.of(k, k_weight, cache), SconvProblem.of(v, v_weight, cache))  # checked by fused_sconv_kv
    _run(k, v, cache, batch, probs, k_offset, v_offset, head_dim, activation, residual, k_out, v_out)


def _run(
    k: torch.Tensor, v: torch.Tensor, cache: torch.Tensor, batch: SconvBatch,
    probs: tuple[SconvProblem, SconvProblem], k_offset: int, v_offset: int, head_dim: int,
    activation: Optional[str], residual: bool, k_out: torch.Tensor, v_out: torch.Tensor,
) -> None:
    """The op's work on checked arguments (``probs`` from the checks)."""
    if not uses_triton(k.device):
        k_new, v_new = reference_fused_sconv_kv(
            k, v, cache, batch, probs, k_offset, v_offset, head_dim, activation, residual
        )
        k_out.copy_(k_new)
        v_out.copy_(v_new)
        return
    from .kernel import launch_fused_sconv_kv  # Triton is only needed off the CPU path

    launch_fused_sconv_kv(
        k, v, cache, batch, probs, k_offset, v_offset, head_dim, activation, residual,
        config=_interpreter_config(k), out=(k_out, v_out),  # type: ignore[arg-type]
    )


@_fused_sconv_kv_op.register_fake
def _fused_sconv_kv_fake(
    k: torch.Tensor, v: torch.Tensor, k_weight: torch.Tensor, v_weight: torch.Tensor, cache: torch.Tensor, *args: Any
) -> None:
    batch, (*rest, k_out, v_out) = SconvBatch.split_op_args(args, check=True)
    check_kv_call(k, v, k_weight, v_weight, cache, batch, *rest)
    outputs_for("out", (k_out, v_out), k)


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
    out: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
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
        out: where to write the results: ``(k_out, v_out)``, two distinct contiguous
            [T, H*head_dim] tensors in the activation dtype on k's device, sharing no
            memory with the inputs or each other (checked); by default two new ones.

    Returns:
        ``(k_out, v_out)``: contiguous [T, H*head_dim] tensors in the activation dtype.

    One host check of the whole launch (:func:`inkling_kernels.checks.check_kv_call`)
    before anything runs; the same semantics as ``fused_sconv`` for each stream,
    including the same-step hazard ("insert the whole batch, then convolve").
    """
    probs = check_kv_call(k, v, k_weight, v_weight, cache, batch, k_offset, v_offset, head_dim, activation, residual)
    k_out, v_out = outputs_for(
        "out", out, k, (("k", k), ("v", v), ("k_weight", k_weight), ("v_weight", v_weight), ("cache", cache))
    )
    run_op(
        _fused_sconv_kv_op, k, v, k_weight, v_weight, cache, *batch.op_args(), k_offset, v_offset, head_dim,
        activation, residual, k_out, v_out,
        direct=lambda: _run(k, v, cache, batch, probs, k_offset, v_offset, head_dim, activation, residual, k_out, v_out),
    )
    return k_out, v_out

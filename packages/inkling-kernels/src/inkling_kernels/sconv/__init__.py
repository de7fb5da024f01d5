"""``fused_sconv``: store + depthwise causal short conv of one stream of the packed
paged cache, in one launch (docs/design.md §3).

- :func:`fused_sconv` — the op, on a step's :class:`~inkling_kernels.SconvBatch`;
- :mod:`.kernel` — the Triton kernel and its launcher; :mod:`.reference` — the fp32
  PyTorch reference (the CPU path) and ``causal_conv_ref``.

Registered as ``torch.ops.inkling.fused_sconv`` (mutating ``cache``) with a fake
implementation, so it sits inside torch.compile'd, CUDA-graph-captured models.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from .._dispatch import run_op, uses_triton
from ..batch import OP_SCHEMA, SconvBatch
from ..checks import SconvProblem, check_conv_call, output_for
from .reference import causal_conv_ref, fused_sconv_ref, reference_fused_sconv

__all__ = ["causal_conv_ref", "fused_sconv", "fused_sconv_ref"]


def _interpreter_config(x: torch.Tensor) -> object:
    """Large tiles for CPU tensors under the interpreter (its cost is per program)."""
    if x.device.type != "cpu":
        return None
    from .kernel import SconvConfig

    return SconvConfig(block_t=32, block_c=128, num_warps=4)


# The batch travels as SconvBatch.op_args() (OP_SCHEMA); no defaults: every argument
# is always passed. The op writes its result into ``out`` (allocated by fused_sconv or
# passed by its caller), so it returns nothing.
@torch.library.custom_op(
    "inkling::fused_sconv",
    mutates_args=("cache", "out"),
    schema=f"(Tensor x, Tensor weight, Tensor(a!) cache, {OP_SCHEMA}, SymInt stream_offset, "
    "SymInt stream_width, str? activation, bool residual, Tensor(b!) out) -> ()",
)
def _fused_sconv_op(x: torch.Tensor, weight: torch.Tensor, cache: torch.Tensor, *args: Any) -> None:
    batch, (stream_offset, stream_width, activation, residual, out) = SconvBatch.split_op_args(args)
    prob = SconvProblem.of(x, weight, cache)  # checked by fused_sconv
    _run(x, cache, batch, prob, stream_offset, stream_width, activation, residual, out)


def _run(x: torch.Tensor, cache: torch.Tensor, batch: SconvBatch, prob: SconvProblem, stream_offset: int,
         stream_width: int, activation: Optional[str], residual: bool, out: torch.Tensor) -> None:
    """The op's work on checked arguments (``prob`` from the checks)."""
    if not uses_triton(x.device):
        out.copy_(reference_fused_sconv(x, cache, batch, prob, stream_offset, stream_width, activation, residual))
        return
    from .kernel import launch_fused_sconv  # Triton is only needed off the CPU path

    launch_fused_sconv(
        x, cache, batch, prob, stream_offset, stream_width, activation, residual,
        config=_interpreter_config(x), out=out,  # type: ignore[arg-type]
    )


@_fused_sconv_op.register_fake
def _fused_sconv_fake(x: torch.Tensor, weight: torch.Tensor, cache: torch.Tensor, *args: Any) -> None:
    batch, (*rest, out) = SconvBatch.split_op_args(args, check=True)
    check_conv_call(x, weight, cache, batch, *rest)
    output_for("out", out, x)


def fused_sconv(
    x: torch.Tensor,
    weight: torch.Tensor,
    cache: torch.Tensor,
    batch: SconvBatch,
    stream_offset: int,
    stream_width: int,
    *,
    activation: Optional[str] = None,
    residual: bool = True,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Fused paged short conv of one stream of a packed cache (one launch per call).

    Args:
        x: [T, H*stream_width] bf16/fp16/fp32, contiguous; row t is token t of ``batch``.
        weight: (H*stream_width, W) or (H*stream_width, 1, W), fp32 or x.dtype;
            ``weight[:, W-1]`` multiplies the current token. Any W >= 2 (the batch's
            ``kernel_size`` when it names one).
        cache: [num_blocks, H, N, D], x.dtype, D stride 1 (page-strided views are
            fine); ``N`` must be ``batch.block_size``. Mutated: each valid slot's
            ``[stream_offset, +stream_width)`` range receives its row of x.
        batch: the step's :class:`~inkling_kernels.SconvBatch` (validated when built).
        stream_offset, stream_width: the stream's range inside D.
        activation: None or "silu", applied to the conv sum (before the residual).
        residual: add x: ``out = x + act(conv)``; else ``out = act(conv)``.
        out: where to write the result: a contiguous [T, H*stream_width] tensor in
            x.dtype on x's device, sharing no memory with the inputs (checked); by
            default a new one.

    Returns:
        out: [T, H*stream_width] in x.dtype.

    Checks the launch once (:func:`inkling_kernels.checks.check_conv_call`). With the
    batch's tap map the CUDA kernel reads each tap's source from it; without one it
    resolves the taps itself (large launches build a map for the call). Same-step
    prefix hits are exact in any batch order and at any alignment on every path.
    Preconditions: a request's rows are contiguous with consecutive positions; taps
    inside the window resolve through valid block-table entries.
    """
    prob = check_conv_call(x, weight, cache, batch, stream_offset, stream_width, activation, residual)
    out = output_for("out", out, x, (("x", x), ("weight", weight), ("cache", cache)))
    run_op(
        _fused_sconv_op, x, weight, cache, *batch.op_args(), stream_offset, stream_width, activation, residual, out,
        direct=lambda: _run(x, cache, batch, prob, stream_offset, stream_width, activation, residual, out),
    )
    return out

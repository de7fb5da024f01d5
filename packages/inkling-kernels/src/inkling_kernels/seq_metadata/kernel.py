"""Triton kernel and typed launcher for ``sconv_seq_metadata``.

One launch fills ``num_padded_tokens`` rows; pad rows get 0. Each row finds its
request (the largest ``r < num_reqs`` with ``query_start_loc[r] <= row``) by binary
lifting over ``query_start_loc``: log2(R) dependent loads of a tiny array that stays
in L1, and two registers per row. 64-row programs up to 4096 rows (more programs in
flight), 256-row ones above.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton_common import cdiv
from ..checks import check_seq_metadata_args

__all__ = ["seq_metadata_block", "sconv_seq_metadata_triton"]


@triton.jit(do_not_specialize=["num_reqs", "num_actual_tokens", "num_padded_tokens", "top_step"])
def _seq_metadata_kernel(
    qsl_ptr,
    seq_out_ptr,
    qs_out_ptr,
    num_reqs,
    num_actual_tokens,
    num_padded_tokens,
    top_step,
    BLOCK: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    active = rows < num_actual_tokens
    t = rows.to(tl.int64)
    r = tl.zeros([BLOCK], dtype=tl.int32)
    # Binary lifting: try r + step for step = top_step, top_step/2, ..., 1.
    # (a while loop: the interpreter cannot range() over a runtime int with
    # NumPy >= 2.4)
    step = top_step
    while step > 0:
        cand = r + step
        ok = active & (cand < num_reqs)
        v = tl.load(qsl_ptr + cand, mask=ok, other=0).to(tl.int64)
        r = tl.where(ok & (v <= t), cand, r)
        step = step // 2
    start = tl.load(qsl_ptr + r, mask=active, other=0)
    keep = rows < num_padded_tokens
    tl.store(seq_out_ptr + rows, tl.where(active, r, 0), mask=keep)
    tl.store(qs_out_ptr + rows, tl.where(active, start, 0).to(tl.int32), mask=keep)


def seq_metadata_block(num_padded_tokens: int) -> int:
    """Rows per program of the default launch: 64 up to 4096 rows, 256 above."""
    return 64 if num_padded_tokens <= 4096 else 256


def launch_sconv_seq_metadata(
    query_start_loc: torch.Tensor,
    num_reqs: int,
    num_actual_tokens: int,
    seq_idx_out: torch.Tensor,
    query_start_out: torch.Tensor,
    num_padded_tokens: int,
    *,
    block: int | None = None,
) -> None:
    """Launch on checked arguments (CUDA, or CPU tensors under ``TRITON_INTERPRET=1``);
    ``block`` (rows per program, a power of two) overrides the heuristic."""
    if num_padded_tokens == 0:
        return
    top_step = 1 << ((num_reqs - 1).bit_length() - 1) if num_reqs > 1 else 0
    block = block or seq_metadata_block(num_padded_tokens)
    if block & (block - 1):
        raise ValueError(f"block must be a power of two, got {block}")
    grid = (cdiv(num_padded_tokens, block),)
    _seq_metadata_kernel[grid](
        query_start_loc, seq_idx_out, query_start_out,
        num_reqs, num_actual_tokens, num_padded_tokens, top_step,
        BLOCK=block, num_warps=4,
    )


def sconv_seq_metadata_triton(
    query_start_loc: torch.Tensor,
    num_reqs: int,
    num_actual_tokens: int,
    seq_idx_out: torch.Tensor,
    query_start_out: torch.Tensor,
    num_padded_tokens: int,
    *,
    block: int | None = None,
) -> None:
    """Check and launch directly, whatever the device (tests, benchmarks). Same
    contract as :func:`inkling_kernels.sconv_seq_metadata`."""
    check_seq_metadata_args(
        query_start_loc, num_reqs, num_actual_tokens, seq_idx_out, query_start_out,
        num_padded_tokens,
    )
    launch_sconv_seq_metadata(
        query_start_loc, num_reqs, num_actual_tokens, seq_idx_out, query_start_out,
        num_padded_tokens, block=block,
    )

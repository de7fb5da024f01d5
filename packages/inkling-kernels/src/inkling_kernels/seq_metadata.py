"""Triton kernel and typed launcher for ``sconv_seq_metadata``.

One launch fills ``num_padded_tokens`` rows: each program takes ``BLOCK`` rows and
counts, over ``query_start_loc`` in chunks of ``RCHUNK`` requests, how many request
starts (after the first) lie at or before each row; the largest such start is the
row's ``query_start``. One pass, no dependent gathers (a binary search would chain
log2(R) dependent loads). Pad rows get 0.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._validation import check_seq_metadata_args

__all__ = ["sconv_seq_metadata_triton"]


@triton.jit(do_not_specialize=["num_reqs", "num_actual_tokens", "num_padded_tokens"])
def _seq_metadata_kernel(
    qsl_ptr,
    seq_out_ptr,
    qs_out_ptr,
    num_reqs,
    num_actual_tokens,
    num_padded_tokens,
    BLOCK: tl.constexpr,
    RCHUNK: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    active = rows < num_actual_tokens
    t = rows.to(tl.int64)
    seq = tl.zeros([BLOCK], dtype=tl.int32)
    first = tl.load(qsl_ptr, mask=num_actual_tokens > 0, other=0).to(tl.int64)
    start = tl.full([BLOCK], 0, tl.int64) + first
    if tl.max(active.to(tl.int32), axis=0) > 0:
        # (a while loop: the interpreter cannot range() over a runtime int with
        # NumPy >= 2.4)
        r0 = 1
        while r0 < num_reqs:
            r = r0 + tl.arange(0, RCHUNK)
            v = tl.load(qsl_ptr + r, mask=r < num_reqs, other=0).to(tl.int64)
            le = (v[None, :] <= t[:, None]) & (r < num_reqs)[None, :]
            seq += tl.sum(le.to(tl.int32), axis=1)
            start = tl.maximum(start, tl.max(tl.where(le, v[None, :], first), axis=1))
            r0 += RCHUNK
    seq = tl.where(active, seq, 0)
    start = tl.where(active, start, 0)
    keep = rows < num_padded_tokens
    tl.store(seq_out_ptr + rows, seq, mask=keep)
    tl.store(qs_out_ptr + rows, start.to(tl.int32), mask=keep)


def sconv_seq_metadata_triton(
    query_start_loc: torch.Tensor,
    num_reqs: int,
    num_actual_tokens: int,
    seq_idx_out: torch.Tensor,
    query_start_out: torch.Tensor,
    num_padded_tokens: int,
) -> None:
    """Validate and launch (CUDA, or CPU tensors under ``TRITON_INTERPRET=1``).
    Same contract as :func:`inkling_kernels.sconv_seq_metadata`."""
    check_seq_metadata_args(
        query_start_loc, num_reqs, num_actual_tokens, seq_idx_out, query_start_out,
        num_padded_tokens,
    )
    if num_padded_tokens == 0:
        return
    block = 256 if num_padded_tokens <= 4096 else 1024
    grid = (triton.cdiv(num_padded_tokens, block),)
    _seq_metadata_kernel[grid](
        query_start_loc, seq_idx_out, query_start_out,
        num_reqs, num_actual_tokens, num_padded_tokens,
        BLOCK=block, RCHUNK=64 if block == 256 else 16,
        num_warps=4,
    )

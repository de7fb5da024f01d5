"""Triton kernel and typed launcher for ``sconv_seq_metadata``.

One launch fills ``num_padded_tokens`` rows; pad rows get 0. A row's request is the
largest ``r < num_reqs`` with ``query_start_loc[r] <= row``. Up to 257 requests
each program loads the request starts once (one coalesced load, no dependent chain)
and counts, per row, the starts ``query_start_loc[1:num_reqs]`` at or below it (int32
compares, one pass); the largest such start is the row's ``query_start``. Beyond that
each row binary-lifts over ``query_start_loc``: log2(R) dependent loads of a tiny
array.

(A first version compared each row with every request start in [rows x chunk]
tiles; it spilled registers and took ~80 µs for 256 requests on an H200.)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._validation import check_seq_metadata_args

__all__ = ["COUNT_MAX_REQS", "sconv_seq_metadata_triton"]

COUNT_MAX_REQS = 257  # one pass over <= 256 request starts


@triton.jit(do_not_specialize=["num_reqs", "num_actual_tokens", "num_padded_tokens"])
def _seq_metadata_count_kernel(
    qsl_ptr,
    seq_out_ptr,
    qs_out_ptr,
    num_reqs,
    num_actual_tokens,
    num_padded_tokens,
    BLOCK: tl.constexpr,
    RCHUNK: tl.constexpr,
):
    # One pass: RCHUNK >= num_reqs - 1 request starts, compared as int32 (every start
    # below num_reqs is <= num_actual_tokens < 2**31).
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    active = rows < num_actual_tokens
    first = tl.load(qsl_ptr).to(tl.int32)  # query_start_loc[0] (0 in practice)
    j = 1 + tl.arange(0, RCHUNK)
    live = j < num_reqs
    v = tl.load(qsl_ptr + j, mask=live, other=0).to(tl.int32)
    below = live[None, :] & (v[None, :] <= rows[:, None])
    count = tl.sum(below.to(tl.int32), axis=1)
    start = tl.maximum(tl.max(tl.where(below, v[None, :], first), axis=1), first)
    keep = rows < num_padded_tokens
    tl.store(seq_out_ptr + rows, tl.where(active, count, 0), mask=keep)
    tl.store(qs_out_ptr + rows, tl.where(active, start, 0), mask=keep)


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


def sconv_seq_metadata_triton(
    query_start_loc: torch.Tensor,
    num_reqs: int,
    num_actual_tokens: int,
    seq_idx_out: torch.Tensor,
    query_start_out: torch.Tensor,
    num_padded_tokens: int,
    *,
    method: str | None = None,
    block: int | None = None,
) -> None:
    """Validate and launch (CUDA, or CPU tensors under ``TRITON_INTERPRET=1``).
    Same contract as :func:`inkling_kernels.sconv_seq_metadata`; ``method``
    ("count" | "lift") and ``block`` (rows per program) override the heuristic
    (benchmarks, tests)."""
    check_seq_metadata_args(
        query_start_loc, num_reqs, num_actual_tokens, seq_idx_out, query_start_out,
        num_padded_tokens,
    )
    if num_padded_tokens == 0:
        return
    if method is None:
        method = "count" if num_reqs <= COUNT_MAX_REQS else "lift"
    if method == "count":
        if num_reqs > COUNT_MAX_REQS:
            raise ValueError(f"the counting kernel takes at most {COUNT_MAX_REQS} requests")
        rchunk = max(16, 1 << max(num_reqs - 2, 0).bit_length())  # >= num_reqs - 1
        block = block or max(16, min(128, 4096 // rchunk))
        _seq_metadata_count_kernel[(triton.cdiv(num_padded_tokens, block),)](
            query_start_loc, seq_idx_out, query_start_out,
            num_reqs, num_actual_tokens, num_padded_tokens,
            BLOCK=block, RCHUNK=rchunk, num_warps=4,
        )
        return
    top_step = 1 << ((num_reqs - 1).bit_length() - 1) if num_reqs > 1 else 0
    block = block or 256
    grid = (triton.cdiv(num_padded_tokens, block),)
    _seq_metadata_kernel[grid](
        query_start_loc, seq_idx_out, query_start_out,
        num_reqs, num_actual_tokens, num_padded_tokens, top_step,
        BLOCK=block, num_warps=4,
    )

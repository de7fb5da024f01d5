"""Triton kernel and typed launcher for ``sconv_seq_metadata``.

One launch fills ``num_padded_tokens`` rows; pad rows get 0. A row's request is the
largest ``r < num_reqs`` with ``query_start_loc[r] <= row``. Up to
``COUNT_MAX_REQS`` requests, each program loads the request starts once (one
coalesced load, no dependent chain) and counts, per row, the starts
``query_start_loc[1:num_reqs]`` at or below it; the largest such start is the row's
``query_start``. Beyond that (counting is O(T x R)) each row binary-lifts over
``query_start_loc``: log2(R) dependent loads of a tiny array.

(A first version compared each row with every request start in [rows x chunk]
tiles; it spilled registers and took ~80 µs for 256 requests on an H200.)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._validation import check_seq_metadata_args

__all__ = ["COUNT_MAX_REQS", "sconv_seq_metadata_triton"]

COUNT_MAX_REQS = 512


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
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    active = rows < num_actual_tokens
    t = rows.to(tl.int64)
    first = tl.load(qsl_ptr).to(tl.int64)  # query_start_loc[0] (0 in practice)
    count = tl.zeros([BLOCK], dtype=tl.int32)
    start = tl.zeros([BLOCK], dtype=tl.int64) + first
    # (a while loop: the interpreter cannot range() over a runtime int with
    # NumPy >= 2.4); one iteration up to RCHUNK + 1 requests
    j0 = 1
    while j0 < num_reqs:
        j = j0 + tl.arange(0, RCHUNK)
        v = tl.load(qsl_ptr + j, mask=j < num_reqs, other=0).to(tl.int64)
        below = (j < num_reqs)[None, :] & (v[None, :] <= t[:, None])
        count += tl.sum(below.to(tl.int32), axis=1)
        start = tl.maximum(start, tl.max(tl.where(below, v[None, :], first), axis=1))
        j0 += RCHUNK
    keep = rows < num_padded_tokens
    tl.store(seq_out_ptr + rows, tl.where(active, count, 0), mask=keep)
    tl.store(qs_out_ptr + rows, tl.where(active, start, 0).to(tl.int32), mask=keep)


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
) -> None:
    """Validate and launch (CUDA, or CPU tensors under ``TRITON_INTERPRET=1``).
    Same contract as :func:`inkling_kernels.sconv_seq_metadata`."""
    check_seq_metadata_args(
        query_start_loc, num_reqs, num_actual_tokens, seq_idx_out, query_start_out,
        num_padded_tokens,
    )
    if num_padded_tokens == 0:
        return
    if num_reqs <= COUNT_MAX_REQS:
        rchunk = max(16, min(256, 1 << max(num_reqs - 2, 0).bit_length()))  # one pass up to 257 requests
        block = 32 if rchunk >= 128 else 128
        _seq_metadata_count_kernel[(triton.cdiv(num_padded_tokens, block),)](
            query_start_loc, seq_idx_out, query_start_out,
            num_reqs, num_actual_tokens, num_padded_tokens,
            BLOCK=block, RCHUNK=rchunk, num_warps=4,
        )
        return
    top_step = 1 << ((num_reqs - 1).bit_length() - 1) if num_reqs > 1 else 0
    block = 256
    grid = (triton.cdiv(num_padded_tokens, block),)
    _seq_metadata_kernel[grid](
        query_start_loc, seq_idx_out, query_start_out,
        num_reqs, num_actual_tokens, num_padded_tokens, top_step,
        BLOCK=block, num_warps=4,
    )

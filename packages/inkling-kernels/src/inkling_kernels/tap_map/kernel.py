"""Triton kernels and typed launcher for ``sconv_tap_map`` (the per-step tap map).

The map resolves, once per step and KV-cache group, where every earlier tap of every
row comes from, so that the (4 x layers) ``fused_sconv`` launches of the step do no
address arithmetic through the block table and no same-step hazard search: a row
loads its ``W-1`` codes and then its taps, one dependent load instead of three.

Codes (int64), entry ``[t, k]`` = the tap at distance ``k + 1`` of row ``t``:

- ``-1``: no tap (before the sequence start, or an unusable block-table entry);
- ``-(r + 2)``: row ``r`` of ``x`` (the tap lies in this forward);
- ``s + ((u + 1) << 32)`` with ``0 <= s < 2**31``: a pre-forward tap in cache slot
  ``s``; ``u >= 0`` is the row of this call that writes slot ``s`` (the same-step
  prefix hit of docs/design.md §3.2: the tap is read from ``x[u]``), ``u = -1`` when no
  row does (the tap is read from the cache).

Two launches, both with grids that depend only on T: the first writes every row's
codes (pre-forward taps with ``u = -1``); the second, over (map-entry tiles x slot
spans), compares the pre-forward slots of its entries with its span of
``slot_mapping`` (int32 compares) and raises the matching entries with ``atomic_max``
(the writer code is larger than the plain one; the largest writer row wins when
several rows name one slot: the hazard rule of :mod:`inkling_kernels._triton_common`,
whose tap resolution the first launch shares). Tiles with no pre-forward tap (the
inside of a prefill) leave after one load. Exact for any same-step hit, block-aligned
or not.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton_common import cdiv, match_rows, pow2_ceil, resolve_taps
from ..batch import SconvBatch
from ..checks import check_tap_map_call

__all__ = ["hazard_tiles", "sconv_tap_map_triton"]


@triton.jit(do_not_specialize=["num_tokens", "num_reqs", "max_blocks"])
def _tap_map_base_kernel(
    pos_ptr,
    table_ptr,
    seq_ptr,
    qs_ptr,
    map_ptr,
    num_tokens,
    num_reqs,
    max_blocks,
    stride_table,
    N: tl.constexpr,
    TAPS: tl.constexpr,
    WP: tl.constexpr,
    BLOCK_R: tl.constexpr,
    SKIP_EMPTY: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < num_tokens
    rows64 = rows.to(tl.int64)
    pos = tl.load(pos_ptr + rows, mask=rmask, other=0).to(tl.int64)
    qs = tl.load(qs_ptr + rows, mask=rmask, other=0).to(tl.int64)
    seq = tl.load(seq_ptr + rows, mask=rmask, other=0).to(tl.int64)
    kk = tl.arange(0, WP)
    live = rmask[:, None] & (kk < TAPS)[None, :]
    trow, in_fwd, pslot = resolve_taps(
        pos, rows64, qs, seq, live, (kk + 1).to(tl.int64),
        table_ptr, num_reqs, max_blocks, stride_table, 2147483648, N, SKIP_EMPTY,
    )
    code = tl.where(in_fwd, -(trow + 2), pslot)
    tl.store(map_ptr + rows64[:, None] * TAPS + kk[None, :], code, mask=live)


@triton.jit(do_not_specialize=["num_tokens"])
def _tap_map_hazard_kernel(
    slot_ptr,
    map_ptr,
    num_tokens,
    TAPS: tl.constexpr,
    KEYS: tl.constexpr,
    CHUNK: tl.constexpr,
    SPAN: tl.constexpr,
):
    # KEYS consecutive map entries (KEYS / TAPS rows' taps, flattened) against
    # SPAN slots of slot_mapping, CHUNK at a time, compared as int32.
    idx = tl.program_id(0).to(tl.int64) * KEYS + tl.arange(0, KEYS)
    live = idx < num_tokens * TAPS
    code = tl.load(map_ptr + idx, mask=live, other=-1)
    pre = code >= 0  # a pre-forward slot (< 2**31, no writer yet)
    if tl.sum(pre.to(tl.int32), axis=0) > 0:
        key = tl.where(pre, code, -2).to(tl.int32)  # -2 never equals a slot below
        # Elementwise running max over the span, reduced across slots once at the
        # end: the loop body holds no cross-thread reduction.
        best = tl.full([KEYS, CHUNK], -1, tl.int32)
        span0 = tl.program_id(1) * SPAN
        for c in tl.static_range(SPAN // CHUNK):
            srows = span0 + c * CHUNK + tl.arange(0, CHUNK)
            sval = tl.load(slot_ptr + srows, mask=srows < num_tokens, other=-1).to(tl.int64)
            sval = tl.where((sval >= 0) & (sval <= 2147483647), sval, -1).to(tl.int32)
            best = tl.maximum(best, match_rows(key, sval, srows))
        hit = tl.max(best, axis=1)
        found = pre & (hit >= 0)
        tl.atomic_max(map_ptr + idx, code + ((hit.to(tl.int64) + 1) << 32), mask=live & found)


def hazard_tiles(num_tokens: int) -> tuple[int, int, int]:
    """(KEYS, CHUNK, SPAN) of the hazard pass: KEYS map entries against CHUNK slots
    at a time (a [KEYS, CHUNK] running max, <= 64 int32 per thread on four warps), SPAN
    slots per program. The grid is (T * (W-1) / KEYS) x (T / SPAN) programs; those
    whose entries hold no pre-forward slot (most of a prefill) leave after one load,
    so long batches take wider key tiles and spans (fewer programs)."""
    # (tiles chosen by a GPU sweep; benchmarks/run.py times the result)
    if num_tokens <= 4096:
        keys, chunk, span = 32, 128, 512
    else:
        keys, chunk, span = 128, 64, 1024
    return keys, chunk, max(chunk, min(span, pow2_ceil(num_tokens)))


def launch_sconv_tap_map(batch: SconvBatch, kernel_size: int, tap_map_out: torch.Tensor) -> None:
    """Fill ``tap_map_out[:T]`` for ``batch`` (checked) and kernel size ``kernel_size``
    (two launches; CUDA, or CPU tensors under ``TRITON_INTERPRET=1``)."""
    num_tokens = batch.num_tokens
    if num_tokens == 0:
        return
    taps = kernel_size - 1
    table = batch.block_table
    _tap_map_base_kernel[(cdiv(num_tokens, 64),)](
        batch.positions, table, batch.seq_idx, batch.query_start, tap_map_out,
        num_tokens, table.shape[0], table.shape[1], table.stride(0),
        # No early exit for tiles without pre-forward taps: the tile-wide reduction
        # it takes costs decode batches more than the masked table load costs a
        # prefill tile.
        N=batch.block_size, TAPS=taps, WP=pow2_ceil(taps), BLOCK_R=64, SKIP_EMPTY=False, num_warps=4,
    )
    keys, chunk, span = hazard_tiles(num_tokens)
    grid = (cdiv(num_tokens * taps, keys), cdiv(num_tokens, span))
    _tap_map_hazard_kernel[grid](
        batch.slot_mapping, tap_map_out, num_tokens,
        TAPS=taps, KEYS=keys, CHUNK=chunk, SPAN=span, num_warps=4,
    )


def sconv_tap_map_triton(batch: SconvBatch, tap_map_out: torch.Tensor) -> SconvBatch:
    """Check and launch the Triton kernels directly, whatever the device. Same
    contract as :func:`inkling_kernels.sconv_tap_map`."""
    kernel_size = check_tap_map_call(batch, tap_map_out)
    launch_sconv_tap_map(batch, kernel_size, tap_map_out)
    return batch._replace_unchecked(tap_map=tap_map_out[: batch.num_tokens])  # checked above

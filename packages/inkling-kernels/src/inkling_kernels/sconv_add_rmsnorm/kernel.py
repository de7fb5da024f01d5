"""Triton kernels and launchers for ``fused_sconv_add_rmsnorm`` and ``fused_sconv_add``
(in each kernel the constexpr ``HAS_NORM`` switches the norm off for the latter).

Two kernels: the tile kernel below, and the row-register kernel of
:mod:`.rows_kernel` (``NormConfig.rows``), the default for mapped prompt launches
(:func:`rows_norm_config`: at least 1024 rows, mostly prompt rows or at least 8 rows a
request; ``sconv.kernel.rows_batch``). This docstring
describes the tile kernel.

Tiling: a row's ``C = H * stream_width`` channels are cut into ``NCH`` chunks of
``[BLOCK_H heads, BLOCK_J channels of each head's stream range]`` (cache addresses
contiguous along ``j``: vector loads and stores; ``stream_width`` need not be a power
of two, the last ``j`` chunk of a head is masked). The grid is
``(cdiv(T, BLOCK_T), SPLIT)``: program ``(p, s)`` owns rows ``p*BLOCK_T ..`` and the
chunks ``s, s + SPLIT, s + 2*SPLIT, ...`` of them. It depends only on T; nothing but
the two outputs is allocated per call and nothing syncs with the host, so the launch
replays under CUDA graphs.

Per program:

0. resolve the ``W-1`` earlier taps of each row once: an in-forward tap names a row
   of ``d``; a pre-forward tap a cache slot through the block table (the batch's tap
   map says so directly when it has one). Same-step hazard, by the rule every kernel
   shares (:mod:`inkling_kernels._triton_common`): a pre-forward slot that a row of
   this very launch writes (a same-step prefix hit) is looked up in ``slot_mapping``
   and read from that writer's row of ``d`` instead of the cache, so the result
   equals "insert the whole batch, then convolve" in any program order;
1. per chunk (a static loop: the chunks stay in registers): load ``d`` and
   ``hidden``, store ``d`` into the rows' slots, form the W taps (fp32),
   ``s = dt(d + conv)``, ``new_h = dt(hidden + s)``; store ``new_h``, keep it, and
   add up its squares;
2. ``SPLIT == 1`` (the program has the whole row): ``rstd = 1 / sqrt(mean + eps)``,
   then ``normed = dt(norm_weight * dt(new_h * rstd))`` from the kept chunks (no
   re-read). ``SPLIT > 1`` (``BLOCK_T == 1``; small batches, so that a row's channels
   spread over SPLIT SMs): the program stores its partial sum of squares in a
   per-row fp32 slot of a scratch buffer and takes a ticket (an atomic add on the
   row's counter, after a block barrier; acquire-release at GPU scope). The program
   drawing the last ticket sums the SPLIT partials in a fixed order (deterministic),
   resets the counter to 0 (the buffer is ready for the next launch: graph replays
   need no memset) and normalises the whole row, reading ``new_h`` back from L2.

Without the norm (``HAS_NORM`` off, ``fused_sconv_add``: the conv + residual add on
a rank's channel shard at tp > 1): steps 0 and 1 only, ``new_h`` stored and nothing
kept; program ``(p, s)`` does chunks ``s, s + SPLIT, ...`` of its rows for any
``BLOCK_T`` (by default every chunk on its own program: :func:`choose_add_config`); no
scratch, no ticket. This branch is taken at compile time (a constexpr ``if`` ahead of
the norm's two paths), so the norm's code is what it was without it.

The conv weight is read as ``weight[c, i]`` with any strides; a channel-contiguous
weight (``stride(0) == 1``, e.g. the transpose of a ``(W, C)`` tensor, as
``InklingShortConvAddRMSNorm`` keeps it) is read with vector loads.

Scratch (SPLIT > 1 only): one zeroed ``(counters, partials)`` pair per (device,
stream), made on the first launch that needs it, eager or under CUDA-graph capture
(:func:`_scratch`), so the split path never depends on an earlier eager call on the
capturing stream. Launches on one stream run one after the other, so they never share
counters concurrently.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .._triton_common import (
    INTERPRETER_ROWS, cdiv, decode_tap_codes, is_interpreter, last_writers, pow2_ceil, resolve_taps,
)
from ..batch import SconvBatch
from ..checks import SconvProblem, output_for, outputs_for

__all__ = [
    "NormConfig",
    "choose_add_config",
    "choose_norm_config",
    "fused_sconv_add_rmsnorm_triton",
    "fused_sconv_add_triton",
    "interpreter_norm_config",
    "row_loop_config",
]


@triton.jit
def _column(table, kidx, i: tl.constexpr):
    """Column ``i`` of a ``[BLOCK_T, KW]`` integer table (exactly one lane selected)."""
    return tl.sum(tl.where(kidx[None, :] == i, table, 0), axis=1)


@triton.jit
def _tap(d_ptr, cache_ptr, d_off, d_on, c_off, c_on, chan, ccol, con):
    """One earlier tap's values (fp32, 0 where a row has none): each row reads its row
    of ``d`` (``d_on``: in this forward, or a same-step writer) or its cache slot
    (``c_on``); never both: two masked loads, one of them always off (both issue).
    One load with its address picked per row (``fused_sconv``'s ``tap_select``) is
    slower in this kernel's tilings."""
    tap = tl.load(d_ptr + d_off + chan, mask=d_on & con, other=0.0).to(tl.float32)
    tap += tl.load(cache_ptr + c_off + ccol, mask=c_on & con, other=0.0).to(tl.float32)
    return tap


@triton.jit
def _chunk(
    ci, hidden_ptr, d_ptr, w_ptr, cache_ptr, new_h_ptr,
    row_off, row_on, dst3, wr_on, d_off, d_on, c_off, c_on,
    stride_wc, stride_wk, stride_ch, stream_offset,
    NH: tl.constexpr, WS: tl.constexpr, W: tl.constexpr, NJ: tl.constexpr, NCH: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_J: tl.constexpr,
):
    """Chunk ``ci`` of the rows: slot store, conv, residual adds, ``new_h`` store.
    Returns ``new_h`` ([BLOCK_T, BLOCK_H, BLOCK_J], d's dtype, 0 where masked) and the
    rows' sums of its squares ([BLOCK_T] fp32)."""
    hh = (ci // NJ) * BLOCK_H + tl.arange(0, BLOCK_H)
    jj = (ci % NJ) * BLOCK_J + tl.arange(0, BLOCK_J)
    chan = (hh[:, None] * WS + jj[None, :])[None, :, :]  # [1, BH, BJ]
    # (ci < NCH) as a vector: Triton 3.9's interpreter turns a vector & a program-id
    # scalar compare into an int32 mask, which its loads refuse; compiled code is the same.
    con = ((hh < NH)[:, None] & (jj < WS)[None, :] & (hh * 0 + ci < NCH)[:, None])[None, :, :]
    ccol = (hh.to(tl.int64)[:, None] * stride_ch + stream_offset + jj[None, :])[None, :, :]
    tmask = row_on & con
    offs = row_off + chan
    d_tile = tl.load(d_ptr + offs, mask=tmask, other=0.0)
    h_tile = tl.load(hidden_ptr + offs, mask=tmask, other=0.0)
    tl.store(cache_ptr + dst3 + ccol, d_tile, mask=wr_on & con)
    d32 = d_tile.to(tl.float32)
    wv = tl.load(w_ptr + chan * stride_wc + (W - 1) * stride_wk, mask=con, other=0.0)
    acc = wv.to(tl.float32) * d32
    for i in tl.static_range(W - 1):
        wv = tl.load(w_ptr + chan * stride_wc + i * stride_wk, mask=con, other=0.0)
        tap = _tap(d_ptr, cache_ptr, d_off[i], d_on[i], c_off[i], c_on[i], chan, ccol, con)
        acc += wv.to(tl.float32) * tap
    s = (d32 + acc).to(d_ptr.dtype.element_ty).to(tl.float32)
    new_h = (h_tile.to(tl.float32) + s).to(d_ptr.dtype.element_ty)
    tl.store(new_h_ptr + offs, new_h, mask=tmask)
    nh32 = tl.where(tmask, new_h.to(tl.float32), 0.0)
    return tl.where(tmask, new_h, 0.0), tl.sum(tl.sum(nh32 * nh32, axis=2), axis=1)


# Batch-dependent ints are not specialised (by value 1 or divisibility): a new batch
# size must not compile a new variant (e.g. between CUDA-graph capture sizes).
@triton.jit(do_not_specialize=["num_tokens", "num_reqs", "max_blocks"])
def _sconv_add_rmsnorm_kernel(
    hidden_ptr,
    d_ptr,
    w_ptr,
    cache_ptr,
    pos_ptr,
    table_ptr,
    seq_ptr,
    slot_ptr,
    qs_ptr,
    map_ptr,
    norm_w_ptr,
    new_h_ptr,
    normed_ptr,
    cnt_ptr,
    part_ptr,
    num_tokens,
    num_slots,
    num_reqs,
    max_blocks,
    stride_wc,
    stride_wk,
    stride_cb,
    stride_ch,
    stride_cn,
    stride_table,
    stream_offset,
    eps,
    NH: tl.constexpr,
    WS: tl.constexpr,
    N: tl.constexpr,
    W: tl.constexpr,
    KW: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_J: tl.constexpr,
    SPLIT: tl.constexpr,
    SPLIT_P2: tl.constexpr,
    NORM_BLOCK: tl.constexpr,
    SCAN: tl.constexpr,
    USE_MAP: tl.constexpr,
    ROW_LOOP: tl.constexpr,
    HAS_NORM: tl.constexpr,
):
    CHANNELS: tl.constexpr = NH * WS
    NJ: tl.constexpr = (WS + BLOCK_J - 1) // BLOCK_J
    NCH: tl.constexpr = ((NH + BLOCK_H - 1) // BLOCK_H) * NJ
    CPP: tl.constexpr = (NCH + SPLIT - 1) // SPLIT  # chunks per program
    pid = tl.program_id(0)
    rows = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    rmask = rows < num_tokens
    rows64 = rows.to(tl.int64)
    slot = tl.load(slot_ptr + rows, mask=rmask, other=-1).to(tl.int64)
    wmask = rmask & (slot >= 0) & (slot < num_slots)
    wslot = tl.where(wmask, slot, 0)
    dst = (wslot // N) * stride_cb + (wslot % N) * stride_cn

    # 0. the taps' sources, [BLOCK_T, KW]; column i is tap i (W-1: the row itself).
    kidx = tl.arange(0, KW)
    if USE_MAP:
        # The step's tap map (inkling_kernels.tap_map): column W-2-i holds tap i
        # (distance W-1-i); one load instead of the block table and the search.
        code = tl.load(
            map_ptr + rows64[:, None] * (W - 1) + (W - 2 - kidx)[None, :],
            mask=rmask[:, None] & (kidx < W - 1)[None, :],
            other=-1,
        )
        drow, pslot = decode_tap_codes(code, num_slots)
        ok = pslot >= 0
        pslot = tl.where(ok, pslot, 0)
    else:
        # The shared tap resolution and hazard rule (inkling_kernels._triton_common).
        pos = tl.load(pos_ptr + rows, mask=rmask, other=0).to(tl.int64)
        qs = tl.load(qs_ptr + rows, mask=rmask, other=0).to(tl.int64)
        seq = tl.load(seq_ptr + rows, mask=rmask, other=0).to(tl.int64)
        live = rmask[:, None] & (kidx < W - 1)[None, :]
        trow, in_fwd, pslot = resolve_taps(
            pos, rows64, qs, seq, live, (W - 1 - kidx).to(tl.int64),
            table_ptr, num_reqs, max_blocks, stride_table, num_slots, N, True,
        )
        ok = pslot >= 0
        # Row of d each tap reads (-1: none); pre-forward taps first look for a writer.
        drow = tl.where(in_fwd, trow, -1)
        if tl.max(tl.max(ok.to(tl.int32), axis=1), axis=0) > 0:
            keys = tl.reshape(tl.where(ok, pslot, -2), [BLOCK_T * KW])
            hit = tl.reshape(last_writers(keys, slot_ptr, num_tokens, SCAN), [BLOCK_T, KW])
            drow = tl.where(ok & (hit >= 0), hit, drow)
            ok = ok & (hit < 0)
        pslot = tl.where(ok, pslot, 0)
    cread = ok.to(tl.int64)

    # Per earlier tap, hoisted out of the chunk loop and shaped for the 3-D tiles:
    # row offset into d and its mask, cache row offset and its mask.
    d_off = ()
    d_on = ()
    c_off = ()
    c_on = ()
    for i in tl.static_range(W - 1):
        r = _column(drow, kidx, i)
        d_off = d_off + ((tl.where(r >= 0, r, 0) * CHANNELS)[:, None, None],)
        d_on = d_on + ((r >= 0)[:, None, None],)
        # (offsets formed after the column pick, so that the compiler still sees
        # them as multiples of the strides: vector loads)
        p = _column(pslot, kidx, i)
        c_off = c_off + (((p // N) * stride_cb + (p % N) * stride_cn)[:, None, None],)
        c_on = c_on + ((_column(cread, kidx, i) > 0)[:, None, None],)

    row_off = (rows64 * CHANNELS)[:, None, None]
    row_on = rmask[:, None, None]
    dst3 = dst[:, None, None]
    wr_on = wmask[:, None, None]

    if not HAS_NORM:
        # fused_sconv_add: no norm, so no program needs a whole row. Program (p, s)
        # does chunks s, s + SPLIT, ... of rows p*BLOCK_T.. (SPLIT == NCH by default:
        # one chunk each); the norm's pointers, scratch and eps are unused.
        for k in tl.static_range(CPP):
            _chunk(
                tl.program_id(1) + k * SPLIT, hidden_ptr, d_ptr, w_ptr, cache_ptr, new_h_ptr,
                row_off, row_on, dst3, wr_on, d_off, d_on, c_off, c_on,
                stride_wc, stride_wk, stride_ch, stream_offset,
                NH, WS, W, NJ, NCH, BLOCK_H, BLOCK_J,
            )
    elif ROW_LOOP:
        # (SPLIT == 1) the rows' tiles in a runtime loop, squares kept as a
        # tile and reduced once; then new_h re-read from L1/L2 after a block barrier.
        hh0 = tl.arange(0, BLOCK_H)
        jj0 = tl.arange(0, BLOCK_J)
        sq3 = tl.zeros([BLOCK_T, BLOCK_H, BLOCK_J], dtype=tl.float32)
        for h0 in range(0, NH, BLOCK_H):
            for j0 in range(0, WS, BLOCK_J):
                hv = h0 + hh0
                jv = j0 + jj0
                ch = (hv[:, None] * WS + jv[None, :])[None, :, :]
                cm = ((hv < NH)[:, None] & (jv < WS)[None, :])[None, :, :]
                cc = (hv.to(tl.int64)[:, None] * stride_ch + stream_offset + jv[None, :])[None, :, :]
                lm = row_on & cm
                dv = tl.load(d_ptr + row_off + ch, mask=lm, other=0.0)
                hv_t = tl.load(hidden_ptr + row_off + ch, mask=lm, other=0.0)
                tl.store(cache_ptr + dst3 + cc, dv, mask=wr_on & cm)
                dv32 = dv.to(tl.float32)
                wl = tl.load(w_ptr + ch * stride_wc + (W - 1) * stride_wk, mask=cm, other=0.0)
                conv = wl.to(tl.float32) * dv32
                for i in tl.static_range(W - 1):
                    wl = tl.load(w_ptr + ch * stride_wc + i * stride_wk, mask=cm, other=0.0)
                    tv = _tap(d_ptr, cache_ptr, d_off[i], d_on[i], c_off[i], c_on[i], ch, cc, cm)
                    conv += wl.to(tl.float32) * tv
                sv = (dv32 + conv).to(d_ptr.dtype.element_ty).to(tl.float32)
                nhv = (hv_t.to(tl.float32) + sv).to(d_ptr.dtype.element_ty)
                tl.store(new_h_ptr + row_off + ch, nhv, mask=lm)
                nf = nhv.to(tl.float32)
                sq3 += nf * nf
        rs = (1.0 / tl.sqrt_rn(tl.sum(tl.sum(sq3, axis=2), axis=1) / CHANNELS + eps))[:, None, None]
        tl.debug_barrier()  # this program's new_h stores are visible to all its threads
        for h0 in range(0, NH, BLOCK_H):
            for j0 in range(0, WS, BLOCK_J):
                hv = h0 + hh0
                jv = j0 + jj0
                ch = (hv[:, None] * WS + jv[None, :])[None, :, :]
                cm = ((hv < NH)[:, None] & (jv < WS)[None, :])[None, :, :]
                lm = row_on & cm
                nf = tl.load(new_h_ptr + row_off + ch, mask=lm, other=0.0).to(tl.float32)
                yv = (nf * rs).to(d_ptr.dtype.element_ty).to(tl.float32)
                wn = tl.load(norm_w_ptr + ch, mask=cm, other=0.0).to(tl.float32)
                tl.store(normed_ptr + row_off + ch, (wn * yv).to(d_ptr.dtype.element_ty), mask=lm)
    else:
        # 1. conv, residual adds, squares; the chunks' new_h stay in registers.
        kept = ()
        sumsq = tl.zeros([BLOCK_T], dtype=tl.float32)
        for k in tl.static_range(CPP):
            if SPLIT == 1:
                ci = k
            else:
                ci = tl.program_id(1) + k * SPLIT
            nh, sq = _chunk(
                ci, hidden_ptr, d_ptr, w_ptr, cache_ptr, new_h_ptr,
                row_off, row_on, dst3, wr_on, d_off, d_on, c_off, c_on,
                stride_wc, stride_wk, stride_ch, stream_offset,
                NH, WS, W, NJ, NCH, BLOCK_H, BLOCK_J,
            )
            kept = kept + (nh,)
            sumsq += sq

        if SPLIT == 1:
            # 2. the whole row is here: normalise the kept chunks.
            rstd = (1.0 / tl.sqrt_rn(sumsq / CHANNELS + eps))[:, None, None]
            for k in tl.static_range(CPP):
                hh = (k // NJ) * BLOCK_H + tl.arange(0, BLOCK_H)
                jj = (k % NJ) * BLOCK_J + tl.arange(0, BLOCK_J)
                chan = (hh[:, None] * WS + jj[None, :])[None, :, :]
                con = ((hh < NH)[:, None] & (jj < WS)[None, :])[None, :, :]
                y = (kept[k].to(tl.float32) * rstd).to(d_ptr.dtype.element_ty).to(tl.float32)
                nw = tl.load(norm_w_ptr + chan, mask=con, other=0.0).to(tl.float32)
                tl.store(normed_ptr + row_off + chan, (nw * y).to(d_ptr.dtype.element_ty), mask=row_on & con)
        else:
            # 2'. one row (BLOCK_T == 1) over SPLIT programs: partial sums, then a ticket.
            row = pid.to(tl.int64)
            tl.store(part_ptr + row * SPLIT + tl.program_id(1), tl.sum(sumsq, axis=0))
            tl.debug_barrier()  # every thread's new_h and partial stores precede the ticket
            ticket = tl.atomic_add(cnt_ptr + row, 1, sem="acq_rel")
            if ticket == SPLIT - 1:  # the last program of the row normalises it
                sidx = tl.arange(0, SPLIT_P2)
                parts = tl.load(part_ptr + row * SPLIT + sidx, mask=sidx < SPLIT, other=0.0, cache_modifier=".cg")
                tl.atomic_xchg(cnt_ptr + row, 0, sem="relaxed")  # ready for the next launch
                rstd1 = 1.0 / tl.sqrt_rn(tl.sum(parts, axis=0) / CHANNELS + eps)
                NB: tl.constexpr = (CHANNELS + NORM_BLOCK - 1) // NORM_BLOCK
                loaded = ()
                for b in tl.static_range(NB):  # all loads first: one round trip
                    cc = b * NORM_BLOCK + tl.arange(0, NORM_BLOCK)
                    cm = cc < CHANNELS
                    nh32 = tl.load(new_h_ptr + row * CHANNELS + cc, mask=cm, other=0.0, cache_modifier=".cg")
                    nw = tl.load(norm_w_ptr + cc, mask=cm, other=0.0)
                    loaded = loaded + ((nh32, nw),)
                for b in tl.static_range(NB):
                    cc = b * NORM_BLOCK + tl.arange(0, NORM_BLOCK)
                    y = (loaded[b][0].to(tl.float32) * rstd1).to(d_ptr.dtype.element_ty).to(tl.float32)
                    out = (loaded[b][1].to(tl.float32) * y).to(d_ptr.dtype.element_ty)
                    tl.store(normed_ptr + row * CHANNELS + cc, out, mask=cc < CHANNELS)


_MAX_SPLIT = 64  # programs a row at most (scratch partials per row)


@dataclass(frozen=True)
class NormConfig:
    """One launch configuration: ``[block_t, block_h, block_j]`` chunks (rows, heads,
    channels of a head's stream range; powers of two) and ``split`` programs per row
    (``split > 1`` needs ``block_t == 1``; at most the number of chunks a row has).
    ``row_loop`` (``split == 1``): the tiles in a runtime loop, ``new_h`` stored and
    re-read for the norm rather than kept in registers (:func:`row_loop_config`).
    ``fused_sconv_add`` (no norm) takes any ``block_t`` with any ``split`` up to the
    row's chunks, and no ``row_loop``."""

    block_t: int
    block_h: int
    block_j: int
    num_warps: int
    scan: int = 256
    split: int = 1
    row_loop: bool = False
    # the row-register kernel (rows_kernel.py): ``block_t`` rows (block_t * (W - 1) <= 64)
    # as register vectors of ``block_j`` channels (flat across heads; C % block_j == 0),
    # block_h 1; needs the step's tap map (built for the launch when the batch has none);
    # with the norm a program walks every chunk of its rows (split 1), without it
    # a chunk a program (split: the row's chunks)
    rows: bool = False


#: (rows, with the norm) tiles of the norm pass loaded before their stores
NORM_PASS_TILES = 4


def _block_j(stream_width: int) -> int:
    """The largest power of two dividing the stream width, at most 256 (no idle lanes;
    768 -> 256), or the next power of two (<= 256) for an odd-sized width."""
    if stream_width % 32 == 0:
        return min(256, stream_width & -stream_width)
    return min(256, pow2_ceil(stream_width))


def row_loop_config(num_heads: int, stream_width: int) -> NormConfig:
    """The ``row_loop`` tiles: one row a program, ``[1, 4096 // BLOCK_J heads,
    next_pow2(stream_width) <= 1024]`` tiles in a runtime loop, warps by tile size,
    ``new_h`` re-read for the norm (the default for 16 < T < 8192)."""
    block_j = min(pow2_ceil(stream_width), 1024)
    block_h = max(1, min(pow2_ceil(num_heads), 4096 // block_j))
    elems = block_h * block_j
    num_warps = 4 if elems >= 2048 else 2 if elems >= 512 else 1
    return NormConfig(block_t=1, block_h=block_h, block_j=block_j, num_warps=num_warps, row_loop=True)


def choose_norm_config(num_tokens: int, num_heads: int, stream_width: int, mapped: bool = False,
                       num_requests: int | None = None, num_prefill_tokens: int | None = None) -> NormConfig:
    """Tile choice (no autotuning: the grid must depend on T alone), per size class
    the configuration that measured fastest in a GPU sweep (benchmarks/RESULTS.md has
    the resulting times).

    - mapped prompt-heavy launches: the row-register kernel (:func:`rows_norm_config`);
    - T <= 16: split rows, every chunk of up to 256 channels on its own program (a
      ``BLOCK_J``-channel piece of one head, :func:`_block_j`, or several whole narrow
      heads), two warps;
    - 16 < T < 8192: the row loop (:func:`row_loop_config`);
    - T >= 8192: one row a program, the whole row in registers as 2048-element chunks,
      four warps.
    """
    rows = rows_norm_config(num_tokens, num_heads, stream_width, mapped, num_requests, num_prefill_tokens)
    if rows is not None:
        return rows
    if 16 < num_tokens < 8192:
        return row_loop_config(num_heads, stream_width)
    block_j = _block_j(stream_width)
    nj = -(-stream_width // block_j)
    if num_tokens <= 16:
        block_h = max(1, min(pow2_ceil(num_heads), 256 // block_j))
        split = max(1, min(-(-num_heads // block_h) * nj, _MAX_SPLIT))
        return NormConfig(block_t=1, block_h=block_h, block_j=block_j, num_warps=2, split=split)
    return _whole_row_config(num_heads, stream_width, 1)


#: Mapped launches of at least this many rows, mostly prompt rows or ``ROWS_TOKENS_PER_REQUEST``
#: (8) rows a request, take the row-register kernel (choose_norm_config, choose_add_config).
NORM_ROWS_MIN_TOKENS = 1024
#: Launches of at least this many rows a request (prompts only) take the two-row,
#: four-warp tile with the norm and 4 rows without; mixed batches take one row with the
#: norm and 2 without.
NORM_ROWS_PROMPT_TOKENS_PER_REQUEST = 32


def rows_norm_config(num_tokens: int, num_heads: int, stream_width: int, mapped: bool,
                     num_requests: int | None, num_prefill_tokens: int | None = None,
                     norm: bool = True) -> NormConfig | None:
    """The row-register kernel's tile (:mod:`.rows_kernel`) for a launch with the step's
    tap map, at least ``NORM_ROWS_MIN_TOKENS`` rows, at least ``ROWS_TOKENS_PER_REQUEST``
    rows a request or at least half its rows in prompts (the batch's
    ``num_prefill_tokens``; :func:`inkling_kernels.sconv.kernel.rows_batch` with
    ``either``), and whole 256-channel chunks; else None (the tile kernel).

    Tiles (measured fastest in a GPU sweep):

    - with the norm, prompts only (``>= NORM_ROWS_PROMPT_TOKENS_PER_REQUEST`` rows a
      request): 2 rows of 512 channels, four warps;
    - with the norm, otherwise: 1 row of 256 channels, two warps;
    - without the norm (``fused_sconv_add`` on a tp shard): 4 rows of 256 channels, two
      warps, for prompts only; otherwise 2 rows.

    Decode-heavy launches stay on the tile kernel: there every row-kernel tile takes its
    load path."""
    from ..sconv.kernel import rows_batch

    if not (mapped and rows_batch(num_tokens, num_requests, num_prefill_tokens, NORM_ROWS_MIN_TOKENS, either=True)
            and num_heads * stream_width % 256 == 0):
        return None
    prompts_only = num_requests is not None and num_tokens >= NORM_ROWS_PROMPT_TOKENS_PER_REQUEST * num_requests
    if not norm:
        return NormConfig(block_t=4 if prompts_only else 2, block_h=1, block_j=256, num_warps=2, rows=True)
    if prompts_only and num_heads * stream_width % 512 == 0:
        return NormConfig(block_t=2, block_h=1, block_j=512, num_warps=4, rows=True)
    return NormConfig(block_t=1, block_h=1, block_j=256, num_warps=2, rows=True)


def interpreter_rows_config(num_tokens: int, num_heads: int, stream_width: int, mapped: bool,
                            num_requests: int | None, num_prefill_tokens: int | None = None) -> NormConfig | None:
    """Under the interpreter, the row-register kernel for the same launches as on a GPU
    but from ``INTERPRETER_ROWS`` rows (``INTERPRETER_ROWS`` rows a program; chunks of the
    largest power of two up to 256 dividing the row; at least 8), so that the e2e
    engines' prompt steps run it; else None."""
    from ..sconv.kernel import rows_batch

    channels = num_heads * stream_width
    block_j = min(256, channels & -channels)
    if (mapped and rows_batch(num_tokens, num_requests, num_prefill_tokens, INTERPRETER_ROWS, either=True)
            and block_j >= 8):
        return NormConfig(block_t=INTERPRETER_ROWS, block_h=1, block_j=block_j, num_warps=2, rows=True)
    return None


def _whole_row_config(num_heads: int, stream_width: int, block_t: int, scan: int = 256) -> NormConfig:
    """``block_t`` rows a program, each whole row in registers as chunks of up to 2048
    elements (:func:`_block_j` channels of up to ``2048 // block_j`` heads), four warps."""
    block_j = _block_j(stream_width)
    block_h = max(1, min(pow2_ceil(num_heads), 2048 // block_j))
    return NormConfig(block_t=block_t, block_h=block_h, block_j=block_j, num_warps=4, scan=scan)


def interpreter_norm_config(num_tokens: int, num_heads: int, stream_width: int, mapped: bool = False,
                            num_requests: int | None = None, num_prefill_tokens: int | None = None) -> NormConfig:
    """The default tiles under Triton's interpreter (``TRITON_INTERPRET=1``; see
    :data:`inkling_kernels._triton_common.INTERPRETER_ROWS`). Mapped prompt-heavy
    launches: the row-register kernel (:func:`interpreter_rows_config`). Up to 16 rows,
    :func:`choose_norm_config`'s split rows (a few programs a row); above, its tiles for
    T >= 8192 (the whole row in registers) with ``INTERPRETER_ROWS`` rows a program
    instead of one."""
    rows = interpreter_rows_config(num_tokens, num_heads, stream_width, mapped, num_requests, num_prefill_tokens)
    if rows is not None:
        return rows
    if num_tokens <= 16:
        return choose_norm_config(num_tokens, num_heads, stream_width)
    return _whole_row_config(num_heads, stream_width, INTERPRETER_ROWS)


# (device, stream) -> (counters int32 [rows], partials fp32 [rows * max_split], rows); zero
# between launches (the last program of each row resets its counter). Buffers a larger
# one replaced stay alive in _RETIRED: a captured CUDA graph may still name them.
_SCRATCH: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor, int]] = {}
_RETIRED: list[tuple[torch.Tensor, torch.Tensor, int]] = []


def _scratch(device: torch.device, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The current stream's split-row scratch, holding at least ``rows`` rows.

    Made on first use on a stream, also while a CUDA graph is being captured on it:
    the zeroed buffers then come from the graph's memory pool and the zeroing is
    recorded into the graph, so a capture on a fresh stream (no eager call before it)
    takes the split path as an eager launch does. Either way the buffer is kept for
    the process's lifetime (graphs hold its address)."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (str(device), stream)
    have = _SCRATCH.get(key)
    if have is not None and have[2] >= rows:
        return have[0], have[1]
    if have is not None:
        _RETIRED.append(have)
    cap = max(256, pow2_ceil(rows))
    cnt = torch.zeros(cap, dtype=torch.int32, device=device)
    part = torch.zeros(cap * _MAX_SPLIT, dtype=torch.float32, device=device)
    _SCRATCH[key] = (cnt, part, cap)
    return cnt, part


def _chunks(cfg: NormConfig, num_heads: int, stream_width: int) -> int:
    """The number of ``[block_h, block_j]`` chunks of a row (tile sizes checked)."""
    for size in (cfg.block_t, cfg.block_h, cfg.block_j, cfg.scan):
        if size < 1 or size & (size - 1):
            raise ValueError(f"config tile sizes must be powers of two, got {cfg}")
    return -(-num_heads // cfg.block_h) * -(-stream_width // cfg.block_j)


def _launch(
    hidden: torch.Tensor,
    d: torch.Tensor,
    prob: SconvProblem,
    cache: torch.Tensor,
    batch: SconvBatch,
    stream_offset: int,
    stream_width: int,
    outputs: tuple[torch.Tensor, torch.Tensor],
    norm: tuple[torch.Tensor, float] | None,
    cfg: NormConfig,
    block_t: int,
    split: int,
    scratch: tuple[torch.Tensor, torch.Tensor] | None,
) -> None:
    """The kernel launch of both ops: ``norm`` is ``(norm_weight, eps)``, or None for
    ``fused_sconv_add`` (HAS_NORM off: ``outputs[1]``, the norm's arguments and the
    scratch are not read or written); the tile kernel (``cfg.rows``: :func:`_try_rows`)."""
    new_hidden, normed = outputs
    norm_weight, eps = norm if norm is not None else (d, 0.0)
    cnt, part = scratch if scratch is not None else (batch.slot_mapping, d)  # (unused at split 1)
    w2 = prob.weight2d
    table = batch.block_table
    tap_map = batch.tap_map
    channels = prob.num_heads * stream_width
    grid = (cdiv(prob.num_tokens, block_t), split)
    _sconv_add_rmsnorm_kernel[grid](
        hidden, d, w2, cache,
        batch.positions, table, batch.seq_idx, batch.slot_mapping, batch.query_start,
        batch.slot_mapping if tap_map is None else tap_map,  # (unused without a map)
        norm_weight, new_hidden, normed, cnt, part,
        prob.num_tokens, prob.num_slots,
        table.shape[0], table.shape[1],
        w2.stride(0), w2.stride(1),
        cache.stride(0), cache.stride(1), cache.stride(2),
        table.stride(0),
        stream_offset,
        eps,
        NH=prob.num_heads, WS=stream_width, N=batch.block_size, W=prob.kernel_size,
        KW=pow2_ceil(prob.kernel_size),
        BLOCK_T=block_t, BLOCK_H=cfg.block_h, BLOCK_J=cfg.block_j,
        SPLIT=split, SPLIT_P2=pow2_ceil(split), NORM_BLOCK=min(2048, pow2_ceil(channels)),
        SCAN=cfg.scan,
        USE_MAP=tap_map is not None,
        ROW_LOOP=cfg.row_loop,
        HAS_NORM=norm is not None,
        num_warps=cfg.num_warps,
    )


def rows_launch_map(batch: SconvBatch, prob: SconvProblem, cfg: NormConfig, device: torch.device,
                    ) -> tuple[SconvBatch | None, str | None]:
    """For a ``cfg.rows`` launch: the batch carrying a tap map (the batch's own, else one
    built now) and None, or None and why the row-register kernel cannot take the launch."""
    from ..checks import TAP_MAP_MAX_SLOTS
    from ..sconv.rows_kernel import rows_unfit

    if cfg.block_h != 1 or cfg.split != 1 or cfg.row_loop:
        return None, "a rows config has block_h 1, split 1 and no row_loop"
    why = rows_unfit(prob.num_tokens, prob.channels, prob.channels, prob.kernel_size, cfg.block_t, cfg.block_j)
    if why is None and batch.tap_map is None and prob.num_slots > TAP_MAP_MAX_SLOTS:
        why = f"the cache's {prob.num_slots} slots are more than a tap map can name"
    if why is not None:
        return None, why
    if batch.tap_map is None:
        from ..tap_map.kernel import launch_sconv_tap_map

        tap_map = torch.empty(prob.num_tokens, prob.kernel_size - 1, dtype=torch.int64, device=device)
        launch_sconv_tap_map(batch, prob.kernel_size, tap_map)
        batch = batch.with_tap_map(tap_map)
    return batch, None


def _try_rows(
    hidden: torch.Tensor,
    d: torch.Tensor,
    prob: SconvProblem,
    cache: torch.Tensor,
    batch: SconvBatch,
    stream_offset: int,
    stream_width: int,
    outputs: tuple[torch.Tensor, torch.Tensor],
    norm: tuple[torch.Tensor, float] | None,
    cfg: NormConfig,
    explicit: bool,
) -> bool:
    """Launch the row-register kernel (:mod:`.rows_kernel`; ``cfg.rows``) when it can
    take the launch (True): with the norm one program a row tile, without it one a
    (chunk, row tile). Else raise saying why (``explicit``: the caller's config) or
    return False (a heuristic's choice: the caller falls back to the tile kernel)."""
    from ..sconv.kernel import ROWS_LOAD_PATH_CHANNELS, ROWS_OFFSET32_LIMIT
    from ..sconv.rows_kernel import cache_max_offset, rows_weight_tile
    from .rows_kernel import _rows_add_norm_kernel

    _chunks(cfg, prob.num_heads, stream_width)  # (tile sizes checked)
    batch_m, why = rows_launch_map(batch, prob, cfg, d.device)
    if batch_m is None:
        if explicit:
            raise ValueError(f"NormConfig(rows=True) cannot take this launch: {why}; use rows=False")
        return False
    new_hidden, normed = outputs
    norm_weight, eps = norm if norm is not None else (d, 0.0)
    w2 = prob.weight2d
    chunks = prob.channels // cfg.block_j
    grid = (1 if norm is not None else chunks, cdiv(prob.num_tokens, cfg.block_t))
    # the norm pass's tiles: [block_t, nsub] (about 1024 elements), p2 of them loaded at once
    nsub = min(cfg.block_j, max(32, 1024 // cfg.block_t))
    p2 = max(1, min(NORM_PASS_TILES, prob.channels // nsub))
    while (prob.channels // nsub) % p2:
        p2 //= 2
    _rows_add_norm_kernel[grid](
        hidden, d, w2, cache, batch_m.slot_mapping, batch_m.tap_map, norm_weight, new_hidden, normed,
        prob.num_tokens, prob.num_slots,
        w2.stride(0), w2.stride(1),
        cache.stride(0), cache.stride(1), cache.stride(2),
        stream_offset, eps,
        C=prob.channels, WS=stream_width, N=batch_m.block_size, W=prob.kernel_size,
        ROWS=cfg.block_t, BLOCK_C=cfg.block_j, QP=max(2, pow2_ceil(cfg.block_t * (prob.kernel_size - 1))),
        WTILE=rows_weight_tile(w2), OFF64=cache_max_offset(cache) >= ROWS_OFFSET32_LIMIT,
        # the load path's [block_t, SUB] tiles: up to 512 elements (two warps: 8 a thread)
        HAS_NORM=norm is not None, SUB=min(cfg.block_j, max(ROWS_LOAD_PATH_CHANNELS, 512 // cfg.block_t)),
        NSUB=nsub, P2=p2,
        num_warps=cfg.num_warps,
    )
    return True


def launch_sconv_add_rmsnorm(
    hidden: torch.Tensor,
    d: torch.Tensor,
    prob: SconvProblem,
    cache: torch.Tensor,
    batch: SconvBatch,
    stream_offset: int,
    stream_width: int,
    norm_weight: torch.Tensor,
    eps: float,
    config: NormConfig | None = None,
    outputs: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Allocate the outputs and launch (CUDA, or CPU tensors under TRITON_INTERPRET=1).

    Arguments must have passed ``check_sconv_add_rmsnorm_args`` (which made ``prob``);
    ``config`` overrides the heuristic tile choice (:func:`choose_norm_config`, or
    :func:`interpreter_norm_config` under the interpreter; benchmarks, tests); ``outputs`` are
    preallocated ``(new_hidden, normed)`` tensors, already checked
    (:func:`inkling_kernels.checks.outputs_for`; tests poison them).
    """
    new_hidden, normed = (torch.empty_like(d), torch.empty_like(d)) if outputs is None else outputs
    if prob.num_tokens == 0:
        return new_hidden, normed
    choose = interpreter_norm_config if is_interpreter() else choose_norm_config
    cfg = config or choose(prob.num_tokens, prob.num_heads, stream_width, batch.tap_map is not None,
                           batch.block_table.shape[0], batch.num_prefill_tokens)
    if cfg.rows:
        if _try_rows(hidden, d, prob, cache, batch, stream_offset, stream_width, (new_hidden, normed),
                     (norm_weight, eps), cfg, config is not None):
            return new_hidden, normed
        cfg = choose(prob.num_tokens, prob.num_heads, stream_width)
    chunks = _chunks(cfg, prob.num_heads, stream_width)
    if cfg.row_loop and cfg.split != 1:
        raise ValueError(f"config split must be 1 with row_loop, got {cfg}")
    if cfg.split < 1 or cfg.split > min(chunks, _MAX_SPLIT) or (cfg.split > 1 and cfg.block_t != 1):
        raise ValueError(f"config split must be 1..{min(chunks, _MAX_SPLIT)} (the row's chunks), "
                         f"with block_t 1 when above 1, got {cfg}")
    split, block_t = cfg.split, cfg.block_t
    scratch = _scratch(d.device, prob.num_tokens) if split > 1 else None
    _launch(hidden, d, prob, cache, batch, stream_offset, stream_width, (new_hidden, normed),
            (norm_weight, eps), cfg, block_t, split, scratch)
    return new_hidden, normed


_MAX_GRID_1 = 65535  # CUDA's limit on the grid's second axis (programs along a row)


def choose_add_config(num_tokens: int, num_heads: int, stream_width: int, mapped: bool = False,
                      kernel_size: int = 4, num_requests: int | None = None,
                      num_prefill_tokens: int | None = None) -> NormConfig:
    """Tiles of ``fused_sconv_add``: without the norm no
    program needs a whole row, so every chunk of a row gets its own program (``split``
    = the row's chunks, no scratch, no ticket), as in ``fused_sconv``'s grid. The tile
    is ``fused_sconv``'s heuristic for the same launch (:func:`inkling_kernels.sconv.
    kernel.choose_config`, tuned for the conv alone), in this kernel's
    terms: its ``BLOCK_C`` channels of one head as ``[block_h 1, block_j BLOCK_C]``, or
    whole narrow power-of-two heads as ``block_h = BLOCK_C / stream_width``; the same
    rows and warps. The hazard scan's chunk keeps its ``[BLOCK_T * KW, SCAN]`` compare
    at about 32 elements a thread (16..256)."""
    from ..sconv.kernel import choose_config

    rows = rows_norm_config(num_tokens, num_heads, stream_width, mapped, num_requests, num_prefill_tokens, norm=False)
    if rows is not None:
        return rows
    conv = choose_config(num_tokens, num_heads, stream_width, mapped, one_load=False)
    if conv.block_c > stream_width and conv.block_c % stream_width == 0:
        block_h, block_j = conv.block_c // stream_width, stream_width
    else:
        block_h, block_j = 1, conv.block_c
    chunks = -(-num_heads // block_h) * -(-stream_width // block_j)
    keys = conv.block_t * pow2_ceil(kernel_size)
    scan = max(16, min(256, 1 << (max(1, 1024 * conv.num_warps // keys).bit_length() - 1)))
    return NormConfig(block_t=conv.block_t, block_h=block_h, block_j=block_j, num_warps=conv.num_warps,
                      scan=scan, split=min(chunks, _MAX_GRID_1))


def launch_sconv_add(
    hidden: torch.Tensor,
    d: torch.Tensor,
    prob: SconvProblem,
    cache: torch.Tensor,
    batch: SconvBatch,
    stream_offset: int,
    stream_width: int,
    config: NormConfig | None = None,
    out: torch.Tensor | None = None,
    auto_map: bool = True,
) -> torch.Tensor:
    """``fused_sconv_add``'s launch (the kernel with HAS_NORM off): allocate
    ``new_hidden`` and launch (CUDA, or CPU tensors under TRITON_INTERPRET=1).
    A large launch without a tap map builds one first (``auto_map=False``: stay
    map-less; tests of the map-less path).

    Arguments must have passed ``check_sconv_add_args`` (which made ``prob``);
    ``config`` overrides :func:`choose_add_config` (under the interpreter: the whole
    row, ``INTERPRETER_ROWS`` rows a program; benchmarks, tests): any
    ``block_t``, ``split`` 1.. the row's chunks (program ``(p, s)`` does chunks ``s,
    s + split, ...``), no ``row_loop`` (the norm's path); ``out`` is a preallocated
    ``new_hidden``, already checked (:func:`inkling_kernels.checks.output_for`; tests poison it).
    """
    if out is None:
        out = torch.empty_like(d)
    if prob.num_tokens == 0:
        return out
    # Every program owns one channel chunk: without a map each would resolve its rows'
    # taps (and scan for same-step writers) again, so a large launch builds the map
    # first, as fused_sconv does.
    from ..sconv.kernel import auto_tap_map

    tap_map = auto_tap_map(batch, prob, cache.device, auto_map)
    if tap_map is not None and batch.tap_map is None:
        batch = batch.with_tap_map(tap_map)
    interp_whole_row = _whole_row_config(prob.num_heads, stream_width, INTERPRETER_ROWS, scan=64)
    if config is not None:
        cfg = config
    elif is_interpreter():  # (the fewest programs)
        cfg = interpreter_rows_config(prob.num_tokens, prob.num_heads, stream_width, batch.tap_map is not None,
                                      batch.block_table.shape[0], batch.num_prefill_tokens) or interp_whole_row
    else:
        cfg = choose_add_config(prob.num_tokens, prob.num_heads, stream_width, batch.tap_map is not None,
                                prob.kernel_size, batch.block_table.shape[0], batch.num_prefill_tokens)
    if cfg.rows:
        if _try_rows(hidden, d, prob, cache, batch, stream_offset, stream_width, (out, out), None, cfg,
                     config is not None):
            return out
        cfg = interp_whole_row if is_interpreter() else choose_add_config(
            prob.num_tokens, prob.num_heads, stream_width, batch.tap_map is not None, prob.kernel_size)
    chunks = _chunks(cfg, prob.num_heads, stream_width)
    if cfg.row_loop:
        raise ValueError(f"config row_loop is the norm's path; fused_sconv_add has no norm: got {cfg}")
    if not 1 <= cfg.split <= min(chunks, _MAX_GRID_1):
        raise ValueError(f"config split must be 1..{min(chunks, _MAX_GRID_1)} (the row's chunks), got {cfg}")
    _launch(hidden, d, prob, cache, batch, stream_offset, stream_width, (out, out), None, cfg, cfg.block_t,
            cfg.split, None)
    return out


def fused_sconv_add_rmsnorm_triton(
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
    config: NormConfig | None = None,
    outputs: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Check and launch the Triton kernel directly (any device Triton runs on).

    Same contract as :func:`inkling_kernels.fused_sconv_add_rmsnorm`; used by tests
    (CPU tensors under ``TRITON_INTERPRET=1``) and benchmarks (``config``)."""
    from . import check_sconv_add_rmsnorm_args

    prob = check_sconv_add_rmsnorm_args(hidden, d, weight, cache, batch, stream_offset, stream_width, norm_weight, eps)
    return launch_sconv_add_rmsnorm(
        hidden, d, prob, cache, batch, stream_offset, stream_width, norm_weight, float(eps),
        config=config, outputs=outputs_for("outputs", outputs, d, (
            ("hidden", hidden), ("d", d), ("weight", weight), ("cache", cache), ("norm_weight", norm_weight))),
    )


def fused_sconv_add_triton(
    hidden: torch.Tensor,
    d: torch.Tensor,
    weight: torch.Tensor,
    cache: torch.Tensor,
    batch: SconvBatch,
    stream_offset: int,
    stream_width: int,
    *,
    config: NormConfig | None = None,
    out: torch.Tensor | None = None,
    auto_map: bool = True,
) -> torch.Tensor:
    """Check and launch ``fused_sconv_add``'s kernel directly (any device Triton runs
    on). Same contract as :func:`inkling_kernels.fused_sconv_add`; used by tests (CPU
    tensors under ``TRITON_INTERPRET=1``) and benchmarks (``config``)."""
    from . import check_sconv_add_args

    prob = check_sconv_add_args(hidden, d, weight, cache, batch, stream_offset, stream_width)
    return launch_sconv_add(hidden, d, prob, cache, batch, stream_offset, stream_width, config=config,
                            out=output_for("out", out, d, (("hidden", hidden), ("d", d), ("weight", weight),
                                                          ("cache", cache))),
                            auto_map=auto_map)

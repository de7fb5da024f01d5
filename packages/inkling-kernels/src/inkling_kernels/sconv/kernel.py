"""Triton kernel and typed launcher for ``fused_sconv`` (docs/design.md §3).

Tiling: one program owns ``BLOCK_T`` consecutive rows of ``x`` times ``BLOCK_C``
channels of one head (so its cache addresses are contiguous along D), or of
``BLOCK_C / stream_width`` whole heads when a power-of-two head is narrower than the
tile; channel chunks vary fastest in the grid. A prologue works out, with small [BLOCK_T, W-1]
tensors, where each pre-forward tap comes from (block table -> slot, and the
hazard scan below); then the program loads its x tile once from HBM, stores it
into the rows' slots and forms the W taps: in-forward taps re-read rows the program
(or its neighbour) just loaded (L1/L2 hits), pre-forward taps read the cache; fp32
accumulation. The grid is ``(H * cdiv(stream_width, BLOCK_C), cdiv(T, BLOCK_T))``
(``cdiv(H, BLOCK_C / stream_width)`` programs along channels for whole-head tiles):
it depends only on T, nothing is allocated besides ``out`` and nothing syncs with
the host, so the launch replays under CUDA graphs.

Two streams in one launch (``STREAMS=2``: ``inkling_kernels.sconv_kv``, the K and V
convs of a layer): every program resolves its rows' taps once (the prologue, or the
map's codes) and then runs the main phase for each stream at its own offset in D,
reading each stream's rows through its own row stride (column slices of the QKV
projection output, no copy). The same grid, tiles and map decision as one stream of
that shape.

Same-step hazard (docs/design.md §3.2): a request that prefix-hit blocks which another
request writes in this very launch reads those slots as pre-forward taps, and program
order on the GPU is undefined. With the step's tap map (``batch.tap_map``) the map says
which row of x to read instead. Without one the kernel applies the same rule itself
(:mod:`inkling_kernels._triton_common`): every usable pre-forward slot is looked up
among this launch's writes (``slot_mapping``, scanned one row at a time; a launch of
at most SCAN rows, e.g. decode, loads it as one chunk sized to T, once per program,
without branching on the tile's contents; longer ones keep two chunks in flight) and,
on a hit, the writer's row of ``x`` is read instead of the cache. The
result equals "insert the whole batch, then convolve" (the reference's semantics) at
any alignment of the hit.

Prefill-sized mapped launches (``choose_config``: at least ``ROWS_MIN_TOKENS`` rows,
mostly prompt rows: :func:`rows_batch`) run another kernel, :mod:`.rows_kernel`
(one launch for one stream or for K and V), whose programs keep their rows in registers
and, inside a prompt, read no tap from memory.

Which path runs without a map: the in-kernel prologue (block table + hazard search)
costs more than building a map once for the call (two small launches) as soon as a
launch moves about a million elements (``T * C >= MAP_MIN_WORK``), and less below. So
a batch without a map takes the map-less kernel for small launches and builds a map
for the call for large ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .._triton_common import cdiv, decode_tap_codes, match_last_writer, pow2_ceil, resolve_taps
from ..batch import SconvBatch
from ..checks import TAP_MAP_MAX_SLOTS, SconvProblem, check_conv_call, output_for
from .rows_kernel import _rows_sconv_kernel, cache_max_offset, rows_unfit, rows_weight_tile

__all__ = [
    "MAP_MIN_WORK", "PREFILL_SHARE", "ROWS_MIN_TOKENS", "ROWS_TOKENS_PER_REQUEST", "ConvStream", "SconvConfig",
    "choose_config", "fused_sconv_triton", "rows_batch",
]


@triton.jit
def _mapless_taps(
    rows, rows64, rmask, pos, qs, table_ptr, seq_ptr, slot_ptr,
    num_tokens, num_slots, num_reqs, max_blocks, stride_table,
    N: tl.constexpr, W: tl.constexpr, WP: tl.constexpr, BLOCK_T: tl.constexpr,
    SCAN: tl.constexpr, SLOT32: tl.constexpr, EARLY_SCAN_LOADS: tl.constexpr, ONE_CHUNK: tl.constexpr,
):
    """Without a tap map: where each pre-forward tap comes from (the shared tap
    resolution, then the hazard rule: every usable pre-forward slot is looked up among
    this call's writes). Returns the rows' own slots, the [BLOCK_T, WP] pre-forward
    slots (-1: none), the writer rows (-1: read the cache) and whether the tile has
    any pre-forward tap.

    ``ONE_CHUNK`` (the launch has at most ``SCAN`` rows, SCAN sized to T: decode and
    other small batches): ``slot_mapping`` is one chunk, loaded once up front, and
    nothing branches on whether the tile has pre-forward taps (it nearly always has):
    the table load and the compare issue straight away."""
    srows = tl.arange(0, SCAN)
    if EARLY_SCAN_LOADS:
        # Small (decode) tiles: the first chunk(s) of the scan are issued before
        # the metadata and block-table loads, hiding their latency.
        sval = tl.load(slot_ptr + srows, mask=srows < num_tokens, other=-1)
        if ONE_CHUNK:
            sval_next = sval  # (unused)
        else:
            sval_next = tl.load(slot_ptr + SCAN + srows, mask=SCAN + srows < num_tokens, other=-1)
    seq = tl.load(seq_ptr + rows, mask=rmask, other=0).to(tl.int64)
    slot = tl.load(slot_ptr + rows, mask=rmask, other=-1).to(tl.int64)
    # Column k of the [BLOCK_T, WP] tensors is the tap at distance k+1.
    kk = tl.arange(0, WP)
    live = rmask[:, None] & (kk < W - 1)[None, :]
    _, _, pslot2 = resolve_taps(
        pos, rows64, qs, seq, live, (kk + 1).to(tl.int64),
        table_ptr, num_reqs, max_blocks, stride_table, num_slots, N, not ONE_CHUNK,
    )
    any_pre = tl.max(tl.max(pslot2, axis=1), axis=0) >= 0  # a usable pre-forward tap
    hit2 = tl.full([BLOCK_T, WP], -1, tl.int32)
    if not EARLY_SCAN_LOADS:
        sval = tl.load(slot_ptr + srows, mask=srows < num_tokens, other=-1)
        if ONE_CHUNK:
            sval_next = sval  # (unused)
        else:
            sval_next = tl.load(slot_ptr + SCAN + srows, mask=SCAN + srows < num_tokens, other=-1)
    if ONE_CHUNK:
        hit2 = _writer_rows(pslot2, sval, sval_next, srows, slot_ptr, num_tokens, num_slots,
                            WP, BLOCK_T, SCAN, SLOT32, ONE_CHUNK)
    elif any_pre:
        hit2 = _writer_rows(pslot2, sval, sval_next, srows, slot_ptr, num_tokens, num_slots,
                            WP, BLOCK_T, SCAN, SLOT32, ONE_CHUNK)
    return slot, pslot2, hit2, any_pre


@triton.jit
def _writer_rows(
    pslot2, sval, sval_next, srows, slot_ptr, num_tokens, num_slots,
    WP: tl.constexpr, BLOCK_T: tl.constexpr, SCAN: tl.constexpr, SLOT32: tl.constexpr,
    ONE_CHUNK: tl.constexpr,
):
    """The hazard rule's writer row of every usable pre-forward slot of the tile
    (``pslot2`` >= 0; -1: none), ``slot_mapping`` scanned SCAN rows at a time (its
    first two chunks already loaded: ``sval``, ``sval_next``)."""
    # Slots compare as int32 when every slot fits (half the work); -2 never equals a
    # (masked) written slot.
    if SLOT32:
        key2 = tl.where(pslot2 >= 0, pslot2.to(tl.int32), -2)
        cur = tl.where((sval >= 0) & (sval < num_slots), sval, -1).to(tl.int32)  # only real writes
    else:
        key2 = tl.where(pslot2 >= 0, pslot2, -2)
        cur = tl.where((sval >= 0) & (sval < num_slots), sval, -1).to(tl.int64)
    hit2 = tl.full([BLOCK_T, WP], -1, tl.int32)
    if ONE_CHUNK and BLOCK_T == 1:
        # The whole slot_mapping against the row's keys, no branch.
        hit2 = match_last_writer(tl.max(key2, axis=0), cur, srows)[None, :]
    else:
        rid = tl.arange(0, BLOCK_T)
        # One row at a time, and only rows that need it; the first two chunks stay in
        # registers for every row, so a batch of T <= 2*SCAN rows loads nothing more.
        for j in range(BLOCK_T):
            key = tl.max(tl.where((rid == j)[:, None], key2, -2), axis=0)  # [WP]
            if tl.max(key, axis=0) >= 0:
                hit = match_last_writer(key, cur, srows)
                if not ONE_CHUNK:
                    nxt = sval_next
                    crows = srows
                    # (a while loop: the interpreter cannot range() over a runtime
                    # int with NumPy >= 2.4)
                    s0 = SCAN
                    while s0 < num_tokens:
                        crows = s0 + tl.arange(0, SCAN)
                        if SLOT32:
                            cmp = tl.where((nxt >= 0) & (nxt < num_slots), nxt, -1).to(tl.int32)
                        else:
                            cmp = tl.where((nxt >= 0) & (nxt < num_slots), nxt, -1).to(tl.int64)
                        # two chunks in flight: load the one after this
                        nxt = tl.load(slot_ptr + SCAN + crows, mask=SCAN + crows < num_tokens, other=-1)
                        hit = tl.maximum(hit, match_last_writer(key, cmp, crows))
                        s0 += SCAN
                hit2 = tl.where((rid == j)[:, None], hit[None, :], hit2)
    return hit2


@triton.jit(do_not_specialize=["num_tokens", "num_reqs", "max_blocks"])
def _fused_sconv_kernel(
    x_ptr,
    w_ptr,
    cache_ptr,
    out_ptr,
    pos_ptr,
    table_ptr,
    seq_ptr,
    slot_ptr,
    qs_ptr,
    map_ptr,
    num_tokens,
    channels,
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
    # the two-stream launch only (after the one-stream kernel's arguments, which keep
    # their order): the first stream's x row stride, then the second stream
    stride_x,
    x2_ptr,
    w2_ptr,
    out2_ptr,
    stride_x2,
    stride_w2c,
    stride_w2k,
    stream_offset2,
    WS: tl.constexpr,
    N: tl.constexpr,
    W: tl.constexpr,
    WP: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
    CHUNKS: tl.constexpr,
    SCAN: tl.constexpr,
    SILU: tl.constexpr,
    RESIDUAL: tl.constexpr,
    SLOT32: tl.constexpr,
    EARLY_SCAN_LOADS: tl.constexpr,
    ONE_CHUNK: tl.constexpr,
    HPT: tl.constexpr,
    USE_MAP: tl.constexpr,
    STREAMS: tl.constexpr,
    TAP_SELECT: tl.constexpr = False,
):
    # Channel chunks vary fastest: the programs of one row block run together
    # (shared shifted-row reads in L2; a row block that scans never trails).
    pid_c = tl.program_id(0)
    pid_t = tl.program_id(1)
    if HPT == 1:
        head = pid_c // CHUNKS
        d = (pid_c % CHUNKS) * BLOCK_C + tl.arange(0, BLOCK_C)
        cmask = d < WS
        chan = head * WS + d  # channel in x / weight
        ccol = head.to(tl.int64) * stride_ch + stream_offset + d  # column inside a cache row
    else:
        # HPT whole heads per tile (BLOCK_C = HPT * WS): fewer programs per row, so
        # fewer copies of the row's prologue.
        chan = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
        cmask = chan < channels
        ccol = (chan // WS).to(tl.int64) * stride_ch + stream_offset + chan % WS

    rows = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    rmask = rows < num_tokens
    rows64 = rows.to(tl.int64)
    kk = tl.arange(0, WP)
    if USE_MAP:
        # The step's tap map (inkling_kernels.tap_map) says where every earlier
        # tap comes from: one [BLOCK_T, W-1] load, then the taps themselves.
        codes = tl.load(
            map_ptr + rows64[:, None] * (W - 1) + kk[None, :],
            mask=rmask[:, None] & (kk < W - 1)[None, :],
            other=-1,
        )
        slot = tl.load(slot_ptr + rows, mask=rmask, other=-1).to(tl.int64)
    else:
        pos = tl.load(pos_ptr + rows, mask=rmask, other=0).to(tl.int64)
        qs = tl.load(qs_ptr + rows, mask=rmask, other=0).to(tl.int64)
        slot, pslot2, hit2, any_pre = _mapless_taps(
            rows, rows64, rmask, pos, qs, table_ptr, seq_ptr, slot_ptr,
            num_tokens, num_slots, num_reqs, max_blocks, stride_table,
            N, W, WP, BLOCK_T, SCAN, SLOT32, EARLY_SCAN_LOADS, ONE_CHUNK,
        )

    # -- Main phase, per stream (two: the K+V launch of sconv_kv, sharing the tap
    # resolution above): one x tile, its slot store, W taps, fp32 accumulation.
    # STREAMS == 1 compiles to the plain one-stream kernel (x rows contiguous: row
    # stride = channels, no second stream's values live): the general form is slower on
    # small launches.
    for s in tl.static_range(STREAMS):
        if s == 0:
            xs_ptr, ws_ptr, outs_ptr = x_ptr, w_ptr, out_ptr
            swc, swk, scol = stride_wc, stride_wk, ccol
            if STREAMS == 1:
                sx = channels
            else:
                sx = stride_x
        else:
            xs_ptr, ws_ptr, outs_ptr = x2_ptr, w2_ptr, out2_ptr
            sx, swc, swk = stride_x2, stride_w2c, stride_w2k
            scol = ccol + (stream_offset2 - stream_offset)
        xmask = rmask[:, None] & cmask[None, :]
        x_tile = tl.load(xs_ptr + rows64[:, None] * sx + chan[None, :], mask=xmask, other=0.0)
        wmask = rmask & (slot >= 0) & (slot < num_slots)
        wslot = tl.where(wmask, slot, 0)
        dst = (wslot // N) * stride_cb + (wslot % N) * stride_cn
        tl.store(cache_ptr + dst[:, None] + scol[None, :], x_tile, mask=wmask[:, None] & cmask[None, :])

        w_cur = tl.load(ws_ptr + chan * swc + (W - 1) * swk, mask=cmask, other=0.0).to(tl.float32)
        acc = w_cur[None, :] * x_tile.to(tl.float32)
        for k in tl.static_range(W - 1):
            dist = k + 1  # constexpr: k comes from static_range
            wv = tl.load(ws_ptr + chan * swc + (W - 1 - dist) * swk, mask=cmask, other=0.0).to(tl.float32)
            if USE_MAP:
                code = tl.sum(tl.where(kk[None, :] == k, codes, 0), axis=1)  # column k
                xrow, cslot = decode_tap_codes(code, num_slots)
                from_x = xrow >= 0
                from_cache = cslot >= 0
                xrow = tl.where(from_x, xrow, 0)
                cslot = tl.where(from_cache, cslot, 0)
                if TAP_SELECT:
                    # one load a tap: the address picked per row from x or the cache
                    xp = xs_ptr + xrow[:, None] * sx + chan[None, :]
                    cp = cache_ptr + ((cslot // N) * stride_cb + (cslot % N) * stride_cn)[:, None] + scol[None, :]
                    tap = tl.load(tl.where(from_x[:, None], xp, cp),
                                  mask=(from_x | from_cache)[:, None] & cmask[None, :], other=0.0).to(tl.float32)
                else:
                    tap = tl.load(
                        xs_ptr + xrow[:, None] * sx + chan[None, :],
                        mask=from_x[:, None] & cmask[None, :],
                        other=0.0,
                    ).to(tl.float32)
                    tap += tl.load(
                        cache_ptr + ((cslot // N) * stride_cb + (cslot % N) * stride_cn)[:, None] + scol[None, :],
                        mask=from_cache[:, None] & cmask[None, :],
                        other=0.0,
                    ).to(tl.float32)
            else:
                trow = rows64 - dist
                in_fwd = rmask & (pos - dist >= 0) & (trow >= qs) & (trow >= 0)
                tap = tl.load(
                    xs_ptr + trow[:, None] * sx + chan[None, :],
                    mask=in_fwd[:, None] & cmask[None, :],
                    other=0.0,
                ).to(tl.float32)
                if any_pre:
                    ps_k = tl.max(tl.where(kk[None, :] == k, pslot2, -1), axis=1)
                    hit_k = tl.max(tl.where(kk[None, :] == k, hit2, -1), axis=1)
                    from_cache = (ps_k >= 0) & (hit_k < 0)
                    ps_k = tl.where(from_cache, ps_k, 0)
                    tap += tl.load(
                        cache_ptr + ((ps_k // N) * stride_cb + (ps_k % N) * stride_cn)[:, None] + scol[None, :],
                        mask=from_cache[:, None] & cmask[None, :],
                        other=0.0,
                    ).to(tl.float32)
                    hrow = tl.where(hit_k >= 0, hit_k, 0).to(tl.int64)
                    tap += tl.load(
                        xs_ptr + hrow[:, None] * sx + chan[None, :],
                        mask=(hit_k >= 0)[:, None] & cmask[None, :],
                        other=0.0,
                    ).to(tl.float32)
            acc += wv[None, :] * tap

        if SILU:
            acc = acc / (1.0 + tl.exp(-acc))
        if RESIDUAL:
            acc += x_tile.to(tl.float32)
        tl.store(
            outs_ptr + rows64[:, None] * channels + chan[None, :],  # out: contiguous
            acc.to(outs_ptr.dtype.element_ty),
            mask=xmask,
        )


@dataclass(frozen=True)
class SconvConfig:
    """One launch configuration of the fused kernel."""

    block_t: int
    block_c: int
    num_warps: int
    # mapped launches: one load a tap, its address picked per row (the x row or the
    # cache slot) instead of two masked loads (one of them always masked off). The
    # default of fused_sconv's mapped launches of T x C >= MAP_MIN_WORK (choose_config)
    tap_select: bool = False
    # mapped launches: the row-register kernel (rows_kernel.py; block_t rows as register
    # vectors, no tap reloads inside a prompt; K and V in one launch). The default of
    # fused_sconv's and fused_sconv_kv's mapped launches of >= ROWS_MIN_TOKENS rows,
    # mostly prompt rows (rows_batch)
    rows: bool = False


def _pow2_floor(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def rows_batch(num_tokens: int, num_requests: int | None, num_prefill_tokens: int | None,
               min_tokens: int = 1024, either: bool = False) -> bool:
    """Whether a mapped launch's batch suits a row-register kernel (:mod:`.rows_kernel`,
    :mod:`inkling_kernels.sconv_add_rmsnorm.rows_kernel`): at least ``min_tokens`` rows,
    and mostly rows inside prompts, whose tiles read no tap from memory. With the
    batch's ``num_prefill_tokens`` hint: at least half its rows are prompt rows
    (``PREFILL_SHARE``); without it: at least ``ROWS_TOKENS_PER_REQUEST`` rows a request
    (``num_requests``, an upper bound: the block table's rows; ``None``: never).
    ``either``: either test suffices (the fused add/norm kernels' one-row tiles, whose
    load path takes only a request's first rows, also win on 8-row speculative batches)."""
    if num_tokens < min_tokens:
        return False
    per_request = num_requests is not None and num_tokens >= ROWS_TOKENS_PER_REQUEST * num_requests
    prompts = num_prefill_tokens is not None and num_prefill_tokens >= PREFILL_SHARE * num_tokens
    if either:
        return per_request or prompts
    return prompts if num_prefill_tokens is not None else per_request


def choose_config(num_tokens: int, num_heads: int, stream_width: int, mapped: bool = False,
                  one_load: bool = True, rows: bool = True, num_requests: int | None = None,
                  num_prefill_tokens: int | None = None) -> SconvConfig:
    """Heuristic tile choice per shape class (one config each: no autotuning; the
    classes and tiles come from GPU sweeps; benchmarks/RESULTS.md has the resulting
    times).

    BLOCK_C: the largest power of two dividing the stream width (<= 256; <= 128 with
    a tap map), so tiles never straddle heads and no lanes idle.

    With a tap map (``mapped``), a launch of at least ``ROWS_MIN_TOKENS`` rows whose
    batch is mostly prompt rows (:func:`rows_batch`: with the batch's
    ``num_prefill_tokens`` hint, at least ``PREFILL_SHARE`` of its rows; without it, at
    least ``ROWS_TOKENS_PER_REQUEST`` rows per request, ``num_requests`` being at most
    this many requests, ``None``: never), over a multiple of 256 channels, takes the
    row-register kernel (``rows``: 8 rows x 256 channels, two warps, one launch for one
    stream or for K and V; :mod:`.rows_kernel`). Its tiles inside a prompt read no tap
    from memory; its tiles with decode rows or a request's first rows take a load path
    of a round trip per 64-channel chunk, so it wins while those tiles are a minority
    (decode-heavy and speculative batches keep the tiles below). ``rows=False`` keeps
    the tiles (the fallback when the row kernel cannot take a launch).

    Otherwise, with a tap map, a launch of ``T * C >= MAP_MIN_WORK`` takes 16 x
    BLOCK_C tiles (four warps at 128 channels) whose taps are one load each
    (``tap_select``). ``one_load=False`` (the two-stream ``fused_sconv_kv`` launch and
    ``fused_sconv_add``, whose tiles mirror these and are slower with it) keeps the
    two-load tiles: small batches (decode, speculative verification) take 4 rows x
    BLOCK_C on two warps once there is enough work (T*C >= 300k), else one row on one
    warp; large batches take 32 x BLOCK_C (8 x BLOCK_C below 16M elements) on four warps.

    Without a map the in-kernel prologue (block table + hazard search) dominates
    small batches: one or two rows per one-warp program spread the gathers, and a
    narrow power-of-two head (< 256 channels) shares its tile with the next heads, up
    to 512 channels; large batches take ~2k-element tiles on four warps.
    """
    if stream_width % 32 == 0:
        block_c = min(256, stream_width & -stream_width)
    else:
        block_c = min(256, pow2_ceil(stream_width))
    work = num_tokens * num_heads * stream_width
    if mapped:
        if (rows and rows_batch(num_tokens, num_requests, num_prefill_tokens, ROWS_MIN_TOKENS)
                and num_heads * stream_width % 256 == 0):
            return SconvConfig(block_t=8, block_c=256, num_warps=2, rows=True)
        block_c = min(block_c, 128)
        if one_load and work >= MAP_MIN_WORK:
            # 32-row tiles with the one-load tap are much slower (registers: an
            # address tile per tap); 16 rows keep the 16-byte vector loads.
            return SconvConfig(block_t=16, block_c=block_c, num_warps=max(1, min(4, 16 * block_c // 512)),
                               tap_select=True)
        if num_tokens <= 1024:
            if work >= 300_000:
                return SconvConfig(block_t=4, block_c=block_c, num_warps=2)
            return SconvConfig(block_t=1, block_c=block_c, num_warps=1)
        return SconvConfig(block_t=32 if work >= 16 * 2**20 else 8, block_c=block_c, num_warps=4)
    if num_tokens <= 1024:
        if block_c == stream_width < 256:
            # Narrow power-of-two heads: one tile spans up to 512 channels (whole
            # heads), so a row's prologue and hazard scan run in fewer programs.
            block_c = min(512, pow2_ceil(num_heads * stream_width))
            chunks = -(-num_heads * stream_width // block_c)
        else:
            chunks = num_heads * -(-stream_width // block_c)
        block_t = 2 if num_tokens * chunks >= 4096 else 1
        return SconvConfig(block_t=block_t, block_c=block_c, num_warps=1)
    block_c = min(block_c, 128)
    block_t = max(1, 2048 // block_c)
    return SconvConfig(block_t=block_t, block_c=block_c, num_warps=max(1, min(4, block_t * block_c // 512)))


def _scan_chunk(cfg: SconvConfig, taps_p2: int) -> int:
    """Slot-mapping chunk of the hazard scan (one row's taps against SCAN slots per
    step): ~32 compares per thread in small tiles, ~16 in large ones (the scan's
    registers count against the tile's)."""
    per_thread = 32 if cfg.block_t * cfg.block_c <= 1024 else 16
    return max(16, min(512, _pow2_floor(per_thread * 32 * cfg.num_warps // taps_p2)))


#: Launches moving at least this many elements (T * C) without a tap map build one
#: for the call (see the module docstring).
MAP_MIN_WORK = 2**20
#: Mapped launches of at least this many rows take the row-register kernel by default
#: when most rows are prompt rows: without the ``num_prefill_tokens`` hint, when they
#: have at least ``ROWS_TOKENS_PER_REQUEST`` rows a request (rows_batch).
ROWS_MIN_TOKENS = 1024
ROWS_TOKENS_PER_REQUEST = 8
#: With the batch's ``num_prefill_tokens`` hint, launches whose prompt rows are at least
#: this share of the rows take it (rows_batch).
PREFILL_SHARE = 0.5
#: Channels per chunk of the row-register kernel's load path (rows_kernel._load_path).
ROWS_LOAD_PATH_CHANNELS = 64
#: The row-register kernel computes cache offsets in int32 when every element of the
#: cache lies below this offset (fewer registers), else in int64.
ROWS_OFFSET32_LIMIT = 2**31


def auto_tap_map(batch: SconvBatch, prob: SconvProblem, device: torch.device, auto_map: bool = True) -> torch.Tensor | None:
    """The launch's tap map: the batch's own, else (``auto_map``) one built now when
    the launch moves at least :data:`MAP_MIN_WORK` elements (a map-less launch of that
    size resolves every row's taps in each of its channel programs), else ``None``."""
    tap_map = batch.tap_map
    if tap_map is None and auto_map and prob.num_tokens * prob.channels >= MAP_MIN_WORK and prob.num_slots <= TAP_MAP_MAX_SLOTS:
        from ..tap_map.kernel import launch_sconv_tap_map

        tap_map = torch.empty(prob.num_tokens, prob.kernel_size - 1, dtype=torch.int64, device=device)
        launch_sconv_tap_map(batch, prob.kernel_size, tap_map)
    return tap_map


class ConvStream(NamedTuple):
    """One stream of a launch: its input rows (unit column stride, any row stride),
    its ``[C, W]`` weight view, its contiguous output and its offset inside D."""

    x: torch.Tensor
    weight2d: torch.Tensor
    out: torch.Tensor
    offset: int


def launch_conv_streams(
    streams: tuple[ConvStream, ...],
    cache: torch.Tensor,
    batch: SconvBatch,
    prob: SconvProblem,
    stream_width: int,
    activation: str | None,
    residual: bool,
    *,
    config: SconvConfig | None = None,
    auto_map: bool = True,
) -> None:
    """One launch of the fused kernel over one stream, or two of equal width whose
    programs share the tap resolution (``sconv_kv``: K and V), on checked arguments
    (``prob``: the first stream's; every stream has its T, C, H and W). The map
    decision and the tiles are those of one stream of the launch's shape."""
    if prob.num_tokens == 0:
        return
    if not 1 <= len(streams) <= 2:
        raise ValueError(f"the kernel convolves one or two streams per launch, got {len(streams)}")
    tap_map = auto_tap_map(batch, prob, cache.device, auto_map)
    # (the block table has a row per request, at least: the rows rule's request bound)
    cfg = config or choose_config(prob.num_tokens, prob.num_heads, stream_width, tap_map is not None,
                                  one_load=len(streams) == 1, num_requests=batch.block_table.shape[0],
                                  num_prefill_tokens=batch.num_prefill_tokens)
    if cfg.rows:
        why = None if tap_map is not None else "it needs the step's tap map"
        for st in streams:
            why = why or rows_unfit(prob.num_tokens, prob.channels, st.x.stride(0), prob.kernel_size, cfg.block_t,
                                    cfg.block_c)
        if why is None:
            # (two streams, K and V, write and read other columns of the slots, and the
            # map already names every same-step writer's row: their programs need no
            # order between them)
            _launch_rows(streams, cache, batch, prob, stream_width, activation, residual, cfg, tap_map)
            return
        if config is not None:
            raise ValueError(f"SconvConfig(rows=True) cannot take this launch: {why}; use rows=False")
        cfg = choose_config(prob.num_tokens, prob.num_heads, stream_width, True, one_load=len(streams) == 1,
                            rows=False)
    taps_p2 = pow2_ceil(prob.kernel_size - 1)
    scan = _scan_chunk(cfg, taps_p2)
    if cfg.block_c & (cfg.block_c - 1) or cfg.block_t & (cfg.block_t - 1) or scan & (scan - 1):
        raise ValueError(f"config tile sizes must be powers of two, got {cfg}")
    # A launch of at most SCAN rows scans slot_mapping as one chunk, sized to T.
    one_chunk = tap_map is None and prob.num_tokens <= scan
    if one_chunk:
        scan = max(16, min(scan, pow2_ceil(prob.num_tokens)))
    # Tiles wider than a (power-of-two) head cover whole heads.
    hpt = cfg.block_c // stream_width if cfg.block_c > stream_width and cfg.block_c % stream_width == 0 else 1
    chunks = 1 if hpt > 1 else -(-stream_width // cfg.block_c)
    block_t = cfg.block_t
    while cdiv(prob.num_tokens, block_t) > 65535:  # grid axis-1 limit
        block_t *= 2
    heads_grid = -(-prob.num_heads // hpt) if hpt > 1 else prob.num_heads * chunks
    grid = (heads_grid, cdiv(prob.num_tokens, block_t))
    first, second = streams[0], streams[-1]  # (one stream: the second is unused)
    table = batch.block_table
    _fused_sconv_kernel[grid](
        first.x, first.weight2d, cache, first.out,
        batch.positions, table, batch.seq_idx, batch.slot_mapping, batch.query_start,
        batch.slot_mapping if tap_map is None else tap_map,  # (unused without a map)
        prob.num_tokens, prob.channels, prob.num_slots,
        table.shape[0], table.shape[1],
        first.weight2d.stride(0), first.weight2d.stride(1),
        cache.stride(0), cache.stride(1), cache.stride(2),
        table.stride(0),
        first.offset,
        first.x.stride(0),
        second.x, second.weight2d, second.out,
        second.x.stride(0), second.weight2d.stride(0), second.weight2d.stride(1),
        second.offset,
        WS=stream_width, N=batch.block_size, W=prob.kernel_size, WP=taps_p2,
        BLOCK_T=block_t, BLOCK_C=cfg.block_c, CHUNKS=chunks, SCAN=scan,
        SILU=activation == "silu", RESIDUAL=residual,
        SLOT32=prob.num_slots < 2**31 - 1,
        EARLY_SCAN_LOADS=block_t * cfg.block_c <= 1024 or one_chunk,
        ONE_CHUNK=one_chunk, HPT=hpt,
        USE_MAP=tap_map is not None,
        STREAMS=len(streams),
        num_warps=cfg.num_warps,
        TAP_SELECT=cfg.tap_select,
    )


def _launch_rows(streams: tuple[ConvStream, ...], cache: torch.Tensor, batch: SconvBatch, prob: SconvProblem,
                 stream_width: int, activation: str | None, residual: bool, cfg: SconvConfig,
                 tap_map: torch.Tensor) -> None:
    """The row-register kernel on a launch that :func:`.rows_kernel.rows_unfit` passed:
    one launch for one stream, or for two (K and V) whose rows share a stride and whose
    weights share their strides (so their layout, ``WTILE``; the grid's third axis picks
    the stream), else a launch each."""
    if len(streams) == 2 and (streams[0].x.stride(0) != streams[1].x.stride(0)
                              or streams[0].weight2d.stride() != streams[1].weight2d.stride()):
        for st in streams:
            _launch_rows((st,), cache, batch, prob, stream_width, activation, residual, cfg, tap_map)
        return
    first, second = streams[0], streams[-1]
    grid = (prob.channels // cfg.block_c, cdiv(prob.num_tokens, cfg.block_t), len(streams))
    _rows_sconv_kernel[grid](
        first.x, first.weight2d, cache, first.out, batch.slot_mapping, tap_map,
        prob.num_tokens, prob.num_slots,
        first.weight2d.stride(0), first.weight2d.stride(1),
        cache.stride(0), cache.stride(1), cache.stride(2), first.offset,
        C=prob.channels, SX=first.x.stride(0), WS=stream_width, N=batch.block_size, W=prob.kernel_size,
        ROWS=cfg.block_t, BLOCK_C=cfg.block_c, QP=max(2, pow2_ceil(cfg.block_t * (prob.kernel_size - 1))),
        SILU=activation == "silu", RESIDUAL=residual,
        WTILE=rows_weight_tile(first.weight2d), SUB=min(ROWS_LOAD_PATH_CHANNELS, cfg.block_c),
        OFF64=cache_max_offset(cache) >= ROWS_OFFSET32_LIMIT,
        x2_ptr=second.x, w2_ptr=second.weight2d, out2_ptr=second.out, stream_offset2=second.offset,
        STREAMS=len(streams),
        num_warps=cfg.num_warps,
    )


def launch_fused_sconv(
    x: torch.Tensor,
    cache: torch.Tensor,
    batch: SconvBatch,
    prob: SconvProblem,
    stream_offset: int,
    stream_width: int,
    activation: str | None,
    residual: bool,
    *,
    config: SconvConfig | None = None,
    out: torch.Tensor | None = None,
    auto_map: bool = True,
) -> torch.Tensor:
    """Allocate ``out`` and launch (CUDA, or CPU tensors under ``TRITON_INTERPRET=1``)
    on arguments that passed :func:`inkling_kernels.checks.check_conv_call` (which
    made ``prob``). ``config`` overrides the heuristic tile choice; ``out`` receives
    the result; ``auto_map=False`` keeps a large launch without a tap map map-less
    (benchmarks measure that path)."""
    if out is None:
        out = torch.empty_like(x)
    launch_conv_streams(
        (ConvStream(x, prob.weight2d, out, stream_offset),), cache, batch, prob, stream_width,
        activation, residual, config=config, auto_map=auto_map,
    )
    return out


def fused_sconv_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    cache: torch.Tensor,
    batch: SconvBatch,
    stream_offset: int,
    stream_width: int,
    *,
    activation: str | None = None,
    residual: bool = True,
    config: SconvConfig | None = None,
    out: torch.Tensor | None = None,
    auto_map: bool = True,
) -> torch.Tensor:
    """Check and launch the Triton kernel directly, whatever the device (tests run
    CPU tensors under ``TRITON_INTERPRET=1``; benchmarks pass ``config``). Same
    contract as :func:`inkling_kernels.fused_sconv`; ``out`` (contiguous, like x)
    receives the result (tests poison it first)."""
    prob = check_conv_call(x, weight, cache, batch, stream_offset, stream_width, activation, residual)
    return launch_fused_sconv(
        x, cache, batch, prob, stream_offset, stream_width, activation, residual,
        config=config, out=output_for("out", out, x, (("x", x), ("weight", weight), ("cache", cache))),
        auto_map=auto_map,
    )

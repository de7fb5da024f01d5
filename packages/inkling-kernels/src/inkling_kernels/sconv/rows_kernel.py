"""The row-register kernel of ``fused_sconv`` and ``fused_sconv_kv``: large mapped
launches of one stream, or of K and V in one launch (``STREAMS=2``: the grid's third
axis picks the stream's x, weights, out and cache column) (``SconvConfig.rows``; the
default for prefill-sized batches, ``choose_config``).

Why a second kernel. A tile kernel (:mod:`.kernel`) loads its ``[BLOCK_T, BLOCK_C]`` x
tile, stores it into the rows' slots, then loads each tap: rows ``t - 1 .. t - 3``
again, from L1/L2. The slot store may alias any load as far as the compiler knows, so
those tap loads stay after it and each tile pays a second round trip; the extra loads
also take issue slots.

Here a program owns ``ROWS`` consecutive rows of ``BLOCK_C`` channels and keeps them,
and the ``W - 1`` rows before them, as separate ``[BLOCK_C]`` register vectors (one
16-byte-or-smaller load each), all loaded before anything is stored. The step's tap map
(:mod:`inkling_kernels.tap_map`) is read once per tile as one vector of
``ROWS * (W - 1)`` codes and reduced to two scalars: a bit per (row, tap) that says "this
tap is x row ``t - dist``" (a register vector), and a count of taps that are neither
that nor absent. When the count is 0 (a tile inside a prompt: prefill, chunked prefill)
the taps are register vectors or zero, and the program issues no load after its first
ones. Otherwise (decode rows, a chunk's first rows, same-step writers) the tile takes
the load path (:func:`_load_path`): ``[ROWS, SUB]`` channel chunks whose taps are one
masked load each from the x row or cache slot the map names, loaded before the chunk's
stores, so the tile waits a round trip per chunk rather than per row. Both paths give
the same value for every row (fp32 accumulation in the same order as the tile kernel;
the cache bit for bit).

The kernel is bound by registers (occupancy), so the load path matters even to
prompt-only launches: the register need is the larger of the two branches. The load
path works in channel chunks, which do not read the register rows, rather than row by
row, so those registers are free for the chunk tiles.

The weights (``[C, W]``, each channel's taps contiguous: the model's layout) are read
as one ``[BLOCK_C, 4]`` tile and split into their columns in registers (``WTILE``,
``rows_weight_tile``): W strided ``[BLOCK_C]`` vectors would cost a scalar load per
channel and tap and many more registers.

Tile order: the grid takes the row tiles first to last (``pid_t = program_id(1)``), with
no arithmetic on the program id before the first loads (ptxas schedules those loads
worse otherwise). The vLLM plugin puts decode rows first, so their load-path tiles,
which wait on round trips, start with the launch.

x offsets are int32 (the launcher checks that they fit: ``T * row stride < 2^31``);
cache offsets are int32 when every element of the cache lies below offset 2^31
(``OFF64`` off: fewer registers than int64 offsets), else int64.
``C`` and the x row stride are compile-time constants (one compile per layer shape).
The host guarantees ``C % BLOCK_C == 0`` (no channel mask) and ``ROWS * (W - 1) <= 64``
(the bit mask).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import triton
import triton.language as tl

from .._triton_common import cdiv, decode_tap_codes

if TYPE_CHECKING:
    import torch


@triton.jit
def weight_columns4(w_ptr, chan, stride_wc, BLOCK_C: tl.constexpr):
    """The 4 taps' weights of channels ``chan`` (``[C, 4]``, taps contiguous) as 4 fp32
    ``[BLOCK_C]`` vectors: one ``[BLOCK_C, 4]`` load (a vector load per channel), split
    into its columns in registers."""
    w2d = tl.load(w_ptr + chan[:, None] * stride_wc + tl.arange(0, 4)[None, :]).to(tl.float32)
    w02, w13 = tl.split(tl.reshape(w2d, [BLOCK_C, 2, 2]))  # columns (0, 2) and (1, 3)
    w0, w2 = tl.split(w02)
    w1, w3 = tl.split(w13)
    return w0, w1, w2, w3


@triton.jit
def tile_slots(slot_ptr, t0, num_tokens, num_slots, stride_cb, stride_cn, N: tl.constexpr, ROWS: tl.constexpr,
               OFF64: tl.constexpr):
    """Each of the tile's ``ROWS`` rows' slot as two ``ROWS``-tuples of scalars: its
    cache offset (block and in-block strides) and whether it is written."""
    dsts = ()
    oks = ()
    for i in tl.static_range(ROWS):
        slot = tl.load(slot_ptr + t0 + i, mask=t0 + i < num_tokens, other=-1)
        ok = (t0 + i < num_tokens) & (slot >= 0) & (slot < num_slots)
        ws = tl.where(ok, slot, 0).to(tl.int64 if OFF64 else tl.int32)
        dsts = dsts + ((ws // N) * stride_cb + (ws % N) * stride_cn,)
        oks = oks + (ok,)
    return dsts, oks


@triton.jit
def tile_tap_bits(map_ptr, t0, num_tokens, num_slots, W: tl.constexpr, ROWS: tl.constexpr, QP: tl.constexpr):
    """The tile's map codes, (row, distance) row-major, read as one vector and reduced
    to two scalars: a bit per pair whose tap is x row ``t - dist`` (bit ``i * (W - 1) +
    dist - 1``), and how many pairs have a tap that is neither that nor absent."""
    q = tl.arange(0, QP)
    qt = t0 + q // (W - 1)
    qlive = (q < ROWS * (W - 1)) & (qt < num_tokens)
    code = tl.load(map_ptr + t0.to(tl.int64) * (W - 1) + q, mask=qlive, other=-1)
    xrow, cslot = decode_tap_codes(code, num_slots)
    in_reg = (xrow >= 0) & (xrow == qt - (q % (W - 1) + 1))
    regbits = tl.sum(tl.where(in_reg, tl.full([QP], 1, tl.int64) << q.to(tl.int64), 0), axis=0)
    other_taps = tl.sum((((xrow >= 0) & ~in_reg) | (cslot >= 0)).to(tl.int32), axis=0)
    return regbits, other_taps


@triton.jit
def tile_tap_sources(slot_ptr, map_ptr, t0, num_tokens, num_slots, stride_cb, stride_cn, N: tl.constexpr,
                     W: tl.constexpr, ROWS: tl.constexpr, OFF64: tl.constexpr):
    """The load path's per-row view of a tile (``[ROWS]`` vectors): its rows ``t``,
    which are live, which slots are written and their cache offsets, then per distance
    ``k + 1`` (``W - 1``-tuples): the x row of the tap, whether it comes from x, its
    cache offset, and whether there is a tap at all."""
    t = t0 + tl.arange(0, ROWS)
    live = t < num_tokens
    slot = tl.load(slot_ptr + t, mask=live, other=-1)
    ok = live & (slot >= 0) & (slot < num_slots)
    ws = tl.where(ok, slot, 0).to(tl.int64 if OFF64 else tl.int32)
    dst = (ws // N) * stride_cb + (ws % N) * stride_cn
    xrows = ()
    from_xs = ()
    cdsts = ()
    takes = ()
    for k in tl.static_range(W - 1):  # map column k: distance k + 1
        code = tl.load(map_ptr + t.to(tl.int64) * (W - 1) + k, mask=live, other=-1)
        xrow, cslot = decode_tap_codes(code, num_slots)
        cs = tl.where(cslot >= 0, cslot, 0).to(tl.int64 if OFF64 else tl.int32)
        xrows = xrows + (tl.where(xrow >= 0, xrow, 0).to(tl.int32),)
        from_xs = from_xs + (xrow >= 0,)
        cdsts = cdsts + ((cs // N) * stride_cb + (cs % N) * stride_cn,)
        takes = takes + ((xrow >= 0) | (cslot >= 0),)
    return t, live, ok, dst, xrows, from_xs, cdsts, takes


@triton.jit
def chunk_taps(x_ptr, cache_ptr, xrows, from_xs, cdsts, takes, ch, ccol, SX: tl.constexpr, W: tl.constexpr):
    """A load-path chunk's taps (``[ROWS, SUB]``, one per distance ``k + 1``, in x's
    dtype, 0 where a row has none): one masked load each, from the x row or the cache
    slot that :func:`tile_tap_sources` resolved."""
    taps = ()
    for k in tl.static_range(W - 1):
        src = tl.where(from_xs[k][:, None], x_ptr + (xrows[k][:, None] * SX + ch[None, :]),
                       cache_ptr + (cdsts[k][:, None] + ccol[None, :]))
        taps = taps + (tl.load(src, mask=takes[k][:, None], other=0.0),)
    return taps


@triton.jit
def _load_path(
    x_ptr, w_ptr, cache_ptr, out_ptr, slot_ptr, map_ptr, t0, num_tokens, num_slots, pid_c,
    stride_wc, stride_wk, stride_cb, stride_ch, stride_cn, stream_offset,
    C: tl.constexpr, SX: tl.constexpr, WS: tl.constexpr, N: tl.constexpr, W: tl.constexpr, ROWS: tl.constexpr,
    BLOCK_C: tl.constexpr, SUB: tl.constexpr, SILU: tl.constexpr, RESIDUAL: tl.constexpr, OFF64: tl.constexpr,
):
    """A tile with taps outside its register rows (decode rows, a chunk's first rows,
    same-step writers), as ``[ROWS, SUB]`` channel chunks: each row's taps resolved once
    from the map (a ``[ROWS]`` code vector per distance), then per chunk its x tile and
    every distance's taps (one masked load each, from the x row or the cache slot the map
    names, 0 where there is none), loaded before the chunk's stores; its weights after
    them, one strided vector a tap (L1 hits; held from the start, or read as the
    ``[SUB, 4]`` tile, they cost more registers). A chunk's loads wait for
    the chunk before it: one round trip a chunk, not a row. The program's register rows
    are not read here, so their registers are free for the chunk tiles. Same fp32
    accumulation order as :func:`_conv_row`."""
    t, live, ok, dst, xrows, from_xs, cdsts, takes = tile_tap_sources(
        slot_ptr, map_ptr, t0, num_tokens, num_slots, stride_cb, stride_cn, N, W, ROWS, OFF64)
    for cc in tl.static_range(BLOCK_C // SUB):
        ch = pid_c * BLOCK_C + cc * SUB + tl.arange(0, SUB)
        ccol = (ch // WS) * stride_ch + stream_offset + ch % WS
        xt = tl.load(x_ptr + (t[:, None] * SX + ch[None, :]), mask=live[:, None], other=0.0)
        taps = chunk_taps(x_ptr, cache_ptr, xrows, from_xs, cdsts, takes, ch, ccol, SX, W)
        tl.store(cache_ptr + (dst[:, None] + ccol[None, :]), xt, mask=ok[:, None])
        xf = xt.to(tl.float32)
        acc = tl.load(w_ptr + ch * stride_wc + (W - 1) * stride_wk).to(tl.float32)[None, :] * xf
        for k in tl.static_range(W - 1):
            wk = tl.load(w_ptr + ch * stride_wc + (W - 2 - k) * stride_wk).to(tl.float32)
            acc += wk[None, :] * taps[k].to(tl.float32)
        if SILU:
            acc = acc / (1.0 + tl.exp(-acc))
        if RESIDUAL:
            acc += xf
        tl.store(out_ptr + (t[:, None] * C + ch[None, :]), acc.to(out_ptr.dtype.element_ty), mask=live[:, None])


@triton.jit
def _conv_row(
    cache_ptr, out_ptr, xs, wts, dst, ok, regbits, t, live, chan, ccol,
    i: tl.constexpr, C: tl.constexpr, W: tl.constexpr, SILU: tl.constexpr, RESIDUAL: tl.constexpr,
):
    """Row ``t`` (the tile's row ``i``, inside a prompt): its slot store (at cache offset
    ``dst`` where ``ok``), its conv, its out. The tap at distance d is the register
    vector of row ``t - d`` where the map says so (``regbits``), else 0."""
    xi = xs[i + W - 1]
    tl.store(cache_ptr + (dst + ccol), xi, mask=ok)
    xf = xi.to(tl.float32)
    acc = wts[W - 1] * xf
    for k in tl.static_range(W - 1):  # distance k + 1: x row t - k - 1 is xs[i + W - 2 - k]
        tap = tl.where(((regbits >> (i * (W - 1) + k)) & 1) != 0, xs[i + W - 2 - k], 0.0)
        acc += wts[W - 2 - k] * tap.to(tl.float32)
    if SILU:
        acc = acc / (1.0 + tl.exp(-acc))
    if RESIDUAL:
        acc += xf
    tl.store(out_ptr + (t * C + chan), acc.to(out_ptr.dtype.element_ty), mask=live)


@triton.jit(do_not_specialize=["num_tokens"])
def _rows_sconv_kernel(
    x_ptr,
    w_ptr,
    cache_ptr,
    out_ptr,
    slot_ptr,
    map_ptr,
    num_tokens,
    num_slots,
    stride_wc,
    stride_wk,
    stride_cb,
    stride_ch,
    stride_cn,
    stream_offset,
    C: tl.constexpr,
    SX: tl.constexpr,
    WS: tl.constexpr,
    N: tl.constexpr,
    W: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_C: tl.constexpr,
    QP: tl.constexpr,
    SILU: tl.constexpr,
    RESIDUAL: tl.constexpr,
    WTILE: tl.constexpr,
    SUB: tl.constexpr,
    OFF64: tl.constexpr,
    x2_ptr,  # the second stream (STREAMS == 2): its x, weights, out and cache column
    w2_ptr,
    out2_ptr,
    stream_offset2,
    STREAMS: tl.constexpr,
):
    if STREAMS == 2:  # (K and V: the grid's third axis picks the stream)
        if tl.program_id(2) == 1:
            x_ptr = x2_ptr
            w_ptr = w2_ptr
            out_ptr = out2_ptr
            stream_offset = stream_offset2
    pid_c = tl.program_id(0)
    pid_t = tl.program_id(1)
    chan = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    ccol = (chan // WS) * stride_ch + stream_offset + chan % WS  # column inside a cache row
    t0 = pid_t * ROWS
    # Every x row the tile reads, before any store: xs[j] is row t0 - (W - 1) + j.
    xs = ()
    for j in tl.static_range(ROWS + W - 1):
        xs = xs + (tl.load(x_ptr + ((t0 - (W - 1) + j) * SX + chan),
                           mask=(t0 - (W - 1) + j >= 0) & (t0 - (W - 1) + j < num_tokens), other=0.0),)
    dsts, oks = tile_slots(slot_ptr, t0, num_tokens, num_slots, stride_cb, stride_cn, N, ROWS, OFF64)
    regbits, other_taps = tile_tap_bits(map_ptr, t0, num_tokens, num_slots, W, ROWS, QP)
    if WTILE:
        wts = weight_columns4(w_ptr, chan, stride_wc, BLOCK_C)
    else:
        wts = ()
        for k in tl.static_range(W):
            wts = wts + (tl.load(w_ptr + chan * stride_wc + k * stride_wk).to(tl.float32),)
    if other_taps == 0:
        for i in tl.static_range(ROWS):
            _conv_row(cache_ptr, out_ptr, xs, wts, dsts[i], oks[i], regbits, t0 + i, t0 + i < num_tokens,
                      chan, ccol, i, C, W, SILU, RESIDUAL)
    else:
        _load_path(x_ptr, w_ptr, cache_ptr, out_ptr, slot_ptr, map_ptr, t0, num_tokens, num_slots, pid_c,
                   stride_wc, stride_wk, stride_cb, stride_ch, stride_cn, stream_offset,
                   C, SX, WS, N, W, ROWS, BLOCK_C, SUB, SILU, RESIDUAL, OFF64)


def rows_weight_tile(weight2d: torch.Tensor) -> bool:
    """Whether the kernel reads the ``[C, W]`` weights as one ``[BLOCK_C, 4]`` tile (W = 4
    and each channel's taps contiguous: a vector load per channel) rather than W
    strided ``[BLOCK_C]`` loads (one scalar load per channel and tap)."""
    return weight2d.shape[1] == 4 and weight2d.stride(1) == 1


def rows_unfit(num_tokens: int, channels: int, row_stride: int, kernel_size: int, block_t: int,
               block_c: int) -> str | None:
    """Why the row-register kernel cannot take this launch (None: it can); the
    launch's arguments passed ``check_conv_call`` (so ``kernel_size >= 2``)."""
    if channels % block_c:
        return f"C={channels} is not a multiple of the tile's {block_c} channels"
    if block_t * (kernel_size - 1) > 64:
        return f"{block_t} rows x {kernel_size - 1} taps exceed the 64-bit tap mask"
    if (num_tokens + block_t) * max(row_stride, channels) >= 2**31:
        return "x offsets would overflow int32"
    if cdiv(num_tokens, block_t) > 65535:
        return "more than 65535 row tiles"
    return None


def cache_max_offset(cache: torch.Tensor) -> int:
    """The largest element offset inside ``cache`` (its strides may leave gaps)."""
    return sum((size - 1) * stride for size, stride in zip(cache.shape, cache.stride()))

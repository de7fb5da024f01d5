"""The row-register kernel of ``fused_sconv_add_rmsnorm`` and ``fused_sconv_add``
(``NormConfig.rows``): prefill-sized launches with the step's tap map.

Why a second kernel. The tile kernel (:mod:`.kernel`) gives a program one row (or a
few) and loads each earlier tap as its own row of ``d`` again, after the row's slot
store, which the compiler must keep ordered before those loads (they may alias). Each
``d`` row is then read four times and every chunk waits two round trips. This kernel
applies :mod:`inkling_kernels.sconv.rows_kernel`'s design to the fused op: a program owns ``ROWS`` consecutive rows and loads, per channel chunk, those
rows and the ``W - 1`` rows before them once, as ``[BLOCK_C]`` register vectors, with
``hidden``'s rows, before any store of the chunk; each row's taps are the register
vectors of the rows before it (the map says which taps are x rows ``t - dist``).

With the norm (``HAS_NORM``) the program owns whole rows: it walks the row's
``C / BLOCK_C`` chunks in a loop (pass 1: slot stores, conv, ``s = dt(d + conv)``,
``new_h = dt(hidden + s)`` stored, its squares summed per lane), then reduces the sums,
waits at a block barrier and walks the chunks again (pass 2: ``new_h`` read back from
L1/L2, ``normed = dt(norm_weight * dt(new_h * rstd))`` stored). Without the norm
(``fused_sconv_add`` on a tp shard) program ``(c, p)`` does chunk ``c`` of row tile
``p`` once.

A tile with any tap that is not a register row of its own (a decode row, a chunk's
first rows, a same-step writer's row) takes the load path instead: per chunk a
``[ROWS, BLOCK_C]`` tile of ``d`` and ``hidden`` and one masked load per tap from the
row of ``d`` or the cache slot the map names, all before the chunk's stores.

Rounding and accumulation order are the tile kernel's (``acc = w[W-1] d + w[0] tap0 +
... + w[W-2] tap(W-2)``, tap i at distance ``W - 1 - i``), so both kernels give the same
bits. x, hidden and output offsets are int32 (the launcher checks ``T * C < 2^31``);
cache offsets int32 unless the cache reaches past 2^31 elements (``OFF64``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..sconv.rows_kernel import chunk_taps, tile_slots, tile_tap_bits, tile_tap_sources, weight_columns4


@triton.jit
def _weights(w_ptr, chan, stride_wc, stride_wk, W: tl.constexpr, BLOCK_C: tl.constexpr, WTILE: tl.constexpr):
    """The W taps' weights of channels ``chan`` as fp32 ``[BLOCK_C]`` vectors."""
    if WTILE:
        wts = weight_columns4(w_ptr, chan, stride_wc, BLOCK_C)
    else:
        wts = ()
        for k in tl.static_range(W):
            wts = wts + (tl.load(w_ptr + chan * stride_wc + k * stride_wk).to(tl.float32),)
    return wts


@triton.jit
def _lanes(lane, cond):
    """A per-row scalar condition as a ``[BLOCK_C]`` mask, formed by a vector compare:
    Triton 3.9's interpreter turns ``scalar & scalar`` into an int32 mask that its loads
    refuse; compiled, ``lane * 0`` folds away and this is the scalar predicate."""
    return (lane * 0 + cond.to(tl.int32)) != 0


@triton.jit
def _register_chunks(
    hidden_ptr, d_ptr, w_ptr, cache_ptr, new_h_ptr, dsts, oks, regbits, t0, num_tokens, c_lo,
    stride_wc, stride_wk, stride_ch, stream_offset,
    C: tl.constexpr, WS: tl.constexpr, W: tl.constexpr, ROWS: tl.constexpr, BLOCK_C: tl.constexpr,
    WTILE: tl.constexpr, CHUNKS: tl.constexpr,
):
    """Pass 1 over chunks ``c_lo .. c_lo + CHUNKS - 1`` of a tile inside a prompt (every tap a
    register row or absent). Returns the rows' sums of ``new_h``'s squares ([ROWS] fp32)."""
    lane = tl.arange(0, BLOCK_C)
    sq = ()
    for i in tl.static_range(ROWS):
        sq = sq + (tl.zeros([BLOCK_C], dtype=tl.float32),)
    for cc in range(0, CHUNKS):
        c = c_lo + cc
        chan = c * BLOCK_C + lane
        ccol = (chan // WS) * stride_ch + stream_offset + chan % WS
        # every load of the chunk before its first store: xs[j] is row t0 - (W - 1) + j
        xs = ()
        for j in tl.static_range(ROWS + W - 1):
            r = t0 - (W - 1) + j
            xs = xs + (tl.load(d_ptr + (r * C + chan), mask=_lanes(lane, (r >= 0) & (r < num_tokens)), other=0.0),)
        hs = ()
        for i in tl.static_range(ROWS):
            hs = hs + (tl.load(hidden_ptr + ((t0 + i) * C + chan), mask=_lanes(lane, t0 + i < num_tokens),
                               other=0.0),)
        wts = _weights(w_ptr, chan, stride_wc, stride_wk, W, BLOCK_C, WTILE)
        nsq = ()
        for i in tl.static_range(ROWS):
            xi = xs[i + W - 1]
            tl.store(cache_ptr + (dsts[i] + ccol), xi, mask=_lanes(lane, oks[i]))
            xf = xi.to(tl.float32)
            acc = wts[W - 1] * xf
            for k in tl.static_range(W - 1):  # tap k: distance W - 1 - k, x row t - W + 1 + k = xs[i + k]
                bit = (regbits >> (i * (W - 1) + (W - 2 - k))) & 1
                acc += wts[k] * tl.where(bit != 0, xs[i + k], 0.0).to(tl.float32)
            s = (xf + acc).to(d_ptr.dtype.element_ty).to(tl.float32)
            nh = (hs[i].to(tl.float32) + s).to(d_ptr.dtype.element_ty)
            tl.store(new_h_ptr + ((t0 + i) * C + chan), nh, mask=_lanes(lane, t0 + i < num_tokens))
            nf = nh.to(tl.float32)  # (0 on rows past the batch: their loads gave 0)
            nsq = nsq + (sq[i] + nf * nf,)
        sq = nsq
    rows = tl.arange(0, ROWS)
    total = tl.zeros([ROWS], dtype=tl.float32)
    for i in tl.static_range(ROWS):
        total = tl.where(rows == i, tl.sum(sq[i], axis=0), total)
    return total


@triton.jit
def _load_chunks(
    hidden_ptr, d_ptr, w_ptr, cache_ptr, new_h_ptr, slot_ptr, map_ptr, t0, num_tokens, num_slots, c_lo,
    stride_wc, stride_wk, stride_cb, stride_ch, stride_cn, stream_offset,
    C: tl.constexpr, WS: tl.constexpr, N: tl.constexpr, W: tl.constexpr, ROWS: tl.constexpr,
    BLOCK_C: tl.constexpr, SUB: tl.constexpr, OFF64: tl.constexpr, CHUNKS: tl.constexpr,
):
    """Pass 1 over chunks ``c_lo .. c_lo + CHUNKS - 1`` of a tile with taps outside its register
    rows, as ``[ROWS, SUB]`` tiles (``SUB`` channels: the registers of a ``[ROWS,
    BLOCK_C]`` tile's addresses would set the whole kernel's occupancy): each row's taps
    resolved once from the map, then
    per chunk the tiles of ``d`` and ``hidden`` and each tap (one masked load, from the
    row of ``d`` or the cache slot the map names, 0 where there is none), loaded before
    the chunk's stores. Returns the rows' sums of ``new_h``'s squares ([ROWS] fp32)."""
    t, live, ok, dst, xrows, from_xs, cdsts, takes = tile_tap_sources(
        slot_ptr, map_ptr, t0, num_tokens, num_slots, stride_cb, stride_cn, N, W, ROWS, OFF64)
    sq = tl.zeros([ROWS, SUB], dtype=tl.float32)
    for cc in range(0, CHUNKS):
        c = c_lo + cc
        for u in tl.static_range(BLOCK_C // SUB):
            ch = (c * (BLOCK_C // SUB) + u) * SUB + tl.arange(0, SUB)
            ccol = (ch // WS) * stride_ch + stream_offset + ch % WS
            offs = t[:, None] * C + ch[None, :]
            xt = tl.load(d_ptr + offs, mask=live[:, None], other=0.0)
            ht = tl.load(hidden_ptr + offs, mask=live[:, None], other=0.0)
            taps = chunk_taps(d_ptr, cache_ptr, xrows, from_xs, cdsts, takes, ch, ccol, C, W)
            tl.store(cache_ptr + (dst[:, None] + ccol[None, :]), xt, mask=ok[:, None])
            xf = xt.to(tl.float32)
            acc = tl.load(w_ptr + ch * stride_wc + (W - 1) * stride_wk).to(tl.float32)[None, :] * xf
            for k in tl.static_range(W - 1):  # tap k: distance W - 1 - k, map column W - 2 - k
                wk = tl.load(w_ptr + ch * stride_wc + k * stride_wk).to(tl.float32)
                acc += wk[None, :] * taps[W - 2 - k].to(tl.float32)
            s = (xf + acc).to(d_ptr.dtype.element_ty).to(tl.float32)
            nh = (ht.to(tl.float32) + s).to(d_ptr.dtype.element_ty)
            tl.store(new_h_ptr + offs, nh, mask=live[:, None])
            nf = nh.to(tl.float32)
            sq += nf * nf
    return tl.sum(sq, axis=1)


@triton.jit(do_not_specialize=["num_tokens"])
def _rows_add_norm_kernel(
    hidden_ptr,
    d_ptr,
    w_ptr,
    cache_ptr,
    slot_ptr,
    map_ptr,
    norm_w_ptr,
    new_h_ptr,
    normed_ptr,
    num_tokens,
    num_slots,
    stride_wc,
    stride_wk,
    stride_cb,
    stride_ch,
    stride_cn,
    stream_offset,
    eps,
    C: tl.constexpr,
    WS: tl.constexpr,
    N: tl.constexpr,
    W: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_C: tl.constexpr,
    QP: tl.constexpr,
    WTILE: tl.constexpr,
    OFF64: tl.constexpr,
    HAS_NORM: tl.constexpr,
    SUB: tl.constexpr,
    NSUB: tl.constexpr,
    P2: tl.constexpr,
):
    pid_t = tl.program_id(1)
    t0 = pid_t * ROWS
    # With the norm the program walks every chunk of its rows; without it (fused_sconv_add)
    # the grid's first axis is the chunk.
    CHUNKS: tl.constexpr = C // BLOCK_C if HAS_NORM else 1
    c_lo = tl.program_id(0)
    # each row's slot, and the tile's taps: which are register rows, how many are not
    dsts, oks = tile_slots(slot_ptr, t0, num_tokens, num_slots, stride_cb, stride_cn, N, ROWS, OFF64)
    regbits, other_taps = tile_tap_bits(map_ptr, t0, num_tokens, num_slots, W, ROWS, QP)
    if other_taps == 0:
        sumsq = _register_chunks(
            hidden_ptr, d_ptr, w_ptr, cache_ptr, new_h_ptr, dsts, oks, regbits, t0, num_tokens, c_lo,
            stride_wc, stride_wk, stride_ch, stream_offset, C, WS, W, ROWS, BLOCK_C, WTILE, CHUNKS,
        )
    else:
        sumsq = _load_chunks(
            hidden_ptr, d_ptr, w_ptr, cache_ptr, new_h_ptr, slot_ptr, map_ptr, t0, num_tokens, num_slots, c_lo,
            stride_wc, stride_wk, stride_cb, stride_ch, stride_cn, stream_offset, C, WS, N, W, ROWS, BLOCK_C, SUB,
            OFF64, CHUNKS,
        )
    if HAS_NORM:
        # Pass 2: new_h read back (this program's own stores: a block barrier first).
        rstd = 1.0 / tl.sqrt_rn(sumsq / C + eps)
        t = t0 + tl.arange(0, ROWS)
        live = t < num_tokens
        tl.debug_barrier()
        for c in range(0, C // (NSUB * P2)):  # P2 tiles a step, all loaded before any store
            got = ()
            for u in tl.static_range(P2):
                ch = (c * P2 + u) * NSUB + tl.arange(0, NSUB)
                got = got + ((tl.load(new_h_ptr + (t[:, None] * C + ch[None, :]), mask=live[:, None], other=0.0),
                              tl.load(norm_w_ptr + ch)),)
            for u in tl.static_range(P2):
                ch = (c * P2 + u) * NSUB + tl.arange(0, NSUB)
                y = (got[u][0].to(tl.float32) * rstd[:, None]).to(d_ptr.dtype.element_ty).to(tl.float32)
                tl.store(normed_ptr + (t[:, None] * C + ch[None, :]),
                         (got[u][1].to(tl.float32)[None, :] * y).to(d_ptr.dtype.element_ty), mask=live[:, None])

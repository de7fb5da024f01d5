# Experiment: can the prefill-sized mapped fused_sconv move its minimum bytes faster?
# Measures, on bench_sconv's prefill-sized cases (with the step's tap map), the library's
# fused_sconv_triton (default config, the baseline) against experimental one-stream
# kernels defined below (activation None, residual True): per-column map loads, int32
# offsets, a per-tile "all taps in-forward" fast path with constexpr C, streaming
# stores, other tiles/warps, a row-streaming kernel, and taps shifted on chip from one
# x tile (mmashift: tl.dot with 0/1 shift matrices; gathershift: tl.gather; overlap:
# an aligned tile plus a small halo tile). Every variant is checked (out and cache) against
# fused_sconv_ref on the case's data before it is timed; a mismatch is FAIL, not timed.
# Reports median µs (CUDA-graph replay over several input sets), GB/s of minimum bytes,
# share of the copy baseline measured in this run, speed-up over the library kernel.
# GPU, from the repo root: PYTHONPATH=packages/inkling-kernels/src:packages/inkling-cache/src python3 packages/inkling-kernels/benchmarks/exp_prefill.py --json $OUT/prefill.json --budget-s 200
"""Prefill experiment for the mapped fused_sconv (see the header above).

``--dry-run`` runs on CPU under TRITON_INTERPRET=1 at tiny shapes: every variant's
correctness check and the deliberately wrong canary kernels (which must FAIL); no
timing. Exit status 1 when a variant fails or a canary passes.
"""

from __future__ import annotations

import os
import sys

if "--dry-run" in sys.argv:  # before triton is imported (here or by inkling_kernels)
    os.environ["TRITON_INTERPRET"] = "1"

import argparse
import contextlib
import dataclasses
import datetime
import json
import math
import pathlib
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import bench_sconv as bs  # noqa: E402  (the case setup, time_graph and copy_baseline)

from inkling_kernels import fused_sconv_ref  # noqa: E402
from inkling_kernels._triton_common import decode_tap_codes  # noqa: E402
from inkling_kernels.sconv import kernel as sconv_kernel  # noqa: E402
from inkling_kernels.sconv.rows_kernel import weight_columns4  # noqa: E402
from inkling_kernels.sconv.kernel import SconvConfig, choose_config, fused_sconv_triton  # noqa: E402

T0 = time.monotonic()
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"  # tl.dot operands through fp32 (shift kernels)


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {msg}", flush=True)


# --------------------------------------------------------------------------------------
# Experimental kernel: the USE_MAP path of _fused_sconv_kernel, one stream, activation
# None, residual True, with switches.
#   I32      offsets in int32 (host asserts x, cache and the map index stay below 2**31)
#   CONST_C  > 0: the channel count as a constexpr (row offsets fold into immediates)
#   FAST     per tile: if every tap of every row is the in-forward row ``row - dist``
#            (checked on the map), taps are plain loads at ``x tile pointer - dist*C``
#            and no cache tap is read; otherwise the general (map-decoding) path
#   CS       out and slot stores with cache_modifier=".cs" (streaming)
#   TAPS     False: no taps at all (out = x + w[W-1] * x): the "floor" reference, the
#            same x load, slot store and out store without the conv (not a conv: only
#            its cache is checked)
#   weights  read as [1, BLOCK_C] in the tile's layout; the host may pass them
#            transposed ([W, C] contiguous, made once per case outside the timing:
#            variant flag wt), which makes those loads contiguous vectors
#   BUG      canaries for the dry run only: the dist-1 tap on the wrong weight column
#            in the fast path (1) or in the general path (3); 2 = no slot store
# The map is always read one column at a time as a [BLOCK_T] vector (idea a): no
# [BLOCK_T, W-1] tensor and no where/sum column extraction.
# --------------------------------------------------------------------------------------


@triton.jit
def _tap_addrs(x_ptr, cache_ptr, xrow, cslot, chan, ccol, C, stride_cb, stride_cn, N: tl.constexpr, I32: tl.constexpr):
    """A tap's two candidate addresses per row, ``[BLOCK_T, BLOCK_C]`` each: x row
    ``xrow`` and cache slot ``cslot`` (decoded from the map; int32 with ``I32``)."""
    if I32:
        xrow = xrow.to(tl.int32)
        cslot = cslot.to(tl.int32)
    cdst = (cslot // N) * stride_cb + (cslot % N) * stride_cn
    return x_ptr + (xrow[:, None] * C + chan[None, :]), cache_ptr + (cdst[:, None] + ccol[None, :])


@triton.jit
def _general_taps(
    acc, x_ptr, w_ptr, cache_ptr, map_ptr, rows, rmask, chan, ccol, num_slots, C,
    stride_wc, stride_wk, stride_cb, stride_cn,
    N: tl.constexpr, W: tl.constexpr, I32: tl.constexpr, BUG: tl.constexpr, SEL: tl.constexpr = False,
):
    for k in tl.static_range(W - 1):
        dist = k + 1
        wcol = W - 1 - dist
        if BUG == 3:
            if dist == 1:
                wcol = W - 1
        wv = tl.load(w_ptr + (chan * stride_wc)[None, :] + wcol * stride_wk).to(tl.float32)  # [1, BLOCK_C]
        # column k of the map as a [BLOCK_T] vector; xrow / cslot are not clamped with
        # tl.where: masked lanes are never dereferenced, and such a where here crashed
        # TritonGPURemoveLayoutConversions (Triton 3.6, sm_90) when compiled offline
        code = tl.load(map_ptr + rows * (W - 1) + k, mask=rmask, other=-1)
        xrow, cslot = decode_tap_codes(code, num_slots)
        from_x = xrow >= 0
        from_cache = cslot >= 0
        xa, ca = _tap_addrs(x_ptr, cache_ptr, xrow, cslot, chan, ccol, C, stride_cb, stride_cn, N, I32)
        if SEL:  # one load, its address picked per row (the library's tap_select)
            tap = tl.load(tl.where(from_x[:, None], xa, ca), mask=(from_x | from_cache)[:, None],
                          other=0.0).to(tl.float32)
        else:
            tap = tl.load(xa, mask=from_x[:, None], other=0.0).to(tl.float32)
            tap += tl.load(ca, mask=from_cache[:, None], other=0.0).to(tl.float32)
        acc += wv * tap
    return acc


@triton.jit
def _spec_taps(
    acc, xp, xm, x_ptr, w_ptr, cache_ptr, map_ptr, rows, rmask, chan, ccol, num_slots, C,
    stride_wc, stride_wk, stride_cb, stride_cn,
    N: tl.constexpr, W: tl.constexpr, I32: tl.constexpr, BUG: tl.constexpr,
):
    """Speculative shifted taps: the W-1 loads of x rows ``t - d`` issue first, at the
    x tile's address minus ``d * C`` (no wait for the map); then per tap the map column
    and one masked fix-up load (the library's one-load pick) for the rows whose tap is
    not that row (a cache slot, a same-step writer's row, or none). In a prefill tile
    every fix-up lane is masked off."""
    specs = ()
    for k in tl.static_range(W - 1):
        dist = k + 1
        shift = dist
        if BUG == 7:
            if dist == 1:
                shift = 2
        specs = specs + (tl.load(xp - shift * C, mask=xm & (rows >= dist)[:, None], other=0.0),)
    for k in tl.static_range(W - 1):
        dist = k + 1
        wv = tl.load(w_ptr + (chan * stride_wc)[None, :] + (W - 1 - dist) * stride_wk).to(tl.float32)  # [1, BLOCK_C]
        code = tl.load(map_ptr + rows * (W - 1) + k, mask=rmask, other=-1)
        xrow, cslot = decode_tap_codes(code, num_slots)
        from_x = xrow >= 0
        shifted = from_x & (xrow == rows - dist)  # (xrow is -1 where the tap is not in x)
        from_cache = cslot >= 0
        xa, ca = _tap_addrs(x_ptr, cache_ptr, xrow, cslot, chan, ccol, C, stride_cb, stride_cn, N, I32)
        fix = tl.load(tl.where(from_x[:, None], xa, ca), mask=((from_x & ~shifted) | from_cache)[:, None], other=0.0)
        tap = tl.where(shifted[:, None], specs[k], fix).to(tl.float32)
        acc += wv * tap
    return acc


@triton.jit
def _feat_taps(
    acc, x_ptr, w_ptr, cache_ptr, map_ptr, rows, rmask, chan, cmask, ccol, num_slots, C,
    stride_wc, stride_wk, stride_cb, stride_cn,
    N: tl.constexpr, W: tl.constexpr, WP: tl.constexpr, I32: tl.constexpr, FEAT: tl.constexpr,
    BUG: tl.constexpr,
):
    """The general path with one load a tap (``sel``) plus the library kernel's ways,
    one bit each (session 12: which of them costs the library the experimental
    kernel's int32 gain): 1 the map as one ``[BLOCK_T, WP]`` load, each column taken
    with a masked sum; 2 the channel mask on every load and store; 4 the decoded row
    and slot clamped with ``tl.where``; 8 the weights as ``[BLOCK_C]`` vectors
    broadcast to the tile."""
    kk = tl.arange(0, WP)
    if FEAT & 1:
        codes = tl.load(map_ptr + rows[:, None] * (W - 1) + kk[None, :],
                        mask=rmask[:, None] & (kk < W - 1)[None, :], other=-1)
    if FEAT & 2:
        cm = cmask[None, :]
    else:
        cm = None
    for k in tl.static_range(W - 1):
        dist = k + 1
        if FEAT & 8:
            wv = tl.load(w_ptr + chan * stride_wc + (W - 1 - dist) * stride_wk, mask=cmask, other=0.0)
            wv = wv.to(tl.float32)[None, :]
        elif FEAT & 2:
            wv = tl.load(w_ptr + (chan * stride_wc)[None, :] + (W - 1 - dist) * stride_wk, mask=cm,
                         other=0.0).to(tl.float32)
        else:
            wv = tl.load(w_ptr + (chan * stride_wc)[None, :] + (W - 1 - dist) * stride_wk).to(tl.float32)
        if FEAT & 1:
            code = tl.sum(tl.where(kk[None, :] == k, codes, 0), axis=1)
        else:
            code = tl.load(map_ptr + rows * (W - 1) + k, mask=rmask, other=-1)
        xrow, cslot = decode_tap_codes(code, num_slots)
        from_x = xrow >= 0
        from_cache = cslot >= 0
        if FEAT & 4:
            xrow = tl.where(from_x, xrow, 0)
            cslot = tl.where(from_cache, cslot, 0)
        xa, ca = _tap_addrs(x_ptr, cache_ptr, xrow, cslot, chan, ccol, C, stride_cb, stride_cn, N, I32)
        src = tl.where(from_x[:, None], xa, ca)
        m = (from_x | from_cache)[:, None]
        if FEAT & 2:
            if BUG == 8:  # canary: the mask inverted
                m = m & ~cm
            else:
                m = m & cm
        acc += wv * tl.load(src, mask=m, other=0.0).to(tl.float32)
    return acc


@triton.jit
def _fast_taps(
    acc, xp, xm, w_ptr, chan, C, stride_wc, stride_wk,
    W: tl.constexpr, BUG: tl.constexpr,
):
    for k in tl.static_range(W - 1):
        dist = k + 1
        wcol = W - 1 - dist
        if BUG == 1:
            if dist == 1:
                wcol = W - 1
        wv = tl.load(w_ptr + (chan * stride_wc)[None, :] + wcol * stride_wk).to(tl.float32)  # [1, BLOCK_C]
        tap = tl.load(xp - dist * C, mask=xm, other=0.0).to(tl.float32)
        acc += wv * tap
    return acc


@triton.jit(do_not_specialize=["num_tokens"])
def _exp_sconv_kernel(
    x_ptr, w_ptr, cache_ptr, out_ptr, slot_ptr, map_ptr,
    num_tokens, channels, num_slots,
    stride_wc, stride_wk, stride_cb, stride_ch, stride_cn, stream_offset,
    WS: tl.constexpr, N: tl.constexpr, W: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
    CONST_C: tl.constexpr, I32: tl.constexpr, FAST: tl.constexpr, CS: tl.constexpr,
    BUG: tl.constexpr, TAPS: tl.constexpr, SEL: tl.constexpr = False, SPEC: tl.constexpr = False,
    FEAT: tl.constexpr = 0, WP: tl.constexpr = 4,
):
    # Channel tiles vary fastest (as in the library). The host guarantees C % BLOCK_C
    # == 0 and that a tile is inside one head or covers whole heads: no channel mask.
    pid_c = tl.program_id(0)
    pid_t = tl.program_id(1)
    chan = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    if CONST_C > 0:
        C = CONST_C
    else:
        C = channels
    if I32:
        ccol = (chan // WS) * stride_ch + stream_offset + chan % WS
    else:
        ccol = (chan // WS).to(tl.int64) * stride_ch + stream_offset + chan % WS
    rows = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    rmask = rows < num_tokens
    if I32:
        r = rows
    else:
        r = rows.to(tl.int64)
    cmask = chan < C
    if FEAT & 2:  # (the library's channel mask: always true here)
        xm = rmask[:, None] & cmask[None, :]
    else:
        xm = rmask[:, None]
    xoff = r[:, None] * C + chan[None, :]  # x and out are contiguous [T, C]
    xp = x_ptr + xoff
    x_tile = tl.load(xp, mask=xm, other=0.0)

    # the rows' own slots
    slot = tl.load(slot_ptr + rows, mask=rmask, other=-1)
    wmask = rmask & (slot >= 0) & (slot < num_slots)
    wslot = tl.where(wmask, slot, 0)
    if I32:
        wslot = wslot.to(tl.int32)
    dst = (wslot // N) * stride_cb + (wslot % N) * stride_cn
    if FEAT & 2:
        wmask2 = wmask[:, None] & cmask[None, :]
    else:
        wmask2 = wmask[:, None]
    if BUG != 2:
        if FEAT != 0:
            tl.store(cache_ptr + dst[:, None] + ccol[None, :], x_tile, mask=wmask2)
        elif CS:
            tl.store(cache_ptr + dst[:, None] + ccol[None, :], x_tile, mask=wmask[:, None], cache_modifier=".cs")
        else:
            tl.store(cache_ptr + dst[:, None] + ccol[None, :], x_tile, mask=wmask[:, None])

    # weights as [1, BLOCK_C] loads in the tile's own layout (a [BLOCK_C] vector costs a
    # layout conversion through shared memory per tap)
    if FEAT & 8:
        w_cur = tl.load(w_ptr + chan * stride_wc + (W - 1) * stride_wk, mask=cmask, other=0.0).to(tl.float32)[None, :]
    else:
        w_cur = tl.load(w_ptr + (chan * stride_wc)[None, :] + (W - 1) * stride_wk).to(tl.float32)
    acc = w_cur * x_tile.to(tl.float32)
    if not TAPS:
        pass
    elif FEAT != 0:
        acc = _feat_taps(acc, x_ptr, w_ptr, cache_ptr, map_ptr, rows, rmask, chan, cmask, ccol, num_slots, C,
                         stride_wc, stride_wk, stride_cb, stride_cn, N, W, WP, I32, FEAT, BUG)
    elif SPEC:
        acc = _spec_taps(acc, xp, xm, x_ptr, w_ptr, cache_ptr, map_ptr, rows, rmask, chan, ccol, num_slots, C,
                         stride_wc, stride_wk, stride_cb, stride_cn, N, W, I32, BUG)
    elif FAST:
        # every live row's tap at distance d must be code -(row - d) - 2 (in-forward row)
        bad = tl.zeros([BLOCK_T, 1], dtype=tl.int32)
        for k in tl.static_range(W - 1):
            code = tl.load(map_ptr + rows[:, None] * (W - 1) + k, mask=xm, other=0)
            want = (k + 1 - 2) - rows[:, None].to(tl.int64)  # -(row - dist) - 2
            bad += (xm & (code != want)).to(tl.int32)
        if tl.max(tl.max(bad, axis=1), axis=0) == 0:
            acc = _fast_taps(acc, xp, xm, w_ptr, chan, C, stride_wc, stride_wk, W, BUG)
        else:
            acc = _general_taps(acc, x_ptr, w_ptr, cache_ptr, map_ptr, rows, rmask, chan, ccol, num_slots, C,
                                stride_wc, stride_wk, stride_cb, stride_cn, N, W, I32, BUG)
    else:
        acc = _general_taps(acc, x_ptr, w_ptr, cache_ptr, map_ptr, rows, rmask, chan, ccol, num_slots, C,
                            stride_wc, stride_wk, stride_cb, stride_cn, N, W, I32, BUG, SEL)
    acc += x_tile.to(tl.float32)
    o = acc.to(out_ptr.dtype.element_ty)
    if CS:
        tl.store(out_ptr + xoff, o, mask=xm, cache_modifier=".cs")
    else:
        tl.store(out_ptr + xoff, o, mask=xm)


# --------------------------------------------------------------------------------------
# Experimental kernel "stream": each program owns a channel chunk [BLOCK_C] (inside one
# head's stream range or covering whole heads, as above) and ROWS consecutive rows, and
# walks the rows one at a time, keeping the x values of the last W-1 rows in registers
# (loop-carried fp32 vectors p1, p2, p3 = rows t-1, t-2, t-3 of this run), so an x
# element is loaded once. Per row t: x load, slot store, the row's W-1 map codes
# (scalars, decoded by the library's decode_tap_codes); tap at distance d: the register
# copy when the code names x row t-d and that row is in this run already walked,
# otherwise a masked x-row load (some other row of x) or a masked cache load (pre-forward
# slot), or 0. Same arithmetic and order as _exp_sconv_kernel: acc = w[W-1]*x, += w*tap
# for dist 1..W-1, += x (residual), one rounding to out's dtype. int32 offsets (the host
# checks the sizes), constexpr C, weights as [W, C] contiguous vectors (host passes wT).
# NS: num_stages of the row loop (tl.range; Triton 3.6 does not pipeline these loads on
# sm_90, offline compile shows no async copies); PF: the x, slot and codes of rows
# t+1..t+PF are loaded ahead by hand (a loop-carried queue), 0 = in the iteration.
# Bytes in flight per SM are what bound this kernel: 1 warp x 256 channels gives 16-byte
# loads per thread, and PF multiplies the rows in flight per program.
# BUG 4 (canary): the dist-1 register tap reads the dist-2 register.
# --------------------------------------------------------------------------------------


@triton.jit
def _stream_row(x_ptr, slot_ptr, map_ptr, t, ok, chan, C, W: tl.constexpr):
    """Row t's x chunk, slot and W-1 map codes (-1 past W-1), masked by ok (scalar)."""
    xt = tl.load(x_ptr + (t * C + chan), mask=ok, other=0.0)
    slot = tl.load(slot_ptr + t, mask=ok, other=-1)
    c1 = tl.load(map_ptr + t * (W - 1), mask=ok, other=-1)
    c2 = tl.load(map_ptr + t * (W - 1) + 1, mask=ok & (W > 2), other=-1)
    c3 = tl.load(map_ptr + t * (W - 1) + 2, mask=ok & (W > 3), other=-1)
    return xt, slot, c1, c2, c3


@triton.jit
def _stream_tap(acc, p, xrow, cslot, t, i, dist, wk, x_ptr, cache_ptr, chan, ccol, C, stride_cb, stride_cn,
                N: tl.constexpr):
    reg = (xrow == t - dist) & (i >= dist)  # the register copy of row t - dist holds it
    need_x = (xrow >= 0) & (reg == 0)
    tap = tl.load(x_ptr + (xrow * C + chan), mask=need_x, other=0.0).to(tl.float32)
    cdst = (cslot // N) * stride_cb + (cslot % N) * stride_cn
    tap += tl.load(cache_ptr + (cdst + ccol), mask=cslot >= 0, other=0.0).to(tl.float32)
    tap = tl.where(reg, p, tap)
    return acc + wk * tap


@triton.jit(do_not_specialize=["num_tokens"])
def _stream_sconv_kernel(
    x_ptr, w_ptr, cache_ptr, out_ptr, slot_ptr, map_ptr,
    num_tokens, num_slots,
    stride_wc, stride_wk, stride_cb, stride_ch, stride_cn, stream_offset,
    C: tl.constexpr, WS: tl.constexpr, N: tl.constexpr, W: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_C: tl.constexpr, NS: tl.constexpr, PF: tl.constexpr, UNROLL: tl.constexpr,
    BUG: tl.constexpr,
):
    pid_c = tl.program_id(0)
    pid_t = tl.program_id(1)
    chan = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    ccol = (chan // WS) * stride_ch + stream_offset + chan % WS
    wbase = w_ptr + chan * stride_wc
    w_cur = tl.load(wbase + (W - 1) * stride_wk).to(tl.float32)
    w1 = tl.load(wbase + (W - 2) * stride_wk).to(tl.float32)  # dist 1
    if W > 2:
        w2 = tl.load(wbase + (W - 3) * stride_wk).to(tl.float32)  # dist 2
    else:
        w2 = tl.zeros([BLOCK_C], dtype=tl.float32)
    if W > 3:
        w3 = tl.load(wbase + (W - 4) * stride_wk).to(tl.float32)  # dist 3
    else:
        w3 = tl.zeros([BLOCK_C], dtype=tl.float32)
    start = pid_t * ROWS
    p1 = tl.zeros([BLOCK_C], dtype=tl.float32)
    p2 = tl.zeros([BLOCK_C], dtype=tl.float32)
    p3 = tl.zeros([BLOCK_C], dtype=tl.float32)
    # prefetch queue: x, slot and codes of rows ``t + 1`` (n*) and ``t + 2`` (m*); unused
    # entries stay constant (PF < 2) and fold away
    nx = tl.zeros([BLOCK_C], dtype=x_ptr.dtype.element_ty)
    ns = tl.full([], -1, tl.int64)
    nc1 = tl.full([], -1, tl.int64)
    nc2 = tl.full([], -1, tl.int64)
    nc3 = tl.full([], -1, tl.int64)
    mx, ms, mc1, mc2, mc3 = nx, ns, nc1, nc2, nc3
    if PF >= 1:
        nx, ns, nc1, nc2, nc3 = _stream_row(x_ptr, slot_ptr, map_ptr, start, start < num_tokens, chan, C, W)
    if PF >= 2:
        mx, ms, mc1, mc2, mc3 = _stream_row(x_ptr, slot_ptr, map_ptr, start + 1,
                                            (start + 1 < num_tokens) & (ROWS > 1), chan, C, W)
    if UNROLL:  # the row loop fully unrolled: the queue and the registers are renames, no moves
        for i in tl.static_range(ROWS):
            p1, p2, p3, nx, ns, nc1, nc2, nc3, mx, ms, mc1, mc2, mc3 = _stream_step(
                i, start, num_tokens, num_slots, p1, p2, p3, nx, ns, nc1, nc2, nc3, mx, ms, mc1, mc2, mc3,
                x_ptr, cache_ptr, out_ptr, slot_ptr, map_ptr, chan, ccol, w_cur, w1, w2, w3,
                stride_cb, stride_cn, C, N, W, ROWS, PF, BUG)
    else:
        for i in tl.range(0, ROWS, num_stages=NS):
            p1, p2, p3, nx, ns, nc1, nc2, nc3, mx, ms, mc1, mc2, mc3 = _stream_step(
                i, start, num_tokens, num_slots, p1, p2, p3, nx, ns, nc1, nc2, nc3, mx, ms, mc1, mc2, mc3,
                x_ptr, cache_ptr, out_ptr, slot_ptr, map_ptr, chan, ccol, w_cur, w1, w2, w3,
                stride_cb, stride_cn, C, N, W, ROWS, PF, BUG)


@triton.jit
def _stream_step(
    i, start, num_tokens, num_slots, p1, p2, p3, nx, ns, nc1, nc2, nc3, mx, ms, mc1, mc2, mc3,
    x_ptr, cache_ptr, out_ptr, slot_ptr, map_ptr, chan, ccol, w_cur, w1, w2, w3,
    stride_cb, stride_cn, C: tl.constexpr, N: tl.constexpr, W: tl.constexpr, ROWS: tl.constexpr,
    PF: tl.constexpr, BUG: tl.constexpr,
):
    """Row ``start + i``: take it from the queue (or load it), refill the queue, store its
    slot, its conv and out; return the shifted registers and queue."""
    t = start + i
    live = t < num_tokens
    if PF == 0:
        xt, slot, c1, c2, c3 = _stream_row(x_ptr, slot_ptr, map_ptr, t, live, chan, C, W)
    elif PF == 1:
        xt, slot, c1, c2, c3 = nx, ns, nc1, nc2, nc3
        nx, ns, nc1, nc2, nc3 = _stream_row(x_ptr, slot_ptr, map_ptr, t + 1,
                                            (t + 1 < num_tokens) & (i + 1 < ROWS), chan, C, W)
    else:
        xt, slot, c1, c2, c3 = nx, ns, nc1, nc2, nc3
        nx, ns, nc1, nc2, nc3 = mx, ms, mc1, mc2, mc3
        mx, ms, mc1, mc2, mc3 = _stream_row(x_ptr, slot_ptr, map_ptr, t + 2,
                                            (t + 2 < num_tokens) & (i + 2 < ROWS), chan, C, W)
    # the row's own slot
    ok = live & (slot >= 0) & (slot < num_slots)
    ws = tl.where(ok, slot, 0).to(tl.int32)
    tl.store(cache_ptr + ((ws // N) * stride_cb + (ws % N) * stride_cn + ccol), xt, mask=ok)
    xf = xt.to(tl.float32)
    acc = w_cur * xf
    r1, s1 = decode_tap_codes(c1, num_slots)
    if BUG == 4:
        acc = _stream_tap(acc, p2, r1.to(tl.int32), s1.to(tl.int32), t, i, 1, w1, x_ptr, cache_ptr, chan, ccol,
                          C, stride_cb, stride_cn, N)
    else:
        acc = _stream_tap(acc, p1, r1.to(tl.int32), s1.to(tl.int32), t, i, 1, w1, x_ptr, cache_ptr, chan, ccol,
                          C, stride_cb, stride_cn, N)
    if W > 2:
        r2, s2 = decode_tap_codes(c2, num_slots)
        acc = _stream_tap(acc, p2, r2.to(tl.int32), s2.to(tl.int32), t, i, 2, w2, x_ptr, cache_ptr, chan, ccol,
                          C, stride_cb, stride_cn, N)
    if W > 3:
        r3, s3 = decode_tap_codes(c3, num_slots)
        acc = _stream_tap(acc, p3, r3.to(tl.int32), s3.to(tl.int32), t, i, 3, w3, x_ptr, cache_ptr, chan, ccol,
                          C, stride_cb, stride_cn, N)
    acc += xf
    tl.store(out_ptr + (t * C + chan), acc.to(out_ptr.dtype.element_ty), mask=live)
    return xf, p1, p2, nx, ns, nc1, nc2, nc3, mx, ms, mc1, mc2, mc3


# --------------------------------------------------------------------------------------
# Experimental kernel "shift": each x element is loaded from global memory once per
# tile and the shifted rows (taps) are made on chip from that one tile. One stream,
# activation None, residual True, int32 offsets, constexpr C, weights as [1, BLOCK_C]
# (the host passes them transposed, wt). A program owns BLOCK_C channels (inside one
# head's stream range or covering whole heads, as above) and loads the x tile X of
# BLOCK_T rows starting OV rows before its first output row t0:
#   SHIFT 1 "mmashift"   OV = 4: X holds rows t0-4 .. t0+BLOCK_T-5, output rows are
#                        t0 .. t0+BLOCK_T-5 (tile rows OV..BLOCK_T-1; the grid steps
#                        BLOCK_T-OV rows, rows before 0 load as 0); the tap at
#                        distance d is tl.dot(S_d, X) with S_d[i, k] = (k == i - d)
#                        ([BLOCK_T, BLOCK_T] 0/1 bf16, fp32 accumulation: exact)
#   SHIFT 2 "gathershift" the same tile; the tap is tl.gather(X, max(i - d, 0), axis=0)
#   SHIFT 3 "overlap"    OV = 0: X holds the output rows t0 .. t0+BLOCK_T-1 (the grid
#                        steps BLOCK_T rows), plus a halo tile Xh of HALO = 16 rows
#                        t0-16 .. t0-1 of which only the last W-1 are loaded (the rest
#                        masked: no traffic); tap = S_d @ X + H_d @ Xh with
#                        H_d[i, j] = (j == i - d + HALO)
# Only when the map says every tap of every output row of the tile is the in-forward
# row ``row - dist`` (the same check as "fast": all those rows lie inside X, or X and Xh);
# otherwise the general (map-decoding) path of _exp_sconv_kernel over the output rows.
# Slot store and out store: the output rows only (each row once), as the library does.
# Same arithmetic as _exp_sconv_kernel: acc = w[W-1]*x, += w*tap for dist 1..W-1, += x,
# one rounding to out's dtype (the dot's fp32 result is the bf16 value exactly).
# INTERPRET: under TRITON_INTERPRET=1 tl.dot multiplies 16-bit floats wrongly, so both
# sides go through fp32 there (exact for 0/1 and bf16 values).
# BUG (canaries, dry run only): 5 = the dist-1 tap is shifted by 2 rows in the on-chip
# path; 6 = overlap without the halo dot (each tile's first rows miss their taps).
# --------------------------------------------------------------------------------------


@triton.jit
def _shift_mma(a, b, acc, INTERPRET: tl.constexpr):
    """``acc + a @ b``, fp32 accumulation (fp32 operands under the interpreter)."""
    if INTERPRET:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    else:
        return tl.dot(a, b, acc)


@triton.jit(do_not_specialize=["num_tokens"])
def _shift_sconv_kernel(
    x_ptr, w_ptr, cache_ptr, out_ptr, slot_ptr, map_ptr,
    num_tokens, num_slots,
    stride_wc, stride_wk, stride_cb, stride_ch, stride_cn, stream_offset,
    C: tl.constexpr, WS: tl.constexpr, N: tl.constexpr, W: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, OV: tl.constexpr, HALO: tl.constexpr,
    SHIFT: tl.constexpr, INTERPRET: tl.constexpr, BUG: tl.constexpr,
):
    pid_c = tl.program_id(0)
    pid_t = tl.program_id(1)
    chan = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    ccol = (chan // WS) * stride_ch + stream_offset + chan % WS
    i = tl.arange(0, BLOCK_T)
    t0 = pid_t * (BLOCK_T - OV)  # first output row
    rows = t0 - OV + i  # the tile's rows (int32: the host checks the sizes)
    live = (rows >= 0) & (rows < num_tokens)
    om = live & (i >= OV)  # output rows
    xoff = rows[:, None] * C + chan[None, :]  # x and out are contiguous [T, C]
    X = tl.load(x_ptr + xoff, mask=live[:, None], other=0.0)

    # the output rows' own slots
    slot = tl.load(slot_ptr + rows, mask=om, other=-1)
    wmask = om & (slot >= 0) & (slot < num_slots)
    wslot = tl.where(wmask, slot, 0).to(tl.int32)
    dst = (wslot // N) * stride_cb + (wslot % N) * stride_cn
    tl.store(cache_ptr + dst[:, None] + ccol[None, :], X, mask=wmask[:, None])

    w_cur = tl.load(w_ptr + (chan * stride_wc)[None, :] + (W - 1) * stride_wk).to(tl.float32)  # [1, BLOCK_C]
    xf = X.to(tl.float32)
    acc = w_cur * xf

    # every output row's tap at distance d must be code -(row - d) - 2 (in-forward row)
    bad = tl.zeros([BLOCK_T, 1], dtype=tl.int32)
    for k in tl.static_range(W - 1):
        code = tl.load(map_ptr + rows[:, None] * (W - 1) + k, mask=om[:, None], other=0)
        want = (k + 1 - 2) - rows[:, None].to(tl.int64)
        bad += (om[:, None] & (code != want)).to(tl.int32)
    if tl.max(tl.max(bad, axis=1), axis=0) == 0:
        if SHIFT == 3:
            j = tl.arange(0, HALO)
            hrows = t0 - HALO + j
            hm = (j >= HALO - (W - 1)) & (hrows >= 0)
            Xh = tl.load(x_ptr + (hrows[:, None] * C + chan[None, :]), mask=hm[:, None], other=0.0)
        for k in tl.static_range(W - 1):
            dist = k + 1
            sh = dist
            if BUG == 5:
                if dist == 1:
                    sh = 2
            wv = tl.load(w_ptr + (chan * stride_wc)[None, :] + (W - 1 - dist) * stride_wk).to(tl.float32)
            if SHIFT == 2:
                idx = tl.broadcast_to(tl.maximum(i - sh, 0)[:, None], [BLOCK_T, BLOCK_C])
                tap = tl.gather(X, idx, axis=0).to(tl.float32)
            else:
                # (through tl.where: the interpreter converts bool to bf16 as 0)
                s_d = tl.where(i[None, :] == i[:, None] - sh, 1.0, 0.0).to(X.dtype)  # [BLOCK_T, BLOCK_T]
                tap = _shift_mma(s_d, X, tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32), INTERPRET)
                if SHIFT == 3:
                    if BUG != 6:
                        h_d = tl.where(j[None, :] == i[:, None] - sh + HALO, 1.0, 0.0).to(X.dtype)  # [BLOCK_T, HALO]
                        tap = _shift_mma(h_d, Xh, tap, INTERPRET)
            acc += wv * tap
    else:
        acc = _general_taps(acc, x_ptr, w_ptr, cache_ptr, map_ptr, rows, om, chan, ccol, num_slots, C,
                            stride_wc, stride_wk, stride_cb, stride_cn, N, W, True, 0)
    acc += xf
    tl.store(out_ptr + xoff, acc.to(out_ptr.dtype.element_ty), mask=om[:, None])


# --------------------------------------------------------------------------------------
# Experimental kernel "rows" (session 13): a program owns ROWS consecutive rows of
# BLOCK_C channels and keeps them as ROWS + W - 1 separate [BLOCK_C] row vectors (its
# rows and the W-1 before them), all loaded before the kernel stores anything: the
# stores may alias as far as the compiler knows, so a load written after a store stays
# after it, and a kernel that loads row by row between stores waits a round trip per row
# (the "stream" kernel above). A tap at distance d that the map says is x row t - d is
# the register copy of that row (no load); any other tap (a cache slot, a same-step
# writer's row, none) is one masked load whose address is picked per row, as in sel.
# A tile whose taps are all register rows or none (a prefill tile) takes a branch with
# no more loads; any other tile issues the fix-up loads G rows at a time, before those
# G rows' stores (a decode tile's G rows share one round trip). int32 offsets (host checks), constexpr C, weights read
# once per program as [BLOCK_C] vectors. Each row: slot store of its x, then
# acc = w[W-1]*x + sum_d w[W-1-d]*tap_d + x, one rounding, out store (as above).
# BUG 9 (canary): the dist-1 register tap is the row two back.
# (Tuple indices are written as expressions of static_range variables or passed as
# constexpr arguments: the interpreter turns an int assigned to a name into a tensor,
# which cannot index a tuple, and the compiler does not let a constexpr name be
# assigned twice.)
# --------------------------------------------------------------------------------------


@triton.jit
def _rows_fix(x_ptr, cache_ptr, code, t, dist, chan, ccol, C, num_slots, stride_cb, stride_cn, N: tl.constexpr):
    """Row ``t``'s tap at ``dist``: (is it x row t - dist, held in registers; else its
    value from one masked load, 0 where there is no tap)."""
    xrow, cslot = decode_tap_codes(code, num_slots)
    from_x = xrow >= 0
    reg = from_x & (xrow == t - dist)
    from_cache = cslot >= 0
    xr = tl.where(from_x, xrow, 0).to(tl.int32)
    cs = tl.where(from_cache, cslot, 0).to(tl.int32)
    cdst = (cs // N) * stride_cb + (cs % N) * stride_cn
    src = tl.where(from_x, x_ptr + (xr * C + chan), cache_ptr + (cdst + ccol))
    fix = tl.load(src, mask=(from_x & (xrow != t - dist)) | from_cache, other=0.0)
    return reg, fix


@triton.jit
def _rows_tile_meta(slot_ptr, map_ptr, t0, num_tokens, num_slots, stride_cb, stride_cn, N: tl.constexpr,
                    W: tl.constexpr, ROWS: tl.constexpr, QP: tl.constexpr):
    """Per row: its slot's offset in the cache and whether it is written; per (row, tap),
    from the map loaded as one vector: a bit of ``regbits`` when the tap is x row
    t - dist (held in xs); ``bad`` counts the taps that are neither that nor "no tap"
    (a cache slot, another x row)."""
    dsts = ()
    oks = ()
    for i in tl.static_range(ROWS):
        t = t0 + i
        live = t < num_tokens
        slot = tl.load(slot_ptr + t, mask=live, other=-1)
        ok = live & (slot >= 0) & (slot < num_slots)
        ws = tl.where(ok, slot, 0).to(tl.int32)
        dsts = dsts + ((ws // N) * stride_cb + (ws % N) * stride_cn,)
        oks = oks + (ok,)
    q = tl.arange(0, QP)  # (row, tap) pairs of the tile, row-major
    qt = t0 + q // (W - 1)
    qlive = (q < ROWS * (W - 1)) & (qt < num_tokens)
    code = tl.load(map_ptr + t0 * (W - 1) + q, mask=qlive, other=-1)
    xrow, cslot = decode_tap_codes(code, num_slots)
    qreg = (xrow >= 0) & (xrow == qt - (q % (W - 1) + 1))
    regbits = tl.sum(tl.where(qreg, tl.full([QP], 1, tl.int64) << q.to(tl.int64), 0), axis=0)
    bad = tl.sum((((xrow >= 0) & ~qreg) | (cslot >= 0)).to(tl.int32), axis=0)
    return dsts, oks, regbits, bad


@triton.jit(do_not_specialize=["num_tokens"])
def _rows_sconv_kernel(
    x_ptr, w_ptr, cache_ptr, out_ptr, slot_ptr, map_ptr,
    num_tokens, num_slots,
    stride_wc, stride_wk, stride_cb, stride_ch, stride_cn, stream_offset,
    C: tl.constexpr, WS: tl.constexpr, N: tl.constexpr, W: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_C: tl.constexpr, G: tl.constexpr, CS: tl.constexpr, BUG: tl.constexpr,
    QP: tl.constexpr, WTILE: tl.constexpr = False, SUB: tl.constexpr = 0, ALL_SLOW: tl.constexpr = False,
    tile_shift=0, ilv_d0=0, ilv_d1=0, ROT: tl.constexpr = False, ILV: tl.constexpr = False,
    REV: tl.constexpr = False, MAPFIRST: tl.constexpr = False,
):
    pid_c = tl.program_id(0)
    pid_t = tl.program_id(1)
    if REV:  # (session 20) the row tiles last to first
        pid_t = tl.num_programs(1) - 1 - tl.program_id(1)
    if ROT:  # (session 16) the row tiles rotated by ``tile_shift`` (< tiles): the tiles from there run first
        # (session 17: as an add and a wrap; a modulo here cost 5-10 % in every launch)
        pid_t += tile_shift
        if pid_t >= tl.num_programs(1):
            pid_t -= tl.num_programs(1)
    # (session 17) with a range [ilv_d0, ilv_d1) of load-path tiles: those spread evenly
    # over the grid, one every k + 1 programs (k = prompt tiles per load-path tile), the
    # other tiles in order from ilv_d1 (wrapping)
    n_dec = ilv_d1 - ilv_d0
    if ILV and n_dec > 0:
        j = tl.program_id(1)
        n_all = tl.num_programs(1)
        k = (n_all - n_dec) // n_dec
        grp = j // (k + 1)
        r = j % (k + 1)
        front = j < n_dec * (k + 1)
        p = tl.where(front, grp * k + r - 1, j - n_dec)
        pid_t = tl.where(front & (r == 0), ilv_d0 + grp, (ilv_d1 + p) % n_all)
    chan = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    ccol = (chan // WS) * stride_ch + stream_offset + chan % WS
    t0 = pid_t * ROWS
    if MAPFIRST:  # (session 20) the tile's slot and map loads issued before its x rows
        dsts, oks, regbits, bad = _rows_tile_meta(slot_ptr, map_ptr, t0, num_tokens, num_slots, stride_cb,
                                                  stride_cn, N, W, ROWS, QP)
    # every x row the tile reads, before any store: xs[j] is row t0 - (W - 1) + j
    xs = ()
    for j in tl.static_range(ROWS + W - 1):
        t = t0 - (W - 1) + j
        xs = xs + (tl.load(x_ptr + (t * C + chan), mask=(t >= 0) & (t < num_tokens), other=0.0),)
    if not MAPFIRST:
        dsts, oks, regbits, bad = _rows_tile_meta(slot_ptr, map_ptr, t0, num_tokens, num_slots, stride_cb,
                                                  stride_cn, N, W, ROWS, QP)
    if WTILE:  # (W == 4, stride_wk == 1) the weights as one [BLOCK_C, 4] tile, split into its columns
        wts = weight_columns4(w_ptr, chan, stride_wc, BLOCK_C)
    else:
        wts = ()
        for k in tl.static_range(W):
            wts = wts + (tl.load(w_ptr + chan * stride_wc + k * stride_wk).to(tl.float32),)
    if bad == 0 and not ALL_SLOW:  # every tap is a register row or none: no more loads
        for i in tl.static_range(ROWS):
            _rows_out(x_ptr, cache_ptr, out_ptr, xs, wts, dsts[i], oks[i], regbits, (), (), t0, num_tokens,
                      chan, ccol, i, 0, C, W, True, CS, BUG)
    elif SUB > 0:  # the tile as [ROWS, SUB] channel chunks, one load round trip each
        _rows_slow2d(x_ptr, w_ptr, cache_ptr, out_ptr, slot_ptr, map_ptr, t0, num_tokens, num_slots, pid_c,
                     stride_wc, stride_wk, stride_cb, stride_ch, stride_cn, stream_offset,
                     C, WS, N, W, ROWS, BLOCK_C, SUB, BUG)
    else:  # fix-up loads G rows at a time (the codes loaded again: L1 hits)
        for g in tl.static_range(ROWS // G):
            regs = ()
            fixes = ()
            for ii in tl.static_range(G):
                for k in tl.static_range(W - 1):
                    c1 = tl.load(map_ptr + (t0 + g * G + ii) * (W - 1) + k, mask=t0 + g * G + ii < num_tokens,
                                 other=-1)
                    reg, fix = _rows_fix(x_ptr, cache_ptr, c1, t0 + g * G + ii, k + 1, chan, ccol, C,
                                         num_slots, stride_cb, stride_cn, N)
                    regs = regs + (reg,)
                    fixes = fixes + (fix,)
            for ii in tl.static_range(G):
                _rows_out(x_ptr, cache_ptr, out_ptr, xs, wts, dsts[g * G + ii], oks[g * G + ii], regbits, regs,
                          fixes, t0, num_tokens, chan, ccol, g * G + ii, ii, C, W, False, CS, BUG)


@triton.jit
def _rows_slow2d(x_ptr, w_ptr, cache_ptr, out_ptr, slot_ptr, map_ptr, t0, num_tokens, num_slots, pid_c,
                 stride_wc, stride_wk, stride_cb, stride_ch, stride_cn, stream_offset,
                 C: tl.constexpr, WS: tl.constexpr, N: tl.constexpr, W: tl.constexpr, ROWS: tl.constexpr,
                 BLOCK_C: tl.constexpr, SUB: tl.constexpr, BUG: tl.constexpr):
    """(session 14, SUB > 0) The load path of a tile with decode rows, a chunk's first rows
    or same-step writers, as 2D chunks: every row's taps resolved once from the map (a
    [ROWS] code vector a distance), then per chunk of SUB channels the x tile, each
    distance's taps (one masked load from the x row or the cache slot the map names) and
    the weights, all loaded before that chunk's stores. A chunk's loads wait behind the
    chunk before it (one round trip a chunk), not behind every row. The program's row
    vectors are not used here (dead in this branch), so their registers are free for
    the chunk tiles. Same accumulation order as _rows_out."""
    r = tl.arange(0, ROWS)
    t = t0 + r
    live = t < num_tokens
    slot = tl.load(slot_ptr + t, mask=live, other=-1)
    ok = live & (slot >= 0) & (slot < num_slots)
    ws = tl.where(ok, slot, 0).to(tl.int32)
    dst = (ws // N) * stride_cb + (ws % N) * stride_cn
    xrows = ()
    from_xs = ()
    cdsts = ()
    takes = ()
    for k in tl.static_range(W - 1):
        code = tl.load(map_ptr + t * (W - 1) + k, mask=live, other=-1)
        xrow, cslot = decode_tap_codes(code, num_slots)
        from_x = xrow >= 0
        cs = tl.where(cslot >= 0, cslot, 0).to(tl.int32)
        xrows = xrows + (tl.where(from_x, xrow, 0).to(tl.int32),)
        from_xs = from_xs + (from_x,)
        cdsts = cdsts + ((cs // N) * stride_cb + (cs % N) * stride_cn,)
        takes = takes + (from_x | (cslot >= 0),)
    for cc in tl.static_range(BLOCK_C // SUB):
        ch = pid_c * BLOCK_C + cc * SUB + tl.arange(0, SUB)
        ccol = (ch // WS) * stride_ch + stream_offset + ch % WS
        xt = tl.load(x_ptr + (t[:, None] * C + ch[None, :]), mask=live[:, None], other=0.0)
        xf = xt.to(tl.float32)
        acc = tl.load(w_ptr + ch * stride_wc + (W - 1) * stride_wk).to(tl.float32)[None, :] * xf
        for k in tl.static_range(W - 1):
            src = tl.where(from_xs[k][:, None], x_ptr + (xrows[k][:, None] * C + ch[None, :]),
                           cache_ptr + (cdsts[k][:, None] + ccol[None, :]))
            tap = tl.load(src, mask=takes[k][:, None], other=0.0).to(tl.float32)
            # the canary (BUG 10) puts the distance-1 tap on the distance-2 weight
            wk = (W - 3) if (BUG == 10 and k == 0) else (W - 2 - k)
            acc += tl.load(w_ptr + ch * stride_wc + wk * stride_wk).to(tl.float32)[None, :] * tap
        tl.store(cache_ptr + (dst[:, None] + ccol[None, :]), xt, mask=ok[:, None])
        acc += xf
        tl.store(out_ptr + (t[:, None] * C + ch[None, :]), acc.to(out_ptr.dtype.element_ty), mask=live[:, None])


@triton.jit
def _rows_out(x_ptr, cache_ptr, out_ptr, xs, wts, dst, ok, regbits, regs, fixes, t0, num_tokens, chan, ccol,
              i: tl.constexpr, ii: tl.constexpr, C: tl.constexpr, W: tl.constexpr, FAST: tl.constexpr,
              CS: tl.constexpr, BUG: tl.constexpr):
    """Row ``t0 + i``: its slot store (at ``dst`` where ``ok``), its conv, its out. FAST: the taps
    are register rows where ``regbits`` says so, else 0; otherwise ``regs`` / ``fixes``
    (entry ``ii`` of the fix-up group)."""
    t = t0 + i
    live = t < num_tokens
    xi = xs[i + W - 1]
    cptr = cache_ptr + (dst + ccol)
    if CS:
        tl.store(cptr, xi, mask=ok, cache_modifier=".cs")
    else:
        tl.store(cptr, xi, mask=ok)
    xf = xi.to(tl.float32)
    acc = wts[W - 1] * xf
    for k in tl.static_range(W - 1):
        # the tap at distance k + 1; the canary (BUG 9) takes row t - 2 for distance 1
        if BUG == 9 and k == 0:
            xr = xs[i + W - 3]
        else:
            xr = xs[i + W - 2 - k]
        if FAST:
            tap = tl.where(((regbits >> (i * (W - 1) + k)) & 1) != 0, xr, 0.0)
        else:
            tap = tl.where(regs[ii * (W - 1) + k], xr, fixes[ii * (W - 1) + k])
        acc += wts[W - 2 - k] * tap.to(tl.float32)
    acc += xf
    optr = out_ptr + (t * C + chan)
    if CS:
        tl.store(optr, acc.to(out_ptr.dtype.element_ty), mask=live, cache_modifier=".cs")
    else:
        tl.store(optr, acc.to(out_ptr.dtype.element_ty), mask=live)


# --------------------------------------------------------------------------------------
# Variants
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    name: str
    desc: str
    lib: bool = False  # the library's fused_sconv_triton (default config)
    libcfg: tuple[int, int, int, str] | None = None  # the library on (block_t, block_c, warps, "rows" | "one-load")
    tile: tuple[int, int, int] | None = None  # (block_t, block_c, warps); None: choose_config's tile
    warps: int | None = None  # override only the warps of choose_config's tile
    i32: bool = False
    const_c: bool = False
    fast: bool = False
    cs: bool = False
    wt: bool = False  # weights passed as [W, C] contiguous
    floor: bool = False  # no taps: a bandwidth reference, not a conv
    stream: bool = False  # _stream_sconv_kernel; tile = (rows per program, block_c, warps)
    stages: int = 1  # stream: num_stages of the row loop (not unrolled)
    pf: int = 0  # stream: rows prefetched ahead by hand (0, 1, 2)
    unroll: bool = False  # stream: the row loop fully unrolled (tl.static_range)
    shift: int = 0  # _shift_sconv_kernel: 1 mmashift, 2 gathershift, 3 overlap; tile = (rows, block_c, warps)
    sel: bool = False  # general path: one load a tap (the library's tap_select)
    spec: bool = False  # speculative shifted taps + one masked fix-up load (_spec_taps)
    feat: int = 0  # sel plus the library kernel's ways, a bit each (_feat_taps)
    wtile: bool = False  # _rows_sconv_kernel: weights loaded as one [BLOCK_C, W] tile and split (W = 4)
    rows: int = 0  # _rows_sconv_kernel, fix-up loads this many rows at a time; tile = (rows, block_c, warps)
    sub: int = 0  # _rows_sconv_kernel: the load path as [rows, sub] channel chunks (_rows_slow2d); 0: row by row
    all_slow: bool = False  # _rows_sconv_kernel: every tile on the load path (a check of that path)
    strided_w: bool = False  # libcfg "rows": the weights read as W strided vectors, not as one tile
    rot: bool = False  # _rows_sconv_kernel: row tiles rotated to start after the last register-path tile
    ilv: bool = False  # _rows_sconv_kernel: the load-path tiles spread evenly over the grid (load_path_range)
    rev: bool = False  # _rows_sconv_kernel: the row tiles last to first (session 20)
    mf: bool = False  # _rows_sconv_kernel: the slot and map loads before the x rows (session 20)
    order: bool | None = None  # lib/libcfg: the batch's decodes_last forced to this; None: as the case's order says
    bug: int = 0


VARIANTS = [
    Variant("lib", "library fused_sconv_triton, default config (baseline)", lib=True),
    Variant("floor", "reference, NOT a conv: x load + slot store + out store only (fast+wT tile), cache checked",
            i32=True, const_c=True, wt=True, floor=True),
    Variant("cols", "(a) map read per column as [BLOCK_T] vectors, weights as [1, BLOCK_C], int64, lib tile"),
    Variant("cols+i32", "(a)+(b) int32 offsets, lib tile", i32=True),
    Variant("cols+i32/8w", "(a)+(b), lib tile on 8 warps (does the 8-warp collapse remain?)", i32=True, warps=8),
    Variant("fast", "(a)+(b)+(c) per-tile in-forward fast path, constexpr C, lib tile", i32=True, const_c=True,
            fast=True),
    Variant("fast+wT", "fast with weights pre-transposed to [W, C] (vector weight loads), lib tile", i32=True,
            const_c=True, fast=True, wt=True),
    Variant("fast+wT+cs", "fast+wT with (e) .cs streaming stores (out, slot), lib tile", i32=True, const_c=True,
            fast=True, wt=True, cs=True),
    Variant("fast+wT 64x128/8w", "(d) fast+wT on 64x128 tiles, 8 warps", tile=(64, 128, 8), i32=True, const_c=True,
            fast=True, wt=True),
    Variant("fast+wT 32x256/8w", "(d) fast+wT on 32x256 tiles, 8 warps", tile=(32, 256, 8), i32=True, const_c=True,
            fast=True, wt=True),
]


def _stream(rows: int, bc: int, nw: int, stages: int = 1, pf: int = 0, unroll: bool = False) -> Variant:
    name = (f"stream {rows}x{bc}/{nw}w" + (f"/s{stages}" if stages > 1 else "") + (f"/pf{pf}" if pf else "")
            + ("/u" if unroll else ""))
    desc = (f"row-streaming kernel: {rows} rows x {bc} channels per program, {nw} warps, last W-1 rows in "
            f"registers, row loop " + ("fully unrolled" if unroll else f"num_stages={stages}")
            + (f", next {pf} row(s) prefetched by hand" if pf else ""))
    return Variant(name, desc, tile=(rows, bc, nw), i32=True, const_c=True, wt=True, stream=True, stages=stages, pf=pf,
                   unroll=unroll)


# H200, prefill 8192 ATTN (lib 109.4 µs, floor 80.3, copy 4266 GB/s): the plain loops 140-260 µs;
# num_stages 3 changed nothing (no async copies); the hand prefetch helped some (32x256/1w/pf2
# 117.7 µs, 0.93x lib; on prefill 8192 K 0.68x lib). Fully unrolled (UNROLL) was worse and slow
# to compile (16x256/1w/pf2/u 0.83x lib; 32 rows 0.35x; 64 rows 77 s of compile): no variant.
VARIANTS += [
    _stream(64, 128, 1), _stream(64, 128, 2), _stream(64, 256, 2), _stream(128, 256, 4), _stream(32, 256, 2),
    _stream(128, 128, 2), _stream(64, 256, 1, pf=1), _stream(32, 256, 1, pf=2),
]


SHIFT_OV = 4  # mmashift / gathershift: rows of the x tile before its first output row (>= W-1)
SHIFT_HALO = 16  # overlap: rows of the halo tile (the last W-1 loaded; a dot needs K >= 16)
_SHIFT_NAMES = {1: "mmashift", 2: "gathershift", 3: "overlap"}
_SHIFT_DESC = {
    1: "x tile of {bt} rows loaded once ({ov} of them before the output rows, grid steps {step} rows), "
       "taps = tl.dot(S_d, X) with 0/1 shift matrices",
    2: "x tile of {bt} rows loaded once ({ov} of them before the output rows, grid steps {step} rows), "
       "taps = tl.gather(X, max(i - d, 0), axis=0)",
    3: "aligned x tile of {bt} output rows + a {halo}-row halo tile (only its last W-1 rows loaded), "
       "taps = S_d @ X + H_d @ Xh",
}


def _shift(kind: int, bt: int, bc: int, nw: int) -> Variant:
    ov = 0 if kind == 3 else SHIFT_OV
    desc = (_SHIFT_DESC[kind].format(bt=bt, ov=ov, step=bt - ov, halo=SHIFT_HALO)
            + f"; {bc} channels, {nw} warps; only where the map says every tap of the tile is in-forward "
              "(else the general path); int32, constexpr C, wT")
    return Variant(f"{_SHIFT_NAMES[kind]} {bt}x{bc}/{nw}w", desc, tile=(bt, bc, nw), i32=True, const_c=True, wt=True,
                   shift=kind)


# H200: not measured yet.
VARIANTS += [_shift(kind, bt, bc, nw) for kind in (1, 2) for bt in (32, 64) for bc in (64, 128) for nw in (4, 8)]
VARIANTS += [_shift(3, bt, bc, nw) for bt, bc, nw in ((32, 64, 4), (32, 128, 4), (64, 128, 4), (64, 128, 8))]
# Session 11 (not yet timed): one load a tap on this kernel's tiles (the library's
# tap_select measured 0.68 of copy on 16x128/4w), and the speculative shifted taps.
_SEL = dict(i32=True, const_c=True, wt=True, sel=True)  # the experimental kernel's one-load path
VARIANTS += [
    Variant(f"sel {bt}x{bc}/{nw}w", f"cols+i32, constexpr C, weights [W, C], one load a tap, {bt}x{bc} tiles, {nw} warps",
            tile=(bt, bc, nw), **_SEL)
    # (the last six: session 12)
    for bt, bc, nw in ((16, 128, 4), (8, 128, 4), (16, 256, 8), (16, 128, 2), (16, 64, 2), (32, 128, 4), (32, 64, 4),
                       (8, 256, 4), (16, 256, 4))
] + [
    Variant(f"spec {bt}x{bc}/{nw}w", f"speculative shifted taps (rows t-d loaded before the map is read) + one "
            f"masked fix-up load a tap, int32, constexpr C, weights [W, C], {bt}x{bc} tiles, {nw} warps",
            tile=(bt, bc, nw), i32=True, const_c=True, wt=True, spec=True)
    for bt, bc, nw in ((16, 128, 4), (8, 128, 4), (32, 128, 4), (16, 256, 8), (16, 64, 2))
]
# Session 12: which of the experimental kernel's differences from the library (int32
# offsets, constexpr C, weights as [W, C]) carry sel 16x128/4w's lead over the library's
# one-load tile (97.7 against 104.2 µs on prefill 8192 ATTN), and streaming stores on top
# (more one-load tiles: with sel's, above).
VARIANTS += [
    Variant("sel-i64 16x128/4w", "sel 16x128/4w with int64 offsets", tile=(16, 128, 4), **{**_SEL, "i32": False}),
    Variant("sel-varC 16x128/4w", "sel 16x128/4w with C a runtime argument", tile=(16, 128, 4),
            **{**_SEL, "const_c": False}),
    Variant("sel-wCW 16x128/4w", "sel 16x128/4w with the weights as the library's [C, W] view", tile=(16, 128, 4),
            **{**_SEL, "wt": False}),
    Variant("sel lib-like 16x128/4w", "one load a tap, int64, runtime C, [C, W] weights (the library's choices)",
            tile=(16, 128, 4), sel=True),
    Variant("sel-i32 16x128/4w", "sel lib-like with int32 offsets only (runtime C, [C, W] weights)",
            tile=(16, 128, 4), sel=True, i32=True),
] + [
    Variant(f"sel+cs {bt}x{bc}/{nw}w", f"sel with .cs streaming stores (out, slot), {bt}x{bc} tiles, {nw} warps",
            tile=(bt, bc, nw), cs=True, **_SEL)
    for bt, bc, nw in ((16, 128, 4), (16, 256, 8), (8, 256, 4))
]
# Session 12, after the port of int32 offsets and a constant C to the library gained
# nothing: sel 16x128/4w (int32, constant C) with the library kernel's other ways, one at
# a time and all together (_feat_taps); the one that takes sel's lead away is the next
# thing to change in the library.
_FEATS = {1: "map2d", 2: "cmask", 4: "clamp", 8: "w1d"}
VARIANTS += [
    Variant(f"sel+{name} 16x128/4w", f"sel 16x128/4w with the library's {name} (_feat_taps bit {bit})",
            tile=(16, 128, 4), feat=bit, **_SEL)
    for bit, name in _FEATS.items()
] + [
    Variant("sel+all4 16x128/4w", "sel 16x128/4w with all four of the library's ways (_feat_taps 15)",
            tile=(16, 128, 4), feat=15, **_SEL),
    Variant("sel+all4 i64 16x128/4w", "sel+all4 with int64 offsets and a runtime C (the library's kernel, one load)",
            tile=(16, 128, 4), feat=15, **{**_SEL, "i32": False, "const_c": False}),
]
# Session 13: the "rows" kernel (x rows in registers, every load before any store).
_ROWS = dict(i32=True, const_c=True, wt=True)


def _rows(bt: int, bc: int, nw: int, g: int, cs: bool = False) -> Variant:
    return Variant(f"rows{'+cs' if cs else ''} {bt}x{bc}/{nw}w/g{g}",
                   f"{bt} rows x {bc} channels as row vectors in registers, every x row loaded before any store, "
                   f"taps from registers, fix-up loads {g} rows at a time, {nw} warps" + (", .cs stores" if cs else ""),
                   tile=(bt, bc, nw), rows=g, cs=cs, **_ROWS)


VARIANTS += [_rows(bt, bc, nw, g) for bt, bc, nw, g in (
    (16, 1024, 4, 1), (8, 1024, 4, 1), (16, 512, 4, 1), (8, 512, 4, 1), (16, 256, 2, 1), (8, 256, 2, 1),
    (16, 512, 2, 1), (8, 512, 2, 1), (16, 256, 1, 1), (8, 256, 1, 1), (16, 128, 1, 1), (16, 512, 4, 4),
    (8, 512, 4, 4), (8, 256, 2, 4))]
# (sm_90, compiled on the CPU: rows-wCW 127 registers, rows-wtile 92, against rows
# 8x256/2w/g1's 102; not yet timed)
VARIANTS += [Variant("rows-wCW 8x256/2w/g1", "rows 8x256/2w/g1 with the weights as the library's [C, W] view",
                     tile=(8, 256, 2), rows=1, **{**_ROWS, "wt": False}),
             Variant("rows-wtile 8x256/2w/g1", "rows-wCW with the weights loaded as one [BLOCK_C, 4] tile and split",
                     tile=(8, 256, 2), rows=1, wtile=True, **{**_ROWS, "wt": False})]
# Session 13: the library's row-register kernel (sconv/rows_kernel.py) on other tiles, and
# its one-load tile (the default before it) for comparison.
VARIANTS += [
    Variant(f"lib-rows {bt}x{bc}/{nw}w", f"the library's row-register kernel on {bt}x{bc} tiles, {nw} warps",
            libcfg=(bt, bc, nw, "rows"))
    for bt, bc, nw in ((16, 256, 1), (8, 256, 1), (16, 1024, 4), (8, 512, 2), (16, 512, 2), (8, 1024, 4))
] + [Variant("lib-one-load 16x128/4w", "the library's one-load tile (fused_sconv's default before session 13)",
             libcfg=(16, 128, 4, "one-load"))]
# The library given its weights as a [C, W] view of a [W, C]-contiguous tensor (strides
# (1, C); every kernel reads weights through strides): vector weight loads. On the CPU the
# row kernel compiles to 114 registers with the [C, W] layout and 96 with this one
# (probe_sm90.py --lib 8,256,2,rows[,wt]); timed in session 14 (RESULTS_prefill_exp.md).
VARIANTS += [
    Variant("lib-rows-wt 8x256/2w", "the library's row kernel, 8x256/2w, weights [W, C]-contiguous",
            libcfg=(8, 256, 2, "rows"), wt=True),
    Variant("lib-one-load-wt 16x128/4w", "the library's one-load tile, weights [W, C]-contiguous",
            libcfg=(16, 128, 4, "one-load"), wt=True),
]
# Session 14: the library's row kernel reads [C, W]-contiguous weights as one [BLOCK_C, 4]
# tile (86 registers for sm_90, 114 before). Measured and dropped the same session (knobs
# of the kernel then; RESULTS_prefill_exp.md): the load path taking 2 or 4 rows' fix-up
# loads at once, loading the next row's codes early, a register cap (maxnreg 80/72/64),
# taking the row tiles from both ends or last first.
VARIANTS += [
    Variant("lib-rows-strided-w 8x256/2w", "the library's row kernel, 8x256/2w, weights read as W strided vectors "
            "(before session 14)", libcfg=(8, 256, 2, "rows"), strided_w=True)
] + [Variant("lib-rows 8x256/2w", "the library's row kernel, 8x256/2w, as committed", libcfg=(8, 256, 2, "rows"))]
# (session 20: variants taking the library's row tiles last to first, or from both ends
# alternately, through a SconvConfig field since removed: 5-9 % slower on prefill, no
# gain on the prompt-first mixed batch; RESULTS_prefill_exp.md, session 20)
# (session 20, after that) Is the reversal's ~1 µs a launch the schedule of the first
# loads? The experimental row kernel with its tiles last to first (rev), with the tile's
# slot and map loads issued before its x rows (mf), and both.
VARIANTS += [
    Variant(f"rows2d{tag} 8x256/2w/s64", f"rows2d 8x256/2w/s64{desc}", tile=(8, 256, 2), rows=1, wtile=True, sub=64,
            rev=rev, mf=mf, **{**_ROWS, "wt": False})
    for tag, desc, rev, mf in (("-rev", ", row tiles last to first", True, False),
                               ("-mf", ", slot and map loads before the x rows", False, True),
                               ("-mf-rev", ", slot and map loads first, row tiles last to first", True, True))
]
# Session 21: the library's row kernel with that compile (REVERSE, taken when the batch's
# decodes_last says its decode rows come last), against its plain order on the same
# batches, and forced on batches where the order cannot matter (prefill).
VARIANTS += [
    Variant("lib-rows-inorder 8x256/2w", "the library's row kernel, 8x256/2w, tiles first to last whatever the "
            "batch's order", libcfg=(8, 256, 2, "rows"), order=False),
    Variant("lib-rows-rev 8x256/2w", "the library's row kernel, 8x256/2w, the reversed compile (REVERSE) on "
            "every batch", libcfg=(8, 256, 2, "rows"), order=True),
]
# Session 14, not yet timed: the experimental row kernel's load path (tiles with decode
# rows) as [8, SUB] channel chunks, one round trip a chunk instead of one a row
# (_rows_slow2d); weights as the library's [C, W] tile.
VARIANTS += [Variant(f"rows2d 8x256/2w/s{sub}", f"rows-wtile 8x256/2w/g1 with its load path as [8, {sub}] chunks",
                     tile=(8, 256, 2), rows=1, wtile=True, sub=sub, **{**_ROWS, "wt": False})
             for sub in (32, 64, 128)] + [
    Variant("rows2d-all 8x256/2w/s64", "rows2d 8x256/2w/s64 with every tile on its load path (checks that path "
            "on prompt tiles too)", tile=(8, 256, 2), rows=1, wtile=True, sub=64, all_slow=True,
            **{**_ROWS, "wt": False})]
# Session 16: order independence. With the decodes after the prompt (2048 + 255), the
# load-path tiles (one round trip per 64-channel chunk) are the grid's last and run as a
# tail on few SMs: 0.68-0.73 of copy against 0.76 with the decodes first (session 15).
# Rotating the row tiles so that the grid starts after the last tile of the register
# path puts them first in either order. Here the shift is computed on the host from the
# map (outside the timing). Timed in session 17 (below).
VARIANTS += [Variant("rows2d-rot 8x256/2w/s64", "rows2d 8x256/2w/s64 with its row tiles rotated to start after "
                     "the last register-path tile", tile=(8, 256, 2), rows=1, wtile=True, sub=64, rot=True,
                     **{**_ROWS, "wt": False})]


# Session 17 (RESULTS_prefill_exp.md): the rotation's gain above came from this kernel's
# modulo (pid + shift) % tiles, which cost 5-10 % in every launch, shift 0 included.
# Without the modulo (the library's row kernel given a host-computed shift, calls 2-4)
# the prompt-first mixed batch gained nothing (30.44 -> 30.52 µs) and 1024 + 255 2 %;
# the library does not rotate. The rotation here is now a compile of its own (ROT).


def _register_tiles(tap_map: torch.Tensor, rows: int) -> torch.Tensor:
    """Per row tile: whether every tap of its rows is a register row or none."""
    t, taps = tap_map.shape
    rowi = torch.arange(t, device=tap_map.device)[:, None]
    dist = torch.arange(1, taps + 1, device=tap_map.device)[None, :]
    ok = ((tap_map == -(rowi - dist + 2)) | (tap_map == -1)).all(dim=1)
    tiles = triton.cdiv(t, rows)
    padded = torch.ones(tiles * rows, dtype=torch.bool, device=tap_map.device)
    padded[:t] = ok
    return padded.view(tiles, rows).all(dim=1)


def rotation_shift(tap_map: torch.Tensor, rows: int) -> int:
    """The first row tile after the last tile whose taps are all register rows or none
    (0 when no tile is): the decode tiles run first whether they follow the prompt or
    precede it. Computed once per map (the launch in a CUDA graph keeps the int)."""
    reg = _register_tiles(tap_map, rows)
    reg_tiles = reg.nonzero()
    return 0 if reg_tiles.numel() == 0 else (int(reg_tiles.max()) + 1) % reg.numel()


def load_path_range(tap_map: torch.Tensor, rows: int) -> tuple[int, int]:
    """(session 17) The load-path tiles as one range [d0, d1) when they are contiguous
    (decodes before or after the prompts), else (0, 0): plain order."""
    slow = (~_register_tiles(tap_map, rows)).nonzero().flatten()
    if slow.numel() == 0:
        return 0, 0
    d0, d1 = int(slow.min()), int(slow.max()) + 1
    return (d0, d1) if d1 - d0 == slow.numel() else (0, 0)


VARIANTS += [Variant("rows2d-ilv 8x256/2w/s64", "rows2d 8x256/2w/s64 with its load-path tiles spread evenly over "
                     "the grid (one every k + 1 programs)", tile=(8, 256, 2), rows=1, wtile=True, sub=64, ilv=True,
                     **{**_ROWS, "wt": False})]


# Canaries (dry run only): deliberately wrong kernels that the check must reject.
CANARIES = [
    Variant("canary: rows2d weight bug", "rows2d 8x256/2w/s64, the load path's dist-1 tap on the dist-2 weight",
            tile=(8, 256, 2), rows=1, wtile=True, sub=64, bug=10, all_slow=True, **{**_ROWS, "wt": False}),
    Variant("canary: rows register bug", "rows 16x256/1w/g4, the dist-1 register tap is the row two back",
            tile=(16, 256, 1), rows=4, bug=9, **_ROWS),
    Variant("canary: spec shift bug", "spec 16x128/4w, the dist-1 speculative load 2 rows back", tile=(16, 128, 4),
            i32=True, const_c=True, wt=True, spec=True, bug=7),
    Variant("canary: feat bug", "sel+all4 16x128/4w with the channel mask inverted on the taps", tile=(16, 128, 4),
            feat=15, bug=8, **_SEL),
    Variant("canary: sel bug", "sel 16x128/4w, its general path with the dist-1 tap on the wrong weight",
            tile=(16, 128, 4), bug=3, **_SEL),
    Variant("canary: fast path bug", "fast, its fast path with the dist-1 tap on the wrong weight", i32=True,
            const_c=True, fast=True, bug=1),
    Variant("canary: general path bug", "fast, its general path with the dist-1 tap on the wrong weight", i32=True,
            const_c=True, fast=True, bug=3),
    Variant("canary: no slot store", "cols+i32 without the slot store", i32=True, bug=2),
    Variant("canary: stream register bug", "stream 32x256/2w, the dist-1 register tap reads the dist-2 register",
            tile=(32, 256, 2), i32=True, const_c=True, wt=True, stream=True, bug=4),
    Variant("canary: mmashift shift bug", "mmashift 32x64/4w, the dist-1 tap shifted by 2 rows", tile=(32, 64, 4),
            i32=True, const_c=True, wt=True, shift=1, bug=5),
    Variant("canary: gathershift shift bug", "gathershift 32x64/4w, the dist-1 tap gathered 2 rows back",
            tile=(32, 64, 4), i32=True, const_c=True, wt=True, shift=2, bug=5),
    Variant("canary: overlap without halo", "overlap 32x64/4w without the halo dot", tile=(32, 64, 4), i32=True,
            const_c=True, wt=True, shift=3, bug=6),
]


def width_taps() -> int:
    return bs.W


def shift_overlap(v: Variant) -> int:
    """Rows of a shift kernel's x tile before its first output row."""
    return SHIFT_OV if v.shift in (1, 2) else 0


def resolve_tile(v: Variant, t: int, heads: int, width: int, dry: bool) -> tuple[int, int, int]:
    if v.tile is not None:
        return v.tile
    # The dry run's tiny T would give decode tiles: take the large-batch rule there.
    # (the two-load tile: the library's default for these launches until session 12)
    cfg = choose_config(max(t, 1025) if dry else t, heads, width, mapped=True, one_load=False)
    return cfg.block_t, cfg.block_c, v.warps or cfg.num_warps


def applicable(v: Variant, tile: tuple[int, int, int], x: torch.Tensor, cache: torch.Tensor, width: int) -> str | None:
    """None, or why this variant cannot run on this case."""
    t, c = x.shape
    bt, bc, _ = tile
    if c % bc or (width % bc and bc % width):
        return f"tile {bc} channels does not fit C={c}, head {width}"
    if triton.cdiv(t, bt - shift_overlap(v)) > 65535:
        return "grid axis 1 too large"
    if v.shift and not 2 <= width_taps() <= min(SHIFT_OV, SHIFT_HALO) + 1:
        return f"shift kernels hold at most {min(SHIFT_OV, SHIFT_HALO)} earlier rows"
    if v.shift and (bt < 16 or bt <= shift_overlap(v)):
        return "shift kernels need at least 16 rows per tile (tl.dot) and some output rows"
    if v.wtile and bs.W != 4:
        return "the weight tile is split for W = 4 only"
    if v.rows and (bt % v.rows or bt * (bs.W - 1) > 64):
        return "rows kernel: the fix-up group must divide the rows, and a tile's taps fit 64 bits"
    if v.stream and not 2 <= width_taps() <= 4:
        return "stream kernel holds at most 3 earlier rows (W <= 4)"
    if v.i32 and (x.numel() >= 2**31 or cache.numel() >= 2**31 or t * (bs.W - 1) >= 2**31):
        return "int32 offsets would overflow"
    return None


def launch_exp(v: Variant, tile: tuple[int, int, int], x: torch.Tensor, weight: torch.Tensor, cache: torch.Tensor,
               inp: bs.Inputs, off: int, width: int, out: torch.Tensor, tile_shift: int = 0,
               ilv: tuple[int, int] = (0, 0)) -> None:
    t, c = x.shape
    bt, bc, nw = tile
    grid = (c // bc, triton.cdiv(t, bt - shift_overlap(v)))
    if v.shift:
        _shift_sconv_kernel[grid](
            x, weight, cache, out, inp.slots, inp.tap_map,
            t, cache.shape[0] * cache.shape[2],
            weight.stride(0), weight.stride(1), cache.stride(0), cache.stride(1), cache.stride(2), off,
            C=c, WS=width, N=bs.N, W=bs.W, BLOCK_T=bt, BLOCK_C=bc, OV=shift_overlap(v), HALO=SHIFT_HALO,
            SHIFT=v.shift, INTERPRET=INTERPRET, BUG=v.bug,
            num_warps=nw,
        )
        return
    if v.rows:
        _rows_sconv_kernel[grid](
            x, weight, cache, out, inp.slots, inp.tap_map,
            t, cache.shape[0] * cache.shape[2],
            weight.stride(0), weight.stride(1), cache.stride(0), cache.stride(1), cache.stride(2), off,
            C=c, WS=width, N=bs.N, W=bs.W, ROWS=bt, BLOCK_C=bc, G=v.rows, CS=v.cs, BUG=v.bug,
            QP=triton.next_power_of_2(bt * (bs.W - 1)), WTILE=v.wtile, SUB=v.sub, ALL_SLOW=v.all_slow,
            tile_shift=tile_shift, ilv_d0=ilv[0], ilv_d1=ilv[1], ROT=v.rot, ILV=v.ilv, REV=v.rev, MAPFIRST=v.mf,
            num_warps=nw,
        )
        return
    if v.stream:
        _stream_sconv_kernel[grid](
            x, weight, cache, out, inp.slots, inp.tap_map,
            t, cache.shape[0] * cache.shape[2],
            weight.stride(0), weight.stride(1), cache.stride(0), cache.stride(1), cache.stride(2), off,
            C=c, WS=width, N=bs.N, W=bs.W, ROWS=bt, BLOCK_C=bc, NS=v.stages, PF=v.pf, UNROLL=v.unroll, BUG=v.bug,
            num_warps=nw,
        )
        return
    _exp_sconv_kernel[grid](
        x, weight, cache, out, inp.slots, inp.tap_map,
        t, c, cache.shape[0] * cache.shape[2],
        weight.stride(0), weight.stride(1), cache.stride(0), cache.stride(1), cache.stride(2), off,
        WS=width, N=bs.N, W=bs.W, BLOCK_T=bt, BLOCK_C=bc,
        CONST_C=c if v.const_c else 0, I32=v.i32, FAST=v.fast, CS=v.cs, BUG=v.bug, TAPS=not v.floor,
        SEL=v.sel, SPEC=v.spec, FEAT=v.feat, WP=triton.next_power_of_2(bs.W - 1),
        num_warps=nw,
    )


@contextlib.contextmanager
def _strided_weights(on: bool) -> Iterator[None]:
    """With ``on``, the library's row kernel reads its weights as W strided vectors (its
    way before session 14) in the launches inside (read at launch time)."""
    saved = sconv_kernel.rows_weight_tile
    if on:
        sconv_kernel.rows_weight_tile = lambda w: False
    try:
        yield
    finally:
        sconv_kernel.rows_weight_tile = saved


def make_launch(v: Variant, tile: tuple[int, int, int] | None, weight: torch.Tensor, cache: torch.Tensor,
                inp: bs.Inputs, off: int, width: int, out: torch.Tensor) -> Callable[[], Any]:
    batch = inp.mapped if v.order is None else dataclasses.replace(inp.mapped, decodes_last=v.order)
    if v.lib:
        return lambda: fused_sconv_triton(inp.x, weight, cache, batch, off, width, out=out)
    if v.libcfg:
        bt, bc, nw, kind = v.libcfg
        cfg = SconvConfig(block_t=bt, block_c=bc, num_warps=nw, rows=kind == "rows", tap_select=kind == "one-load")

        def launch() -> Any:
            with _strided_weights(v.strided_w):
                return fused_sconv_triton(inp.x, weight, cache, batch, off, width, out=out, config=cfg)
        return launch
    assert tile is not None
    shift = rotation_shift(inp.tap_map[: inp.x.shape[0]], tile[0]) if v.rot else 0  # (before any timing)
    if v.rot:
        log(f"{v.name}: row tiles rotated by {shift} of {triton.cdiv(inp.x.shape[0], tile[0])}")
    ilv = load_path_range(inp.tap_map[: inp.x.shape[0]], tile[0]) if v.ilv else (0, 0)
    if v.ilv:
        log(f"{v.name}: load-path tiles {ilv} of {triton.cdiv(inp.x.shape[0], tile[0])} spread over the grid")
    return lambda: launch_exp(v, tile, inp.x, weight, cache, inp, off, width, out, shift, ilv)


# --------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------

GPU_CASES = ["prefill 8192, ATTN", "prefill 8192, K", "prefill 16384, K (sliding)",
             "mixed 2048 + 255 decodes, ATTN", "chunked 8192 after 8190, ATTN"]


def gpu_cases() -> list[bs.Case]:
    by_name = {c.name: c for c in bs.cases()}
    missing = [n for n in GPU_CASES if n not in by_name]
    if missing:
        raise SystemExit(f"bench_sconv has no case named {missing}")
    return [by_name[n] for n in GPU_CASES]


def threshold_cases() -> list[bs.Case]:
    """(--threshold) Launches between decode and prefill size, to place choose_config's
    switch to the row kernel: decode-heavy batches of >= 1024 rows (every tile on the
    row kernel's load path) next to prompts and mixes of the same size, and a TP 8 shard."""
    h = bs._hist
    return [
        bs.Case("prefill 1024, ATTN", bs.ATTN_GLOBAL, [(0, 1024)], 0.0),
        bs.Case("prefill 2048, K", bs.K_GLOBAL, [(0, 2048)], 0.0),
        bs.Case("prefill 8192, ATTN, tp8", bs.ATTN_GLOBAL_TP8, [(0, 8192)], 0.0),
        bs.Case("decode 1024 reqs, ATTN", bs.ATTN_GLOBAL, [(h(i), 1) for i in range(1024)], 0.0),
        bs.Case("decode 2048 reqs, K (global)", bs.K_GLOBAL, [(h(i), 1) for i in range(2048)], 0.0),
        bs.Case("spec verify 256x4, ATTN", bs.ATTN_GLOBAL, [(h(i), 4) for i in range(256)], 0.0),
        bs.Case("mixed 512 + 512 decodes, ATTN", bs.ATTN_GLOBAL, [(0, 512)] + [(h(i), 1) for i in range(512)], 0.0),
        bs.Case("mixed 1024 + 255 decodes, ATTN", bs.ATTN_GLOBAL, [(0, 1024)] + [(h(i), 1) for i in range(255)],
                0.0),
        # bench_sconv's mixed case with its decodes first (their tiles start first)
        bs.Case("mixed 255 decodes + 2048, ATTN", bs.ATTN_GLOBAL, [(h(i), 1) for i in range(255)] + [(0, 2048)],
                0.0),
        bs.Case("mixed 2048 + 255 decodes, ATTN", bs.ATTN_GLOBAL, [(0, 2048)] + [(h(i), 1) for i in range(255)],
                0.0),
        # (session 20) speculative batches of 7 and 8 drafts (8 and 9 rows a request: the
        # rows rule's boundary; every row tile holds a request's first rows), and the
        # 1024-token mix with its decodes first
        bs.Case("spec verify 128x8, ATTN", bs.ATTN_GLOBAL, [(h(i), 8) for i in range(128)], 0.0),
        bs.Case("spec verify 256x8, ATTN", bs.ATTN_GLOBAL, [(h(i), 8) for i in range(256)], 0.0),
        bs.Case("spec verify 114x9, ATTN", bs.ATTN_GLOBAL, [(h(i), 9) for i in range(114)], 0.0),
        bs.Case("spec verify 256x8, K (global)", bs.K_GLOBAL, [(h(i), 8) for i in range(256)], 0.0),
        bs.Case("mixed 255 decodes + 1024, ATTN", bs.ATTN_GLOBAL, [(h(i), 1) for i in range(255)] + [(0, 1024)],
                0.0),
        # (session 17) the two parts of the mixed batch alone: where does the order cost?
        bs.Case("part of the mix: prompt 2048, ATTN", bs.ATTN_GLOBAL, [(0, 2048)], 0.0),
        bs.Case("part of the mix: 255 decodes, ATTN", bs.ATTN_GLOBAL, [(h(i), 1) for i in range(255)], 0.0),
    ]


def dry_cases() -> list[bs.Case]:
    attn = (2, 512, 128, 256)  # (H, D, stream offset, stream width): ATTN-like, tiny
    k = (2, 128, 0, 128)  # K-like, tiny (a 256-channel tile covers both heads)
    return [
        bs.Case("tiny prefill 100, ATTN-like", attn, [(0, 100)], 0.0),
        bs.Case("tiny prefill 100, K-like", k, [(0, 100)], 0.0),
        bs.Case("tiny two prompts 37 + 60, K-like", k, [(0, 37), (0, 60)], 0.0),
        bs.Case("tiny chunked 70 after 10, ATTN-like", attn, [(10, 70)], 0.0),
        # 72 prompt rows: a 32-row shift tile (rows 28..55, or 32..63) lies wholly in-forward (on-chip taps,
        # their canaries fail here too) and the next one mixes prompt and decode rows
        bs.Case("tiny mixed 72 + 5 decodes, ATTN-like", attn, [(0, 72)] + [(bs._hist(i), 1) for i in range(5)], 0.0),
        # (session 17) several load-path tiles before the prompt (rows2d-ilv's range at the start)
        bs.Case("tiny 20 decodes + 60, K-like", k, [(bs._hist(i), 1) for i in range(20)] + [(0, 60)], 0.0),
    ]


# --------------------------------------------------------------------------------------
# Check and time
# --------------------------------------------------------------------------------------

ATOL = RTOL = 1.6e-2  # bf16 out: a different fp32 summation order may move the last bit


def check(launch_on: Callable[[torch.Tensor, torch.Tensor], None], x: torch.Tensor, cache: torch.Tensor,
          ref_out: torch.Tensor, ref_cache: torch.Tensor) -> dict[str, Any]:
    """Run once on a copy of the pre-call cache and a NaN-poisoned out; compare."""
    c2 = cache.clone()
    out = torch.full_like(x, float("nan"))
    launch_on(c2, out)
    if out.is_cuda:
        torch.cuda.synchronize()
    err = (out.float() - ref_out.float()).abs()
    close = torch.isclose(out.float(), ref_out.float(), rtol=RTOL, atol=ATOL)
    cache_ok = bool(torch.equal(c2, ref_cache))
    bad = int((~close).sum())
    ok = bad == 0 and cache_ok
    res = dict(ok=ok, max_abs_err=float(err.nan_to_num(float("inf")).max()), bad_out=bad, cache_equal=cache_ok)
    del c2, out
    return res


def run_case(case: bs.Case, variants: list[Variant], args: argparse.Namespace, gen: torch.Generator,
             device: str, copy_gbps: float | None, deadline: float) -> dict[str, Any]:
    heads, _, off, width = case.stream
    nbytes = bs.min_bytes(case)
    num_sets = 2 if args.dry_run else max(2, min(16, math.ceil(256e6 / nbytes)))
    cache, weight, sets = bs.build(case, num_sets, gen, device=device)
    pristine = cache.clone()  # timing writes every set's slots into cache; checks start from this
    # [C, W] view of a [W, C] contiguous copy (variants with wt): stride 1 along channels
    weight_t = weight.t().contiguous().t()
    t, c = sets[0].x.shape
    s0 = sets[0]
    ref_cache = cache.clone()
    ref_out = fused_sconv_ref(s0.x, weight, ref_cache, s0.batch, off, width)
    res: dict[str, Any] = dict(case=case.name, T=t, C=c, bytes=nbytes, sets=num_sets, variants=[])
    outs = [torch.empty_like(s.x) for s in sets]
    lib_us = None
    log(f"case {case.name}: T={t} C={c} sets={num_sets} min bytes {nbytes / 1e6:.1f} MB")
    for v in variants:
        row: dict[str, Any] = dict(name=v.name, desc=v.desc)
        res["variants"].append(row)
        if time.monotonic() > deadline:
            row["status"] = "SKIP (budget)"
            log(f"  {v.name}: skipped, budget spent")
            continue
        if v.lib:
            cfg = choose_config(t, heads, width, mapped=True, num_requests=len(case.requests),
                                num_prefill_tokens=sets[0].prefill)  # (the tile the library picks)
            tile = None
            row["tile"] = f"{cfg.block_t}x{cfg.block_c}/{cfg.num_warps}w" + (" rows" if cfg.rows else "")
        elif v.libcfg:
            tile = None
            row["tile"] = "{}x{}/{}w {}".format(*v.libcfg)
            if v.libcfg[3] == "rows" and c % v.libcfg[1]:
                row["status"] = f"SKIP (C={c} is not a multiple of {v.libcfg[1]})"
                log(f"  {v.name}: skipped: {row['status']}")
                continue
        else:
            tile = resolve_tile(v, t, heads, width, args.dry_run)
            row["tile"] = f"{tile[0]}x{tile[1]}/{tile[2]}w"
            why = applicable(v, tile, s0.x, cache, width)
            if why:
                row["status"] = f"SKIP ({why})"
                log(f"  {v.name}: skipped: {why}")
                continue
        t_start = time.monotonic()
        try:
            w = weight_t if v.wt else weight
            chk = check(lambda cc, oo: make_launch(v, tile, w, cc, s0, off, width, oo)(),
                        s0.x, pristine, ref_out, ref_cache)
        except Exception as e:  # a variant that fails to compile or launch: report, go on
            row["status"] = f"ERROR {type(e).__name__}: {str(e)[:200]}"
            log(f"  {v.name} [{row['tile']}]: {row['status']}")
            continue
        if v.floor:  # not a conv: only its slot stores are checked
            chk["ok"] = chk["cache_equal"]
        row.update(chk)
        row["status"] = ("PASS (cache only)" if v.floor else "PASS") if chk["ok"] else "FAIL"
        msg = (f"  {v.name} [{row['tile']}]: {row['status']} max|err| {chk['max_abs_err']:.3g} "
               f"bad out {chk['bad_out']} cache equal {chk['cache_equal']} ({time.monotonic() - t_start:.1f}s incl. compile)")
        if not chk["ok"] or args.dry_run:
            log(msg)
            continue
        launches = [make_launch(v, tile, w, cache, s, off, width, o) for s, o in zip(sets, outs)]
        us = bs.time_graph(launches, args.reps)
        gbps = nbytes / (us * 1e-6) / 1e9
        row.update(us=us, GBps=gbps, of_copy=gbps / copy_gbps if copy_gbps else None)
        if v.lib and lib_us is None:
            lib_us = us
        row["speedup_vs_lib"] = lib_us / us if lib_us else None
        log(msg + f" | {us:.2f} µs {gbps:.0f} GB/s {row['of_copy']:.3f} of copy"
            + (f" {row['speedup_vs_lib']:.3f}x lib" if row["speedup_vs_lib"] else ""))
    # the baseline again at the end of the case: a noise gauge
    if not args.dry_run and lib_us is not None and time.monotonic() <= deadline:
        launches = [make_launch(VARIANTS[0], None, weight, cache, s, off, width, o) for s, o in zip(sets, outs)]
        us = bs.time_graph(launches, args.reps)
        res["lib_repeat_us"] = us
        log(f"  lib (repeat): {us:.2f} µs")
    if not args.dry_run and time.monotonic() <= deadline:
        # the copy rate at this case's size and set count (may be below the 1-2 GiB
        # baseline: ramp-up and tail of a short launch)
        try:
            cp_us = bs.same_size_copy_us(nbytes, num_sets, args.reps)
            cp_gbps = nbytes / (cp_us * 1e-6) / 1e9
            res.update(same_size_copy_us=cp_us, same_size_copy_GBps=cp_gbps)
            log(f"  same-size copy ({num_sets} x {nbytes / 1e6:.1f} MB, torch.mul in a graph): {cp_us:.2f} µs "
                f"{cp_gbps:.0f} GB/s" + (f", {cp_gbps / copy_gbps:.3f} of the copy baseline" if copy_gbps else "")
                + (f"; the library at {cp_us / lib_us:.3f} of it" if lib_us else ""))
        except Exception as e:  # a measurement aid: report and go on
            log(f"  same-size copy: {type(e).__name__}: {str(e)[:200]}")
    del cache, sets, outs, ref_cache, weight_t
    if device == "cuda":
        torch.cuda.empty_cache()
    return res


def markdown(results: dict[str, Any]) -> str:
    lines = [
        f"Copy baseline (same run, bench_sconv.copy_baseline, read+write): {results.get('copy_GBps') or float('nan'):.0f} GB/s",
        "",
        "| case | variant | tile | check | µs | GB/s | of copy | speed-up vs lib |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results["cases"]:
        for v in r["variants"]:
            us = v.get("us")
            lines.append(
                f"| {r['case']} | {v['name']} | {v.get('tile', '')} | {v['status']} | "
                + (f"{us:.2f} | {v['GBps']:.0f} | {v['of_copy']:.3f} | "
                   + (f"{v['speedup_vs_lib']:.3f}x" if v.get("speedup_vs_lib") else "—") + " |"
                   if us is not None else "— | — | — | — |")
            )
        if "lib_repeat_us" in r:
            lines.append(f"| {r['case']} | lib (repeat, noise gauge) | | | {r['lib_repeat_us']:.2f} | | | |")
    lines += ["", "Variants:"] + [f"- **{v.name}**: {v.desc}" for v in VARIANTS]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true", help="CPU, TRITON_INTERPRET=1, tiny shapes, checks only")
    ap.add_argument("--json", type=pathlib.Path, default=None)
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no new measurement after this many seconds (default 200; none in --dry-run, where a "
                         "skipped check would go unnoticed)")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--only", default=None, help="substring filter on case names ('a|b': either)")
    ap.add_argument("--threshold", action="store_true", help="the cases between decode and prefill size "
                    "(threshold_cases) instead of the prefill ones")
    ap.add_argument("--variants", default=None, help="comma-separated variant names, run in this order (lib is "
                    "always run first)")
    args = ap.parse_args()
    deadline = T0 + (args.budget_s if args.budget_s is not None else math.inf if args.dry_run else 200.0)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    variants = VARIANTS
    if args.variants:  # in the order given (what matters most first, before the budget runs out)
        by_name = {v.name: v for v in VARIANTS}
        names = [n.strip() for n in args.variants.split(",") if n.strip()]
        unknown = [n for n in names if n not in by_name]
        if unknown:
            ap.error(f"no such variants: {unknown}")
        variants = [VARIANTS[0]] + [by_name[n] for n in names if not by_name[n].lib]
    if args.dry_run:
        device, cases = "cpu", dry_cases()
        variants = variants + CANARIES
    else:
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device: use --dry-run on a CPU machine")
        device, cases = "cuda", threshold_cases() if args.threshold else gpu_cases()
    if args.only:
        cases = [c for c in cases if any(part in c.name for part in args.only.split("|"))]
    results: dict[str, Any] = dict(
        device=torch.cuda.get_device_name() if device == "cuda" else "cpu (TRITON_INTERPRET=1)",
        torch=torch.__version__, triton=triton.__version__, dry_run=args.dry_run,
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        command=" ".join(sys.argv), variants=[dataclasses.asdict(v) for v in variants], cases=[],
    )
    copy_gbps = None
    if device == "cuda":
        log("copy baseline ...")
        results["copy_baseline"] = bs.copy_baseline()
        copy_gbps = results["copy_baseline"]["GBps"]
        log(f"copy baseline {copy_gbps:.0f} GB/s")
    results["copy_GBps"] = copy_gbps
    for case in cases:
        if time.monotonic() > deadline:
            log(f"budget spent: case {case.name} not started")
            results["cases"].append(dict(case=case.name, variants=[], skipped="budget"))
            continue
        results["cases"].append(run_case(case, variants, args, gen, device, copy_gbps, deadline))
        if args.json:  # partial results survive a kill
            args.json.write_text(json.dumps(results, indent=1))
    results["elapsed_s"] = time.monotonic() - T0
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print(markdown(results), flush=True)
    # verdict: real variants must pass, canaries must fail
    failed = []
    for r in results["cases"]:
        for v in r["variants"]:
            st = v.get("status", "")
            canary = v["name"].startswith("canary")
            if canary and st == "PASS":
                failed.append(f"{r['case']}: {v['name']} PASSED (the check would miss a wrong kernel)")
            elif not canary and (st == "FAIL" or st.startswith("ERROR")):
                failed.append(f"{r['case']}: {v['name']} {st}")
    log(f"done in {time.monotonic() - T0:.1f}s; " + ("all checks as expected" if not failed else
                                                      "problems:\n  " + "\n  ".join(failed)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

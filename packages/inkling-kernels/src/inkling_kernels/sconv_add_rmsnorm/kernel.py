"""Triton kernel and launcher for ``fused_sconv_add_rmsnorm``.

Tiling: one program owns ``BLOCK_T`` consecutive rows and the *whole* hidden row
(RMSNorm needs it). The row's ``C = H * stream_width`` channels are walked as
``[BLOCK_T, BLOCK_H, BLOCK_J]`` tiles: ``BLOCK_H`` heads times ``BLOCK_J`` channels
of each head's stream range, so every tile's cache addresses are contiguous along
``j`` (vector loads and stores; ``stream_width`` need not be a power of two: the
last ``j`` chunk of a head is masked). Grid ``cdiv(T, BLOCK_T)``: it depends only
on T, nothing but the two outputs is allocated and nothing syncs with the host, so
the launch replays under CUDA graphs.

Per program:

0. resolve the ``W-1`` earlier taps of each row once, before the channel loop: an
   in-forward tap names a row of ``d``; a pre-forward tap a cache slot through the
   block table (the batch's tap map says so directly when it has one). Same-step
   hazard, by the rule every kernel shares (:mod:`inkling_kernels._triton_common`): a
   pre-forward slot that a row of this very launch writes (a same-step prefix hit) is
   looked up in ``slot_mapping`` and read from that writer's row of ``d`` instead of
   the cache, so the result equals "insert the whole batch, then convolve" in any
   program order. Only programs holding a pre-forward tap scan (decode tiles; the
   first W-1 rows of each request in prefill), once for all taps and chunks;
1. per tile: load ``d`` and ``hidden``, store ``d`` into the rows' slots, form the W
   taps (fp32), ``s = dt(d + conv)``, ``new_h = dt(hidden + s)``; store ``new_h`` and
   accumulate its squares (reduced once, after the loop);
2. ``rstd = 1 / sqrt(mean + eps)``; after a block barrier (the ``new_h`` tiles this
   program stored are visible to all its threads) re-read ``new_h`` tile by tile
   (L1/L2 hits) and store ``dt(norm_weight * dt(new_h * rstd))``.

The conv weight is read as ``weight[c, i]`` with any strides; a channel-contiguous
weight (``stride(0) == 1``, e.g. the transpose of a ``(W, C)`` tensor, as
``InklingShortConvAddRMSNorm`` keeps it) is read with vector loads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .._triton_common import decode_tap_codes, last_writers, pow2_ceil, resolve_taps
from ..batch import SconvBatch
from ..checks import SconvProblem

__all__ = [
    "NormConfig",
    "choose_norm_config",
    "launch_sconv_add_rmsnorm",
    "sconv_add_rmsnorm_triton",
]


@triton.jit
def _column(table, kidx, i: tl.constexpr):
    """Column ``i`` of a ``[BLOCK_T, KW]`` integer table (exactly one lane selected)."""
    return tl.sum(tl.where(kidx[None, :] == i, table, 0), axis=1)


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
    SCAN: tl.constexpr,
    USE_MAP: tl.constexpr,
):
    CHANNELS: tl.constexpr = NH * WS
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

    # Per earlier tap, hoisted out of the channel loop and shaped for the 3-D tiles:
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
    hh0 = tl.arange(0, BLOCK_H)
    jj0 = tl.arange(0, BLOCK_J)

    # 1. conv, residual adds, squares.
    sq = tl.zeros([BLOCK_T, BLOCK_H, BLOCK_J], dtype=tl.float32)
    for h0 in range(0, NH, BLOCK_H):
        for j0 in range(0, WS, BLOCK_J):
            hh = h0 + hh0
            jj = j0 + jj0
            chan = (hh[:, None] * WS + jj[None, :])[None, :, :]  # [1, BH, BJ]
            con = ((hh < NH)[:, None] & (jj < WS)[None, :])[None, :, :]
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
                tap = tl.load(d_ptr + d_off[i] + chan, mask=d_on[i] & con, other=0.0).to(tl.float32)
                tap += tl.load(cache_ptr + c_off[i] + ccol, mask=c_on[i] & con, other=0.0).to(tl.float32)
                acc += wv.to(tl.float32) * tap
            s = (d32 + acc).to(d_ptr.dtype.element_ty).to(tl.float32)
            new_h = (h_tile.to(tl.float32) + s).to(d_ptr.dtype.element_ty)
            tl.store(new_h_ptr + offs, new_h, mask=tmask)
            nh32 = new_h.to(tl.float32)
            sq += nh32 * nh32

    # 2. normalise the stored rows.
    sumsq = tl.sum(tl.sum(sq, axis=2), axis=1)
    rstd = (1.0 / tl.sqrt_rn(sumsq / CHANNELS + eps))[:, None, None]
    tl.debug_barrier()
    for h0 in range(0, NH, BLOCK_H):
        for j0 in range(0, WS, BLOCK_J):
            hh = h0 + hh0
            jj = j0 + jj0
            chan = (hh[:, None] * WS + jj[None, :])[None, :, :]
            con = ((hh < NH)[:, None] & (jj < WS)[None, :])[None, :, :]
            tmask = row_on & con
            offs = row_off + chan
            nh32 = tl.load(new_h_ptr + offs, mask=tmask, other=0.0).to(tl.float32)
            y = (nh32 * rstd).to(d_ptr.dtype.element_ty).to(tl.float32)
            nw = tl.load(norm_w_ptr + chan, mask=con, other=0.0).to(tl.float32)
            tl.store(normed_ptr + offs, (nw * y).to(d_ptr.dtype.element_ty), mask=tmask)


@dataclass(frozen=True)
class NormConfig:
    """One launch configuration: ``[block_t, block_h, block_j]`` tiles (rows, heads,
    channels of a head's stream range), all powers of two."""

    block_t: int
    block_h: int
    block_j: int
    num_warps: int
    scan: int = 256


def choose_norm_config(num_tokens: int, num_heads: int, stream_width: int) -> NormConfig:
    """Tile choice (no autotuning: the grid must depend on T alone).

    One row per program, ``[1, 4 heads, next_pow2(stream_width)]`` tiles of about 4k
    elements and 4 warps: the fastest configuration at every 975B shape measured on
    the H200 (decode 1..256, spec verify, prefill and chunked 8192, mixed; see
    benchmarks/RESULTS_sconv_add_rmsnorm.md). One row per program gives the most
    programs for small batches, and with a channel-contiguous conv weight re-reading
    the weights per row costs only L1/L2 traffic. ``num_tokens`` is accepted for
    shape-dependent choices; none was better in the measurements.
    """
    del num_tokens
    block_j = min(pow2_ceil(stream_width), 1024)
    block_h = max(1, min(pow2_ceil(num_heads), 4096 // block_j))
    elems = block_h * block_j
    num_warps = 4 if elems >= 2048 else 2 if elems >= 512 else 1
    return NormConfig(block_t=1, block_h=block_h, block_j=block_j, num_warps=num_warps)


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
    ``config`` overrides the heuristic tile choice (benchmarks, tests); ``outputs`` are
    preallocated ``(new_hidden, normed)`` tensors (tests poison them).
    """
    if outputs is None:
        new_hidden, normed = torch.empty_like(d), torch.empty_like(d)
    else:
        new_hidden, normed = outputs
        for out in outputs:
            if out.shape != d.shape or out.dtype != d.dtype or not out.is_contiguous():
                raise ValueError("outputs must be two contiguous tensors shaped and typed like d")
    if prob.num_tokens == 0:
        return new_hidden, normed
    cfg = config or choose_norm_config(prob.num_tokens, prob.num_heads, stream_width)
    for size in (cfg.block_t, cfg.block_h, cfg.block_j, cfg.scan):
        if size < 1 or size & (size - 1):
            raise ValueError(f"config tile sizes must be powers of two, got {cfg}")
    w2 = prob.weight2d
    table = batch.block_table
    tap_map = batch.tap_map
    grid = (triton.cdiv(prob.num_tokens, cfg.block_t),)
    _sconv_add_rmsnorm_kernel[grid](
        hidden, d, w2, cache,
        batch.positions, table, batch.seq_idx, batch.slot_mapping, batch.query_start,
        batch.slot_mapping if tap_map is None else tap_map,  # (unused without a map)
        norm_weight, new_hidden, normed,
        prob.num_tokens, prob.num_slots,
        table.shape[0], table.shape[1],
        w2.stride(0), w2.stride(1),
        cache.stride(0), cache.stride(1), cache.stride(2),
        table.stride(0),
        stream_offset,
        eps,
        NH=prob.num_heads, WS=stream_width, N=batch.block_size, W=prob.kernel_size,
        KW=pow2_ceil(prob.kernel_size),
        BLOCK_T=cfg.block_t, BLOCK_H=cfg.block_h, BLOCK_J=cfg.block_j, SCAN=cfg.scan,
        USE_MAP=tap_map is not None,
        num_warps=cfg.num_warps,
    )
    return new_hidden, normed


def sconv_add_rmsnorm_triton(
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
        config=config, outputs=outputs,
    )

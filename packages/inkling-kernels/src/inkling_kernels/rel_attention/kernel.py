"""Triton kernel and typed launcher for paged relative-logit attention (the GPU path).

Same math as :func:`.paged.paged_rel_attention` (see :mod:`.reference`), one launch
(plus a small combine launch when the keys are split, or a far-tile launch before it
on long prefills):

* **Tiles.** A program owns ``BLOCK_Q`` consecutive query rows of *one* request times
  the query heads of *one* KV head (GQA): its ``BLOCK_M = max(BLOCK_Q * GP, 16)`` tile rows are
  (query, head-in-group) pairs, heads fastest (``GP``: the group size rounded up to a
  power of two). Every K/V tile is therefore read once for the whole group.
* **Which request.** Request ``i`` owns the query blocks
  ``query_start_loc[i] // BLOCK_Q + i ..`` (at least ``cdiv(qlen_i, BLOCK_Q)`` of
  them; with ``BLOCK_Q = 1`` rows are blocks: ``query_start_loc[i] ..``); a program
  finds its request with a binary search over ``query_start_loc`` on the device.
  Blocks past the last request cover the pad rows (they write zeros). The grid,
  ``cdiv(T, BLOCK_Q) + R`` blocks (``T`` with ``BLOCK_Q = 1``) x ``Hkv`` x
  ``num_splits``, depends only on shapes and nothing syncs with the host; besides the
  output the launch allocates only device buffers of fixed size (split mode's
  workspace, the far launch's buffer, the diag bias's table), so it can be captured
  in a CUDA graph.
* **Keys.** A query block at positions ``p_first..p_last`` reads the keys
  ``[k_lo, p_last]`` (``k_lo = p_first - window + 1`` on sliding layers, else 0) in
  tiles of ``BLOCK_N`` positions, each key's page looked up in the block table (any
  page size ``N``, any cache strides). Keys outside that range are never loaded, so
  null / stale pages outside the window are never touched.
* **Far and near tiles.** On global layers the key tiles more than ``extent``
  behind the query block, wholly seen by every row, run a plain flash-attention
  step (no bias, no mask); the rest ("near": the bias band, the diagonal, the
  window, range ends) run after them, ``near_block_n`` keys at a time, with the
  bias; of those, only the tiles holding a key that some row does not see (the
  window's far end, the diagonal, the range ends) compute masks. Sliding layers
  have only near tiles. With ``tma`` (SM 9.0+, 16-bit caches, tiles inside a page)
  far tiles load K and V through TMA descriptors of the caches: no per-thread
  addresses.
* **Far launch** (``far_block_q``; prefill and chunks whose far tiles carry most of
  the work). A first launch runs only the far tiles, of ``far_block_q`` query rows a
  program (twice the rows share each K/V tile), and writes each row's normalised
  output in fp32 with its running max and sum; the main launch then runs each
  ``block_q`` block's near tiles (and the far tiles its larger block did not cover)
  and merges the two partial softmaxes on a common max into ``out``.
* **Bias.** Only near tiles compute it. ``"band"``: the tile's distances span
  ``BLOCK_Q + near_block_n - 1`` consecutive values, so the program
  multiplies its rows' ``r`` [BLOCK_M, d_rel] by those columns of ``rel_proj`` (one
  small ``tl.dot``; exact fp32 products when both are bf16/fp16) and picks each
  (row, key)'s distance out of that band with ``tl.gather``. ``"diag"``: the bias
  tile is one MMA and nothing is gathered. Once per program the rows' ``r`` become a
  block-diagonal ``A`` [BLOCK_M, BLOCK_Q * DR] (the row of query ``qi`` holds its
  ``r`` in columns ``qi * DR ..``, zeros elsewhere; ``DR``: d_rel rounded up to a
  power of two, at least 16); each near tile loads ``B`` [BLOCK_Q * DR, near_block_n]
  whose block ``qi`` holds the ``rel_proj`` columns at query ``qi``'s distances to
  the tile's keys (zero outside ``0 <= d < extent``), and ``A @ B`` is the bias (fp32
  accumulation, exact products for bf16/fp16 as in ``"band"``). ``B`` depends only
  on how far the tile's first key lies behind the block's first query, so a small
  launch first writes every such ``B`` as rows of a shifted table (8 x BLOCK_Q * DR
  rows of about ``extent + 2 * near_block_n`` entries, eight copies shifted by one
  so that each tile's slice starts on 8 elements) and a near tile loads its ``B``
  as one contiguous, aligned tile with no address arithmetic per element. The MMA
  is ``BLOCK_Q`` times deeper than the band's and ``A`` stays in registers.
  ``"row"`` (``block_q == 1``: a block holds one query position, so every row of
  the tile has the same distance to a key): the bias tile is the rows' ``r``
  [BLOCK_M, DR] times the ``rel_proj`` columns at the tile's distances, one MMA of
  depth ``DR`` and nothing gathered. Tiles keep at least 16 rows (``tl.dot``'s
  minimum on the GPU): with fewer ``BLOCK_Q`` x group rows the rest are padding.
* **Softmax.** Online (running max and sum) in fp32, base 2; ``tau(p)`` (log
  scaling) multiplies each row's fp32 scores and bias, never the bf16 ``q``. Where
  every row's coefficient ``scale * tau * log2(e)`` is positive (a positive scale,
  log-scaling ``alpha >= 0``), a tile's row maximum is taken on the unscaled scores
  and scaled once (exact: rounding is monotonic), and each score's scale and shift
  is one fused multiply-add inside ``exp2``; otherwise the scores are scaled first.
  Where ``scale`` is a power of two (Inkling's ``1 / head_dim``) and ``r`` is not
  fp16, the program divides its rows' ``r`` by ``scale`` once (exact), so the near
  tiles' bias MMAs accumulate onto the unscaled ``q.k`` (bit for bit the same scores).
* **Addresses.** A tile inside one page (``block_size % block_n == 0``) adds one
  scalar offset (its page and first slot) to per-element offsets that are the same
  for every tile, so the loop does no per-element division or 64-bit multiply.
* **Split KV** (flash-decoding). With ``num_splits > 1`` a query block with many
  key tiles divides them among up to ``num_splits`` programs (each keeping at least
  ``min_split_tiles`` tiles) that write unnormalised partial results to an fp32
  workspace; :func:`_combine_kernel` merges them. A block that needs no split writes
  its output directly, so short requests in the batch cost no workspace traffic.
  This is what fills the GPU for decode batches of a few long requests; for those
  the grid is flat, split fastest (``RelAttentionConfig.flat_grid``), the registers
  capped so that 3 programs fit on an SM, the splits sized to one whole wave of them,
  and the two launches overlap (programmatic dependent launch: the combine starts
  while the split kernel finishes and waits for it on the device).

Query positions are derived from the metadata (request ``i``'s rows are positions
``seq_lens[i] - qlen_i ..`` in order, the contract of :func:`paged_rel_attention`);
the values of ``positions`` are not read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

try:  # host-side TMA descriptors (Triton >= 3.3); without them far tiles use pointers
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton
    TensorDescriptor = None

from .._triton_common import is_interpreter, pdl_launch
from .paged import (
    _check_caches,
    _float_tensor,
    _same_device,
    _tensor,
    check_metadata_values,
    check_write_kv_args,
)
from .reference import INDEX_DTYPES, check_log_scaling, check_scale, check_window

__all__ = [
    "RelAttentionConfig",
    "RelAttentionProblem",
    "check_paged_rel_attention_triton_args",
    "choose_rel_attention_config",
    "paged_rel_attention_triton",
    "write_kv_triton",
]

BIAS_MODES = ("band", "diag", "row")
#: the default tiling takes ``bias="diag"`` only up to this MMA depth (block_q x d_rel
#: rounded up): deeper, the bias MMA outweighs the QK one (head dim 128)
DIAG_MAX_DEPTH = 128


# --------------------------------------------------------------------------- kernels


@triton.jit
def _mma(a, b, acc, PREC: tl.constexpr, INTERPRET: tl.constexpr):
    """``acc + a @ b`` with fp32 accumulation (``acc`` feeds the MMA directly); the
    interpreter multiplies 16-bit floats wrongly, so there both sides go through
    fp32 (exact for bf16/fp16 values)."""
    if INTERPRET:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    else:
        return tl.dot(a, b, acc, input_precision=PREC)


@triton.jit
def _key_rows(blk, j0, j, offs_n, kvh, stride_b, stride_n, stride_h, N: tl.constexpr, PAGE_TILE: tl.constexpr):
    """[BLOCK_N] int64 offsets of a key tile's rows (one head) in a cache. ``PAGE_TILE``
    (the tile lies in one page): one scalar offset of its page, first slot and head plus
    ``offs_n * stride_n``, the same for every tile (kept out of the loop), instead of a
    modulo and a 64-bit multiply per key."""
    if PAGE_TILE:
        return (blk * stride_b + (j0 % N).to(tl.int64) * stride_n + kvh * stride_h) + offs_n.to(tl.int64) * stride_n
    else:
        return blk * stride_b + (j % N).to(tl.int64) * stride_n + kvh * stride_h


@triton.jit
def _attend_tile(
    m_i, l_i, acc,
    q, r_rows, scale, qk_coef, b_coef, p_row,
    j0, k_lo, p_first, p_last, req, extent, window,
    k_ptr, v_ptr, bt_ptr, rp_ptr, tab_ptr, tab_off,
    max_blocks, stride_btr, stride_btc,
    stride_kb, stride_kn, stride_kh, stride_kd,
    stride_vb, stride_vn, stride_vh, stride_vd,
    stride_rpc, stride_rpe,
    kvh,
    N: tl.constexpr, BLOCK_Q: tl.constexpr, GP: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, DP: tl.constexpr, HEAD_DIM: tl.constexpr, DR: tl.constexpr,
    D_REL: tl.constexpr, BAND: tl.constexpr, HAS_WINDOW: tl.constexpr,
    BIAS_DIAG: tl.constexpr, BIAS_ROW: tl.constexpr, DOT_PREC: tl.constexpr, BAND_PREC: tl.constexpr,
    INTERPRET: tl.constexpr, PAGE_TILE: tl.constexpr, NEAR: tl.constexpr, MASK: tl.constexpr,
    TAB_U: tl.constexpr, POS_COEF: tl.constexpr, FOLD_SCALE: tl.constexpr, TMA: tl.constexpr,
):
    """One key tile (positions ``j0 .. j0 + BLOCK_N - 1``) of the online softmax.

    ``NEAR``: add the bias (else the tile lies beyond the extent). ``MASK``: some
    (row, key) pair of the tile is not seen (the diagonal, the window, range ends);
    a tile without it is seen whole by every row."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, DP)
    j = j0 + offs_n
    if MASK:
        kv_ok = (j >= k_lo) & (j <= p_last)
    else:  # every key of the tile is in range: unmasked loads
        kv_ok = offs_n < BLOCK_N
    if PAGE_TILE:  # the tile lies in one page: one block-table entry
        page0 = j0 // N
        blk = tl.load(bt_ptr + req.to(tl.int64) * stride_btr + page0 * stride_btc,
                      mask=page0 < max_blocks, other=0).to(tl.int64)
    else:
        page = j // N
        blk = tl.load(bt_ptr + req.to(tl.int64) * stride_btr + page * stride_btc,
                      mask=kv_ok & (page < max_blocks), other=0).to(tl.int64)
    d_ok = offs_d < HEAD_DIM
    if TMA:  # k_ptr, v_ptr: descriptors of [blocks, N, Hkv, head_dim] (a page-tile, unmasked)
        coord = [blk.to(tl.int32), j0 % N, kvh, 0]
        kt = tl.trans(tl.reshape(k_ptr.load(coord), [BLOCK_N, DP]))
    else:
        k_rows = _key_rows(blk, j0, j, offs_n, kvh, stride_kb, stride_kn, stride_kh, N, PAGE_TILE)
        kt = tl.load(k_ptr + k_rows[None, :] + offs_d[:, None] * stride_kd,
                     mask=kv_ok[None, :] & d_ok[:, None], other=0.0)  # [DP, BLOCK_N]
    s = _mma(q, kt, tl.zeros([BLOCK_M, BLOCK_N], tl.float32), DOT_PREC, INTERPRET)

    if NEAR:
        if not FOLD_SCALE:  # (FOLD_SCALE: r came divided by scale, exactly)
            s = s * scale
        if BIAS_ROW:
            # one query position per block: the tile's distances are p_first - j for
            # every row, so the bias is r [BLOCK_M, DR] @ rel_proj[:, p_first - j]
            offs_c = tl.arange(0, DR)
            dcol = p_first - j
            pm = (offs_c < D_REL)[:, None] & ((dcol >= 0) & (dcol < extent))[None, :]
            pcols = tl.load(rp_ptr + offs_c[:, None] * stride_rpc + dcol[None, :] * stride_rpe,
                            mask=pm, other=0.0)
            s = _mma(r_rows, pcols.to(r_rows.dtype), s, BAND_PREC, INTERPRET)
        elif BIAS_DIAG:
            # r_rows is block-diagonal [BLOCK_M, BLOCK_Q * DR] (row of query qi holds its
            # r in columns qi * DR ..); B's block qi2 holds rel_proj's columns at the
            # distances of query qi2 to this tile's keys, so A @ B is the bias itself.
            # B depends only on p_first - j0: it is one aligned tile of the shifted
            # table (_bias_table_kernel), zeros already in place, nothing masked
            # (a tile farther behind than tab_off sees only zeros; one starting past the
            # block's last query has no key seen: any in-range slice will do)
            a = tab_off - tl.minimum(tl.maximum(p_first - j0, 1 - BLOCK_Q), tab_off)
            shift = a % 8
            a8 = tl.multiple_of(a - shift, 8)
            offs_k = tl.arange(0, BLOCK_Q * DR)
            bmat = tl.load(tab_ptr + (shift * (BLOCK_Q * DR * TAB_U) + a8)
                           + (offs_k[:, None] * TAB_U + offs_n[None, :]))
            s = _mma(r_rows, bmat.to(r_rows.dtype), s, BAND_PREC, INTERPRET)
        else:
            # distances of this (rows, keys) tile: dbase .. dbase + BLOCK_Q + BLOCK_N - 2
            dbase = p_first - j0 - (BLOCK_N - 1)
            offs_w = tl.arange(0, BAND)
            offs_c = tl.arange(0, DR)
            dcol = dbase + offs_w
            pm = (offs_c < D_REL)[:, None] & ((dcol >= 0) & (dcol < extent))[None, :]
            pslice = tl.load(rp_ptr + offs_c[:, None] * stride_rpc + dcol[None, :] * stride_rpe,
                             mask=pm, other=0.0)
            band = _mma(r_rows, pslice.to(r_rows.dtype), tl.zeros([BLOCK_M, BAND], tl.float32),
                        BAND_PREC, INTERPRET)  # [BLOCK_M, BAND]
            qi = tl.minimum(tl.arange(0, BLOCK_M) // GP, BLOCK_Q - 1)  # padding rows: any column
            idx = qi[:, None] + (BLOCK_N - 1) - offs_n[None, :]
            s = s + tl.gather(band, idx, axis=1)
        # s: scale * q.k + bias (the row and diag MMAs accumulate onto the scaled
        # scores: one [BLOCK_M, BLOCK_N] accumulator); times coef: log2 units.
        # FOLD_SCALE: r came divided by scale (exact), so s is q.k + bias / scale
        coef = qk_coef if FOLD_SCALE else b_coef
    else:
        coef = qk_coef  # s: q.k
    if not POS_COEF:  # (a coefficient may be <= 0: the row max needs the products)
        s = s * coef[:, None]
    if MASK:
        dist2 = p_row[:, None] - j[None, :]
        seen = (dist2 >= 0) & kv_ok[None, :]
        if HAS_WINDOW:
            seen = seen & (dist2 < window)
        s = tl.where(seen, s, float("-inf"))

    if POS_COEF:
        # coef > 0: the row max of s * coef is coef times the row max of s (exactly:
        # rounding is monotonic), and each s * coef - m is one fused multiply-add
        m_new = tl.maximum(m_i, tl.max(s, axis=1) * coef)
    else:
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
    if MASK:
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing seen yet
    else:  # every row saw this tile's keys
        m_ref = m_new
    alpha = tl.math.exp2(m_i - m_ref)
    if POS_COEF:
        prob = tl.math.exp2(s * coef[:, None] - m_ref[:, None])
    else:
        prob = tl.math.exp2(s - m_ref[:, None])
    l_i = l_i * alpha + tl.sum(prob, axis=1)
    if TMA:
        v = tl.reshape(v_ptr.load(coord), [BLOCK_N, DP])
    else:
        v_rows = _key_rows(blk, j0, j, offs_n, kvh, stride_vb, stride_vn, stride_vh, N, PAGE_TILE)
        v = tl.load(v_ptr + v_rows[:, None] + offs_d[None, :] * stride_vd,
                    mask=kv_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_N, DP]
    acc = _mma(prob.to(v.dtype), v, acc * alpha[:, None], DOT_PREC, INTERPRET)
    return m_new, l_i, acc


@triton.jit
def _key_loop(
    t0, t1, k_start,
    m_i, l_i, acc,
    q, r_rows, scale, qk_coef, b_coef, p_row,
    k_lo, p_first, p_last, req, extent, window,
    k_ptr, v_ptr, bt_ptr, rp_ptr, tab_ptr, tab_off,
    max_blocks, stride_btr, stride_btc,
    stride_kb, stride_kn, stride_kh, stride_kd,
    stride_vb, stride_vn, stride_vh, stride_vd,
    stride_rpc, stride_rpe,
    kvh,
    N: tl.constexpr, BLOCK_Q: tl.constexpr, GP: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, DP: tl.constexpr, HEAD_DIM: tl.constexpr, DR: tl.constexpr,
    D_REL: tl.constexpr, BAND: tl.constexpr, HAS_WINDOW: tl.constexpr,
    BIAS_DIAG: tl.constexpr, BIAS_ROW: tl.constexpr, DOT_PREC: tl.constexpr, BAND_PREC: tl.constexpr,
    INTERPRET: tl.constexpr, PAGE_TILE: tl.constexpr, NEAR: tl.constexpr, MASK: tl.constexpr,
    TAB_U: tl.constexpr, POS_COEF: tl.constexpr, FOLD_SCALE: tl.constexpr, TMA: tl.constexpr,
):
    """Key tiles ``t0 .. t1 - 1`` (tile ``t`` starts at ``k_start + t * BLOCK_N``)."""
    if INTERPRET:  # the interpreter cannot range() over runtime ints
        t = t0
        while t < t1:
            m_i, l_i, acc = _attend_tile(
                m_i, l_i, acc, q, r_rows, scale, qk_coef, b_coef, p_row,
                k_start + t * BLOCK_N, k_lo, p_first, p_last, req, extent, window,
                k_ptr, v_ptr, bt_ptr, rp_ptr, tab_ptr, tab_off, max_blocks, stride_btr, stride_btc,
                stride_kb, stride_kn, stride_kh, stride_kd, stride_vb, stride_vn, stride_vh, stride_vd,
                stride_rpc, stride_rpe, kvh,
                N, BLOCK_Q, GP, BLOCK_M, BLOCK_N, DP, HEAD_DIM, DR, D_REL, BAND, HAS_WINDOW,
                BIAS_DIAG, BIAS_ROW, DOT_PREC, BAND_PREC, INTERPRET, PAGE_TILE, NEAR, MASK, TAB_U,
                POS_COEF, FOLD_SCALE, TMA,
            )
            t += 1
    else:
        for t in range(t0, t1):
            m_i, l_i, acc = _attend_tile(
                m_i, l_i, acc, q, r_rows, scale, qk_coef, b_coef, p_row,
                k_start + t * BLOCK_N, k_lo, p_first, p_last, req, extent, window,
                k_ptr, v_ptr, bt_ptr, rp_ptr, tab_ptr, tab_off, max_blocks, stride_btr, stride_btc,
                stride_kb, stride_kn, stride_kh, stride_kd, stride_vb, stride_vn, stride_vh, stride_vd,
                stride_rpc, stride_rpe, kvh,
                N, BLOCK_Q, GP, BLOCK_M, BLOCK_N, DP, HEAD_DIM, DR, D_REL, BAND, HAS_WINDOW,
                BIAS_DIAG, BIAS_ROW, DOT_PREC, BAND_PREC, INTERPRET, PAGE_TILE, NEAR, MASK, TAB_U,
                POS_COEF, FOLD_SCALE, TMA,
            )
    return m_i, l_i, acc


@triton.jit(do_not_specialize=["num_rows", "num_reqs", "max_blocks", "extent", "window", "tab_off"])
def _rel_attention_kernel(
    q_ptr, r_ptr, rp_ptr, tab_ptr, k_ptr, v_ptr, kd_ptr, vd_ptr, bt_ptr, qsl_ptr, sl_ptr, out_ptr, ws_ptr, wml_ptr,
    nsp_ptr,
    num_rows, num_reqs, max_blocks, extent, window, tab_off,
    scale, ls_inv_floor, ls_alpha,
    stride_qt, stride_qh, stride_qd,
    stride_rt, stride_rh, stride_rc,
    stride_rpc, stride_rpe,
    stride_kb, stride_kn, stride_kh, stride_kd,
    stride_vb, stride_vn, stride_vh, stride_vd,
    stride_btr, stride_btc,
    stride_ot, stride_oh, stride_od,
    NUM_Q_HEADS: tl.constexpr, GROUP: tl.constexpr, GP: tl.constexpr, N: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NEAR_BN: tl.constexpr,
    DP: tl.constexpr, HEAD_DIM: tl.constexpr, DR: tl.constexpr, D_REL: tl.constexpr,
    BAND: tl.constexpr, HAS_WINDOW: tl.constexpr, LOG_SCALE: tl.constexpr,
    BIAS_DIAG: tl.constexpr, BIAS_ROW: tl.constexpr, NUM_SPLITS: tl.constexpr, FLAT: tl.constexpr,
    MIN_SPLIT_TILES: tl.constexpr, NEAR_COST: tl.constexpr, TAB_U: tl.constexpr, POS_COEF: tl.constexpr,
    FOLD_SCALE: tl.constexpr,
    INTERPRET: tl.constexpr, DOT_PREC: tl.constexpr, BAND_PREC: tl.constexpr, PAGE_TILE: tl.constexpr,
    USE_PDL: tl.constexpr, PASS: tl.constexpr, FAR_Q: tl.constexpr, TMA: tl.constexpr,
):
    # PASS 0: every key tile. With far tiles in a launch of their own (FAR_Q query
    # rows a program): PASS 1 (first) the far tiles of FAR_Q-row blocks, writing each
    # row's normalised output (fp32) and (max, sum) to `ws` / `wml`; PASS 2 the rest
    # (the near tiles, and far tiles of this block that its FAR_Q block leaves), merged
    # with those into `out`
    if USE_PDL:
        # launched early (programmatic dependent launch): wait for the kernel before
        # this one in the stream (it may produce our inputs or still read `ws`),
        # then let the next one (the combine) launch and wait in its turn
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    if FLAT:
        # one flat grid, split fastest, query block slowest: a single long request's
        # programs are dispatched first, its spare query block's after them
        pid = tl.program_id(0)
        split = pid % NUM_SPLITS
        kvh = (pid // NUM_SPLITS) % (NUM_Q_HEADS // GROUP)
        pid_b = pid // NUM_SPLITS // (NUM_Q_HEADS // GROUP)
    else:
        pid_b = tl.program_id(0)
        kvh = tl.program_id(1)
        split = tl.program_id(2)

    # request of this query block: the largest i in [0, R] with
    # query_start_loc[i] // BLOCK_Q + i <= pid_b (i == R: the pad rows); with one row
    # a block, blocks are rows and no request needs a spare block
    SPARE: tl.constexpr = 1 if BLOCK_Q > 1 else 0
    lo = pid_b * 0
    hi = lo + num_reqs
    while lo < hi:
        mid = (lo + hi + 1) // 2
        first_block = tl.load(qsl_ptr + mid).to(tl.int32) // BLOCK_Q + mid * SPARE
        go_up = first_block <= pid_b
        lo = tl.where(go_up, mid, lo)
        hi = tl.where(go_up, hi, mid - 1)
    req = lo
    is_req = req < num_reqs
    q_start = tl.load(qsl_ptr + req).to(tl.int32)
    # pad rows: "request" R with rows up to T and no keys (zeros out)
    q_end = tl.load(qsl_ptr + req + 1, mask=is_req, other=num_rows).to(tl.int32)
    seq_len = tl.load(sl_ptr + req, mask=is_req, other=0).to(tl.int32)
    ctx = seq_len - (q_end - q_start)
    row0 = q_start + (pid_b - (q_start // BLOCK_Q + req * SPARE)) * BLOCK_Q

    offs_m = tl.arange(0, BLOCK_M)
    qi = offs_m // GP
    hg = offs_m % GP
    rows = row0 + qi
    row_ok = (rows < q_end) & (hg < GROUP) & (qi < BLOCK_Q)  # tile rows past BLOCK_Q: padding
    rows64 = rows.to(tl.int64)
    heads = kvh * GROUP + hg
    p_row = ctx + (rows - q_start)
    p_first = ctx + (row0 - q_start)
    p_last = tl.minimum(p_first + BLOCK_Q - 1, seq_len - 1)
    if HAS_WINDOW:
        k_lo = tl.maximum(p_first - window + 1, 0)
    else:
        k_lo = p_first * 0
    k_start = (k_lo // BLOCK_N) * BLOCK_N
    n_tiles = tl.maximum((p_last + BLOCK_N - k_start) // BLOCK_N, 0)
    n_tiles = tl.where(row0 < q_end, n_tiles, 0)  # a request's spare block has no rows
    # far tiles (t < t_far): wholly seen by every row and beyond the extent (global
    # layers only); near tiles: the rest (bias band, diagonal, window, range ends)
    if HAS_WINDOW:
        t_far = n_tiles * 0
    else:
        t_far = tl.maximum((p_first - extent + 1 - k_start) // BLOCK_N, 0)
    if PASS == 2:
        # far tiles of the FAR_Q-row block holding this one are the far pass's
        p_far = ctx + ((row0 - q_start) // FAR_Q) * FAR_Q
        t_skip = tl.minimum(tl.maximum((p_far - extent + 1 - k_start) // BLOCK_N, 0), t_far)
    else:
        t_skip = t_far * 0
    if NUM_SPLITS == 1:
        t_begin = t_skip
        t_end = n_tiles
    else:
        # only blocks with many tiles split (at most NUM_SPLITS ways, at least
        # MIN_SPLIT_TILES tiles a split); a block in one split writes `out` directly.
        # The splits share the block's *cost*, a near tile counting NEAR_COST far
        # ones: equal tile counts would leave the last splits (all near tiles: a
        # decode's last `extent` keys) on the critical path.
        used = tl.minimum(tl.maximum((n_tiles + MIN_SPLIT_TILES - 1) // MIN_SPLIT_TILES, 1), NUM_SPLITS)
        n_far = tl.minimum(t_far, n_tiles)
        cost = n_far + (n_tiles - n_far) * NEAR_COST
        per_split = (cost + used - 1) // used
        c0 = tl.minimum(split * per_split, cost)
        c1 = tl.minimum(c0 + per_split, cost)
        # cost position -> first tile at or after it (the same map for both ends)
        t_begin = tl.where(c0 <= n_far, c0, n_far + (c0 - n_far + NEAR_COST - 1) // NEAR_COST)
        t_end = tl.where(c1 <= n_far, c1, n_far + (c1 - n_far + NEAR_COST - 1) // NEAR_COST)

    offs_d = tl.arange(0, DP)
    d_ok = offs_d < HEAD_DIM
    q = tl.load(q_ptr + rows64[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if PASS == 1:  # far tiles only: no bias
        r_rows = tl.zeros([16, 16], r_ptr.dtype.element_ty)
    elif BIAS_DIAG:
        # block-diagonal [BLOCK_M, BLOCK_Q * DR]: row (qi, hg) holds r[row, head] in the
        # columns qi * DR .. qi * DR + D_REL - 1, zeros elsewhere (built once, kept)
        offs_k = tl.arange(0, BLOCK_Q * DR)
        kq = offs_k // DR
        kc = offs_k % DR
        a_ok = row_ok[:, None] & (kq[None, :] == qi[:, None]) & (kc < D_REL)[None, :]
        r_rows = tl.load(r_ptr + rows64[:, None] * stride_rt + heads[:, None] * stride_rh
                         + kc[None, :] * stride_rc, mask=a_ok, other=0.0)
        if BAND_PREC == "ieee":
            r_rows = r_rows.to(tl.float32)
    else:
        offs_c = tl.arange(0, DR)
        r_rows = tl.load(r_ptr + rows64[:, None] * stride_rt + heads[:, None] * stride_rh
                         + offs_c[None, :] * stride_rc,
                         mask=row_ok[:, None] & (offs_c < D_REL)[None, :], other=0.0)
        if BAND_PREC == "ieee":
            r_rows = r_rows.to(tl.float32)
    if FOLD_SCALE and PASS != 1:
        # 1 / scale is a power of two: r / scale is exact, and the near tiles' bias
        # MMAs accumulate onto the unscaled q.k (no multiply of the scores by scale)
        r_rows = (r_rows.to(tl.float32) * (1.0 / scale)).to(r_rows.dtype)
    if LOG_SCALE:
        ratio = tl.maximum((p_row.to(tl.float32) + 1.0) * ls_inv_floor, 1.0)
        tau = 1.0 + ls_alpha * tl.log(ratio)
    else:
        tau = tl.full([BLOCK_M], 1.0, tl.float32)
    b_coef = tau * 1.4426950408889634
    qk_coef = b_coef * scale

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DP], tl.float32)
    # far tiles [t_begin, t_far) in steps of BLOCK_N keys, then near tiles in steps of
    # NEAR_BN (fewer registers, smaller pipeline buffers): of those, [n0, n1) and
    # [n2, n3) hold a key some row does not see (the window's far end, the diagonal,
    # the range ends) and [n1, n2) is seen whole by every row (no masks)
    n0 = tl.maximum(t_begin, t_far) * (BLOCK_N // NEAR_BN)
    n3 = tl.maximum(t_end * (BLOCK_N // NEAR_BN), n0)
    if HAS_WINDOW:
        seen_lo = tl.maximum(k_lo, p_last - window + 1)
    else:
        seen_lo = k_lo
    n1 = tl.minimum(tl.maximum((seen_lo - k_start + NEAR_BN - 1) // NEAR_BN, n0), n3)
    n2 = tl.minimum(tl.maximum((p_first + 1 - k_start) // NEAR_BN, n1), n3)
    for part in tl.static_range(1 if PASS == 1 else 4):
        if part == 0:
            lo, hi = t_begin, tl.minimum(t_end, t_far)
        elif part == 1:
            lo, hi = n0, n1
        elif part == 2:
            lo, hi = n1, n2
        else:
            lo, hi = n2, n3
        m_i, l_i, acc = _key_loop(
            lo, hi, k_start, m_i, l_i, acc,
            q, r_rows, scale, qk_coef, b_coef, p_row, k_lo, p_first, p_last, req, extent, window,
            kd_ptr if TMA and part == 0 else k_ptr, vd_ptr if TMA and part == 0 else v_ptr,
            bt_ptr, rp_ptr, tab_ptr, tab_off, max_blocks, stride_btr, stride_btc,
            stride_kb, stride_kn, stride_kh, stride_kd, stride_vb, stride_vn, stride_vh, stride_vd,
            stride_rpc, stride_rpe, kvh,
            N, BLOCK_Q, GP, BLOCK_M, BLOCK_N if part == 0 else NEAR_BN, DP, HEAD_DIM, DR, D_REL, BAND,
            HAS_WINDOW, BIAS_DIAG, BIAS_ROW, DOT_PREC, BAND_PREC, INTERPRET, PAGE_TILE,
            part > 0, part == 1 or part == 3, TAB_U, POS_COEF, FOLD_SCALE, TMA and part == 0,
        )

    o_ptrs = out_ptr + rows64[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :] * stride_od
    o_mask = row_ok[:, None] & d_ok[None, :]
    slot = rows64 * NUM_Q_HEADS + heads  # (row, head) in ws / wml (of split 0)
    if PASS == 2:
        # merge with the far pass's normalised output o_n and (max, sum): out = (acc
        # * w_f + o_n * w_n) / (l * w_f + w_n) on a common max (o_n = 0, l_n = 0 where
        # a row had no far tile)
        m_n = tl.load(wml_ptr + slot * 2, mask=row_ok, other=0.0)
        l_n = tl.load(wml_ptr + slot * 2 + 1, mask=row_ok, other=1.0)
        m_t = tl.maximum(m_i, m_n)
        m_t = tl.where(m_t == float("-inf"), 0.0, m_t)  # pad rows: no key seen
        w_f = tl.math.exp2(m_i - m_t)
        w_n = l_n * tl.math.exp2(m_n - m_t)
        l_t = l_i * w_f + w_n
        inv = tl.where(l_t > 0.0, 1.0 / tl.where(l_t > 0.0, l_t, 1.0), 0.0)
        o_n = tl.load(ws_ptr + slot[:, None] * DP + offs_d[None, :], mask=o_mask, other=0.0)
        o = acc * (w_f * inv)[:, None] + o_n * (w_n * inv)[:, None]
        tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=o_mask)
    else:
        has = l_i > 0.0
        o = acc / tl.where(has, l_i, 1.0)[:, None]
        o = tl.where(has[:, None], o, 0.0)
        if PASS == 1:  # the far tiles' normalised output in fp32 and its (max, sum)
            tl.store(wml_ptr + slot * 2, m_i, mask=row_ok)
            tl.store(wml_ptr + slot * 2 + 1, l_i, mask=row_ok)
            tl.store(ws_ptr + slot[:, None] * DP + offs_d[None, :], o, mask=o_mask)
        elif NUM_SPLITS == 1:
            tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=o_mask)
        else:
            # the scalars as per-row blocks: Triton 3.9's interpreter turns a bool
            # scalar `&` a bool block into an int32 mask, which its store refuses
            used_m = used + rows * 0
            split_m = split + rows * 0
            direct = (used_m == 1) & (split_m == 0)
            tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=o_mask & direct[:, None])
            # how many splits the combine merges for these rows (1: none, out is final)
            tl.store(nsp_ptr + rows64, used_m,
                     mask=row_ok & (hg == 0) & (split_m == 0) & ((kvh + rows * 0) == 0))
            # partial state of a split: [S, T, Hq, DP] unnormalised acc, [S, T, Hq, 2] (max, sum)
            part = row_ok & (split_m < used_m) & (used_m > 1)
            slot += split.to(tl.int64) * num_rows * NUM_Q_HEADS
            tl.store(ws_ptr + slot[:, None] * DP + offs_d[None, :], acc, mask=part[:, None])
            tl.store(wml_ptr + slot * 2, m_i, mask=part)
            tl.store(wml_ptr + slot * 2 + 1, l_i, mask=part)


@triton.jit(do_not_specialize=["num_rows"])
def _combine_kernel(
    ws_ptr, wml_ptr, nsp_ptr, out_ptr, num_rows,
    stride_ot, stride_oh, stride_od,
    NUM_Q_HEADS: tl.constexpr, HB: tl.constexpr, SP: tl.constexpr, DP: tl.constexpr,
    HEAD_DIM: tl.constexpr, USE_PDL: tl.constexpr,
):
    """Merge the splits' partial softmax states of one row and ``HB`` heads, all
    splits at once (rows whose block ran in one split already hold their output)."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()  # the main kernel's partials are complete and visible
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * HB + tl.arange(0, HB)
    offs_s = tl.arange(0, SP)
    offs_d = tl.arange(0, DP)
    used = tl.load(nsp_ptr + row) + heads * 0  # per head (see the main kernel's stores)
    h_ok = (heads < NUM_Q_HEADS) & (used > 1)
    ok = (offs_s[:, None] < used[None, :]) & h_ok[None, :]  # [SP, HB]
    slot = (offs_s.to(tl.int64)[:, None] * num_rows + row) * NUM_Q_HEADS + heads[None, :]
    m_s = tl.load(wml_ptr + slot * 2, mask=ok, other=float("-inf"))
    l_s = tl.load(wml_ptr + slot * 2 + 1, mask=ok, other=0.0)
    a_s = tl.load(ws_ptr + slot[:, :, None] * DP + offs_d[None, None, :], mask=ok[:, :, None], other=0.0)
    m_top = tl.max(m_s, axis=0)  # [HB]
    ref = tl.where(m_top == float("-inf"), 0.0, m_top)
    wgt = tl.math.exp2(m_s - ref[None, :])  # splits that saw nothing weigh 0
    l_sum = tl.sum(wgt * l_s, axis=0)
    acc = tl.sum(wgt[:, :, None] * a_s, axis=0)  # [HB, DP]
    has = l_sum > 0.0
    o = acc / tl.where(has, l_sum, 1.0)[:, None]
    o = tl.where(has[:, None], o, 0.0)
    tl.store(out_ptr + row * stride_ot + heads[:, None] * stride_oh + offs_d[None, :] * stride_od,
             o.to(out_ptr.dtype.element_ty), mask=h_ok[:, None] & (offs_d < HEAD_DIM)[None, :])


@triton.jit
def _bias_table_kernel(
    rp_ptr, tab_ptr, extent, tab_off, stride_rpc, stride_rpe,
    BLOCK_Q: tl.constexpr, DR: tl.constexpr, D_REL: tl.constexpr, TAB_U: tl.constexpr,
    BLOCK_U: tl.constexpr,
):
    """One row ``(shift, qi, c)`` of the shifted bias table of the ``"diag"`` bias:
    ``tab[shift, qi * DR + c, u] = rel_proj[c, tab_off - shift + qi - u]``, zero where
    that distance lies outside ``[0, extent)`` or ``c >= d_rel``. A near tile whose
    first query lies ``delta`` after its first key needs ``rel_proj[c, delta + qi - n]``
    at row ``qi * DR + c`` and key ``n``: with ``a = tab_off - delta`` that is
    ``tab[a % 8, qi * DR + c, a - a % 8 + n]``, one tile load aligned to 8 elements."""
    row = tl.program_id(0)
    c = row % DR
    qi = (row // DR) % BLOCK_Q
    shift = row // (DR * BLOCK_Q)
    for u0 in range(0, TAB_U, BLOCK_U):
        u = u0 + tl.arange(0, BLOCK_U)
        d = tab_off - shift + qi - u
        ok = (u < TAB_U) & (d >= 0) & (d < extent) & (c < D_REL)
        val = tl.load(rp_ptr + c * stride_rpc + d * stride_rpe, mask=ok, other=0.0)
        tl.store(tab_ptr + row.to(tl.int64) * TAB_U + u, val, mask=u < TAB_U)


@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr,
    stride_kt, stride_kh, stride_kd, stride_vt, stride_vh, stride_vd,
    stride_kcb, stride_kcn, stride_kch, stride_kcd,
    stride_vcb, stride_vcn, stride_vch, stride_vcd,
    N: tl.constexpr, HEAD_DIM: tl.constexpr, DP: tl.constexpr,
):
    """One (row, KV head): store the row's K and V in its slot; slot < 0 writes nothing."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        blk = slot // N
        row = slot % N
        offs = tl.arange(0, DP)
        m = offs < HEAD_DIM
        kv = tl.load(k_ptr + t * stride_kt + h * stride_kh + offs * stride_kd, mask=m)
        tl.store(kc_ptr + blk * stride_kcb + row * stride_kcn + h * stride_kch + offs * stride_kcd, kv, mask=m)
        vv = tl.load(v_ptr + t * stride_vt + h * stride_vh + offs * stride_vd, mask=m)
        tl.store(vc_ptr + blk * stride_vcb + row * stride_vcn + h * stride_vch + offs * stride_vcd, vv, mask=m)


# --------------------------------------------------------------------------- launcher


def write_kv_triton(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """:func:`.paged.write_kv` in one Triton launch: same arguments and result, but
    pad rows (slot -1) are skipped on the device, so the call never synchronises
    with the host and can be captured in a CUDA graph."""
    check_write_kv_args(key, value, key_cache, value_cache, slot_mapping)
    rows, heads, head_dim = key.shape
    if rows == 0:
        return
    kc, vc = key_cache, value_cache
    _write_kv_kernel[(rows, heads)](
        key, value, kc, vc, slot_mapping,
        key.stride(0), key.stride(1), key.stride(2), value.stride(0), value.stride(1), value.stride(2),
        kc.stride(0), kc.stride(1), kc.stride(2), kc.stride(3),
        vc.stride(0), vc.stride(1), vc.stride(2), vc.stride(3),
        N=kc.shape[1], HEAD_DIM=head_dim, DP=_next_pow2(head_dim), num_warps=1,
    )


@dataclass(frozen=True)
class RelAttentionConfig:
    """Tiling of one launch.

    ``block_q`` query rows x the group's heads (rounded up to a power of two) per
    program, ``block_n`` keys per tile, ``num_splits`` programs per query block
    along the keys (1: no workspace, no combine launch), ``bias``: how near tiles
    get the relative bias (see the module docstring): ``"band"`` (one small MMA per
    tile, then a gather of each score's distance), ``"diag"`` (one MMA per tile: the
    rows' ``r`` as a block-diagonal matrix [tile rows, block_q * d_rel'] times the
    tile's ``rel_proj`` columns, d_rel' = d_rel rounded up to a power of two >= 16;
    no gather, the MMA depth and the registers holding ``r`` grow with ``block_q``),
    ``"row"`` (``block_q`` 1 only: every row of a tile at one position, so the bias
    tile is the rows' ``r`` times the tile's ``rel_proj`` columns, one MMA of depth
    d_rel', no gather);
    a query block splits only into as many
    splits as give each at least ``min_split_tiles`` key tiles (one split: it writes
    its output directly). Tiles that need the bias or a mask (the last ``extent``
    keys before a query block, the diagonal, the window) are processed
    ``near_block_n`` keys at a time (default ``block_n``). Key splits divide a query
    block's work counting a near tile as ``near_cost`` far tiles; in split mode a
    second launch merges the partial results. ``flat_grid`` (split mode): a 1-D grid, split fastest, query block
    slowest (else ``(blocks, kv heads, splits)``). ``num_splits`` need not be a power
    of two. ``pdl`` (CUDA, SM 9.0+): programmatic dependent launch; each launch may
    start while the kernel before it in the stream finishes, and waits for it
    (``griddepcontrol.wait``) before touching memory, so only launch latency
    overlaps; ignored under the interpreter and on older GPUs. ``max_registers``
    (CUDA): a cap on the main kernel's registers per thread (ptxas ``maxnreg``), so
    that more programs fit on an SM. ``far_block_q`` (``num_splits`` 1; global layers):
    the far tiles run first in a launch of their own, ``far_block_q`` query rows a
    program, and the main launch (``block_q`` rows a program: the near tiles' bias
    keeps its smaller tile) merges their result into its own; it costs an fp32
    buffer of the output's rows and heads. ``tma`` (CUDA, SM 9.0+): far tiles load K
    and V through TMA descriptors where the caches allow (16-bit, page-sized tiles,
    16-byte aligned strides), else through pointers as without it."""

    block_q: int
    block_n: int
    num_splits: int = 1
    bias: str = "band"
    num_warps: int = 4
    num_stages: int = 2
    min_split_tiles: int = 4
    near_block_n: int | None = None
    near_cost: int = 4
    flat_grid: bool = False
    pdl: bool = False
    max_registers: int | None = None
    far_block_q: int | None = None
    tma: bool = False

    def __post_init__(self) -> None:
        mr = self.max_registers
        if mr is not None and (isinstance(mr, bool) or not isinstance(mr, int) or not 24 <= mr <= 255):
            raise ValueError(f"RelAttentionConfig.max_registers must be None or an int in [24, 255], got {mr!r}")
        for name in ("flat_grid", "pdl", "tma"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"RelAttentionConfig.{name} must be a bool, got {getattr(self, name)!r}")
        fq = self.far_block_q
        if fq is not None and (isinstance(fq, bool) or not isinstance(fq, int) or fq < 1 or fq & (fq - 1)):
            raise ValueError(f"RelAttentionConfig.far_block_q must be None or a power of two >= 1, got {fq!r}")
        if fq is not None and isinstance(self.block_q, int) and fq < self.block_q:
            raise ValueError(f"RelAttentionConfig.far_block_q ({fq}) must be >= block_q ({self.block_q})")
        nb = self.near_block_n
        if nb is not None and (isinstance(nb, bool) or not isinstance(nb, int) or nb < 1 or nb & (nb - 1)
                               or nb > self.block_n):
            raise ValueError(
                f"RelAttentionConfig.near_block_n must be None or a power of two <= block_n, got {nb!r}")
        for name in ("block_q", "block_n", "num_splits", "num_warps", "min_split_tiles", "near_cost"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"RelAttentionConfig.{name} must be an int >= 1, got {value!r}")
        for name in ("block_q", "block_n", "num_warps"):
            value = getattr(self, name)
            if value & (value - 1):
                raise ValueError(f"RelAttentionConfig.{name} must be a power of two, got {value}")
        if self.bias not in BIAS_MODES:
            raise ValueError(f"RelAttentionConfig.bias must be one of {BIAS_MODES}, got {self.bias!r}")
        if self.bias == "row" and self.block_q != 1:
            raise ValueError(f"RelAttentionConfig(bias='row') needs block_q=1 (one query position a tile), "
                             f"got block_q={self.block_q}")
        if isinstance(self.num_stages, bool) or not isinstance(self.num_stages, int) or self.num_stages < 1:
            raise ValueError(f"RelAttentionConfig.num_stages must be an int >= 1, got {self.num_stages!r}")


@dataclass(frozen=True)
class RelAttentionProblem:
    """Validated shapes of one :func:`paged_rel_attention_triton` call."""

    num_rows: int  # T
    num_reqs: int  # R
    num_q_heads: int  # Hq
    num_kv_heads: int  # Hkv
    head_dim: int  # Dh
    d_rel: int
    extent: int  # E
    block_size: int  # N
    scale: float
    window: int | None
    log_scaling: tuple[int, float] | None


def _next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def _metadata(name: str, value: object, length: int | None, what: str, dev: torch.device) -> torch.Tensor:
    t = _tensor(name, value)
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D ({what}), got shape {tuple(t.shape)}")
    if t.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")
    if length is not None and t.shape[0] != length:
        raise ValueError(f"{name} must have {length} entries ({what}), got {t.shape[0]}")
    if t.device != dev and t.device.type != "cpu":
        raise ValueError(f"{name} is on {t.device} but q is on {dev}: pass it on q's device (or the host)")
    if t.shape[0] > 1 and t.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous (stride 1), got stride {t.stride(0)}")
    return t


def check_paged_rel_attention_triton_args(
    q: object, r: object, rel_proj: object, key_cache: object, value_cache: object,
    positions: object, block_table: object, query_start_loc: object, seq_lens: object,
    scale: object, window: object, log_scaling: object, out: object, max_chunk_elements: object,
) -> RelAttentionProblem:
    """Validate a :func:`paged_rel_attention_triton` call; raise TypeError/ValueError
    saying what to change. Reads shapes, dtypes, strides and devices, and the values of
    ``query_start_loc`` and ``seq_lens`` only when both are host tensors
    (:func:`.paged.check_metadata_values`, ``block_table`` too when it is on the host);
    never a device tensor's values, so with device metadata it is safe inside
    CUDA-graph capture."""
    q = _float_tensor("q", q, 3, "[T, Hq, Dh]")
    t_rows, hq, dh = q.shape
    dev = q.device
    r = _float_tensor("r", r, 3, "[T, Hq, d_rel]")
    if r.shape[:2] != q.shape[:2] or r.shape[2] < 1:
        raise ValueError(f"r must be [T, Hq, d_rel] = [{t_rows}, {hq}, d_rel >= 1], got {tuple(r.shape)}")
    _same_device("r", r, dev)
    rel_proj = _float_tensor("rel_proj", rel_proj, 2, "[d_rel, E]")
    if rel_proj.shape[0] != r.shape[2] or rel_proj.shape[1] < 1:
        raise ValueError(f"rel_proj must be [d_rel, E] = [{r.shape[2]}, E >= 1], got {tuple(rel_proj.shape)}")
    _same_device("rel_proj", rel_proj, dev)
    kc, _ = _check_caches(key_cache, value_cache)
    if kc.dtype != q.dtype:
        raise TypeError(f"cache dtype {kc.dtype} differs from q dtype {q.dtype}")
    _same_device("key_cache", kc, dev)
    _, n, hkv, kdh = kc.shape
    if kdh != dh:
        raise ValueError(f"cache head_dim {kdh} differs from q head_dim {dh}")
    if hq % hkv != 0:
        raise ValueError(f"q heads {hq} must be a multiple of the cache's kv heads {hkv} (GQA)")
    if dh > 256 or r.shape[2] > 128:
        raise ValueError(f"head_dim {dh} > 256 or d_rel {r.shape[2]} > 128 is not supported by the kernel")

    pos = _tensor("positions", positions)
    if pos.dim() != 1 or pos.shape[0] != t_rows:
        raise ValueError(f"positions must be [T] = [{t_rows}] (one per query row), got {tuple(pos.shape)}")
    if pos.dtype not in INDEX_DTYPES:
        raise TypeError(f"positions must be int64 (int32 accepted), got {pos.dtype}")
    _same_device("positions", pos, dev)
    bt = _tensor("block_table", block_table)
    if bt.dim() != 2:
        raise ValueError(f"block_table must be 2-D [R, max_blocks], got shape {tuple(bt.shape)}")
    if bt.dtype not in INDEX_DTYPES:
        raise TypeError(f"block_table must be int32 or int64, got {bt.dtype}")
    _same_device("block_table", bt, dev)

    sl = _metadata("seq_lens", seq_lens, None, "[R] context lengths", dev)
    num_reqs = sl.shape[0]
    qsl = _metadata("query_start_loc", query_start_loc, num_reqs + 1, "[R + 1] row offsets", dev)
    if num_reqs > 0 and bt.shape[0] < num_reqs:
        raise ValueError(f"block_table has {bt.shape[0]} rows but there are {num_reqs} requests")

    scale_f = check_scale(scale)
    window_i = check_window(window)
    log_s = check_log_scaling(log_scaling)
    if qsl.device.type == "cpu" and sl.device.type == "cpu":
        check_metadata_values(qsl.tolist(), sl.tolist(), t_rows, bt, kc.shape[0], n, window_i)
    if isinstance(max_chunk_elements, bool) or not isinstance(max_chunk_elements, int):
        raise TypeError(f"max_chunk_elements must be an int, got {type(max_chunk_elements).__name__}")
    if out is not None:
        o = _tensor("out", out)
        if o.shape != q.shape:
            raise ValueError(f"out must have q's shape {tuple(q.shape)}, got {tuple(o.shape)}")
        if o.dtype != q.dtype:
            raise TypeError(f"out dtype {o.dtype} differs from q dtype {q.dtype}")
        _same_device("out", o, dev)
    return RelAttentionProblem(
        num_rows=t_rows, num_reqs=num_reqs, num_q_heads=hq, num_kv_heads=hkv, head_dim=dh,
        d_rel=r.shape[2], extent=rel_proj.shape[1], block_size=n, scale=scale_f, window=window_i,
        log_scaling=log_s,
    )


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


# decode with few long requests: the main kernel capped at DECODE_FEW_REGS registers a
# thread so that DECODE_FEW_PER_SM programs of 4 warps fit on an SM, and key splits for
# one whole wave of them
DECODE_FEW_REGS = 160
DECODE_FEW_PER_SM = 65536 // (DECODE_FEW_REGS * 4 * 32)  # 3
MAX_SPLITS = 128
#: the far launch (``far_block_q``): at least this many rows a request, reaching on
#: average at least FAR_MIN_REACH extents back
FAR_MIN_ROWS = 512
FAR_MIN_REACH = 3


def _check_max_seq_len(max_seq_len: object) -> None:
    if max_seq_len is not None and (isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int)
                                    or max_seq_len < 0):
        raise ValueError(f"max_seq_len must be None or a host int >= 0 (the batch's longest sequence), "
                         f"got {max_seq_len!r}")


def choose_rel_attention_config(
    problem: RelAttentionProblem, device: torch.device, max_seq_len: int | None = None
) -> RelAttentionConfig:
    """Default tiling from shapes only (stable under CUDA graphs: the same padded
    batch always gets the same config). ``max_seq_len`` (a host int, when the caller
    knows it) caps the key splits so that each split keeps a few tiles."""
    _check_max_seq_len(max_seq_len)
    t, reqs, hkv = problem.num_rows, max(problem.num_reqs, 1), problem.num_kv_heads
    gp = _next_pow2(problem.num_q_heads // hkv)
    decode = one_row_window = False
    if device.type == "cpu":  # interpreter: its cost is per program and per op, so few, large tiles
        block_q, block_n, warps, stages = max(1, 64 // gp), 64, 4, 1
        target = 4
    elif t <= 8 * reqs:  # decode / speculative verification: bound by reading K/V
        # one query block per request when its rows fit in 64 tile rows (K/V read once)
        per_req = _next_pow2(-(-t // reqs))
        block_q = max(max(1, 16 // gp), min(per_req, max(1, 64 // gp)))
        one_row_window = problem.window is not None and t == reqs
        if one_row_window:
            block_q = 1  # one row a request on a sliding layer: the one-distance bias (below)
        block_n, warps, stages = 64, 2, 2
        target = 8 * _num_sms(device)
        decode = True
    else:  # prefill, chunked prefill, mixed: 64 tile rows, 4 warps
        block_q, block_n, warps, stages = max(1, 64 // gp), 64, 4, 3
        target = 2 * _num_sms(device)
    blocks = max(min(reqs, t), -(-t // block_q))
    splits = 1
    while splits < 64 and blocks * hkv * splits * 2 <= target:
        splits *= 2
    few = False  # decode of a few long requests: flat grid, capped registers, pdl
    if decode and splits >= 16 and device.type == "cuda":
        # few long requests: the splits fill exactly one wave of DECODE_FEW_PER_SM
        # programs on every SM, flat grid (a second wave, or a wave with empty slots,
        # leaves SMs idle at the end)
        splits = max(2, min(MAX_SPLITS, DECODE_FEW_PER_SM * _num_sms(device) // (blocks * hkv)))
        few = True
        stages = 3
    if max_seq_len is not None:
        while splits > 1 and -(-max_seq_len // block_n) < 4 * splits:
            splits //= 2
    # Near tiles' bias: batches with many rows per request (prefill, chunked prefill,
    # mixed) get the block-diagonal MMA when it is at most DIAG_MAX_DEPTH deep
    # (block_q * d_rel, rounded up); otherwise, and for decode-like batches, the band
    # (deeper, the diag MMA outweighs the gather it saves). On the GPU their near
    # tiles are half as wide as the far ones.
    # The interpreter follows the same rule, so CPU runs take the GPU's code paths.
    near_bn = None
    if one_row_window:
        # Every key tile of a sliding layer's decode is near: one query row a tile takes
        # the bias as one MMA at a single distance per key, no band gather (H100, 256
        # requests x 8k, window 512: 1.17x the band's speed, 0.94 of copy)
        bias = "row"
    elif t <= 8 * reqs or block_q * max(16, _next_pow2(problem.d_rel)) > DIAG_MAX_DEPTH:
        bias = "band"
        if not decode and device.type != "cpu" and block_n >= 32:
            near_bn = block_n // 2  # band tiles: half the keys (a narrower band to gather)
    else:
        bias = "diag"
        if device.type != "cpu":
            # half-width near tiles: the pipeline's buffers (K, V and the bias table's
            # tile, 3 stages) fit two programs on an SM (H100, prefill 8k: 3376 µs
            # against 4580 with whole-width near tiles)
            near_bn = block_n // 2
    if decode:
        # 2 warps once there are >= 2048 programs on global layers, >= 4096 on
        # sliding ones (every tile near: 2 warps spill there); with fewer programs 4
        # warps, and 128-key tiles when the keys are not split
        programs = blocks * hkv * splits
        if programs < (4096 if problem.window is not None else 2048):
            warps = 4
            if splits == 1 and programs < 2048:
                block_n = 128
    # few long requests: near tiles weigh 3 far ones in the split, launches overlap
    # (pdl), registers capped
    extra: dict[str, object] = dict(near_cost=3, pdl=True, max_registers=DECODE_FEW_REGS) if few else {}
    if not decode and problem.window is None:
        # global-layer prefill, chunks, mixed: far tiles through TMA descriptors (H100:
        # 0-4.6 % faster on every such case, none slower)
        extra["tma"] = True
        # where far tiles carry most of the work, they run in a launch of their own
        # with twice the query rows. A request's rows reach on average
        # max_seq_len - rows / 2 keys back, of which `extent` are near; from
        # FAR_MIN_REACH extents on (about 2/3 of the keys far) and FAR_MIN_ROWS rows a
        # request the far launch wins over TMA alone (H100: prefill 8k 1-2 %, 16k 9 %,
        # chunks of 512 / 1k / 8k rows after 8k 8-10 %); prefill 2k-4k and mixed
        # batches of decodes lose 7-17 % (the fp32 merge, padded 16-row blocks)
        rows_per_req = -(-t // reqs)
        if (splits == 1 and max_seq_len is not None and rows_per_req >= FAR_MIN_ROWS
                and max_seq_len - rows_per_req // 2 >= FAR_MIN_REACH * problem.extent):
            extra["far_block_q"] = 2 * block_q
    return RelAttentionConfig(block_q=block_q, block_n=block_n, num_splits=splits, bias=bias,
                              num_warps=warps, num_stages=stages, near_block_n=near_bn, flat_grid=few,
                              **extra)


def _query_blocks(t_rows: int, num_reqs: int, block_q: int) -> int:
    """Query blocks of ``block_q`` rows for ``t_rows`` rows of ``num_reqs`` requests:
    each request starts a block (at most one partial block each), pad rows included."""
    return -(-t_rows // block_q) + (num_reqs if block_q > 1 else 0)


def _tma_ok(kc: torch.Tensor, vc: torch.Tensor, prob: RelAttentionProblem, block_n: int, dp: int) -> bool:
    """Whether far tiles can load K and V through TMA descriptors of the caches: an
    SM 9.0+ NVIDIA GPU (and a Triton with host descriptors), 16-bit caches, tiles
    inside one page, the head dim a power of two and the caches' strides and base
    addresses 16-byte aligned."""
    if (TensorDescriptor is None or kc.device.type != "cuda" or is_interpreter() or torch.version.hip is not None
            or torch.cuda.get_device_capability(kc.device)[0] < 9):
        return False
    if kc.dtype not in (torch.bfloat16, torch.float16) or prob.block_size % block_n or prob.head_dim != dp:
        return False
    return all(c.stride(3) == 1 and all(st * 2 % 16 == 0 for st in c.stride()[:3]) and c.data_ptr() % 16 == 0
               for c in (kc, vc))


def _exact_inverse(scale: float) -> bool:
    """Whether ``r / scale`` is exact in any float dtype short of overflow: ``scale`` a
    positive power of two within fp32's normal range (Inkling's ``1 / head_dim``)."""
    mant, exp = math.frexp(scale)
    return scale > 0 and mant == 0.5 and -120 <= exp <= 120


def paged_rel_attention_triton(
    q: torch.Tensor,
    r: torch.Tensor,
    rel_proj: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    positions: torch.Tensor,
    block_table: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float,
    window: int | None = None,
    log_scaling: tuple[int, float] | None = None,
    out: torch.Tensor | None = None,
    max_chunk_elements: int = 1 << 24,
    max_seq_len: int | None = None,
    config: RelAttentionConfig | None = None,
) -> torch.Tensor:
    """Relative-logit attention over the paged KV cache in one Triton launch (plus a
    combine launch when the keys are split).

    Arguments and result as :func:`inkling_kernels.rel_attention.paged_rel_attention`,
    except:

    * ``query_start_loc`` [R + 1] and ``seq_lens`` [R] should be tensors on q's
      device (vLLM: ``query_start_loc`` / ``seq_lens``); host tensors are accepted,
      value-checked as :func:`paged_rel_attention` checks them (the block table's
      entries too when it is on the host) and copied (not CUDA-graph capturable).
      Device metadata is never read on the host: the call does not synchronise and
      replays under CUDA graphs (fixed grid from T and R).
    * ``positions`` is checked for shape only: the kernel derives each row's position
      from the metadata (request ``i``'s rows are positions ``seq_lens[i] - qlen_i ..``).
    * ``max_chunk_elements`` is accepted for signature compatibility and ignored
      (the kernel never materialises scores).
    * ``max_seq_len``: optional host bound on ``seq_lens`` (vLLM has it) that keeps
      the key split of decode batches from over-splitting short contexts.
    * ``config``: explicit tiling (default :func:`choose_rel_attention_config`).
    """
    prob = check_paged_rel_attention_triton_args(
        q, r, rel_proj, key_cache, value_cache, positions, block_table, query_start_loc,
        seq_lens, scale, window, log_scaling, out, max_chunk_elements,
    )
    if config is None:
        config = choose_rel_attention_config(prob, q.device, max_seq_len)
    else:
        _check_max_seq_len(max_seq_len)
    if not isinstance(config, RelAttentionConfig):
        raise TypeError(f"config must be a RelAttentionConfig, got {type(config).__name__}")
    result = torch.empty_like(q) if out is None else out
    t_rows = prob.num_rows
    if t_rows == 0:
        return result
    dev = q.device
    qsl = query_start_loc.to(dev, non_blocking=True)
    sl = seq_lens.to(dev, non_blocking=True)

    group = prob.num_q_heads // prob.num_kv_heads
    gp = _next_pow2(group)
    block_q, block_n, splits = config.block_q, config.block_n, config.num_splits
    far_q = config.far_block_q if prob.window is None else None  # (sliding layers: no far tiles)
    if far_q is not None and splits > 1:
        raise ValueError(f"RelAttentionConfig.far_block_q needs num_splits=1, got num_splits={splits}")
    # tile rows: block_q x the group's heads, padded to 16 (tl.dot's minimum on the GPU)
    block_m = max(block_q * gp, 16)
    near_bn = config.near_block_n or block_n
    if dev.type != "cpu" and min(block_n, near_bn) < 16:
        raise ValueError(f"on the GPU, block_n ({block_n}) and near_block_n ({near_bn}) must be >= 16 (tl.dot)")
    dp = max(16, _next_pow2(prob.head_dim))
    dr = max(16, _next_pow2(prob.d_rel))
    band = max(16, _next_pow2(block_q + near_bn - 1))

    use_diag, use_row = config.bias == "diag", config.bias == "row"
    if q.dtype == torch.float32:
        dot_prec = "ieee"
    else:
        dot_prec = "tf32"  # ignored for 16-bit inputs
    if r.dtype == rel_proj.dtype and r.dtype in (torch.bfloat16, torch.float16):
        band_prec = "tf32"  # 16-bit x 16-bit products are exact in fp32: any precision
    else:
        band_prec = "ieee"
    num_blocks = _query_blocks(t_rows, prob.num_reqs, block_q)
    if splits > 1:
        ws = torch.empty((splits, t_rows, prob.num_q_heads, dp), dtype=torch.float32, device=dev)
        wml = torch.empty((splits, t_rows, prob.num_q_heads, 2), dtype=torch.float32, device=dev)
        nsp = torch.empty((t_rows,), dtype=torch.int32, device=dev)
        if config.flat_grid:
            grid: tuple[int, ...] = (num_blocks * prob.num_kv_heads * splits,)
        else:
            grid = (num_blocks, prob.num_kv_heads, splits)
    else:
        ws = wml = nsp = result  # unused
        grid = (num_blocks, prob.num_kv_heads, 1)
    inv_floor, alpha = (0.0, 0.0) if prob.log_scaling is None else (1.0 / prob.log_scaling[0], prob.log_scaling[1])
    kc, vc = key_cache, value_cache
    if use_diag:
        # the diag bias's shifted table: near tiles load their B from it as one aligned
        # tile; a tile at most tab_off keys behind its query block reads every
        # distance it needs, a farther one reads zeros (8 x block_q * dr rows of about
        # extent + 2 * near_bn entries: 2.2 MB for Inkling's prefill tiling)
        tab_off = prob.extent + near_bn - 1
        tab_u = -(-(tab_off + block_q + near_bn) // 8) * 8
        tab = torch.empty((8 * block_q * dr, tab_u), dtype=rel_proj.dtype, device=dev)
        _bias_table_kernel[(tab.shape[0],)](
            rel_proj, tab, prob.extent, tab_off, rel_proj.stride(0), rel_proj.stride(1),
            BLOCK_Q=block_q, DR=dr, D_REL=prob.d_rel, TAB_U=tab_u, BLOCK_U=min(1024, _next_pow2(tab_u)),
            num_warps=4,
        )
    else:
        tab, tab_off, tab_u = rel_proj, 0, 8  # unused
    launch = pdl_launch(config.pdl, dev)
    main_launch = dict(launch)
    if config.max_registers is not None and dev.type == "cuda" and not is_interpreter():
        main_launch["maxnreg"] = config.max_registers
    if far_q is not None:
        # the far pass's normalised output (fp32) and its (max, sum) per row and head
        ws = torch.empty((t_rows, prob.num_q_heads, dp), dtype=torch.float32, device=dev)
        wml = torch.empty((t_rows, prob.num_q_heads, 2), dtype=torch.float32, device=dev)
    kd, vd = kc, vc  # the far tiles' K/V: TMA descriptors where the GPU and caches allow
    if config.tma and _tma_ok(kc, vc, prob, block_n, dp):
        kd, vd = (TensorDescriptor(c, list(c.shape), list(c.stride()), [1, block_n, 1, dp]) for c in (kc, vc))

    def main(grid: tuple[int, ...], bq: int, bm: int, pass_: int, diag: bool, row: bool) -> None:
        _rel_attention_kernel[grid](
            q, r, rel_proj, tab, kc, vc, kd, vd, block_table, qsl, sl, result, ws, wml, nsp,
            t_rows, prob.num_reqs, block_table.shape[1], prob.extent, prob.window or 0, tab_off,
            prob.scale, inv_floor, alpha,
            q.stride(0), q.stride(1), q.stride(2),
            r.stride(0), r.stride(1), r.stride(2),
            rel_proj.stride(0), rel_proj.stride(1),
            kc.stride(0), kc.stride(1), kc.stride(2), kc.stride(3),
            vc.stride(0), vc.stride(1), vc.stride(2), vc.stride(3),
            block_table.stride(0), block_table.stride(1),
            result.stride(0), result.stride(1), result.stride(2),
            NUM_Q_HEADS=prob.num_q_heads, GROUP=group, GP=gp, N=prob.block_size,
            BLOCK_Q=bq, BLOCK_M=bm, BLOCK_N=block_n, NEAR_BN=near_bn, DP=dp, HEAD_DIM=prob.head_dim,
            DR=dr, D_REL=prob.d_rel, BAND=band, HAS_WINDOW=prob.window is not None,
            LOG_SCALE=prob.log_scaling is not None, BIAS_DIAG=diag, BIAS_ROW=row, NUM_SPLITS=splits,
            FLAT=config.flat_grid and splits > 1,
            MIN_SPLIT_TILES=config.min_split_tiles, NEAR_COST=config.near_cost, TAB_U=tab_u,
            # every row coefficient > 0 (tau >= 1), and no product of a score underflows to 0
            POS_COEF=prob.scale > 1e-30 and alpha >= 0,
            FOLD_SCALE=_exact_inverse(prob.scale) and r.dtype != torch.float16,  # (r / scale: no fp16 overflow)
            INTERPRET=is_interpreter(), DOT_PREC=dot_prec, BAND_PREC=band_prec,
            PAGE_TILE=prob.block_size % block_n == 0, PASS=pass_, FAR_Q=far_q or 1,
            TMA=kd is not kc,
            # (the register cap is the main launch's: the far launch's 128-row tiles need theirs)
            num_warps=config.num_warps, num_stages=config.num_stages, **(launch if pass_ == 1 else main_launch),
        )

    if far_q is not None:
        # first the far tiles of far_q-row blocks, then the rest merged with them
        main((_query_blocks(t_rows, prob.num_reqs, far_q), prob.num_kv_heads, 1), far_q, max(far_q * gp, 16), 1, False, False)
    main(grid, block_q, block_m, 0 if far_q is None else 2, use_diag, use_row)
    if splits > 1:
        sp = _next_pow2(splits)
        hb = 1  # heads per program: about 8K partial values in registers
        while hb < 16 and hb < prob.num_q_heads and 2 * hb * sp * dp <= 8192:
            hb *= 2
        _combine_kernel[(t_rows, -(-prob.num_q_heads // hb))](
            ws, wml, nsp, result, t_rows, result.stride(0), result.stride(1), result.stride(2),
            NUM_Q_HEADS=prob.num_q_heads, HB=hb, SP=sp, DP=dp, HEAD_DIM=prob.head_dim,
            num_warps=4, **launch,
        )
    return result


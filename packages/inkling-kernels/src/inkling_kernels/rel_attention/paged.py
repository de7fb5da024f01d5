"""Paged relative-logit attention in PyTorch: the CPU path of the served model.

The math is that of
:func:`.reference.rel_attention_ref`, evaluated per request straight from the paged
KV cache:

* each request's queries see only keys in ``[lo, hi]``: ``hi = seq_lens[r] - 1``
  (the last query position), ``lo = max(0, first query position - window + 1)`` on
  sliding layers and 0 otherwise; only the cache blocks holding positions in that
  range are read (vLLM points blocks that left the window at a null block holding
  garbage);
* queries are processed in chunks sized so that the fp32 score tensor
  ``[chunk, Hq, keys]`` holds at most ``max_chunk_elements`` elements; when one
  query row alone would exceed that, its keys are split as well and the softmax
  is accumulated online (running max and sum, all in fp32);
* the relative bias is gathered per chunk, only for the distances the chunk can
  produce: nothing of size ``[T, total_keys]`` is ever built.

Host metadata (``query_start_loc``, ``seq_lens``) drives the loop, so nothing here
reads a device tensor back to the host except :func:`write_kv`'s pad-row filter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .reference import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_log_scaling,
    check_scale,
    check_window,
    log_scale_factor,
)

__all__ = [
    "check_metadata_values",
    "check_paged_rel_attention_args",
    "check_write_kv_args",
    "paged_rel_attention",
    "write_kv",
]


@dataclass(frozen=True)
class RelAttentionPlan:
    """Validated view of one :func:`paged_rel_attention` call."""

    num_rows: int  # T
    num_q_heads: int  # Hq
    num_kv_heads: int  # Hkv
    head_dim: int  # Dh
    extent: int  # E
    block_size: int  # N
    starts: tuple[int, ...]  # query_start_loc, R + 1 host ints
    seq_lens: tuple[int, ...]  # R host ints
    scale: float
    window: int | None
    log_scaling: tuple[int, float] | None
    max_chunk_elements: int


def _tensor(name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def _float_tensor(name: str, value: object, ndim: int, layout: str) -> torch.Tensor:
    t = _tensor(name, value)
    if t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D {layout}, got shape {tuple(t.shape)}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be bfloat16, float16 or float32, got {t.dtype}")
    return t


def _same_device(name: str, t: torch.Tensor, device: torch.device) -> None:
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but q is on {device}: move it to q's device")


def _host_ints(name: str, value: object, what: str) -> list[int]:
    t = _tensor(name, value)
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D ({what}), got shape {tuple(t.shape)}")
    if t.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")
    if t.device.type != "cpu":
        raise ValueError(
            f"{name} must be a host (cpu) tensor, got one on {t.device}: pass the CPU copy "
            "of the metadata (vLLM: query_start_loc_cpu / seq_lens_cpu)"
        )
    return [int(x) for x in t.tolist()]


def _check_caches(key_cache: object, value_cache: object) -> tuple[torch.Tensor, torch.Tensor]:
    kc = _float_tensor("key_cache", key_cache, 4, "[num_blocks, block_size, Hkv, Dh]")
    vc = _float_tensor("value_cache", value_cache, 4, "[num_blocks, block_size, Hkv, Dh]")
    if kc.shape != vc.shape:
        raise ValueError(
            f"key_cache {tuple(kc.shape)} and value_cache {tuple(vc.shape)} must have the same "
            "shape [num_blocks, block_size, Hkv, Dh]"
        )
    if kc.dtype != vc.dtype:
        raise TypeError(f"key_cache dtype {kc.dtype} differs from value_cache dtype {vc.dtype}")
    if kc.device != vc.device:
        raise ValueError(f"key_cache is on {kc.device} but value_cache is on {vc.device}")
    if kc.shape[1] < 1 or kc.shape[2] < 1:
        raise ValueError(f"caches need block_size >= 1 and Hkv >= 1, got shape {tuple(kc.shape)}")
    return kc, vc


def check_metadata_values(
    starts: list[int],
    lens: list[int],
    num_rows: int,
    block_table: torch.Tensor,
    num_blocks: int,
    block_size: int,
    window: int | None,
) -> None:
    """Check the host metadata's values (``starts``: ``query_start_loc``, ``lens``:
    ``seq_lens``, as ints) against the call's shapes: offsets from 0, non-decreasing,
    within q's ``num_rows`` rows; each request's ``seq_lens`` at least its query length
    and within its block-table row. When ``block_table`` is a CPU tensor, also the
    entries each request reads (positions ``[max(0, first query - window + 1),
    seq_lens - 1]``): in ``[0, num_blocks)``. Raises ValueError saying what to change."""
    n = block_size
    if starts[0] != 0:
        raise ValueError(f"query_start_loc[0] must be 0, got {starts[0]}")
    for i in range(len(lens)):
        qlen = starts[i + 1] - starts[i]
        if qlen < 0:
            raise ValueError(f"query_start_loc must be non-decreasing, but entry {i + 1} < entry {i}")
        if lens[i] < qlen:
            raise ValueError(
                f"request {i} has {qlen} query rows but seq_lens[{i}] = {lens[i]}: seq_lens counts "
                "the context including this step's tokens, so it must be >= the query length"
            )
        if qlen > 0 and lens[i] > block_table.shape[1] * n:
            raise ValueError(
                f"request {i} has seq_lens {lens[i]} but block_table holds only "
                f"{block_table.shape[1]} blocks of {n} = {block_table.shape[1] * n} positions"
            )
    if starts[-1] > num_rows:
        raise ValueError(f"query_start_loc[-1] = {starts[-1]} exceeds the {num_rows} rows of q")
    if block_table.device.type != "cpu" or starts[-1] == 0:
        return
    qlens = torch.tensor(starts[1:]) - torch.tensor(starts[:-1])
    ends = torch.tensor(lens)
    first = torch.zeros_like(ends) if window is None else (ends - qlens - window + 1).clamp(min=0)
    cols = torch.arange(block_table.shape[1])
    read = (qlens > 0)[:, None] & (cols >= (first // n)[:, None]) & (cols <= ((ends - 1) // n)[:, None])
    table = block_table[: len(lens)]
    bad = (read & ((table < 0) | (table >= num_blocks))).nonzero()
    if bad.numel() > 0:
        i, c = int(bad[0, 0]), int(bad[0, 1])
        raise ValueError(
            f"block_table[{i}, {c}] = {int(table[i, c])} but the caches have {num_blocks} blocks: request "
            f"{i} reads positions {c * n}..{c * n + n - 1} through it, so it must be in [0, {num_blocks})"
        )


def check_paged_rel_attention_args(
    q: object,
    r: object,
    rel_proj: object,
    key_cache: object,
    value_cache: object,
    positions: object,
    block_table: object,
    query_start_loc: object,
    seq_lens: object,
    scale: object,
    window: object,
    log_scaling: object,
    out: object,
    max_chunk_elements: object,
) -> RelAttentionPlan:
    """Validate a :func:`paged_rel_attention` call; raise TypeError/ValueError saying
    what to change. Reads shapes, dtypes and devices of the device tensors, and the
    values of the host metadata (:func:`check_metadata_values`); ``positions`` and
    ``block_table`` values are checked against it only when they are on the CPU (no
    device sync)."""
    q = _float_tensor("q", q, 3, "[T, Hq, Dh]")
    t_rows, hq, dh = q.shape
    dev = q.device
    r = _float_tensor("r", r, 3, "[T, Hq, d_rel]")
    if r.shape[:2] != q.shape[:2]:
        raise ValueError(f"r must be [T, Hq, d_rel] = [{t_rows}, {hq}, d_rel], got {tuple(r.shape)}")
    _same_device("r", r, dev)
    rel_proj = _float_tensor("rel_proj", rel_proj, 2, "[d_rel, E]")
    if rel_proj.shape[0] != r.shape[2]:
        raise ValueError(
            f"rel_proj has d_rel {rel_proj.shape[0]} rows but r has d_rel {r.shape[2]}: "
            "rel_proj must be [d_rel, E] (InklingRelativeLogits.proj)"
        )
    if rel_proj.shape[1] < 1:
        raise ValueError("rel_proj must have extent E >= 1 columns")
    _same_device("rel_proj", rel_proj, dev)
    kc, _ = _check_caches(key_cache, value_cache)
    if kc.dtype != q.dtype:
        raise TypeError(f"key_cache/value_cache dtype {kc.dtype} differs from q dtype {q.dtype}")
    _same_device("key_cache", kc, dev)
    _, n, hkv, kdh = kc.shape
    if kdh != dh:
        raise ValueError(f"cache head_dim {kdh} differs from q head_dim {dh}")
    if hq % hkv != 0:
        raise ValueError(f"q heads {hq} must be a multiple of the cache's kv heads {hkv} (GQA)")

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

    starts = _host_ints("query_start_loc", query_start_loc, "[R + 1] row offsets")
    lens = _host_ints("seq_lens", seq_lens, "[R] context lengths")
    if len(starts) != len(lens) + 1:
        raise ValueError(
            f"query_start_loc has {len(starts)} entries and seq_lens {len(lens)}: "
            "query_start_loc must have one more (R + 1 offsets for R requests)"
        )
    if lens and bt.shape[0] < len(lens):
        raise ValueError(f"block_table has {bt.shape[0]} rows but there are {len(lens)} requests")

    scale_f = check_scale(scale)
    window_i = check_window(window)
    log_s = check_log_scaling(log_scaling)
    check_metadata_values(starts, lens, t_rows, bt, kc.shape[0], n, window_i)
    if isinstance(max_chunk_elements, bool) or not isinstance(max_chunk_elements, int):
        raise TypeError(f"max_chunk_elements must be an int, got {type(max_chunk_elements).__name__}")
    if max_chunk_elements < hq:
        raise ValueError(
            f"max_chunk_elements must be >= Hq = {hq} (one query row against one key), got {max_chunk_elements}"
        )
    if out is not None:
        o = _tensor("out", out)
        if o.shape != q.shape:
            raise ValueError(f"out must have q's shape {tuple(q.shape)}, got {tuple(o.shape)}")
        if o.dtype != q.dtype:
            raise TypeError(f"out dtype {o.dtype} differs from q dtype {q.dtype}")
        _same_device("out", o, dev)

    if pos.device.type == "cpu" and starts[-1] > 0:
        # Each request's rows must be its last qlen positions (vLLM's layout); the key
        # range is derived from that on the host. Only checkable without a sync on CPU.
        qlens = torch.tensor([starts[i + 1] - starts[i] for i in range(len(lens))], dtype=torch.int64)
        first = torch.tensor(lens, dtype=torch.int64) - qlens
        row_req = torch.repeat_interleave(torch.arange(len(lens)), qlens)
        expected = first[row_req] + (torch.arange(starts[-1]) - torch.tensor(starts[:-1])[row_req])
        bad = (pos[: starts[-1]].to(torch.int64) != expected).nonzero()
        if bad.numel() > 0:
            row = int(bad[0, 0])
            req = int(row_req[row])
            raise ValueError(
                f"positions[{row}] = {int(pos[row])} but row {row} is query {row - starts[req]} of "
                f"request {req} (seq_lens {lens[req]}, {int(qlens[req])} query rows), so its "
                f"position must be {int(expected[row])}: a request's rows hold its last "
                "query-length positions, in order"
            )

    return RelAttentionPlan(
        num_rows=t_rows, num_q_heads=hq, num_kv_heads=hkv, head_dim=dh,
        extent=rel_proj.shape[1], block_size=n, starts=tuple(starts), seq_lens=tuple(lens),
        scale=scale_f, window=window_i, log_scaling=log_s, max_chunk_elements=max_chunk_elements,
    )


def _query_chunk_rows(budget: int, qlen: int, total_keys: int, window: int | None) -> int:
    """Largest row count ``c`` (1..qlen) with ``c * keys(c) <= budget`` where
    ``keys(c) <= min(total_keys, window + c - 1)`` is what ``c`` rows can see."""
    c = budget // max(total_keys, 1)
    if window is not None:
        w1 = window - 1
        # c * (w1 + c) <= budget  <=>  c <= (sqrt(w1^2 + 4 budget) - w1) / 2
        c = max(c, (math.isqrt(w1 * w1 + 4 * budget) - w1) // 2)
    return max(1, min(c, qlen))


def _gather_keys(
    cache: torch.Tensor, block_row: torch.Tensor, k0: int, k1: int, n: int
) -> torch.Tensor:
    """fp32 rows for positions ``k0..k1`` (inclusive) of one request: [k1-k0+1, Hkv, Dh].

    Reads exactly the blocks ``block_row[k0 // n .. k1 // n]``."""
    b0, b1 = k0 // n, k1 // n
    blocks = block_row[b0 : b1 + 1].to(torch.int64)
    rows = cache.index_select(0, blocks).reshape(-1, cache.shape[2], cache.shape[3])
    return rows[k0 - b0 * n : k1 - b0 * n + 1].float()


def _attend_chunk(
    plan: RelAttentionPlan,
    q: torch.Tensor,
    r: torch.Tensor,
    rel_proj: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    pos: torch.Tensor,
    block_row: torch.Tensor,
    p_first: int,
    p_last: int,
    k_lo: int,
    key_chunk: int,
) -> torch.Tensor:
    """Attention of query rows at positions ``p_first..p_last`` (``q`` [c, Hq, Dh],
    ``r`` [c, Hq, d_rel], ``pos`` [c] on the device) over keys ``k_lo..p_last``,
    in key chunks of ``key_chunk`` with an online fp32 softmax. Returns [c, Hq, Dh] fp32."""
    c, hq, dh = q.shape
    hkv, n, extent, window = plan.num_kv_heads, plan.block_size, plan.extent, plan.window
    dev = q.device
    qg = q.float().reshape(c, hkv, hq // hkv, dh)
    tau = log_scale_factor(pos, plan.log_scaling)[:, None, None]  # [c, 1, 1]
    pos64 = pos.to(torch.int64)
    run_max = torch.full((c, hq), float("-inf"), dtype=torch.float32, device=dev)
    run_sum = torch.zeros((c, hq), dtype=torch.float32, device=dev)
    acc = torch.zeros((c, hq, dh), dtype=torch.float32, device=dev)
    zero = torch.zeros((), dtype=torch.float32, device=dev)

    for k0 in range(k_lo, p_last + 1, key_chunk):
        k1 = min(k0 + key_chunk - 1, p_last)
        keys = _gather_keys(key_cache, block_row, k0, k1, n)  # [kc, Hkv, Dh]
        vals = _gather_keys(value_cache, block_row, k0, k1, n)
        kc = k1 - k0 + 1
        dist = pos64[:, None] - torch.arange(k0, k1 + 1, device=dev, dtype=torch.int64)[None, :]  # [c, kc]

        scores = torch.einsum("qhgd,khd->qhgk", qg, keys).reshape(c, hq, kc) * plan.scale
        # distances this block of (rows, keys) can produce, clipped to the extent
        d_min, d_max = max(0, p_first - k1), min(extent - 1, p_last - k0)
        if d_min <= d_max:
            rel = torch.einsum("qhc,ce->qhe", r.float(), rel_proj[:, d_min : d_max + 1].float())
            index = (dist - d_min).clamp(0, d_max - d_min)[:, None, :].expand(c, hq, kc)
            in_extent = ((dist >= 0) & (dist < extent))[:, None, :]
            scores = scores + torch.where(in_extent, rel.gather(2, index), zero)
        scores = scores * tau

        seen = dist >= 0
        if window is not None:
            seen = seen & (dist < window)
        scores = scores.masked_fill(~seen[:, None, :], float("-inf"))

        new_max = torch.maximum(run_max, scores.amax(dim=-1))
        # rows that have seen nothing yet keep a finite reference so exp() gives 0, not NaN
        ref = torch.where(torch.isfinite(new_max), new_max, zero)
        decay = torch.exp(run_max - ref)
        probs = torch.exp(scores - ref[:, :, None])
        run_sum = run_sum * decay + probs.sum(dim=-1)
        pv = torch.einsum("qhgk,khd->qhgd", probs.reshape(c, hkv, hq // hkv, kc), vals)
        acc = acc * decay[:, :, None] + pv.reshape(c, hq, dh)
        run_max = new_max

    # a row saw a key iff its running max left -inf (NaN inputs stay visible as NaN)
    has_keys = run_max != float("-inf")
    safe_sum = torch.where(has_keys, run_sum, torch.ones((), dtype=torch.float32, device=dev))
    return torch.where(has_keys[:, :, None], acc / safe_sum[:, :, None], zero)


def paged_rel_attention(
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
) -> torch.Tensor:
    """Relative-logit attention of a batch of requests over a paged KV cache.

    This step's keys and values must already be in the cache (call
    :func:`write_kv` first): the queries read them back through the block table.

    Args:
        q: [T, Hq, Dh] queries (RMS-normalised), bf16/fp16/fp32.
        r: [T, Hq, d_rel] relative states of the query rows (bf16, fp16 or fp32).
        rel_proj: [d_rel, E] the layer's ``rel_logits_proj.proj`` (bf16, fp16 or fp32).
        key_cache, value_cache: [num_blocks, N, Hkv, Dh] in q's dtype, any strides
            (e.g. ``kv[0]``/``kv[1]`` of a ``[2, num_blocks, N, Hkv, Dh]`` tensor, or
            ``kv[:, 0]``/``kv[:, 1]`` of ``[num_blocks, 2, N, Hkv, Dh]``); any N >= 1.
        positions: [T] int64 (int32 accepted) absolute positions of the rows, on q's
            device. Request ``i``'s rows must be positions
            ``seq_lens[i] - qlen_i .. seq_lens[i] - 1`` in order (checked on CPU).
        block_table: [>= R, max_blocks] int32/int64 on q's device; position ``j`` of
            request ``i`` lives at ``cache[block_table[i, j // N], j % N]``. The entries
            a request reads must be in ``[0, num_blocks)`` (checked on CPU).
        query_start_loc: [R + 1] host (cpu) int tensor; request ``i`` owns rows
            ``query_start_loc[i] : query_start_loc[i + 1]``. Rows from
            ``query_start_loc[R]`` on are padding and get zeros.
        seq_lens: [R] host (cpu) int tensor, context length of each request
            including this step's tokens.
        scale: multiplier of ``q . k`` (1/head_dim for Inkling).
        window: sliding window (key ``j`` seen by query ``p`` iff ``p - j < window``)
            or None on global layers. On sliding layers pass ``E == window``.
        log_scaling: ``(n_floor, alpha)`` on global layers with log scaling, else None.
        out: optional preallocated [T, Hq, Dh] output in q's dtype (every row is
            written, pad rows with zeros).
        max_chunk_elements: bound on the fp32 score tensor ``[chunk, Hq, keys]``
            (must be >= Hq).

    Returns:
        [T, Hq, Dh] in q's dtype (``out`` when given).
    """
    plan = check_paged_rel_attention_args(
        q, r, rel_proj, key_cache, value_cache, positions, block_table, query_start_loc,
        seq_lens, scale, window, log_scaling, out, max_chunk_elements,
    )
    result = torch.empty_like(q) if out is None else out
    starts, lens, window_i = plan.starts, plan.seq_lens, plan.window
    budget = plan.max_chunk_elements // plan.num_q_heads  # query rows x keys per chunk

    for req in range(len(lens)):
        s, e = starts[req], starts[req + 1]
        qlen = e - s
        if qlen == 0:
            continue
        p0 = lens[req] - qlen  # position of the request's first query row
        lo = 0 if window_i is None else max(0, p0 - window_i + 1)
        rows_per_chunk = _query_chunk_rows(budget, qlen, lens[req] - lo, window_i)
        block_row = block_table[req]
        for a in range(0, qlen, rows_per_chunk):
            b = min(a + rows_per_chunk, qlen)
            p_first, p_last = p0 + a, p0 + b - 1
            k_lo = lo if window_i is None else max(lo, p_first - window_i + 1)
            key_chunk = max(1, budget // (b - a))
            chunk_out = _attend_chunk(
                plan, q[s + a : s + b], r[s + a : s + b], rel_proj, key_cache, value_cache,
                positions[s + a : s + b], block_row, p_first, p_last, k_lo, key_chunk,
            )
            result[s + a : s + b].copy_(chunk_out)
    result[starts[-1] :].zero_()
    return result


def check_write_kv_args(
    key: object, value: object, key_cache: object, value_cache: object, slot_mapping: object
) -> None:
    """Validate a :func:`write_kv` call; raise TypeError/ValueError saying what to change.

    Slot values are checked (against the cache size) only on CPU, where that costs
    no device sync."""
    k = _float_tensor("key", key, 3, "[T, Hkv, Dh]")
    v = _float_tensor("value", value, 3, "[T, Hkv, Dh]")
    if k.shape != v.shape:
        raise ValueError(f"key {tuple(k.shape)} and value {tuple(v.shape)} must have the same shape [T, Hkv, Dh]")
    kc, _ = _check_caches(key_cache, value_cache)
    if k.shape[1:] != kc.shape[2:]:
        raise ValueError(
            f"key rows are [Hkv, Dh] = {list(k.shape[1:])} but the cache holds {list(kc.shape[2:])}"
        )
    if k.dtype != kc.dtype or v.dtype != kc.dtype:
        raise TypeError(f"key/value dtype {k.dtype}/{v.dtype} must equal the cache dtype {kc.dtype}")
    if k.device != kc.device or v.device != kc.device:
        raise ValueError(f"key/value are on {k.device}/{v.device} but the caches are on {kc.device}")
    sm = _tensor("slot_mapping", slot_mapping)
    if sm.dim() != 1 or sm.shape[0] != k.shape[0]:
        raise ValueError(f"slot_mapping must be [T] = [{k.shape[0]}] (one per key row), got {tuple(sm.shape)}")
    if sm.dtype not in INDEX_DTYPES:
        raise TypeError(f"slot_mapping must be int64 (int32 accepted), got {sm.dtype}")
    if sm.device != kc.device:
        raise ValueError(f"slot_mapping is on {sm.device} but the caches are on {kc.device}")
    if sm.device.type == "cpu" and sm.numel() > 0:
        capacity = kc.shape[0] * kc.shape[1]
        top = int(sm.max())
        if top >= capacity:
            raise ValueError(
                f"slot_mapping holds slot {top} but the cache has only {kc.shape[0]} blocks x "
                f"{kc.shape[1]} = {capacity} slots (slot = block * block_size + row; -1 = pad)"
            )


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store each row's key and value in its cache slot, in place.

    Args:
        key, value: [T, Hkv, Dh] in the cache dtype.
        key_cache, value_cache: [num_blocks, N, Hkv, Dh] (any strides); mutated.
        slot_mapping: [T] int64 (int32 accepted), flat slot ``block * N + row``; a
            negative slot (-1) marks a pad row, which writes nothing. Slots must be
            distinct (as vLLM's are).

    Only the named slots change; every other element of the caches keeps its bits.
    On CUDA the pad-row filter costs one device sync.
    """
    check_write_kv_args(key, value, key_cache, value_cache, slot_mapping)
    rows = (slot_mapping >= 0).nonzero().squeeze(1)
    if rows.numel() == 0:
        return
    slots = slot_mapping.index_select(0, rows).to(torch.int64)
    n = key_cache.shape[1]
    block, offset = slots // n, slots % n
    key_cache.index_put_((block, offset), key.index_select(0, rows))
    value_cache.index_put_((block, offset), value.index_select(0, rows))

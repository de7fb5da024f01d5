"""Vectorised fp32 PyTorch references: the test oracle and the CPU path.

Semantics (docs/design.md §3.1). For one stream of a packed paged cache
``cache[num_blocks, H, N, D]`` (stream channels ``[stream_offset, stream_offset +
stream_width)`` of every head), each row ``t`` of ``x`` at absolute position
``p = positions[t]``:

1. stores ``x[t]`` into its slot ``slot_mapping[t]`` (skipped when the slot is
   negative or outside the cache);
2. for each tap ``i`` in ``[0, W)`` with source position ``src = p - (W-1) + i >= 0``
   reads the tap from ``x[t - (p - src)]`` when that row belongs to the current
   forward (``>= query_start[t]``), otherwise from the cache through the request's
   block table (a *pre-forward* tap); accumulates ``weight[c, i] * tap`` in fp32;
3. ``out[t] = x[t] + act(acc)`` (``act(acc)`` when ``residual=False``), cast to
   ``x.dtype``.

Pre-forward taps see the cache *after* every write of the call. That is what makes
the call correct under the same-step prefix hit (docs/design.md §3.2): a pre-forward
slot that another request writes in this very call reads that request's input.
"""

from __future__ import annotations

import torch

from ._validation import (
    TAP_MAP_MAX_SLOTS,
    check_fused_sconv_args,
    check_seq_metadata_args,
    check_tap_map_args,
)

__all__ = ["causal_conv_ref", "fused_sconv_ref", "sconv_seq_metadata_ref", "sconv_tap_map_ref"]


def _activate(acc: torch.Tensor, activation: str | None) -> torch.Tensor:
    if activation == "silu":
        return torch.nn.functional.silu(acc)
    return acc


def _tap_sources(
    pos: torch.Tensor, rows: torch.Tensor, qs: torch.Tensor, dist: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """For the tap at distance ``dist`` of every row: its source position, its row
    in x, whether that row is in this forward, whether it is a pre-forward tap."""
    src = pos - dist
    row = rows - dist
    has_tap = src >= 0
    in_forward = has_tap & (row >= qs) & (row >= 0)
    return src, row, in_forward, has_tap & ~in_forward


def _pre_forward_slots(
    src: torch.Tensor, seq: torch.Tensor, block_table: torch.Tensor, n: int, num_slots: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cache slots of pre-forward taps (source positions ``src`` of requests ``seq``)
    through the block table, and whether each is usable (a request row and logical
    block inside the table, a slot in ``[0, num_slots)``)."""
    num_reqs, max_blocks = block_table.shape
    blk = src // n
    ok = (seq >= 0) & (seq < num_reqs) & (blk < max_blocks)
    entry = block_table[seq.clamp(0, max(num_reqs - 1, 0)), blk.clamp(0, max(max_blocks - 1, 0))]
    slot = entry.long() * n + src % n
    return slot, ok & (slot >= 0) & (slot < num_slots)


def causal_conv_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    activation: str | None = None,
    residual: bool = True,
) -> torch.Tensor:
    """Full-sequence depthwise causal conv of one sequence, fp32 math.

    x: [L, C] (any float dtype); weight: (C, W) or (C, 1, W), ``weight[:, W-1]``
    multiplies the current token. Returns ``x + act(conv(x))`` (or ``act(conv(x))``)
    in ``x.dtype``, [L, C]; positions before the sequence start read zero.
    """
    if x.dim() != 2:
        raise ValueError(f"x must be [L, C], got shape {tuple(x.shape)}")
    w = weight.reshape(weight.shape[0], weight.shape[-1]).float()
    if w.shape[0] != x.shape[1]:
        raise ValueError(f"weight has {w.shape[0]} channels but x has {x.shape[1]}")
    length, kernel = x.shape[0], w.shape[1]
    xf = x.float()
    padded = torch.cat([xf.new_zeros(kernel - 1, xf.shape[1]), xf], dim=0)
    acc = xf.new_zeros(xf.shape)
    for i in range(kernel):
        acc += w[:, i] * padded[i : i + length]
    conv = _activate(acc, activation)
    return (xf + conv if residual else conv).to(x.dtype)


def fused_sconv_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    cache: torch.Tensor,
    positions: torch.Tensor,
    block_table: torch.Tensor,
    seq_idx: torch.Tensor,
    slot_mapping: torch.Tensor,
    query_start: torch.Tensor,
    stream_offset: int,
    stream_width: int,
    block_size: int,
    *,
    activation: str | None = None,
    residual: bool = True,
) -> torch.Tensor:
    """Reference for :func:`inkling_kernels.fused_sconv` (same signature).

    Mutates ``cache`` (the written slots' stream range only) and returns a new
    ``out`` [T, H*stream_width] in ``x.dtype``. Out-of-range slots are skipped on
    write and read as zero, exactly as the Triton kernel masks them.
    """
    prob = check_fused_sconv_args(
        x, weight, cache, positions, block_table, seq_idx, slot_mapping, query_start,
        stream_offset, stream_width, block_size, activation, residual,
    )
    out = torch.empty_like(x)
    num_tokens, channels = prob.num_tokens, prob.channels
    if num_tokens == 0:
        return out
    n = block_size
    lo, hi = stream_offset, stream_offset + stream_width
    heads = prob.num_heads
    w = prob.weight2d.float()

    # 1. insert every row of this call first (post-write semantics for all taps).
    slots = slot_mapping.long()
    written = (slots >= 0) & (slots < prob.num_slots)
    ws = slots[written]
    if ws.numel():
        cache[ws // n, :, ws % n, lo:hi] = x[written].view(-1, heads, stream_width)

    # 2. gather the W taps of every row, in fp32.
    pos = positions.long()
    qs = query_start.long()
    seq = seq_idx.long()
    rows = torch.arange(num_tokens, device=x.device)
    xf = x.float()
    acc = xf.new_zeros(num_tokens, channels)
    for i in range(prob.kernel_size):
        src, row, in_forward, pre_forward = _tap_sources(pos, rows, qs, prob.kernel_size - 1 - i)
        tap = xf.new_zeros(num_tokens, channels)
        tap[in_forward] = xf[row[in_forward]]
        if bool(pre_forward.any()):
            slot, ok = _pre_forward_slots(src[pre_forward], seq[pre_forward], block_table, n, prob.num_slots)
            slot = torch.where(ok, slot, torch.zeros_like(slot))
            vals = cache[slot // n, :, slot % n, lo:hi].reshape(-1, channels).float()
            vals[~ok] = 0.0
            tap[pre_forward] = vals
        acc += w[:, i] * tap

    # 3. residual and cast.
    conv = _activate(acc, activation)
    out.copy_(xf + conv if residual else conv)
    return out


def sconv_seq_metadata_ref(
    query_start_loc: torch.Tensor,
    num_reqs: int,
    num_actual_tokens: int,
    seq_idx_out: torch.Tensor,
    query_start_out: torch.Tensor,
    num_padded_tokens: int,
) -> None:
    """Reference for :func:`inkling_kernels.sconv_seq_metadata`.

    For rows ``t < num_actual_tokens``: ``seq_idx_out[t]`` = the last request ``r <
    num_reqs`` with ``query_start_loc[r] <= t`` and ``query_start_out[t] =
    query_start_loc[r]``. Rows ``num_actual_tokens <= t < num_padded_tokens`` get 0.
    Rows beyond ``num_padded_tokens`` are left untouched.
    """
    check_seq_metadata_args(
        query_start_loc, num_reqs, num_actual_tokens, seq_idx_out, query_start_out,
        num_padded_tokens,
    )
    if num_padded_tokens == 0:
        return
    seq = torch.zeros(num_padded_tokens, dtype=torch.int64, device=query_start_loc.device)
    start = torch.zeros_like(seq)
    if num_actual_tokens > 0:
        starts = query_start_loc[:num_reqs].long()
        t = torch.arange(num_actual_tokens, device=seq.device)
        r = torch.searchsorted(starts, t, right=True) - 1
        r = r.clamp(0, num_reqs - 1)
        seq[:num_actual_tokens] = r
        start[:num_actual_tokens] = starts[r]
    seq_idx_out[:num_padded_tokens] = seq.to(torch.int32)
    query_start_out[:num_padded_tokens] = start.to(torch.int32)


def sconv_tap_map_ref(
    positions: torch.Tensor,
    block_table: torch.Tensor,
    seq_idx: torch.Tensor,
    slot_mapping: torch.Tensor,
    query_start: torch.Tensor,
    block_size: int,
    kernel_size: int,
    tap_map_out: torch.Tensor,
) -> None:
    """Reference for :func:`inkling_kernels.sconv_tap_map` (fills ``tap_map_out[:T]``).

    Entry ``[t, k]`` says where the tap at distance ``k + 1`` of row ``t`` comes from,
    by the rules of :func:`fused_sconv_ref`: ``-1`` no tap (before the sequence start,
    or an unusable block-table entry); ``-(r + 2)`` row ``r`` of x (an in-forward tap);
    ``s + ((u + 1) << 32)`` a pre-forward tap in cache slot ``s`` (``0 <= s < 2**31``),
    where ``u`` is the last row of this call whose slot is ``s`` (the same-step
    writer; ``u = -1`` when none writes it).
    """
    num_tokens = check_tap_map_args(
        positions, block_table, seq_idx, slot_mapping, query_start, block_size,
        kernel_size, tap_map_out,
    )
    if num_tokens == 0:
        return
    n = block_size
    pos = positions.long()
    qs = query_start.long()
    seq = seq_idx.long()
    slots = slot_mapping.long()
    rows = torch.arange(num_tokens, device=pos.device)
    codes = torch.full((num_tokens, kernel_size - 1), -1, dtype=torch.int64, device=pos.device)
    for k in range(kernel_size - 1):
        src, row, in_forward, pre_forward = _tap_sources(pos, rows, qs, k + 1)
        codes[in_forward, k] = -(row[in_forward] + 2)
        if not bool(pre_forward.any()):
            continue
        slot, ok = _pre_forward_slots(src[pre_forward], seq[pre_forward], block_table, n, TAP_MAP_MAX_SLOTS)
        # the same-step writer: the last row whose slot is this one
        match = slot[:, None] == slots[None, :]
        writer = torch.where(match, rows[None, :], torch.full_like(match, -1, dtype=torch.int64)).amax(dim=1)
        code = torch.where(ok, slot + ((writer + 1) << 32), torch.full_like(slot, -1))
        codes[pre_forward, k] = code
    tap_map_out[:num_tokens] = codes

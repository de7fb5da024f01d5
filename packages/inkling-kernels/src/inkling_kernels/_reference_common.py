"""Tap resolution and the same-step hazard rule, in PyTorch: used by every reference
(``sconv``, ``tap_map``, ``sconv_add_rmsnorm``). The Triton twins are in
:mod:`inkling_kernels._triton_common`.

Tap resolution. The tap at distance ``dist >= 1`` of row ``t`` (position ``p``) has
source position ``src = p - dist``; none when ``src < 0``. It is *in-forward* when its
row ``t - dist`` belongs to this call (``>= query_start[t]``): read from ``x``.
Otherwise it is *pre-forward*: read from cache slot ``block_table[seq_idx[t], src // N]
* N + src % N``, usable when the request row and the logical block lie inside the table
and the slot inside the cache.

Hazard rule (docs/design.md §3.2). A pre-forward slot that a row of this very call also
writes (a same-step prefix hit) reads that row's input; when several rows write it,
the last one (the largest row). This equals "insert the whole batch, then convolve",
at any alignment and in any program order.
"""

from __future__ import annotations

import torch

__all__ = ["last_writers", "pre_forward_slots", "tap_sources"]


def tap_sources(
    pos: torch.Tensor, rows: torch.Tensor, qs: torch.Tensor, dist: int | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(src, row, in_forward, pre_forward)`` of the tap at distance ``dist`` (an int,
    or a tensor broadcasting against ``pos``) of every row."""
    src = pos - dist
    row = rows - dist
    has_tap = src >= 0
    in_forward = has_tap & (row >= qs) & (row >= 0)
    return src, row, in_forward, has_tap & ~in_forward


def pre_forward_slots(
    src: torch.Tensor, seq: torch.Tensor, block_table: torch.Tensor, n: int, num_slots: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cache slots of source positions ``src`` (>= 0) of requests ``seq`` through the
    block table, and whether each is usable."""
    num_reqs, max_blocks = block_table.shape
    blk = src.clamp(min=0) // n
    ok = (seq >= 0) & (seq < num_reqs) & (blk < max_blocks)
    entry = block_table[seq.clamp(0, max(num_reqs - 1, 0)), blk.clamp(0, max(max_blocks - 1, 0))]
    slot = entry.long() * n + src.clamp(min=0) % n
    return slot, ok & (slot >= 0) & (slot < num_slots)


def last_writers(slots: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
    """For each (usable) slot in ``slots`` (any shape), the last row ``u`` with
    ``slot_mapping[u] == slot``, or -1: the hazard rule's writer."""
    flat = slots.reshape(-1)
    rows = torch.arange(slot_mapping.shape[0], device=slots.device)
    match = flat[:, None] == slot_mapping.long()[None, :]
    writer = torch.where(match, rows[None, :], torch.full_like(rows, -1)[None, :]).amax(dim=1) if rows.numel() else torch.full_like(flat, -1)
    return writer.reshape(slots.shape)

"""Exact PyTorch reference of ``sconv_tap_map`` (the CPU path and the test oracle)."""

from __future__ import annotations

import torch

from .._reference_common import last_writers, pre_forward_slots, tap_sources
from ..batch import SconvBatch
from ..checks import TAP_MAP_MAX_SLOTS, check_tap_map_call

__all__ = ["sconv_tap_map_ref"]


def reference_sconv_tap_map(batch: SconvBatch, kernel_size: int, tap_map_out: torch.Tensor) -> None:
    """Fill ``tap_map_out[:T]`` on checked arguments.

    Entry ``[t, k]`` says where the tap at distance ``k + 1`` of row ``t`` comes from,
    by the rules of :mod:`inkling_kernels._reference_common`: ``-1`` no tap (before the
    sequence start, or an unusable block-table entry); ``-(r + 2)`` row ``r`` of x (an
    in-forward tap); ``s + ((u + 1) << 32)`` a pre-forward tap in cache slot ``s``
    (``0 <= s < 2**31``), where ``u`` is the last row of this call whose slot is ``s``
    (the same-step writer; ``u = -1`` when none writes it).
    """
    num_tokens = batch.num_tokens
    if num_tokens == 0:
        return
    pos = batch.positions
    qs = batch.query_start.long()
    seq = batch.seq_idx.long()
    rows = torch.arange(num_tokens, device=pos.device)
    codes = torch.full((num_tokens, kernel_size - 1), -1, dtype=torch.int64, device=pos.device)
    for k in range(kernel_size - 1):
        src, row, in_forward, pre_forward = tap_sources(pos, rows, qs, k + 1)
        codes[in_forward, k] = -(row[in_forward] + 2)
        if not bool(pre_forward.any()):
            continue
        slot, ok = pre_forward_slots(src[pre_forward], seq[pre_forward], batch.block_table, batch.block_size, TAP_MAP_MAX_SLOTS)
        writer = last_writers(slot, batch.slot_mapping)
        codes[pre_forward, k] = torch.where(ok, slot + ((writer + 1) << 32), torch.full_like(slot, -1))
    tap_map_out[:num_tokens] = codes


def sconv_tap_map_ref(batch: SconvBatch, tap_map_out: torch.Tensor) -> SconvBatch:
    """Reference for :func:`inkling_kernels.sconv_tap_map` (checked; same signature)."""
    kernel_size = check_tap_map_call(batch, tap_map_out)
    reference_sconv_tap_map(batch, kernel_size, tap_map_out)
    return batch._replace_unchecked(tap_map=tap_map_out[: batch.num_tokens])  # checked above

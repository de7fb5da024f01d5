"""PyTorch reference of ``sconv_seq_metadata`` (the CPU path and the test oracle)."""

from __future__ import annotations

import torch

from ..checks import check_seq_metadata_args

__all__ = ["sconv_seq_metadata_ref"]


def reference_sconv_seq_metadata(
    query_start_loc: torch.Tensor,
    num_reqs: int,
    num_actual_tokens: int,
    seq_idx_out: torch.Tensor,
    query_start_out: torch.Tensor,
    num_padded_tokens: int,
) -> None:
    """On checked arguments: for rows ``t < num_actual_tokens``, ``seq_idx_out[t]`` =
    the last request ``r < num_reqs`` with ``query_start_loc[r] <= t`` and
    ``query_start_out[t] = query_start_loc[r]``. Rows ``num_actual_tokens <= t <
    num_padded_tokens`` get 0; rows beyond ``num_padded_tokens`` are left untouched.
    """
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


def sconv_seq_metadata_ref(
    query_start_loc: torch.Tensor,
    num_reqs: int,
    num_actual_tokens: int,
    seq_idx_out: torch.Tensor,
    query_start_out: torch.Tensor,
    num_padded_tokens: int,
) -> None:
    """Reference for :func:`inkling_kernels.sconv_seq_metadata` (checked; same signature)."""
    check_seq_metadata_args(
        query_start_loc, num_reqs, num_actual_tokens, seq_idx_out, query_start_out, num_padded_tokens
    )
    reference_sconv_seq_metadata(
        query_start_loc, num_reqs, num_actual_tokens, seq_idx_out, query_start_out, num_padded_tokens
    )

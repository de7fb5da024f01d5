"""``sconv_seq_metadata``: per-token ``seq_idx`` / ``query_start`` from the step's
``query_start_loc``, into persistent buffers, in one launch.

- :func:`sconv_seq_metadata` — the op (``torch.ops.inkling.sconv_seq_metadata``);
- :mod:`.kernel` — the Triton kernel; :mod:`.reference` — the PyTorch reference.
"""

from __future__ import annotations

from typing import Any

import torch

from .._dispatch import run_op, uses_triton
from ..checks import check_seq_metadata_args
from .reference import reference_sconv_seq_metadata, sconv_seq_metadata_ref

__all__ = ["sconv_seq_metadata", "sconv_seq_metadata_ref"]


@torch.library.custom_op(
    "inkling::sconv_seq_metadata",
    mutates_args=("seq_idx_out", "query_start_out"),
    schema="(Tensor query_start_loc, SymInt num_reqs, SymInt num_actual_tokens, Tensor(a!) seq_idx_out, "
    "Tensor(b!) query_start_out, SymInt num_padded_tokens) -> ()",
)
def _sconv_seq_metadata_op(*args: Any) -> None:  # the arguments of sconv_seq_metadata
    if not uses_triton(args[0].device):
        reference_sconv_seq_metadata(*args)
        return
    from .kernel import launch_sconv_seq_metadata

    launch_sconv_seq_metadata(*args)


@_sconv_seq_metadata_op.register_fake
def _sconv_seq_metadata_fake(*args: Any) -> None:
    check_seq_metadata_args(*args)


def sconv_seq_metadata(
    query_start_loc: torch.Tensor,
    num_reqs: int,
    num_actual_tokens: int,
    seq_idx_out: torch.Tensor,
    query_start_out: torch.Tensor,
    num_padded_tokens: int,
) -> None:
    """Fill persistent per-token ``seq_idx`` / ``query_start`` buffers (one launch).

    Args:
        query_start_loc: [>= num_reqs+1] int32/int64, cumulative query starts.
        num_reqs, num_actual_tokens: the batch (host ints).
        seq_idx_out, query_start_out: int32 buffers with >= num_padded_tokens rows;
            rows ``[0, num_padded_tokens)`` are written, pad rows get 0.
        num_padded_tokens: rows to fill (>= num_actual_tokens).
    """
    check_seq_metadata_args(
        query_start_loc, num_reqs, num_actual_tokens, seq_idx_out, query_start_out, num_padded_tokens
    )
    run_op(
        _sconv_seq_metadata_op, query_start_loc, num_reqs, num_actual_tokens, seq_idx_out, query_start_out,
        num_padded_tokens,
    )

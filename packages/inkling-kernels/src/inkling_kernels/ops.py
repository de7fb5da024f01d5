"""Public ops: torch custom ops under the ``inkling`` namespace, dispatched by device.

CPU tensors run the PyTorch reference (no Triton needed); CUDA tensors run the
Triton kernels. Both are registered as ``torch.ops.inkling.*`` with fake (meta)
implementations, so they can sit inside torch.compile'd, CUDA-graph-captured models.
"""

# No ``from __future__ import annotations``: torch.library infers the op schema from
# the real annotation objects.
from typing import Optional

import torch

from ._validation import check_fused_sconv_args, check_seq_metadata_args
from .reference import fused_sconv_ref, sconv_seq_metadata_ref

__all__ = ["fused_sconv", "sconv_seq_metadata"]


@torch.library.custom_op("inkling::fused_sconv", mutates_args=("cache",))
def _fused_sconv_op(
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
    activation: Optional[str] = None,
    residual: bool = True,
) -> torch.Tensor:
    if x.device.type == "cpu":
        return fused_sconv_ref(
            x, weight, cache, positions, block_table, seq_idx, slot_mapping, query_start,
            stream_offset, stream_width, block_size, activation=activation, residual=residual,
        )
    from .sconv import fused_sconv_triton  # Triton is only needed off the CPU path

    return fused_sconv_triton(
        x, weight, cache, positions, block_table, seq_idx, slot_mapping, query_start,
        stream_offset, stream_width, block_size, activation=activation, residual=residual,
    )


@_fused_sconv_op.register_fake
def _fused_sconv_fake(
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
    activation: Optional[str] = None,
    residual: bool = True,
) -> torch.Tensor:
    check_fused_sconv_args(
        x, weight, cache, positions, block_table, seq_idx, slot_mapping, query_start,
        stream_offset, stream_width, block_size, activation, residual,
    )
    return torch.empty_like(x)


@torch.library.custom_op(
    "inkling::sconv_seq_metadata", mutates_args=("seq_idx_out", "query_start_out")
)
def _sconv_seq_metadata_op(
    query_start_loc: torch.Tensor,
    num_reqs: int,
    num_actual_tokens: int,
    seq_idx_out: torch.Tensor,
    query_start_out: torch.Tensor,
    num_padded_tokens: int,
) -> None:
    if query_start_loc.device.type == "cpu":
        sconv_seq_metadata_ref(
            query_start_loc, num_reqs, num_actual_tokens, seq_idx_out, query_start_out,
            num_padded_tokens,
        )
        return
    from .seq_metadata import sconv_seq_metadata_triton

    sconv_seq_metadata_triton(
        query_start_loc, num_reqs, num_actual_tokens, seq_idx_out, query_start_out,
        num_padded_tokens,
    )


@_sconv_seq_metadata_op.register_fake
def _sconv_seq_metadata_fake(
    query_start_loc: torch.Tensor,
    num_reqs: int,
    num_actual_tokens: int,
    seq_idx_out: torch.Tensor,
    query_start_out: torch.Tensor,
    num_padded_tokens: int,
) -> None:
    check_seq_metadata_args(
        query_start_loc, num_reqs, num_actual_tokens, seq_idx_out, query_start_out,
        num_padded_tokens,
    )


def fused_sconv(
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
    activation: Optional[str] = None,
    residual: bool = True,
) -> torch.Tensor:
    """Fused paged short conv for one stream of a packed cache (one launch per call).

    Args:
        x: [T, H*stream_width] bf16/fp16/fp32, contiguous; row t is one token.
        weight: (H*stream_width, W) or (H*stream_width, 1, W), fp32 or x.dtype;
            ``weight[:, W-1]`` multiplies the current token. Any W >= 2.
        cache: [num_blocks, H, N, D], x.dtype, D stride 1 (page-strided views are
            fine). Mutated: each valid slot's ``[stream_offset, +stream_width)``
            range receives its row of x.
        positions: [T] int64 (or int32), absolute position of each row.
        block_table: [R, max_blocks] int32 (or int64), physical blocks per request.
        seq_idx: [T] int32, request row of each token in ``block_table``.
        slot_mapping: [T] int64, flat slot (``block * N + offset``) of each token;
            negative (pad row) or outside the cache: no write.
        query_start: [T] int32, first row of the token's request in x.
        stream_offset, stream_width: the stream's range inside D.
        block_size: N, must equal ``cache.shape[2]`` (the runtime block size).
        activation: None or "silu", applied to the conv sum (before the residual).
        residual: add x: ``out = x + act(conv)``; else ``out = act(conv)``.

    Returns:
        out: [T, H*stream_width] in x.dtype (a new tensor).

    Preconditions: a request's rows are contiguous with consecutive positions; taps
    inside the window resolve through valid block-table entries. Same-step prefix
    hits are handled in any batch order (the pre-forward tap then reads the writer's
    row of x); on CUDA this relies on such hits being whole blocks (the reading
    request's first position in the call is a multiple of N), as engines produce
    them. The CPU path has no such precondition.
    """
    # Checked here too so that bad types raise TypeError/ValueError, not a
    # dispatcher RuntimeError.
    check_fused_sconv_args(
        x, weight, cache, positions, block_table, seq_idx, slot_mapping, query_start,
        stream_offset, stream_width, block_size, activation, residual,
    )
    return torch.ops.inkling.fused_sconv(
        x, weight, cache, positions, block_table, seq_idx, slot_mapping, query_start,
        stream_offset, stream_width, block_size, activation, residual,
    )


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
        query_start_loc, num_reqs, num_actual_tokens, seq_idx_out, query_start_out,
        num_padded_tokens,
    )
    torch.ops.inkling.sconv_seq_metadata(
        query_start_loc, num_reqs, num_actual_tokens, seq_idx_out, query_start_out,
        num_padded_tokens,
    )

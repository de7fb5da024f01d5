"""Public ops: torch custom ops under the ``inkling`` namespace, dispatched by device.

CPU tensors run the PyTorch reference (no Triton needed); CUDA tensors run the
Triton kernels. All are registered as ``torch.ops.inkling.*`` with fake (meta)
implementations, so they can sit inside torch.compile'd, CUDA-graph-captured models.

Testing aid: with ``INKLING_KERNELS_CPU_BACKEND=triton`` (and ``TRITON_INTERPRET=1``
set before Triton is imported) CPU tensors run the Triton kernels under Triton's
interpreter instead, so a whole engine on CPU exercises the GPU code path (slowly;
large tiles keep the interpreter's per-program cost down).
"""

# No ``from __future__ import annotations``: torch.library infers the op schema from
# the real annotation objects.
import os
from typing import Optional

import torch

from ._validation import (
    check_fused_sconv_args,
    check_seq_metadata_args,
    check_tap_map_args,
    check_tap_map_for_call,
)
from .reference import fused_sconv_ref, sconv_seq_metadata_ref, sconv_tap_map_ref

__all__ = ["fused_sconv", "sconv_seq_metadata", "sconv_tap_map", "uses_triton"]

CPU_BACKEND_ENV = "INKLING_KERNELS_CPU_BACKEND"


def uses_triton(device: torch.device) -> bool:
    """Whether the ops run the Triton kernels for tensors on ``device``: always off
    the CPU; on the CPU only with ``INKLING_KERNELS_CPU_BACKEND=triton`` (read at
    each call). Builders use it to decide whether a tap map is worth building."""
    if torch.device(device).type != "cpu":
        return True
    value = os.environ.get(CPU_BACKEND_ENV, "reference")
    if value not in ("reference", "triton"):
        raise ValueError(f"{CPU_BACKEND_ENV} must be 'reference' or 'triton', got {value!r}")
    return value == "triton"


def _interpreter_config(x: torch.Tensor) -> object:
    """Large tiles for CPU tensors under the interpreter (its cost is per program)."""
    if x.device.type != "cpu":
        return None
    from .sconv import SconvConfig

    return SconvConfig(block_t=32, block_c=128, num_warps=4)


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
    tap_map: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    if not uses_triton(x.device):
        # The reference resolves every tap itself; the map only saves work on the
        # device (it was validated by the caller).
        return fused_sconv_ref(
            x, weight, cache, positions, block_table, seq_idx, slot_mapping, query_start,
            stream_offset, stream_width, block_size, activation=activation, residual=residual,
        )
    from .sconv import fused_sconv_triton  # Triton is only needed off the CPU path

    return fused_sconv_triton(
        x, weight, cache, positions, block_table, seq_idx, slot_mapping, query_start,
        stream_offset, stream_width, block_size, activation=activation, residual=residual,
        tap_map=tap_map, config=_interpreter_config(x),
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
    tap_map: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    prob = check_fused_sconv_args(
        x, weight, cache, positions, block_table, seq_idx, slot_mapping, query_start,
        stream_offset, stream_width, block_size, activation, residual,
    )
    if tap_map is not None:
        check_tap_map_for_call(tap_map, prob, x.device)
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
    if not uses_triton(query_start_loc.device):
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
    tap_map: Optional[torch.Tensor] = None,
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
        tap_map: optional [>= T, W-1] int64, built by :func:`sconv_tap_map` from this
            call's metadata (once per step and KV-cache group, shared by every
            stream and layer of the group). With it the CUDA kernel reads each tap's
            source from the map: no block-table lookups, no same-step hazard search,
            and exact same-step prefix hits with no alignment precondition. A map
            built from other metadata gives wrong results. The CPU path ignores it.

    Returns:
        out: [T, H*stream_width] in x.dtype (a new tensor).

    Preconditions: a request's rows are contiguous with consecutive positions; taps
    inside the window resolve through valid block-table entries. Same-step prefix
    hits are handled in any batch order (the pre-forward tap then reads the writer's
    row of x); on CUDA this relies on such hits being whole blocks (the reading
    request's first position in the call is a multiple of N), as engines produce
    them, unless a ``tap_map`` is given. The CPU path has no such precondition.
    """
    # Checked here too so that bad types raise TypeError/ValueError, not a
    # dispatcher RuntimeError.
    prob = check_fused_sconv_args(
        x, weight, cache, positions, block_table, seq_idx, slot_mapping, query_start,
        stream_offset, stream_width, block_size, activation, residual,
    )
    if tap_map is not None:
        check_tap_map_for_call(tap_map, prob, x.device)
    return torch.ops.inkling.fused_sconv(
        x, weight, cache, positions, block_table, seq_idx, slot_mapping, query_start,
        stream_offset, stream_width, block_size, activation, residual, tap_map,
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


@torch.library.custom_op("inkling::sconv_tap_map", mutates_args=("tap_map_out",))
def _sconv_tap_map_op(
    positions: torch.Tensor,
    block_table: torch.Tensor,
    seq_idx: torch.Tensor,
    slot_mapping: torch.Tensor,
    query_start: torch.Tensor,
    block_size: int,
    kernel_size: int,
    tap_map_out: torch.Tensor,
) -> None:
    args = (positions, block_table, seq_idx, slot_mapping, query_start, block_size, kernel_size, tap_map_out)
    if not uses_triton(positions.device):
        sconv_tap_map_ref(*args)
        return
    from .tap_map import sconv_tap_map_triton

    sconv_tap_map_triton(*args)


@_sconv_tap_map_op.register_fake
def _sconv_tap_map_fake(
    positions: torch.Tensor,
    block_table: torch.Tensor,
    seq_idx: torch.Tensor,
    slot_mapping: torch.Tensor,
    query_start: torch.Tensor,
    block_size: int,
    kernel_size: int,
    tap_map_out: torch.Tensor,
) -> None:
    check_tap_map_args(
        positions, block_table, seq_idx, slot_mapping, query_start, block_size, kernel_size, tap_map_out
    )


def sconv_tap_map(
    positions: torch.Tensor,
    block_table: torch.Tensor,
    seq_idx: torch.Tensor,
    slot_mapping: torch.Tensor,
    query_start: torch.Tensor,
    block_size: int,
    kernel_size: int,
    tap_map_out: torch.Tensor,
) -> None:
    """Fill the step's tap map ``tap_map_out[:T]`` for :func:`fused_sconv` (two launches).

    Build it once per step and KV-cache group, after the per-token metadata, and
    pass it to every ``fused_sconv`` of the group (every stream and layer with this
    block table, slot mapping and block size). Entry ``[t, k]`` says where the tap at
    distance ``k + 1`` of row ``t`` comes from: ``-1`` none; ``-(r + 2)`` row ``r`` of
    x; ``s + ((u + 1) << 32)`` cache slot ``s``, or, when row ``u >= 0`` of the same
    call writes slot ``s`` (a same-step prefix hit, any alignment), that row of x.

    Args:
        positions, block_table, seq_idx, slot_mapping, query_start: the call's
            metadata, exactly as given to :func:`fused_sconv` (T rows each).
        block_size: N of the group's caches.
        kernel_size: W of the layers' convolutions.
        tap_map_out: [>= T, W-1] int64, contiguous; a persistent buffer (its
            address survives across steps, so CUDA graphs replay).
    """
    check_tap_map_args(
        positions, block_table, seq_idx, slot_mapping, query_start, block_size, kernel_size, tap_map_out
    )
    torch.ops.inkling.sconv_tap_map(
        positions, block_table, seq_idx, slot_mapping, query_start, block_size, kernel_size, tap_map_out
    )

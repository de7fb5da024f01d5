"""The step's per-token metadata of the paged short conv: one type for every op.

A :class:`SconvBatch` is built (and validated, by :func:`inkling_kernels.checks.
check_batch`) once per step and KV-cache group, then handed unchanged to every conv
launch of the group: ``fused_sconv(x, weight, cache, batch, stream_offset,
stream_width)`` and ``fused_sconv_add_rmsnorm(hidden, d, weight, cache, batch, ...)``
check only what the launch adds (``x``, the weight, the cache and its block
dimension against the batch), once.

A ``torch.library`` custom op cannot take a dataclass: :meth:`SconvBatch.op_args`
unpacks a batch into the ops' tensor and int arguments, :data:`OP_SCHEMA` is their
part of every op's schema, and :meth:`SconvBatch.split_op_args` packs them again
inside the op, unchecked (they came from a valid batch): the one place that lists
them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from collections.abc import Sequence
from typing import Any, Optional

import torch

from .checks import check_batch, check_tap_map_buffer, need_int

__all__ = ["OP_SCHEMA", "SconvBatch", "schedule_start"]

#: The batch's arguments in every sconv custom op's schema, in :meth:`SconvBatch.op_args` order.
OP_SCHEMA = (
    "Tensor positions, Tensor block_table, Tensor seq_idx, Tensor slot_mapping, Tensor query_start, "
    "Tensor? tap_map, SymInt block_size, SymInt? kernel_size, int schedule_start"
)


@dataclass(frozen=True, eq=False)
class SconvBatch:
    """One step's metadata for the paged short conv of one KV-cache group.

    Attributes (T rows = the padded token batch):
        positions: ``[T]`` int64, absolute position of each token (pad rows: any).
        block_table: ``[R, max_blocks]`` int32, physical block of each request's
            logical block (entries out of the window may be null or stale: never read).
        seq_idx: ``[T]`` int32, request row of each token in ``block_table`` (pad: 0).
        slot_mapping: ``[T]`` int64, flat cache slot ``block * N + row`` of each
            token; negative (pad row) or outside the cache: no write.
        query_start: ``[T]`` int32, first row of the token's request in ``x`` (pad: 0).
        block_size: N, the group's runtime block size (the one source of truth;
            every launch checks it against its cache's ``shape[2]``).
        kernel_size: W of the group's convolutions, or ``None`` when unknown (then
            the batch carries no tap map and the weight's W is not checked).
        tap_map: ``[>= T, W - 1]`` int64, the step's tap map
            (:func:`inkling_kernels.sconv_tap_map` of this very batch), or ``None``.
            With it the Triton kernels read each earlier tap's source from it.
        num_actual_tokens: real (non-pad) tokens, when known (informational).
        schedule_start: a scheduling hint, never a correctness input: the flat row
            where the row-register kernel (``fused_sconv``'s and ``fused_sconv_kv``'s
            prefill-sized launches) starts its row tiles, taking the rest in order and
            wrapping around. Any value gives the same results; 0 (the default) keeps the
            plain order. :func:`schedule_start` computes the useful one from the host's
            ``query_start_loc``: the row after the last prompt chunk, so that tiles with
            decode rows behind a prompt (which wait for memory round trips) run first
            instead of as the launch's tail.

    Construction validates every field (:func:`inkling_kernels.checks.check_batch`);
    the batch is immutable afterwards.
    """

    positions: torch.Tensor
    block_table: torch.Tensor
    seq_idx: torch.Tensor
    slot_mapping: torch.Tensor
    query_start: torch.Tensor
    block_size: int
    kernel_size: Optional[int] = None
    tap_map: Optional[torch.Tensor] = None
    num_actual_tokens: Optional[int] = None
    schedule_start: int = 0

    def __post_init__(self) -> None:
        check_batch(self)

    @property
    def num_tokens(self) -> int:
        """T: rows of the flat batch (pad rows included)."""
        return int(self.positions.shape[0])

    @property
    def device(self) -> torch.device:
        return self.positions.device

    def with_tap_map(self, tap_map: torch.Tensor) -> SconvBatch:
        """This batch carrying ``tap_map`` (built from it by ``sconv_tap_map``); only
        the map is checked."""
        if self.kernel_size is None:
            raise ValueError("a batch with a tap_map needs its kernel_size (the map has W - 1 columns)")
        check_tap_map_buffer("tap_map", tap_map, self.num_tokens, self.kernel_size, self.device)
        return self._replace_unchecked(tap_map=tap_map[: self.num_tokens])

    def _replace_unchecked(self, **changes: Any) -> SconvBatch:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return SconvBatch._unchecked(**values)

    @classmethod
    def _unchecked(cls, **values: Any) -> SconvBatch:
        batch = object.__new__(cls)
        for name, value in values.items():
            object.__setattr__(batch, name, value)
        return batch

    # --- the custom ops' view -------------------------------------------------
    def op_args(self) -> tuple[Any, ...]:
        """The batch as the custom ops take it (their schema lists these, in this
        order, right after the op's own tensors): ``positions, block_table, seq_idx,
        slot_mapping, query_start, tap_map, block_size, kernel_size, schedule_start``."""
        return (
            self.positions, self.block_table, self.seq_idx, self.slot_mapping,
            self.query_start, self.tap_map, self.block_size, self.kernel_size, self.schedule_start,
        )

    @classmethod
    def split_op_args(cls, args: tuple[Any, ...], *, check: bool = False) -> tuple[SconvBatch, tuple[Any, ...]]:
        """Inverse of :meth:`op_args` inside an op: ``(batch, the op's remaining
        arguments)`` from the arguments that follow the op's own tensors. Unchecked
        (they came from a valid batch) unless ``check`` (fake implementations, tracing)."""
        (positions, block_table, seq_idx, slot_mapping, query_start, tap_map, block_size, kernel_size,
         schedule_start) = args[:9]
        values = dict(
            positions=positions, block_table=block_table, seq_idx=seq_idx, slot_mapping=slot_mapping,
            query_start=query_start, block_size=block_size, kernel_size=kernel_size, tap_map=tap_map,
            num_actual_tokens=None, schedule_start=schedule_start,
        )
        batch = cls(**values) if check else cls._unchecked(**values)
        return batch, tuple(args[9:])

    def __repr__(self) -> str:
        tap = "none" if self.tap_map is None else "yes"
        start = f", schedule_start={self.schedule_start}" if self.schedule_start else ""
        return (
            f"SconvBatch(T={self.num_tokens}, reqs={self.block_table.shape[0]}, "
            f"N={self.block_size}, W={self.kernel_size}, tap_map={tap}{start}, device={self.device})"
        )


def schedule_start(query_start_loc: torch.Tensor | Sequence[int], kernel_size: int) -> int:
    """The batch's :attr:`SconvBatch.schedule_start`, from host data only (no device
    sync): the row after the last request with at least ``kernel_size`` (W) rows this
    step, 0 when there is none.

    A row whose taps all lie in this forward (or before its sequence start) is one the
    row-register kernel convolves from registers; any other row (a decode, a
    speculative draft, a chunk's first W - 1 rows) sends its tile to the slower load
    path. A request with W or more rows ends on such a register row, so this is the
    row after the batch's last register row whenever every request with fewer rows
    continues a sequence (decodes and drafts do); a fresh prompt shorter than W is
    not counted (then the hint is only less useful, never wrong). With a prompt
    followed by decodes the kernel starts at the decodes' tiles; with decodes first,
    or a prompt last, the hint is the batch end, which wraps to row 0 (plain order).

    Args:
        query_start_loc: ``[num_reqs + 1]`` host int tensor or sequence (request row
            offsets; the engine's CPU copy).
        kernel_size: W, the conv width (>= 2).
    """
    if isinstance(query_start_loc, torch.Tensor):
        if query_start_loc.device.type != "cpu":
            raise ValueError(
                f"query_start_loc is on {query_start_loc.device}: pass the host copy (reading a device "
                "tensor here would synchronise every step)"
            )
        if query_start_loc.dim() != 1 or query_start_loc.dtype.is_floating_point:
            raise ValueError(f"query_start_loc must be a 1-D int tensor, got {query_start_loc.dtype} "
                             f"of shape {tuple(query_start_loc.shape)}")
        starts = query_start_loc.tolist()
    else:
        starts = [int(v) for v in query_start_loc]
    need_int("kernel_size", kernel_size, 2)
    for i in range(len(starts) - 1, 0, -1):
        if starts[i] - starts[i - 1] >= kernel_size:
            return starts[i]
    return 0

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

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Optional

import torch

from .checks import check_batch, check_tap_map_buffer

__all__ = ["OP_SCHEMA", "PREFILL_MIN_ROWS", "SconvBatch", "prefill_token_count"]

#: :func:`prefill_token_count`'s default: requests of more rows than this count as prompts
#: (two of the row kernel's 8-row tiles: a request of at most 16 rows keeps at least half
#: of its tiles on the load path, as a speculative verification does).
PREFILL_MIN_ROWS = 16


def prefill_token_count(query_lens: Iterable[int], decode_max_rows: int = PREFILL_MIN_ROWS) -> int:
    """:attr:`SconvBatch.num_prefill_tokens` of a step: the rows of its requests that
    bring more than ``decode_max_rows`` rows (prompts, chunks of prompts), from each
    request's row count in the step. ``decode_max_rows`` is the most rows a decode or a
    speculative verification brings: at least 1 + the draft tokens (vLLM's decode
    threshold); the default, 16, covers up to 15 drafts."""
    _check_decode_max_rows(decode_max_rows)
    return sum(n for n in (int(q) for q in query_lens) if n > decode_max_rows)


def _check_decode_max_rows(decode_max_rows: object) -> None:
    if isinstance(decode_max_rows, bool) or not isinstance(decode_max_rows, int) or decode_max_rows < 1:
        raise ValueError(f"decode_max_rows must be an int >= 1, got {decode_max_rows!r}")


#: The batch's arguments in every sconv custom op's schema, in :meth:`SconvBatch.op_args` order.
OP_SCHEMA = (
    "Tensor positions, Tensor block_table, Tensor seq_idx, Tensor slot_mapping, Tensor query_start, "
    "Tensor? tap_map, SymInt block_size, SymInt? kernel_size, SymInt? num_prefill_tokens"
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
        num_prefill_tokens: rows of the requests that bring more rows than a decode or
            a speculative verification does (prompts and chunks of prompts), when known:
            a host-side hint for the kernel choice of prefill-sized launches (a batch
            mostly of prompt rows takes the row-register kernels, one of decodes and
            short speculative requests the tiles), never for the result.
            :func:`inkling_kernels.prefill_token_count` counts it from the requests'
            row counts. ``None``: the choice goes by rows per request.
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
    num_prefill_tokens: Optional[int] = None

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
        batch = object.__new__(SconvBatch)
        batch.__dict__.update(self.__dict__)  # (the fields: one dict copy, per step and group)
        batch.__dict__.update(changes)
        return batch

    @classmethod
    def _unchecked(cls, **values: Any) -> SconvBatch:
        batch = object.__new__(cls)
        batch.__dict__.update(values)
        return batch

    # --- the custom ops' view -------------------------------------------------
    def op_args(self) -> tuple[Any, ...]:
        """The batch as the custom ops take it (their schema lists these, in this
        order, right after the op's own tensors): ``positions, block_table, seq_idx,
        slot_mapping, query_start, tap_map, block_size, kernel_size,
        num_prefill_tokens``."""
        return (
            self.positions, self.block_table, self.seq_idx, self.slot_mapping,
            self.query_start, self.tap_map, self.block_size, self.kernel_size, self.num_prefill_tokens,
        )

    @classmethod
    def split_op_args(cls, args: tuple[Any, ...], *, check: bool = False) -> tuple[SconvBatch, tuple[Any, ...]]:
        """Inverse of :meth:`op_args` inside an op: ``(batch, the op's remaining
        arguments)`` from the arguments that follow the op's own tensors. Unchecked
        (they came from a valid batch) unless ``check`` (fake implementations, tracing)."""
        (positions, block_table, seq_idx, slot_mapping, query_start, tap_map, block_size, kernel_size,
         num_prefill_tokens) = args[:9]
        values = dict(
            positions=positions, block_table=block_table, seq_idx=seq_idx, slot_mapping=slot_mapping,
            query_start=query_start, block_size=block_size, kernel_size=kernel_size, tap_map=tap_map,
            num_actual_tokens=None, num_prefill_tokens=num_prefill_tokens,
        )
        batch = cls(**values) if check else cls._unchecked(**values)
        return batch, tuple(args[9:])

    def __repr__(self) -> str:
        tap = "none" if self.tap_map is None else "yes"
        prefill = "" if self.num_prefill_tokens is None else f", prefill_rows={self.num_prefill_tokens}"
        return (
            f"SconvBatch(T={self.num_tokens}, reqs={self.block_table.shape[0]}, "
            f"N={self.block_size}, W={self.kernel_size}, tap_map={tap}{prefill}, device={self.device})"
        )

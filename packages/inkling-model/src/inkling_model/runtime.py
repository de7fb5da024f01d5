"""A small standalone paged runtime for the conv-state cache.

For users without an engine, and for tests: a step function that turns a batch of
scheduled chunks (request, first position, number of new tokens) into
:class:`~inkling_model.SconvMetadata`, over persistent tensors.

The paging itself (which physical block holds which positions, sliding-window
freeing, prefix sharing, the rules a schedule must follow) is pure Python and lives in
:mod:`inkling_cache.allocator` (:class:`~inkling_cache.BlockTables`,
:class:`~inkling_cache.BlockAllocator`); this module only validates what its buffers
can hold and turns the step's layout into tensors. What a schedule may do: prefill,
chunked prefill, decode and mixed batches; speculative rounds (restart after the last
accepted token: rejected positions are overwritten); preemption
(:meth:`PagedConvRuntime.preempt`, then restart at 0); prefix hits
(:class:`ScheduledChunk` with ``prefix_from``). A chunk's ``start`` may not go below
the previous step's ``start`` of the same request (blocks behind it may have been
freed); rewinding further means preempting.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass

import torch

from inkling_cache import BlockAllocator, BlockTables, OutOfBlocksError, ScheduledChunk, StepLayout, StepPlan
from inkling_kernels import prefill_token_count

from .metadata import SconvMetadata, SconvMetadataBuilder
from .state import ConvStateOwner

# BlockAllocator, OutOfBlocksError and ScheduledChunk live in inkling_cache; they are
# re-exported here (and from inkling_model) for existing callers.
__all__ = [
    "BlockAllocator",
    "OutOfBlocksError",
    "PagedConvRuntime",
    "RuntimeStep",
    "ScheduledChunk",
]


@dataclass
class RuntimeStep:
    """One step's batch description.

    Attributes:
        metadata: what the conv layers need (install it with
            ``forward_metadata(step.metadata)``), with the step's tap map when the
            runtime builds one (on CUDA by default).
        positions: ``[num_padded_tokens]`` int64 absolute positions (0 on pad rows).
        query_start_loc: ``[num_reqs + 1]`` int32 row offsets of the requests.
        req_ids: request ids in batch order.
        token_slices: ``req_id -> slice`` of that request's rows in the flat batch.
        num_actual_tokens / num_padded_tokens: real rows / rows including padding.
    """

    metadata: SconvMetadata
    positions: torch.Tensor
    query_start_loc: torch.Tensor
    req_ids: list[Hashable]
    token_slices: dict[Hashable, slice]
    num_actual_tokens: int
    num_padded_tokens: int


class PagedConvRuntime:
    """Block tables, slot mappings and metadata for a batch of requests.

    Args:
        num_blocks: physical blocks in every bound cache (one is the null block).
        block_size: tokens per block (``N``; may exceed the kernel size).
        sliding_window: the conv window ``W`` (a token reads ``W - 1`` earlier ones).
        max_num_tokens: the most (padded) tokens one step may hold.
        max_blocks_per_req: block-table width (bounds a request's length:
            ``max_blocks_per_req * block_size`` positions).
        max_num_reqs: the most requests one step may hold.
        device: where the metadata tensors live.
        tap_map: whether each step's metadata carries the step's tap map (built
            for kernel size ``sliding_window``): ``None`` (auto) on CUDA only,
            ``True`` always, ``False`` never (see :class:`SconvMetadataBuilder`).

    The requests' block tables are an :class:`inkling_cache.BlockTables`
    (``runtime.tables``; its allocator is ``runtime.allocator``).
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        sliding_window: int,
        *,
        max_num_tokens: int = 1024,
        max_blocks_per_req: int = 256,
        max_num_reqs: int = 64,
        device: torch.device | str = "cpu",
        null_block: int = 0,
        tap_map: bool | None = None,
    ) -> None:
        for name, value in (("max_num_tokens", max_num_tokens), ("max_num_reqs", max_num_reqs)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(sliding_window, int) or isinstance(sliding_window, bool) or sliding_window < 2:
            raise ValueError(f"sliding_window must be the layers' conv kernel size W (an int >= 2), "
                             f"got {sliding_window!r}")
        self.tables = BlockTables(
            num_blocks, block_size, sliding_window, max_blocks_per_req=max_blocks_per_req, null_block=null_block
        )
        self.block_size = block_size
        self.sliding_window = sliding_window
        self.max_num_tokens = max_num_tokens
        self.max_blocks_per_req = max_blocks_per_req
        self.max_num_reqs = max_num_reqs
        try:
            self.device = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise ValueError(f"device {device!r} is not a torch device: pass e.g. 'cpu' or 'cuda' ({exc})") from None
        # The conv window W is the layers' kernel size.
        self.builder = SconvMetadataBuilder(
            max_num_tokens,
            self.device,
            kernel_size=sliding_window,
            tap_map=tap_map,
        )
        # Persistent buffers: step tensors keep their addresses (graph capture).
        self.positions_buffer = torch.zeros(max_num_tokens, dtype=torch.int64, device=self.device)
        self.slot_mapping_buffer = torch.full((max_num_tokens,), -1, dtype=torch.int64, device=self.device)
        self.query_start_loc_buffer = torch.zeros(max_num_reqs + 1, dtype=torch.int32, device=self.device)
        self.block_table_buffer = torch.full(
            (max_num_reqs, max_blocks_per_req), null_block, dtype=torch.int32, device=self.device
        )

    @property
    def allocator(self) -> BlockAllocator:
        """The physical block allocator behind the block tables."""
        return self.tables.allocator

    # --- caches -------------------------------------------------------------
    def allocate_caches(
        self,
        owners: Iterable[ConvStateOwner],
        dtype: torch.dtype,
        *,
        fill: float = 0.0,
    ) -> list[torch.Tensor]:
        """Allocate a ``[num_blocks, H, block_size, D]`` cache for every owner
        (filled with ``fill``; NaN is a useful poison in tests) and bind it. Every
        owner's conv kernel size must be this runtime's ``sliding_window`` (a smaller
        window would free blocks the conv still reads)."""
        if isinstance(owners, ConvStateOwner):
            raise TypeError("owners must be an iterable of ConvStateOwner objects: pass [owner] for one")
        owners = list(owners)
        for owner in owners:
            if not isinstance(owner, ConvStateOwner):
                raise TypeError(f"owners must be ConvStateOwner objects (an iterable of them), "
                                f"got {type(owner).__name__}")
            if owner.layout.kernel_size != self.sliding_window:
                raise ValueError(
                    f"{owner.name}: conv kernel size {owner.layout.kernel_size} but this runtime was built "
                    f"with sliding_window={self.sliding_window}: build it with sliding_window="
                    f"{owner.layout.kernel_size}"
                )
        caches = []
        for owner in owners:
            cache = torch.full(
                (self.allocator.num_blocks, owner.layout.num_heads, self.block_size, owner.layout.head_size),
                fill,
                dtype=dtype,
                device=self.device,
            )
            owner.bind_cache(cache)
            caches.append(cache)
        return caches

    # --- requests (kept by the block tables) ----------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self.tables.num_free_blocks

    def has_request(self, req_id: Hashable) -> bool:
        return self.tables.has_request(req_id)

    def num_written(self, req_id: Hashable) -> int:
        """Positions of ``req_id`` stored so far (rejected drafts included)."""
        return self.tables.num_written(req_id)

    def live_blocks(self, req_id: Hashable) -> list[int]:
        """The request's physical blocks still held (not freed by the window)."""
        return self.tables.live_blocks(req_id)

    def block_table_row(self, req_id: Hashable) -> list[int]:
        """The request's logical -> physical block list (null where freed)."""
        return self.tables.block_table_row(req_id)

    def preempt(self, req_id: Hashable) -> None:
        """Free every block of ``req_id``; it restarts from position 0."""
        self.tables.preempt(req_id)

    def finish(self, req_id: Hashable) -> None:
        """Free every block of ``req_id`` and forget it."""
        self.tables.finish(req_id)

    # --- the step -------------------------------------------------------------
    def step(
        self,
        chunks: Iterable[ScheduledChunk | tuple[Hashable, int, int]],
        *,
        pad_to: int | None = None,
    ) -> RuntimeStep:
        """Schedule one forward: allocate blocks, free those out of the window, and
        build positions, slot mapping, block table and metadata.

        Args:
            chunks: per request ``(req_id, start, num_tokens)`` or a
                :class:`ScheduledChunk`; a new (or preempted) request must start at 0
                (or on a shared prefix, ``prefix_from``); a known one at any ``start``
                between its previous step's start and the positions it has written.
            pad_to: pad the batch to this many rows (pad rows: slot -1, position 0).

        The rows follow the order of ``chunks``; the results are the same in any order.
        Decode (and speculative) chunks all before the prompt chunks, as vLLM orders
        them, is the fast order: the row kernel's tiles that wait on memory (decode
        rows) then start with the launch rather than trail it.

        A step refused by validation changes nothing (no request, block or buffer).
        """
        plan, num_padded = self._validate(chunks, pad_to)
        layout = self.tables.apply(plan)
        self._stage(layout, num_padded)
        metadata = self._build_metadata(layout, num_padded)
        return RuntimeStep(
            metadata=metadata,
            positions=self.positions_buffer[:num_padded],
            query_start_loc=self.query_start_loc_buffer[: layout.num_requests + 1],
            req_ids=layout.req_ids,
            token_slices=layout.token_slices,
            num_actual_tokens=layout.num_tokens,
            num_padded_tokens=num_padded,
        )

    def _validate(
        self, chunks: Iterable[ScheduledChunk | tuple[Hashable, int, int]], pad_to: int | None
    ) -> tuple[StepPlan, int]:
        """Check the batch against the block tables and against what the buffers hold;
        return the plan and the padded token count. Changes nothing."""
        if pad_to is not None and (isinstance(pad_to, bool) or not isinstance(pad_to, int)):
            raise TypeError(
                f"pad_to must be an int (the rows to pad the batch to) or None, got {pad_to!r} "
                f"({type(pad_to).__name__})"
            )
        batch = [ScheduledChunk.of(c) for c in chunks]
        if len(batch) > self.max_num_reqs:
            raise ValueError(f"{len(batch)} requests exceed max_num_reqs {self.max_num_reqs}")
        plan = self.tables.plan(batch)
        num_padded = plan.num_tokens if pad_to is None else pad_to
        if num_padded < plan.num_tokens:
            raise ValueError(f"pad_to {pad_to} is smaller than the step's {plan.num_tokens} tokens")
        if num_padded > self.max_num_tokens:
            raise ValueError(f"the step holds {num_padded} tokens, more than max_num_tokens {self.max_num_tokens}")
        return plan, num_padded

    def _stage(self, layout: StepLayout, num_padded: int) -> None:
        """Copy the step's layout into the persistent buffers (pad rows: position 0,
        slot -1; unused block-table entries: the null block)."""
        num_tokens, num_reqs = layout.num_tokens, layout.num_requests
        self.positions_buffer[:num_tokens] = torch.tensor(layout.positions, dtype=torch.int64)
        self.positions_buffer[num_tokens:num_padded].zero_()
        self.slot_mapping_buffer[:num_tokens] = torch.tensor(layout.slot_mapping, dtype=torch.int64)
        self.slot_mapping_buffer[num_tokens:num_padded].fill_(-1)
        self.query_start_loc_buffer[: num_reqs + 1] = torch.tensor(layout.query_start_loc, dtype=torch.int32)
        self.block_table_buffer[:num_reqs].fill_(self.tables.null_block)
        for row, blocks in enumerate(layout.block_table):
            self.block_table_buffer[row, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)

    def _build_metadata(self, layout: StepLayout, num_padded: int) -> SconvMetadata:
        """The conv layers' metadata over the staged buffers."""
        query_lens = [b - a for a, b in zip(layout.query_start_loc, layout.query_start_loc[1:])]
        return self.builder.build(
            self.query_start_loc_buffer[: layout.num_requests + 1],
            self.slot_mapping_buffer[:num_padded],
            self.block_table_buffer,  # whole buffer: a fixed shape and address to capture
            layout.num_requests,
            layout.num_tokens,
            num_padded,
            block_size=self.block_size,
            positions=self.positions_buffer[:num_padded],
            # the kernels' hint: rows of the requests of more than 16 rows (prompts)
            num_prefill_tokens=prefill_token_count(query_lens),
        )

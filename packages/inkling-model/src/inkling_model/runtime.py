"""A small standalone paged runtime for the conv-state cache.

For users without an engine, and for tests: a block allocator with sliding-window
freeing, and a step function that turns a batch of scheduled chunks (request,
first position, number of new tokens) into :class:`~inkling_model.SconvMetadata`.

What it supports, and how (the cache stores each token's conv *input* at its
absolute position, so none of these needs special state handling):

- prefill, chunked prefill, decode, mixed batches: a chunk may start at any
  position up to what the request has written;
- speculative rounds: schedule the verified token plus the drafts; on the next step
  start after the last accepted token: the rejected positions are simply
  overwritten;
- preemption / recompute: :meth:`PagedConvRuntime.preempt` frees every block of the
  request; it then restarts from position 0;
- sliding-window freeing: before a step, blocks that hold only positions older than
  ``start - (window - 1)`` are returned to the allocator and their table entries
  point at the null block (never read for positions inside the window).

A chunk's ``start`` may not go below the previous step's ``start`` of the same
request (blocks behind it may have been freed); rewinding further means preempting.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

import torch

from inkling_cache import first_live_block, slot_of

from .metadata import SconvMetadata, SconvMetadataBuilder
from .state import ConvStateOwner

__all__ = [
    "BlockAllocator",
    "OutOfBlocksError",
    "PagedConvRuntime",
    "RuntimeStep",
    "ScheduledChunk",
]


class OutOfBlocksError(RuntimeError):
    """The allocator cannot satisfy a step; preempt or finish a request first."""


class BlockAllocator:
    """Reference-counted free-list allocator of physical block ids ``[0, num_blocks)``.

    ``null_block`` (default 0) is reserved and never handed out: block-table
    entries that fell out of the window point at it. A block shared by several
    requests (a common prefix) returns to the free list when its last holder frees it.
    """

    def __init__(self, num_blocks: int, *, null_block: int = 0) -> None:
        if not isinstance(num_blocks, int) or num_blocks < 2:
            raise ValueError(f"num_blocks must be an int >= 2 (one is the null block), got {num_blocks!r}")
        if not 0 <= null_block < num_blocks:
            raise ValueError(f"null_block must be in [0, {num_blocks}), got {null_block}")
        self.num_blocks = num_blocks
        self.null_block = null_block
        # Pop from the end: low ids first, which keeps small tests readable.
        self._free = [b for b in range(num_blocks - 1, -1, -1) if b != null_block]
        self._refs: dict[int, int] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._refs)

    def ref_count(self, block: int) -> int:
        return self._refs.get(block, 0)

    def allocate(self) -> int:
        if not self._free:
            raise OutOfBlocksError(
                f"all {self.num_blocks - 1} blocks are in use: preempt or finish a request, "
                "or build the runtime with more blocks"
            )
        block = self._free.pop()
        self._refs[block] = 1
        return block

    def share(self, block: int) -> int:
        """Take one more reference to an allocated block."""
        if block not in self._refs:
            raise ValueError(f"block {block} is not allocated: only live blocks can be shared")
        self._refs[block] += 1
        return block

    def free(self, block: int) -> None:
        """Drop one reference; the block is free again when none is left."""
        refs = self._refs.get(block)
        if refs is None:
            raise ValueError(f"block {block} is not allocated (double free or the null block)")
        if refs == 1:
            del self._refs[block]
            self._free.append(block)
        else:
            self._refs[block] = refs - 1


@dataclass(frozen=True)
class ScheduledChunk:
    """``num_tokens`` new tokens of request ``req_id`` at positions
    ``start, start + 1, ...``.

    ``prefix_from`` (a prefix-cache hit): a *new* request starts at ``start > 0``
    (a multiple of the block size) on the blocks of request ``prefix_from`` holding
    positions ``[0, start)``, shared, not copied. The source must have computed
    those positions (final inputs, not speculative drafts) by the end of this step;
    it may compute them in this very step (the same-step hit of docs/design.md §3.2,
    which the kernel resolves).
    """

    req_id: Hashable
    start: int
    num_tokens: int
    prefix_from: Hashable | None = None


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


@dataclass
class _Request:
    blocks: list[int] = field(default_factory=list)  # logical block -> physical (null if freed)
    written: int = 0  # positions [0, written) have been stored at least once
    min_start: int = 0  # the last step's start: never rewind below it


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
        for name, value in (
            ("block_size", block_size),
            ("sliding_window", sliding_window),
            ("max_num_tokens", max_num_tokens),
            ("max_blocks_per_req", max_blocks_per_req),
            ("max_num_reqs", max_num_reqs),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.allocator = BlockAllocator(num_blocks, null_block=null_block)
        self.block_size = block_size
        self.sliding_window = sliding_window
        self.max_num_tokens = max_num_tokens
        self.max_blocks_per_req = max_blocks_per_req
        self.max_num_reqs = max_num_reqs
        self.device = torch.device(device)
        # The conv window W is the layers' kernel size (a W = 1 conv has no taps).
        self.builder = SconvMetadataBuilder(
            max_num_tokens,
            self.device,
            kernel_size=sliding_window if sliding_window >= 2 else None,
            tap_map=tap_map,
        )
        # Persistent buffers: step tensors keep their addresses (graph capture).
        self.positions_buffer = torch.zeros(max_num_tokens, dtype=torch.int64, device=self.device)
        self.slot_mapping_buffer = torch.full((max_num_tokens,), -1, dtype=torch.int64, device=self.device)
        self.query_start_loc_buffer = torch.zeros(max_num_reqs + 1, dtype=torch.int32, device=self.device)
        self.block_table_buffer = torch.full(
            (max_num_reqs, max_blocks_per_req), null_block, dtype=torch.int32, device=self.device
        )
        self._requests: dict[Hashable, _Request] = {}

    # --- caches -------------------------------------------------------------
    def allocate_caches(
        self,
        owners: Iterable[ConvStateOwner],
        dtype: torch.dtype,
        *,
        fill: float = 0.0,
    ) -> list[torch.Tensor]:
        """Allocate a ``[num_blocks, H, block_size, D]`` cache for every owner
        (filled with ``fill``; NaN is a useful poison in tests) and bind it."""
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

    # --- requests -----------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self.allocator.num_free

    def has_request(self, req_id: Hashable) -> bool:
        return req_id in self._requests

    def num_written(self, req_id: Hashable) -> int:
        """Positions of ``req_id`` stored so far (rejected drafts included)."""
        return self._requests[req_id].written if req_id in self._requests else 0

    def live_blocks(self, req_id: Hashable) -> list[int]:
        """The request's physical blocks still held (not freed by the window)."""
        req = self._requests.get(req_id)
        if req is None:
            return []
        null = self.allocator.null_block
        return [b for b in req.blocks if b != null]

    def block_table_row(self, req_id: Hashable) -> list[int]:
        """The request's logical -> physical block list (null where freed)."""
        req = self._requests.get(req_id)
        return list(req.blocks) if req is not None else []

    def preempt(self, req_id: Hashable) -> None:
        """Free every block of ``req_id``; it restarts from position 0."""
        self.finish(req_id)

    def finish(self, req_id: Hashable) -> None:
        """Free every block of ``req_id`` and forget it."""
        req = self._requests.pop(req_id, None)
        if req is None:
            raise KeyError(f"unknown request {req_id!r}")
        for block in req.blocks:
            if block != self.allocator.null_block:
                self.allocator.free(block)

    def _first_needed_block(self, start: int) -> int:
        # Positions >= start - (W - 1) are still read; blocks wholly before them are dead.
        return first_live_block(start, self.sliding_window, self.block_size)

    def _check_prefix_hit(self, chunk: ScheduledChunk, parsed: Sequence[ScheduledChunk]) -> None:
        name, source_id = chunk.req_id, chunk.prefix_from
        if name in self._requests:
            raise ValueError(f"request {name!r} already exists: only a new request can start on a shared prefix")
        if chunk.start <= 0 or chunk.start % self.block_size:
            raise ValueError(
                f"request {name!r}: a shared prefix must end on a block boundary (a positive "
                f"multiple of block_size {self.block_size}), got start {chunk.start}"
            )
        in_step = [c for c in parsed if c.req_id == source_id]
        if in_step and in_step[0].prefix_from is not None:
            raise ValueError(f"request {name!r}: its prefix source {source_id!r} is itself a new prefix hit")
        source = self._requests.get(source_id)
        if source is None and not in_step:
            raise ValueError(f"request {name!r}: unknown prefix source {source_id!r}")
        written = source.written if source is not None else 0
        source_start = source.min_start if source is not None else 0
        if in_step:
            written = max(written, in_step[0].start + in_step[0].num_tokens)
            source_start = in_step[0].start
        if written < chunk.start:
            raise ValueError(
                f"request {name!r}: prefix source {source_id!r} holds positions up to {written}, "
                f"fewer than the {chunk.start} shared"
            )
        if self._first_needed_block(source_start) > self._first_needed_block(chunk.start):
            raise ValueError(
                f"request {name!r}: prefix source {source_id!r} has already freed blocks that "
                f"position {chunk.start} still reads (its window moved past them)"
            )

    # --- the step -------------------------------------------------------------
    def step(
        self,
        chunks: Sequence[ScheduledChunk | tuple[Hashable, int, int]],
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
        """
        parsed = [c if isinstance(c, ScheduledChunk) else ScheduledChunk(*c) for c in chunks]
        if not parsed:
            raise ValueError("a step needs at least one chunk")
        if len(parsed) > self.max_num_reqs:
            raise ValueError(f"{len(parsed)} requests exceed max_num_reqs {self.max_num_reqs}")
        seen: set[Hashable] = set()
        num_tokens = 0
        blocks_needed = 0
        blocks_freed = 0
        null = self.allocator.null_block
        for chunk in parsed:
            if chunk.req_id in seen:
                raise ValueError(f"request {chunk.req_id!r} appears twice in one step; merge its chunks")
            seen.add(chunk.req_id)
            if not isinstance(chunk.num_tokens, int) or chunk.num_tokens < 1:
                raise ValueError(f"request {chunk.req_id!r}: num_tokens must be >= 1, got {chunk.num_tokens!r}")
            if not isinstance(chunk.start, int) or chunk.start < 0:
                raise ValueError(f"request {chunk.req_id!r}: start must be >= 0, got {chunk.start!r}")
            req = self._requests.get(chunk.req_id)
            if chunk.prefix_from is not None:
                self._check_prefix_hit(chunk, parsed)
                req = _Request()
            elif req is None:
                if chunk.start != 0:
                    raise ValueError(
                        f"request {chunk.req_id!r} is new (or was preempted): it must start at "
                        f"position 0, got {chunk.start}"
                    )
                req = _Request()
            elif not req.min_start <= chunk.start <= req.written:
                raise ValueError(
                    f"request {chunk.req_id!r}: start {chunk.start} must lie in "
                    f"[{req.min_start}, {req.written}] (not before the previous step's start, "
                    "not past what was written); preempt it to recompute from 0"
                )
            end = chunk.start + chunk.num_tokens
            last_block = (end - 1) // self.block_size
            if last_block >= self.max_blocks_per_req:
                raise ValueError(
                    f"request {chunk.req_id!r} reaches position {end - 1}, beyond the block "
                    f"table's {self.max_blocks_per_req} blocks of {self.block_size}"
                )
            first_live = self._first_needed_block(chunk.start)
            # Shared blocks may stay held by another request: count only sole holders.
            blocks_freed += sum(
                1 for b in req.blocks[:first_live] if b != null and self.allocator.ref_count(b) == 1
            )
            for logical in range(chunk.start // self.block_size, last_block + 1):
                if logical >= len(req.blocks) or req.blocks[logical] == null:
                    blocks_needed += 1
            num_tokens += chunk.num_tokens
        num_padded = num_tokens if pad_to is None else pad_to
        if num_padded < num_tokens:
            raise ValueError(f"pad_to {pad_to} is smaller than the step's {num_tokens} tokens")
        if num_padded > self.max_num_tokens:
            raise ValueError(
                f"the step holds {num_padded} tokens, more than max_num_tokens {self.max_num_tokens}"
            )
        if blocks_needed > self.allocator.num_free + blocks_freed:
            raise OutOfBlocksError(
                f"the step needs {blocks_needed} new blocks but only "
                f"{self.allocator.num_free + blocks_freed} are free: preempt or finish a request"
            )

        # Validated: now mutate. Prefix hits go last, so that they can share blocks
        # their source allocates in this step (the batch order stays as given).
        for chunk in sorted(parsed, key=lambda c: c.prefix_from is not None):
            req = self._requests.setdefault(chunk.req_id, _Request())
            first_live = self._first_needed_block(chunk.start)
            if chunk.prefix_from is not None:
                source = self._requests[chunk.prefix_from]
                shared = range(first_live, chunk.start // self.block_size)
                req.blocks = [null] * first_live + [self.allocator.share(source.blocks[b]) for b in shared]
                req.written = chunk.start
            for logical in range(min(first_live, len(req.blocks))):
                if req.blocks[logical] != null:
                    self.allocator.free(req.blocks[logical])
                    req.blocks[logical] = null
            end = chunk.start + chunk.num_tokens
            last_block = (end - 1) // self.block_size
            while len(req.blocks) <= last_block:
                req.blocks.append(null)
            for logical in range(chunk.start // self.block_size, last_block + 1):
                if req.blocks[logical] == null:
                    req.blocks[logical] = self.allocator.allocate()

        positions: list[int] = []
        slots: list[int] = []
        query_start_loc = [0]
        token_slices: dict[Hashable, slice] = {}
        self.block_table_buffer[: len(parsed)].fill_(null)
        for row, chunk in enumerate(parsed):
            req = self._requests[chunk.req_id]
            end = chunk.start + chunk.num_tokens
            for pos in range(chunk.start, end):
                positions.append(pos)
                slots.append(slot_of(pos, req.blocks, self.block_size))
            req.written = max(req.written, end)
            req.min_start = chunk.start
            token_slices[chunk.req_id] = slice(query_start_loc[-1], query_start_loc[-1] + chunk.num_tokens)
            query_start_loc.append(query_start_loc[-1] + chunk.num_tokens)
            self.block_table_buffer[row, : len(req.blocks)] = torch.tensor(req.blocks, dtype=torch.int32)

        self.positions_buffer[:num_tokens] = torch.tensor(positions, dtype=torch.int64)
        self.positions_buffer[num_tokens:num_padded].zero_()
        self.slot_mapping_buffer[:num_tokens] = torch.tensor(slots, dtype=torch.int64)
        self.slot_mapping_buffer[num_tokens:num_padded].fill_(-1)
        num_reqs = len(parsed)
        self.query_start_loc_buffer[: num_reqs + 1] = torch.tensor(query_start_loc, dtype=torch.int32)
        query_start_loc_t = self.query_start_loc_buffer[: num_reqs + 1]
        metadata = self.builder.build(
            query_start_loc_t,
            self.slot_mapping_buffer[:num_padded],
            self.block_table_buffer,  # whole buffer: a fixed shape and address to capture
            num_reqs,
            num_tokens,
            num_padded,
            block_size=self.block_size,
            positions=self.positions_buffer[:num_padded],
        )
        return RuntimeStep(
            metadata=metadata,
            positions=self.positions_buffer[:num_padded],
            query_start_loc=query_start_loc_t,
            req_ids=[c.req_id for c in parsed],
            token_slices=token_slices,
            num_actual_tokens=num_tokens,
            num_padded_tokens=num_padded,
        )

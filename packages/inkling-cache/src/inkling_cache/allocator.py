"""Block allocation for a paged sliding-window cache: who holds which physical block.

Pure Python. :class:`BlockAllocator` hands out physical block ids (reference-counted,
so requests can share a common prefix); :class:`BlockTables` keeps one block-table row
per request and turns a batch of scheduled chunks into the step's positions, slots and
block-table rows (:class:`StepLayout`), freeing blocks the sliding window has left
behind. A step is checked whole before anything changes (:meth:`BlockTables.plan`),
then applied (:meth:`BlockTables.apply`): a refused step leaves every request and
every block as it was.

What a schedule may do (the cache stores each token's conv input at its absolute
position, so none of these needs special state handling):

- prefill, chunked prefill, decode, mixed batches: a chunk may start at any position
  up to what the request has written;
- speculative rounds: a chunk may restart on positions already written (the rejected
  drafts are overwritten), but never before the previous step's start (blocks behind
  it may have been freed); rewinding further means preempting;
- preemption / recompute: :meth:`BlockTables.preempt` frees every block of the
  request; it then restarts from position 0;
- prefix hits: a new request starts at a block boundary on another request's blocks,
  shared rather than copied, even when the source computes them in the same step;
- sliding-window freeing: before a step, blocks that hold only positions older than
  ``start - (window - 1)`` go back to the allocator and their entries point at the
  null block (never read for positions inside the window).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from .paging import first_live_block, slot_of

__all__ = [
    "BlockAllocator",
    "BlockTables",
    "OutOfBlocksError",
    "ScheduledChunk",
    "StepLayout",
    "StepPlan",
]


def _positive_int(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


class OutOfBlocksError(RuntimeError):
    """The allocator cannot satisfy a step; preempt or finish a request first."""


class BlockAllocator:
    """Reference-counted free-list allocator of physical block ids ``[0, num_blocks)``.

    ``null_block`` (default 0) is reserved and never handed out: block-table
    entries that fell out of the window point at it. A block shared by several
    requests (a common prefix) returns to the free list when its last holder frees it.
    """

    def __init__(self, num_blocks: int, *, null_block: int = 0) -> None:
        if not isinstance(num_blocks, int) or isinstance(num_blocks, bool) or num_blocks < 2:
            raise ValueError(f"num_blocks must be an int >= 2 (one is the null block), got {num_blocks!r}")
        if not isinstance(null_block, int) or isinstance(null_block, bool) or not 0 <= null_block < num_blocks:
            raise ValueError(f"null_block must be an int in [0, {num_blocks}), got {null_block!r}")
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

    def __post_init__(self) -> None:
        for name, minimum in (("start", 0), ("num_tokens", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(
                    f"request {self.req_id!r}: {name} must be an int, got "
                    f"{type(value).__name__} {value!r}"
                )
            if value < minimum:
                raise ValueError(f"request {self.req_id!r}: {name} must be >= {minimum}, got {value}")

    @property
    def end(self) -> int:
        """One past the chunk's last position."""
        return self.start + self.num_tokens

    @classmethod
    def of(cls, chunk: ScheduledChunk | tuple[Hashable, int, int]) -> ScheduledChunk:
        """A chunk as given, or built from a ``(req_id, start, num_tokens)`` triple."""
        return chunk if isinstance(chunk, ScheduledChunk) else cls(*chunk)


@dataclass(frozen=True)
class StepPlan:
    """A batch of chunks checked against the tables (see :meth:`BlockTables.plan`).

    Attributes:
        chunks: the chunks in batch order.
        num_tokens: the step's real tokens (the sum of the chunks' ``num_tokens``).
        blocks_needed: blocks the step allocates.
        blocks_freed: blocks the sliding window returns to the allocator first.
    """

    chunks: tuple[ScheduledChunk, ...]
    num_tokens: int
    blocks_needed: int
    blocks_freed: int
    _version: int = field(repr=False, compare=False)


@dataclass(frozen=True)
class StepLayout:
    """Where one applied step's tokens live, in batch order (plain lists).

    Attributes:
        req_ids: request ids, one per row of the block table.
        positions: ``[num_tokens]`` absolute positions.
        slot_mapping: ``[num_tokens]`` flat cache slots (``block * N + row``).
        query_start_loc: ``[num_requests + 1]`` offsets of each request's tokens.
        block_table: one logical -> physical block row per request (null where freed).
        token_slices: ``req_id -> slice`` of that request's tokens.
    """

    req_ids: list[Hashable]
    positions: list[int]
    slot_mapping: list[int]
    query_start_loc: list[int]
    block_table: list[list[int]]
    token_slices: dict[Hashable, slice]

    @property
    def num_requests(self) -> int:
        return len(self.req_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.positions)


@dataclass
class _Request:
    blocks: list[int] = field(default_factory=list)  # logical block -> physical (null if freed)
    written: int = 0  # positions [0, written) have been stored at least once
    min_start: int = 0  # the last step's start: never rewind below it


class BlockTables:
    """One block-table row per request over a :class:`BlockAllocator`.

    Args:
        num_blocks: physical blocks in the pool (one is the null block).
        block_size: tokens per block (``N``; may exceed the window).
        sliding_window: the window ``W`` (a token reads ``W - 1`` earlier ones).
        max_blocks_per_req: block-table width (bounds a request's length:
            ``max_blocks_per_req * block_size`` positions).
        null_block: the reserved block freed entries point at.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        sliding_window: int,
        *,
        max_blocks_per_req: int = 256,
        null_block: int = 0,
    ) -> None:
        self.block_size = _positive_int("block_size", block_size)
        self.sliding_window = _positive_int("sliding_window", sliding_window)
        self.max_blocks_per_req = _positive_int("max_blocks_per_req", max_blocks_per_req)
        self.allocator = BlockAllocator(num_blocks, null_block=null_block)
        self._requests: dict[Hashable, _Request] = {}
        self._version = 0  # bumped by every change: a plan applies only to the state it saw

    # --- requests -----------------------------------------------------------
    @property
    def null_block(self) -> int:
        return self.allocator.null_block

    @property
    def num_free_blocks(self) -> int:
        return self.allocator.num_free

    @property
    def request_ids(self) -> list[Hashable]:
        """Requests that hold a block-table row."""
        return list(self._requests)

    def has_request(self, req_id: Hashable) -> bool:
        return req_id in self._requests

    def num_written(self, req_id: Hashable) -> int:
        """Positions of ``req_id`` stored so far (rejected drafts included)."""
        req = self._requests.get(req_id)
        return req.written if req is not None else 0

    def live_blocks(self, req_id: Hashable) -> list[int]:
        """The request's physical blocks still held (not freed by the window)."""
        req = self._requests.get(req_id)
        if req is None:
            return []
        return [b for b in req.blocks if b != self.null_block]

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
        self._version += 1
        for block in req.blocks:
            if block != self.null_block:
                self.allocator.free(block)

    def first_needed_block(self, start: int) -> int:
        """First logical block a chunk starting at ``start`` still reads (or writes)."""
        return first_live_block(start, self.sliding_window, self.block_size)

    # --- a step: check it whole, then apply it ------------------------------
    def schedule(self, chunks: Iterable[ScheduledChunk | tuple[Hashable, int, int]]) -> StepLayout:
        """:meth:`plan` then :meth:`apply`."""
        return self.apply(self.plan(chunks))

    def plan(self, chunks: Iterable[ScheduledChunk | tuple[Hashable, int, int]]) -> StepPlan:
        """Check a batch of chunks against the requests and the free blocks; change nothing.

        A new (or preempted) request must start at 0, or on a shared prefix
        (``prefix_from``); a known one anywhere between its previous step's start and
        the positions it has written. Each request appears once.

        Raises:
            ValueError: a chunk breaks one of those rules, or reaches past the block table.
            OutOfBlocksError: the step needs more blocks than are (or become) free.
        """
        parsed = tuple(ScheduledChunk.of(c) for c in chunks)
        if not parsed:
            raise ValueError("a step needs at least one chunk")
        seen: set[Hashable] = set()
        num_tokens = blocks_needed = 0
        dropped: Counter[int] = Counter()  # references the window drops, per block
        for chunk in parsed:
            if chunk.req_id in seen:
                raise ValueError(f"request {chunk.req_id!r} appears twice in one step; merge its chunks")
            seen.add(chunk.req_id)
            blocks = self._check_chunk(chunk, parsed)
            dropped.update(b for b in blocks[: self.first_needed_block(chunk.start)] if b != self.null_block)
            blocks_needed += sum(
                1
                for logical in range(chunk.start // self.block_size, (chunk.end - 1) // self.block_size + 1)
                if logical >= len(blocks) or blocks[logical] == self.null_block
            )
            num_tokens += chunk.num_tokens
        # A block is free again once every holder has dropped it (requests sharing a
        # prefix may all slide past it in one step).
        blocks_freed = sum(1 for b, n in dropped.items() if n == self.allocator.ref_count(b))
        available = self.allocator.num_free + blocks_freed
        if blocks_needed > available:
            raise OutOfBlocksError(
                f"the step needs {blocks_needed} new blocks but only {available} are free: "
                "preempt or finish a request"
            )
        return StepPlan(parsed, num_tokens, blocks_needed, blocks_freed, self._version)

    def apply(self, plan: StepPlan) -> StepLayout:
        """Free the blocks behind each chunk's window, allocate the ones it writes, and
        lay the step out. ``plan`` must come from :meth:`plan` on the current state."""
        if not isinstance(plan, StepPlan):
            raise TypeError(
                f"plan must be the StepPlan that BlockTables.plan() returned, got "
                f"{type(plan).__name__} {plan!r}: call tables.apply(tables.plan(chunks)) "
                "or tables.schedule(chunks)"
            )
        if plan._version != self._version:
            raise ValueError("the plan is stale: the tables changed since it was made; plan again")
        self._version += 1
        own = [c for c in plan.chunks if c.prefix_from is None]
        hits = [c for c in plan.chunks if c.prefix_from is not None]
        # Every chunk frees before any allocates (the plan counted the freed blocks as
        # available); prefix hits go last, so that they can share blocks their source
        # allocates in this step. The batch order of the layout stays as given.
        for chunk in own:
            self._free_behind_window(chunk)
        for chunk in own:
            self._allocate(chunk)
        for chunk in hits:
            self._share_prefix(chunk)
            self._allocate(chunk)
        return self._lay_out(plan.chunks)

    # --- the parts ----------------------------------------------------------
    def _check_chunk(self, chunk: ScheduledChunk, batch: Sequence[ScheduledChunk]) -> list[int]:
        """Check one chunk; return the block row it starts from (empty for a new request)."""
        name = chunk.req_id
        req = self._requests.get(name)
        if chunk.prefix_from is not None:
            self._check_prefix_hit(chunk, batch)
            req = None
        elif req is None:
            if chunk.start != 0:
                raise ValueError(
                    f"request {name!r} is new (or was preempted): it must start at "
                    f"position 0, got {chunk.start}"
                )
        elif not req.min_start <= chunk.start <= req.written:
            raise ValueError(
                f"request {name!r}: start {chunk.start} must lie in "
                f"[{req.min_start}, {req.written}] (not before the previous step's start, "
                "not past what was written); preempt it to recompute from 0"
            )
        if (chunk.end - 1) // self.block_size >= self.max_blocks_per_req:
            raise ValueError(
                f"request {name!r} reaches position {chunk.end - 1}, beyond the block "
                f"table's {self.max_blocks_per_req} blocks of {self.block_size}"
            )
        return req.blocks if req is not None else []

    def _check_prefix_hit(self, chunk: ScheduledChunk, batch: Sequence[ScheduledChunk]) -> None:
        name, source_id = chunk.req_id, chunk.prefix_from
        if name in self._requests:
            raise ValueError(f"request {name!r} already exists: only a new request can start on a shared prefix")
        if chunk.start <= 0 or chunk.start % self.block_size:
            raise ValueError(
                f"request {name!r}: a shared prefix must end on a block boundary (a positive "
                f"multiple of block_size {self.block_size}), got start {chunk.start}"
            )
        in_step = [c for c in batch if c.req_id == source_id]
        if in_step and in_step[0].prefix_from is not None:
            raise ValueError(f"request {name!r}: its prefix source {source_id!r} is itself a new prefix hit")
        source = self._requests.get(source_id)
        if source is None and not in_step:
            raise ValueError(f"request {name!r}: unknown prefix source {source_id!r}")
        written = source.written if source is not None else 0
        source_start = source.min_start if source is not None else 0
        if in_step:
            written = max(written, in_step[0].end)
            source_start = in_step[0].start
        if written < chunk.start:
            raise ValueError(
                f"request {name!r}: prefix source {source_id!r} holds positions up to {written}, "
                f"fewer than the {chunk.start} shared"
            )
        if self.first_needed_block(source_start) > self.first_needed_block(chunk.start):
            raise ValueError(
                f"request {name!r}: prefix source {source_id!r} has already freed blocks that "
                f"position {chunk.start} still reads (its window moved past them)"
            )

    def _free_behind_window(self, chunk: ScheduledChunk) -> None:
        """Return the blocks wholly behind the chunk's window; their entries go null."""
        req = self._requests.get(chunk.req_id)
        if req is None:
            return
        for logical in range(min(self.first_needed_block(chunk.start), len(req.blocks))):
            if req.blocks[logical] != self.null_block:
                self.allocator.free(req.blocks[logical])
                req.blocks[logical] = self.null_block

    def _share_prefix(self, chunk: ScheduledChunk) -> None:
        """Start a new request on its source's blocks of positions ``[0, start)`` still
        in its window (those behind it stay null)."""
        assert chunk.prefix_from is not None
        source = self._requests[chunk.prefix_from]
        first_live = self.first_needed_block(chunk.start)
        shared = range(first_live, chunk.start // self.block_size)
        blocks = [self.null_block] * first_live + [self.allocator.share(source.blocks[b]) for b in shared]
        self._requests[chunk.req_id] = _Request(blocks=blocks, written=chunk.start)

    def _allocate(self, chunk: ScheduledChunk) -> None:
        """Give the chunk a block for every block it writes that has none."""
        req = self._requests.setdefault(chunk.req_id, _Request())
        last_block = (chunk.end - 1) // self.block_size
        req.blocks.extend([self.null_block] * (last_block + 1 - len(req.blocks)))
        for logical in range(chunk.start // self.block_size, last_block + 1):
            if req.blocks[logical] == self.null_block:
                req.blocks[logical] = self.allocator.allocate()

    def _lay_out(self, chunks: Sequence[ScheduledChunk]) -> StepLayout:
        """Positions, slots and rows of the placed chunks, in batch order; advance each
        request's written / minimum start."""
        positions: list[int] = []
        slots: list[int] = []
        query_start_loc = [0]
        token_slices: dict[Hashable, slice] = {}
        rows: list[list[int]] = []
        for chunk in chunks:
            req = self._requests[chunk.req_id]
            for pos in range(chunk.start, chunk.end):
                positions.append(pos)
                slots.append(slot_of(pos, req.blocks, self.block_size))
            req.written = max(req.written, chunk.end)
            req.min_start = chunk.start
            token_slices[chunk.req_id] = slice(query_start_loc[-1], query_start_loc[-1] + chunk.num_tokens)
            query_start_loc.append(query_start_loc[-1] + chunk.num_tokens)
            rows.append(list(req.blocks))
        return StepLayout([c.req_id for c in chunks], positions, slots, query_start_loc, rows, token_slices)

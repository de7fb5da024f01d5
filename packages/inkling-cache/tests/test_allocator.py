"""Block allocation: the allocator against a reference-count model, the block tables
against the paging rules over random schedules (prefix hits, rewinds, preemption)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from inkling_cache import (
    BlockAllocator,
    BlockTables,
    OutOfBlocksError,
    ScheduledChunk,
    first_live_block,
    slot_of,
)

# ----------------------------------------------------------------------------- allocator


def test_allocator_never_hands_out_the_null_block() -> None:
    alloc = BlockAllocator(4)
    assert sorted(alloc.allocate() for _ in range(3)) == [1, 2, 3] and alloc.num_free == 0
    with pytest.raises(OutOfBlocksError, match="all 3 blocks are in use"):
        alloc.allocate()
    alloc.free(2)
    assert alloc.allocate() == 2
    with pytest.raises(ValueError, match="not allocated"):
        alloc.free(0)
    other = BlockAllocator(3, null_block=2)
    assert sorted(other.allocate() for _ in range(2)) == [0, 1]


@pytest.mark.parametrize(("num_blocks", "null"), [(1, 0), (True, 0), (4, 4), (4, -1), (4, True), (4, 1.0)])
def test_allocator_arguments(num_blocks: int, null: int) -> None:
    with pytest.raises(ValueError):
        BlockAllocator(num_blocks, null_block=null)


class AllocatorMachine(RuleBasedStateMachine):
    """Any sequence of allocate / share / free keeps the allocator equal to a plain
    reference count, and frees a block exactly when its last holder lets go."""

    def __init__(self) -> None:
        super().__init__()
        self.alloc = BlockAllocator(6)
        self.refs: Counter[int] = Counter()

    @rule()
    def allocate(self) -> None:
        if self.alloc.num_free == 0:
            with pytest.raises(OutOfBlocksError):
                self.alloc.allocate()
            return
        block = self.alloc.allocate()
        assert block != 0 and self.refs[block] == 0
        self.refs[block] = 1

    @precondition(lambda self: bool(self.refs))
    @rule(data=st.data())
    def share(self, data: st.DataObject) -> None:
        block = data.draw(st.sampled_from(sorted(self.refs)))
        assert self.alloc.share(block) == block
        self.refs[block] += 1

    @precondition(lambda self: bool(self.refs))
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        block = data.draw(st.sampled_from(sorted(self.refs)))
        self.alloc.free(block)
        self.refs[block] -= 1
        if not self.refs[block]:
            del self.refs[block]

    @rule(block=st.integers(0, 5))
    def free_or_share_an_unheld_block_fails(self, block: int) -> None:
        if block not in self.refs:
            with pytest.raises(ValueError):
                self.alloc.free(block)
            with pytest.raises(ValueError):
                self.alloc.share(block)

    @invariant()
    def matches_the_model(self) -> None:
        assert self.alloc.num_used == len(self.refs)
        assert self.alloc.num_free == 5 - len(self.refs)
        for block in range(6):
            assert self.alloc.ref_count(block) == self.refs[block]


TestAllocatorMachine = AllocatorMachine.TestCase
TestAllocatorMachine.settings = settings(max_examples=60, stateful_step_count=30)

# ----------------------------------------------------------------------------- block tables


def snapshot(tables: BlockTables) -> tuple[object, ...]:
    rows = {r: tables.block_table_row(r) for r in tables.request_ids}
    written = {r: tables.num_written(r) for r in tables.request_ids}
    refs = [tables.allocator.ref_count(b) for b in range(tables.allocator.num_blocks)]
    return rows, written, refs, tables.num_free_blocks


def check_tables(tables: BlockTables) -> None:
    """Reference counts equal the rows holding each block; free + held = the pool."""
    held: Counter[int] = Counter()
    for req in tables.request_ids:
        held.update(tables.live_blocks(req))
    assert tables.null_block not in held
    for block in range(tables.allocator.num_blocks):
        assert tables.allocator.ref_count(block) == held[block]
    assert tables.num_free_blocks + len(held) == tables.allocator.num_blocks - 1


@st.composite
def schedules(draw: st.DrawFn) -> tuple[int, int, int, list[list[tuple[str, int, int, str | None, bool]]]]:
    """(block_size, window, num_blocks, steps); a step lists (req, rewind, tokens,
    prefix source, preempt-after) choices that the test turns into chunks."""
    block = draw(st.integers(1, 6))
    window = draw(st.integers(1, 7))
    num_blocks = draw(st.integers(4, 40))
    step = st.lists(
        st.tuples(
            st.sampled_from("abcde"),
            st.integers(0, 3),
            st.integers(1, 9),
            st.none() | st.sampled_from("abcde"),
            st.booleans(),
        ),
        min_size=1,
        max_size=4,
        unique_by=lambda t: t[0],
    )
    return block, window, num_blocks, draw(st.lists(step, min_size=1, max_size=14))


@given(schedules())
def test_random_schedules_keep_the_paging_rules(
    case: tuple[int, int, int, list[list[tuple[str, int, int, str | None, bool]]]],
) -> None:
    block, window, num_blocks, steps = case
    tables = BlockTables(num_blocks, block, window, max_blocks_per_req=16)
    min_start: dict[Hashable, int] = {}
    for choices in steps:
        chunks = []
        for req, rewind, n, source, _ in choices:
            written = tables.num_written(req)
            if source is not None and source != req and not tables.has_request(req) and written == 0:
                # a prefix hit on whole blocks the source has written
                start = (tables.num_written(source) // block) * block
                chunks.append(ScheduledChunk(req, start, n, prefix_from=source))
            else:
                start = max(min_start.get(req, 0), written - rewind) if tables.has_request(req) else 0
                chunks.append(ScheduledChunk(req, start, n))
        before = snapshot(tables)
        try:
            layout = tables.schedule(chunks)
        except (ValueError, OutOfBlocksError):
            assert snapshot(tables) == before  # a refused step changes nothing
            continue
        assert layout.req_ids == [c.req_id for c in chunks]
        assert layout.query_start_loc[-1] == layout.num_tokens == sum(c.num_tokens for c in chunks)
        for chunk, row in zip(chunks, layout.block_table):
            assert row == tables.block_table_row(chunk.req_id)
            rows = layout.token_slices[chunk.req_id]
            assert layout.positions[rows] == list(range(chunk.start, chunk.end))
            assert layout.slot_mapping[rows] == [slot_of(p, row, block) for p in range(chunk.start, chunk.end)]
            # blocks wholly behind the window are freed, every block the chunk reads or writes is held
            first = first_live_block(chunk.start, window, block)
            assert all(b == tables.null_block for b in row[:first])
            assert all(b != tables.null_block for b in row[first:])
            assert len(row) == -(-tables.num_written(chunk.req_id) // block) >= (chunk.end - 1) // block + 1
            assert tables.num_written(chunk.req_id) >= chunk.end
            min_start[chunk.req_id] = chunk.start
        check_tables(tables)
        for req, *_, preempt in choices:
            if preempt and tables.has_request(req):
                tables.preempt(req)
                min_start.pop(req, None)
        check_tables(tables)
    for req in tables.request_ids:
        tables.finish(req)
    assert tables.num_free_blocks == num_blocks - 1


def test_step_errors_and_rewind_rules() -> None:
    tables = BlockTables(6, 4, 4, max_blocks_per_req=4)
    with pytest.raises(ValueError, match="at least one chunk"):
        tables.plan([])
    with pytest.raises(ValueError, match="must start at position 0"):
        tables.plan([("a", 3, 1)])
    tables.schedule([("a", 0, 6)])
    with pytest.raises(ValueError, match="appears twice"):
        tables.plan([("a", 6, 1), ("a", 7, 1)])
    with pytest.raises(ValueError, match="num_tokens must be >= 1"):
        tables.plan([("a", 6, 0)])
    with pytest.raises(ValueError, match=r"in \[0, 6\]"):
        tables.plan([("a", 7, 1)])
    tables.schedule([("a", 4, 3)])  # a speculative rewind onto written positions
    with pytest.raises(ValueError, match=r"in \[4, 7\]"):
        tables.plan([("a", 3, 1)])  # but not behind the last step's start
    with pytest.raises(ValueError, match="beyond the block table"):
        tables.plan([("a", 7, 10)])
    with pytest.raises(OutOfBlocksError, match="needs 4 new blocks but only 3"):
        tables.plan([("b", 0, 16)])
    stale = tables.plan([("b", 0, 4)])
    tables.preempt("a")
    with pytest.raises(ValueError, match="stale"):
        tables.apply(stale)
    assert tables.num_free_blocks == 5 and not tables.has_request("a")
    layout = tables.schedule([("b", 0, 16)])
    (row,) = layout.block_table
    assert sorted(row) == [1, 2, 3, 4] and layout.slot_mapping[:5] == [4 * row[0] + i for i in range(4)] + [4 * row[1]]
    with pytest.raises(KeyError):
        tables.finish("a")


def test_prefix_hits_share_blocks_even_from_the_same_step() -> None:
    tables = BlockTables(16, 4, 4)
    tables.schedule([("A", 0, 3)])
    # B starts at 8 on blocks A finishes computing in this very step (B listed first)
    layout = tables.schedule([ScheduledChunk("B", 8, 2, prefix_from="A"), ("A", 3, 9)])
    row_a, row_b = tables.block_table_row("A"), tables.block_table_row("B")
    assert layout.block_table == [row_b, row_a]
    assert row_b[1] == row_a[1] and tables.allocator.ref_count(row_a[1]) == 2
    assert row_b[0] == tables.null_block  # behind B's window: not shared
    assert row_b[2] not in row_a
    check_tables(tables)
    with pytest.raises(ValueError, match="block boundary"):
        tables.plan([ScheduledChunk("C", 6, 1, prefix_from="A")])
    with pytest.raises(ValueError, match="holds positions up to 12"):
        tables.plan([ScheduledChunk("C", 16, 1, prefix_from="A")])
    with pytest.raises(ValueError, match="unknown prefix source"):
        tables.plan([ScheduledChunk("C", 4, 1, prefix_from="Z")])
    with pytest.raises(ValueError, match="already exists"):
        tables.plan([ScheduledChunk("A", 4, 1, prefix_from="B")])
    with pytest.raises(ValueError, match="itself a new prefix hit"):
        tables.plan([ScheduledChunk("C", 4, 1, prefix_from="A"), ScheduledChunk("D", 4, 1, prefix_from="C")])
    with pytest.raises(ValueError, match="already freed"):
        tables.plan([("A", 12, 1), ScheduledChunk("C", 4, 1, prefix_from="A")])
    tables.finish("A")
    assert tables.live_blocks("B") == [b for b in row_b if b]
    check_tables(tables)


@pytest.mark.parametrize(
    ("args", "match"),
    [((8, 0, 4), "block_size"), ((8, 4, 0), "sliding_window"), ((1, 4, 4), "num_blocks")],
)
def test_tables_arguments(args: tuple[int, int, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        BlockTables(*args)


def test_blocks_freed_later_in_the_batch_serve_earlier_requests() -> None:
    """Every chunk frees before any allocates: the plan counts the blocks that "c"
    leaves behind as available, so "b" and "d" (listed before "c") get them. (Freeing
    chunk by chunk ran out of blocks half way through a step the plan had accepted.)"""
    tables = BlockTables(5, 1, 1)
    tables.schedule([("a", 0, 1), ("c", 0, 2)])
    assert tables.num_free_blocks == 1
    layout = tables.schedule([("a", 1, 1), ("b", 0, 1), ("d", 0, 1), ("c", 2, 1)])
    assert layout.num_tokens == 4 and tables.num_free_blocks == 0
    check_tables(tables)


def test_bools_are_not_ints() -> None:
    with pytest.raises(ValueError, match="null_block must be an int in \\[0, 4\\), got True"):
        BlockAllocator(4, null_block=True)
    with pytest.raises(ValueError, match="null_block must be an int"):
        BlockTables(8, 4, 4, null_block=True)
    with pytest.raises(ValueError, match="request 'a': num_tokens must be an int, got bool True"):
        ScheduledChunk("a", 0, True)
    with pytest.raises(ValueError, match="request 'a': start must be an int, got bool False"):
        ScheduledChunk("a", False, 1)
    with pytest.raises(ValueError, match="request 'a': start must be >= 0, got -1"):
        ScheduledChunk("a", -1, 1)
    tables = BlockTables(8, 4, 4)
    with pytest.raises(ValueError, match="num_tokens must be an int, got bool True"):
        tables.plan([("a", 0, True)])
    assert tables.request_ids == [] and tables.num_free_blocks == 7


def test_apply_needs_a_step_plan() -> None:
    tables = BlockTables(8, 4, 4)
    with pytest.raises(TypeError, match=r"plan must be the StepPlan that BlockTables.plan\(\) returned, got NoneType"):
        tables.apply(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got list"):
        tables.apply([("a", 0, 4)])  # type: ignore[arg-type]
    assert tables.apply(tables.plan([("a", 0, 4)])).num_tokens == 4

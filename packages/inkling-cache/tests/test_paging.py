"""Paging math against brute-force references."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inkling_cache import (
    PageSpec,
    admission_reserve_blocks,
    blocks_for_tokens,
    cdiv,
    first_live_block,
    freed_blocks,
    live_blocks,
    slot_of,
    slot_to_block_row,
    steady_state_blocks,
    unify_page_sizes,
)


def needed_blocks_ref(n: int, new: int, window: int, block: int) -> set[int]:
    """Blocks holding the positions the next `new` tokens read or write."""
    return {p // block for p in range(max(0, n - window + 1), n + new)}


# ----------------------------------------------------------------------------- addressing


@given(st.integers(1, 64), st.lists(st.integers(0, 10_000), min_size=1, max_size=40, unique=True),
       st.data())
def test_slot_round_trips(block: int, row: list[int], data: st.DataObject) -> None:
    p = data.draw(st.integers(0, block * len(row) - 1))
    slot = slot_of(p, row, block)
    phys, r = slot_to_block_row(slot, block)
    assert phys == row[p // block] and r == p % block
    assert phys * block + r == slot
    # a different position in the same request maps to a different slot (rows are unique)
    q = data.draw(st.integers(0, block * len(row) - 1))
    assert (slot_of(q, row, block) == slot) == (q == p)


def test_slot_examples_and_errors() -> None:
    assert slot_of(0, [7], 4) == 28
    assert slot_of(5, [7, 2], 4) == 9
    assert slot_to_block_row(9, 4) == (2, 1)
    with pytest.raises(ValueError, match="needs block-table entry 2"):
        slot_of(8, [7, 2], 4)
    with pytest.raises(ValueError, match="position"):
        slot_of(-1, [7], 4)
    with pytest.raises(ValueError, match="slot"):
        slot_to_block_row(-1, 4)
    with pytest.raises(ValueError, match="block_table_row"):
        slot_of(0, [-1], 4)


# ----------------------------------------------------------------------------- lifetime


@given(st.integers(0, 5000), st.integers(0, 600), st.integers(1, 600), st.integers(1, 64))
def test_live_and_freed_blocks_match_reference(n: int, new: int, window: int, block: int) -> None:
    live = live_blocks(n, new, window, block)
    if new:
        assert set(live) == needed_blocks_ref(n, new, window, block)
    freed = freed_blocks(n, window, block)
    assert freed.stop == live.start == first_live_block(n, window, block)
    # a freed block holds only positions older than the window of the next token
    for b in (freed.stop - 1,) if freed else ():
        assert (b + 1) * block - 1 < n - window + 1


@given(st.integers(1, 64), st.integers(1, 64), st.integers(1, 8))
def test_steady_state_is_the_worst_decode_step(window: int, block: int, new: int) -> None:
    worst = max(len(needed_blocks_ref(n, new, window, block)) for n in range(window + 3 * block))
    assert steady_state_blocks(window, block, new) == worst


def test_conv_state_holds_at_most_two_blocks() -> None:
    for block in (4, 8, 16, 32, 64, 128):
        assert steady_state_blocks(4, block) == 2
    assert steady_state_blocks(512, 16) == 33


@given(st.integers(1, 600), st.integers(1, 64), st.integers(1, 3000), st.integers(1, 5000),
       st.integers(0, 64))
def test_admission_reserve_covers_every_step(
    window: int, block: int, batched: int, max_len: int, extra: int
) -> None:
    reserve = admission_reserve_blocks(window, block, batched, max_len, extra)
    tokens = min(window - 1 + extra + batched, max_len)
    assert reserve == -(-tokens // block) + 1
    # no step (any chunk <= batched, positions < max_len) needs more than the reserve
    n_values = {0, max(0, max_len - batched), max(0, max_len - 1)} | set(range(0, 2 * block))
    for n in n_values:
        new = min(batched, max_len - n)
        if new > 0:
            assert len(needed_blocks_ref(n, new, window + extra, block)) <= reserve


def test_admission_reserve_vllm_example() -> None:
    # vLLM's comment: block 4, a window [CDEF] spilling over [XXCD][EF] needs 2 blocks.
    assert admission_reserve_blocks(sliding_window=3, block_size=4, max_num_batched_tokens=1,
                                    max_model_len=100) == 2
    # Inkling conv at vLLM defaults: 3 + 8192 tokens over blocks of 4 -> 2049 + 1
    assert admission_reserve_blocks(4, 4, 8192, 131072) == 2050
    assert admission_reserve_blocks(4, 4, 8192, 100) == 26
    assert blocks_for_tokens(0, 4) == 0 and blocks_for_tokens(9, 4) == 3


def test_lifetime_argument_errors() -> None:
    with pytest.raises(ValueError):
        admission_reserve_blocks(4, 0, 8192, 100)
    with pytest.raises(ValueError):
        live_blocks(0, -1, 4, 4)
    with pytest.raises(TypeError):
        first_live_block(1.5, 4, 4)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- unification

page_specs = st.lists(
    st.builds(PageSpec, st.just("x"), st.integers(1, 64), st.sampled_from([1, 2, 3, 4, 8, 12, 16])
              .flatmap(lambda k: st.sampled_from([k, 2 * k, 4 * k, 64 * k]))),
    min_size=1, max_size=6,
)


@given(page_specs, st.booleans())
def test_unification_equalizes_pages(specs: list[PageSpec], pad: bool) -> None:
    largest = max(s.page_bytes for s in specs)
    divisible = all(largest % s.page_bytes == 0 for s in specs)
    if not divisible and not pad:
        with pytest.raises(ValueError, match="does not divide the largest page"):
            unify_page_sizes(specs)
        return
    out = unify_page_sizes(specs, pad=pad)
    assert len(out) == len(specs)
    assert {u.physical_page_bytes for u in out} == {largest}
    for spec, u in zip(specs, out):
        assert isinstance(u.block_size, int) and u.block_size >= spec.block_size
        assert u.page_bytes == u.block_size * spec.bytes_per_token
        assert u.original_page_bytes == spec.page_bytes
        if largest % spec.page_bytes == 0:
            assert not u.padded and u.page_bytes == largest
            assert u.block_size == spec.block_size * (largest // spec.page_bytes)
        else:
            assert u.padded and u.block_size == spec.block_size
            assert 0 < u.padding_bytes < largest


def test_unification_examples() -> None:
    out = unify_page_sizes([PageSpec("a", 4, 100), PageSpec("b", 16, 50), PageSpec("c", 2, 400)])
    assert [(u.block_size, u.scale) for u in out] == [(8, 2), (16, 1), (2, 1)]
    with pytest.raises(ValueError, match="'b'.*does not divide.*'a'"):
        unify_page_sizes([PageSpec("a", 3, 100), PageSpec("b", 2, 100)])
    with pytest.raises(ValueError):
        unify_page_sizes([])
    with pytest.raises(ValueError):
        PageSpec("a", 0, 1)


# ----------------------------------------------------------------------------- conv pages without padding


def _unpadded_page_ref(rows: list[int], pages: list[int], min_rows: int) -> int:
    """Brute force: the smallest P that every row size and page divides, holds at least
    min_rows of every conv row, and is a power-of-two multiple of the least such P."""
    base = next(p for p in range(1, 10**9) if all(p % b == 0 for b in (*rows, *pages)))
    scale = 1
    while any(base * scale < min_rows * r for r in rows):
        scale *= 2
    return base * scale


@given(
    rows=st.lists(st.sampled_from([96, 128, 192, 256, 384, 448, 512, 1792 * 2, 2048]), min_size=1, max_size=3),
    pages=st.lists(st.sampled_from([1024, 2048, 4096, 8192, 6144]), max_size=3),
    min_rows=st.integers(1, 5),
)
def test_conv_page_without_padding_matches_brute_force(rows: list[int], pages: list[int], min_rows: int) -> None:
    from inkling_cache import conv_page_without_padding

    page = conv_page_without_padding(rows, pages, min_rows)
    assert page == _unpadded_page_ref(rows, pages, min_rows)
    # every conv group declares page // row rows; vLLM's rule (largest wins, the rest
    # divide it) then unifies every page with nothing padded
    specs = [PageSpec(f"conv{i}", page // r, r) for i, r in enumerate(rows)]
    specs += [PageSpec(f"attn{i}", 1, p) for i, p in enumerate(pages)]
    unified = unify_page_sizes(specs)
    assert {u.physical_page_bytes for u in unified} == {page}
    assert not any(u.padded for u in unified)
    assert all(page // r >= min_rows for r in rows)


def test_conv_page_without_padding_unpadded_975b_head() -> None:
    from inkling_cache import conv_page_without_padding

    # 975B global layer at TP 8, bf16: one KV head, D = 128 + 128 + 2 * 6144 / 8 = 1792
    # unpadded (7 * 256) against a 16-token attention page of 1 head x 256 x 2 bytes
    row, attn = 1 * 1792 * 2, 16 * 1 * 256 * 2
    page = conv_page_without_padding([row], [attn], 3)
    assert page == 7 * attn and page // row == 16  # 16 rows per conv block, attention x7
    # with D padded to 2048 the conv page stays a power of two: 4 rows, attention x2
    padded = conv_page_without_padding([1 * 2048 * 2], [attn], 3)
    assert padded == 2 * attn and padded // (2048 * 2) == 4


@pytest.mark.parametrize(
    "args,error",
    [
        (([], [1024], 3), ValueError),
        (([0], [1024], 3), ValueError),
        (([256], [0], 3), ValueError),
        (([256], [1024], 0), ValueError),
        (([256.0], [1024], 3), TypeError),
    ],
)
def test_conv_page_without_padding_rejects(args: tuple, error: type[Exception]) -> None:
    from inkling_cache import conv_page_without_padding

    with pytest.raises(error):
        conv_page_without_padding(*args)


# ----------------------------------------------------------------------------- argument checks


def test_cdiv_rejects_what_it_is_not_defined_for() -> None:
    assert [cdiv(a, 4) for a in (0, 1, 4, 5)] == [0, 1, 1, 2]
    with pytest.raises(ValueError, match="divisor b must be >= 1, got 0"):
        cdiv(3, 0)
    with pytest.raises(ValueError, match="divisor b must be >= 1, got -2"):
        cdiv(3, -2)
    with pytest.raises(ValueError, match="dividend a must be >= 0, got -1"):
        cdiv(-1, 2)
    with pytest.raises(TypeError, match="divisor b must be an int"):
        cdiv(3, True)
    with pytest.raises(TypeError, match="dividend a must be an int"):
        cdiv(3.0, 2)  # type: ignore[arg-type]


def test_unify_page_sizes_needs_page_specs() -> None:
    spec = {"name": "a", "block_size": 4, "bytes_per_token": 100}
    with pytest.raises(TypeError, match=r"specs\[1\] must be a PageSpec, got dict.*PageSpec\(name, block_size"):
        unify_page_sizes([PageSpec("a", 4, 100), spec])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="specs must be a list of PageSpec, got PageSpec"):
        unify_page_sizes(PageSpec("a", 4, 100))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="specs must be a list of PageSpec, got int"):
        unify_page_sizes(3)  # type: ignore[arg-type]
    # any iterable of specs works, a generator included
    gen = (PageSpec(n, 4, b) for n, b in (("a", 100), ("b", 50)))
    assert [u.block_size for u in unify_page_sizes(gen)] == [4, 8]

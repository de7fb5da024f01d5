"""sconv_tap_map: the Triton kernels (interpreted) against the reference map, and
fused_sconv with a map against the reference op on adversarial metadata: blocks shared
between requests at any alignment, so that pre-forward taps name slots that other rows
of the same call write (the same-step hazard at any alignment)."""

from __future__ import annotations

import random

import pytest
import torch

from _sconv_world import TOL, bits
from inkling_kernels import SconvBatch, fused_sconv, fused_sconv_ref, sconv_tap_map, sconv_tap_map_ref


def _adversarial(seed: int, *, block_size: int, kernel_size: int, num_blocks: int = 24,
                 num_reqs: int = 6, pad: int = 2) -> dict[str, torch.Tensor]:
    """Random requests whose block tables draw from a small shared pool; written slots
    are kept unique (a later duplicate becomes a pad row, slot -1)."""
    rng = random.Random(seed)
    n = block_size
    positions, seq_idx, slots, qstart = [], [], [], []
    tables = []
    written: set[int] = set()
    for r in range(num_reqs):
        p0 = rng.randint(0, 5 * n)
        count = rng.choice([1, 1, 2, 3, rng.randint(1, 3 * n)])
        blocks = [rng.randrange(num_blocks + 2) for _ in range((p0 + count) // n + 1)]  # may exceed the cache
        tables.append(blocks)
        row0 = len(positions)
        for p in range(p0, p0 + count):
            slot = blocks[p // n] * n + p % n
            if slot in written:
                slot = -1
            else:
                written.add(slot)
            positions.append(p)
            seq_idx.append(r)
            slots.append(slot)
            qstart.append(row0)
    for _ in range(pad):
        positions.append(0)
        seq_idx.append(0)
        slots.append(-1)
        qstart.append(0)
    width = max(len(t) for t in tables)
    table = torch.zeros(num_reqs, width, dtype=torch.int32)
    for r, t in enumerate(tables):
        table[r, : len(t)] = torch.tensor(t, dtype=torch.int32)
    return dict(
        positions=torch.tensor(positions, dtype=torch.int64),
        block_table=table,
        seq_idx=torch.tensor(seq_idx, dtype=torch.int32),
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        query_start=torch.tensor(qstart, dtype=torch.int32),
    )


def _batch(m: dict[str, torch.Tensor], block_size: int, kernel_size: int | None) -> SconvBatch:
    return SconvBatch(**m, block_size=block_size, kernel_size=kernel_size)


@pytest.mark.parametrize("tiles", [None, (256, 32, 32), (16, 8, 16)], ids=["default", "wide", "narrow"])
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("block_size,kernel_size", [(4, 4), (1, 4), (8, 3), (16, 5), (4, 2)])
def test_map_matches_reference(seed: int, block_size: int, kernel_size: int, tiles: tuple | None,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Also with the long-batch key tiles and with small tiles and spans (several
    programs per key tile and per span), forced on these short batches."""
    from inkling_kernels.tap_map import kernel as tap_map_module
    from inkling_kernels.tap_map.kernel import sconv_tap_map_triton

    if tiles is not None:
        monkeypatch.setattr(tap_map_module, "hazard_tiles", lambda num_tokens: tiles)

    m = _adversarial(seed, block_size=block_size, kernel_size=kernel_size)
    rows = m["positions"].shape[0]
    got = torch.full((rows + 3, kernel_size - 1), 777, dtype=torch.int64)
    want = got.clone()
    batch = _batch(m, block_size, kernel_size)
    mapped = sconv_tap_map_triton(batch, got)
    sconv_tap_map_ref(batch, want)
    assert torch.equal(got, want)
    assert bool((got[rows:] == 777).all())
    assert mapped.tap_map is not None and mapped.tap_map.shape[0] == rows and batch.tap_map is None
    # The CPU op is the reference.
    via_op = torch.full_like(got, 777)
    sconv_tap_map(batch, via_op)
    assert torch.equal(via_op, want)


def test_map_codes_by_hand() -> None:
    """Row 0: request 1 at position 4; rows 1-3: request 0 at positions 5..7 (N 4,
    W 4; request 0's blocks are physical 3 and 7). Every code kind appears."""
    n, w = 4, 4
    table = torch.tensor([[3, 7], [9, 1]], dtype=torch.int32)
    positions = torch.tensor([4, 5, 6, 7], dtype=torch.int64)
    seq_idx = torch.tensor([1, 0, 0, 0], dtype=torch.int32)
    query_start = torch.tensor([0, 1, 1, 1], dtype=torch.int32)
    slot_mapping = torch.tensor([13, 29, 30, 31], dtype=torch.int64)  # slot 13: no tap reads it
    out = torch.empty(4, w - 1, dtype=torch.int64)

    def build(slots: torch.Tensor) -> None:
        sconv_tap_map_ref(SconvBatch(positions, table, seq_idx, slots, query_start, n, w), out)

    build(slot_mapping)
    # row 1 (position 5): taps at 4 (slot 7*4+0 = 28), 3 (3*4+3 = 15), 2 (3*4+2 = 14)
    assert out[1].tolist() == [28, 15, 14]
    # row 2 (position 6): tap 5 is row 1 (in forward), 4 and 3 from the cache
    assert out[2].tolist() == [-(1 + 2), 28, 15]
    # row 0 (request 1, position 4): taps 3, 2, 1 in its block 0 = physical 9
    assert out[0].tolist() == [9 * 4 + 3, 9 * 4 + 2, 9 * 4 + 1]
    # Row 0 now writes slot 14 = request 0's position 2: a same-step hit, unaligned.
    slot_mapping2 = torch.tensor([14, 29, 30, 31], dtype=torch.int64)
    build(slot_mapping2)
    assert out[1].tolist() == [28, 15, 14 + ((0 + 1) << 32)]  # position 2 is written by row 0
    assert out[3].tolist() == [-(2 + 2), -(1 + 2), 28]


# (block_t, block_c, warps, scan): rows spread over programs; the map-less scan as one
# chunk sized to T (the default scan exceeds these batches), as several 8-slot chunks,
# and tiles of two / four whole heads (block_c > stream width 8).
ADVERSARIAL_CONFIGS = [(2, 8, 1, 0), (2, 8, 1, 8), (1, 16, 1, 0), (4, 32, 1, 0)]


@pytest.mark.parametrize("tiles", ADVERSARIAL_CONFIGS, ids=["one-chunk", "chunked-scan", "2-heads", "4-heads"])
@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fused_with_map_adversarial(seed: int, dtype: torch.dtype, tiles: tuple[int, int, int, int],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """fused_sconv (Triton, interpreted), with the map and without it, == the
    reference op, for any same-step hit (block-aligned or not)."""
    from inkling_kernels.sconv.kernel import SconvConfig, fused_sconv_triton
    from inkling_kernels.tap_map.kernel import sconv_tap_map_triton

    n, w, heads, width, dim = 4, 4, 2, 8, 16
    m = _adversarial(seed + 100, block_size=n, kernel_size=w, num_blocks=24)
    rows = m["positions"].shape[0]
    gen = torch.Generator().manual_seed(seed)
    cache = torch.randn(24, heads, n, dim, generator=gen).to(dtype)
    x = torch.randn(rows, heads * width, generator=gen).to(dtype)
    weight = torch.randn(heads * width, w, generator=gen)
    batch = _batch(m, n, w)
    mapped = sconv_tap_map_triton(batch, torch.empty(rows, w - 1, dtype=torch.int64))
    ref_cache = cache.clone()
    ref = fused_sconv_ref(x, weight, ref_cache, batch, 4, width, activation="silu")
    cfg = SconvConfig(block_t=tiles[0], block_c=tiles[1], num_warps=tiles[2])
    if tiles[3]:
        import inkling_kernels.sconv.kernel as K

        monkeypatch.setattr(K, "_scan_chunk", lambda cfg, taps_p2: tiles[3])
    for b in (mapped, batch):
        out = torch.full_like(x, float("nan"))
        tri_cache = cache.clone()
        fused_sconv_triton(x, weight, tri_cache, b, 4, width, activation="silu", config=cfg, out=out)
        torch.testing.assert_close(out, ref, **TOL[dtype])
        assert torch.equal(bits(tri_cache), bits(ref_cache))
    # The public op on CPU ignores the map and runs the reference.
    again = fused_sconv(x, weight, ref_cache.clone(), mapped, 4, width, activation="silu")
    torch.testing.assert_close(again, ref, rtol=0, atol=0)


def test_adversarial_traces_contain_unaligned_hazards() -> None:
    """The generator above does produce same-step hits, some not block-aligned."""
    n, w = 4, 4
    unaligned = total = 0
    for seed in range(100, 105):
        m = _adversarial(seed, block_size=n, kernel_size=w)
        tap_map = torch.empty(m["positions"].shape[0], w - 1, dtype=torch.int64)
        sconv_tap_map_ref(_batch(m, n, w), tap_map)
        hit = (tap_map >= 0) & ((tap_map >> 32) > 0)
        total += int(hit.sum())
        rows = torch.arange(tap_map.shape[0])
        p0 = m["positions"] - (rows - m["query_start"].long())
        unaligned += int((hit & (p0 % n != 0)[:, None]).sum())
    assert total > 0 and unaligned > 0


def test_tap_map_validation() -> None:
    m = _adversarial(0, block_size=4, kernel_size=4)
    rows = m["positions"].shape[0]
    batch = _batch(m, 4, 4)
    good = torch.empty(rows, 3, dtype=torch.int64)
    with pytest.raises(ValueError, match="W-1"):
        sconv_tap_map(batch, torch.empty(rows, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match=">= "):
        sconv_tap_map(batch, torch.empty(rows - 1, 3, dtype=torch.int64))
    with pytest.raises(TypeError, match="int64"):
        sconv_tap_map(batch, good.to(torch.int32))
    with pytest.raises(ValueError, match="contiguous"):
        sconv_tap_map(batch, torch.empty(3, rows, dtype=torch.int64).t())
    with pytest.raises(ValueError, match="kernel_size"):
        sconv_tap_map(_batch(m, 4, None), good)
    with pytest.raises(TypeError, match="SconvBatch"):
        sconv_tap_map(m, good)  # type: ignore[arg-type]
    # The batch checks itself when built.
    with pytest.raises(ValueError, match="kernel_size"):
        _batch(m, 4, 1)
    with pytest.raises(ValueError, match="block_size"):
        _batch(m, 0, 4)
    with pytest.raises(ValueError, match="seq_idx"):
        _batch(dict(m, seq_idx=m["seq_idx"][:-1]), 4, 4)
    with pytest.raises(ValueError, match="tap_map"):
        SconvBatch(**m, block_size=4, kernel_size=4, tap_map=torch.empty(rows, 4, dtype=torch.int64))
    with pytest.raises(TypeError, match="tap_map"):
        SconvBatch(**m, block_size=4, kernel_size=4, tap_map=good.float())
    with pytest.raises(ValueError, match="kernel_size"):
        SconvBatch(**m, block_size=4, tap_map=good)
    # fused_sconv checks the weight's W against the batch's
    cache = torch.zeros(30, 2, 4, 16)
    x = torch.zeros(rows, 16)
    with pytest.raises(ValueError, match="kernel_size"):
        fused_sconv(x, torch.zeros(16, 3), cache, batch, 0, 8)


def test_huge_slots_never_match() -> None:
    """A slot_mapping entry of 2**32 + s (outside any cache; equal to s in its low 32
    bits) is no writer of slot s, and a block-table entry whose slot would reach 2**31
    gives no tap."""
    from inkling_kernels.tap_map.kernel import sconv_tap_map_triton

    n, w = 4, 4
    table = torch.tensor([[2, 3], [2**29, 5]], dtype=torch.int32)
    positions = torch.tensor([4, 5, 4], dtype=torch.int64)
    seq_idx = torch.tensor([0, 0, 1], dtype=torch.int32)
    query_start = torch.tensor([0, 0, 2], dtype=torch.int32)
    slot_mapping = torch.tensor([12, 13, 2**32 + 11], dtype=torch.int64)  # low bits = slot 11 (row 0's tap)
    got = torch.empty(3, w - 1, dtype=torch.int64)
    want = torch.empty_like(got)
    batch = SconvBatch(positions, table, seq_idx, slot_mapping, query_start, n, w)
    sconv_tap_map_triton(batch, got)
    sconv_tap_map_ref(batch, want)
    assert torch.equal(got, want)
    assert got[0].tolist() == [11, 10, 9]  # no writer
    assert got[2].tolist() == [-1, -1, -1]  # block 2**29 * 4 + 3 >= 2**31: no tap

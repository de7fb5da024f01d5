"""The step's tap map: built by SconvMetadataBuilder / PagedConvRuntime, carried by
SconvMetadata and handed by the conv layers to every fused_sconv launch.

On CPU fused_sconv ignores the map (the reference resolves every tap itself), so
these tests check that the map equals ``inkling_kernels.sconv_tap_map_ref`` of the
same metadata, that the layers pass it on (a spy on ``fused_sconv``), and that the
results with a map equal those without.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

import inkling_model.sconv as sconv_module
from inkling_cache import ConvStateLayout, Stream
from inkling_kernels import causal_conv_ref, sconv_tap_map_ref
from inkling_model import (
    ConvStateOwner,
    InklingShortConv,
    PagedConvRuntime,
    ScheduledChunk,
    SconvMetadata,
    SconvMetadataBuilder,
    forward_metadata,
)
from model_test_driver import Feed, run_schedule


def make_layout(kernel_size: int = 4) -> ConvStateLayout:
    return ConvStateLayout.build(num_kv_heads=4, head_dim=8, hidden_size=32, kernel_size=kernel_size)


def reference_map(meta: SconvMetadata, positions: torch.Tensor, kernel_size: int) -> torch.Tensor:
    """sconv_tap_map_ref of exactly ``meta`` (pad rows included)."""
    assert torch.equal(meta.positions, positions[: meta.num_tokens])
    out = torch.full((meta.num_tokens, kernel_size - 1), -99, dtype=torch.int64)
    sconv_tap_map_ref(meta._replace_unchecked(tap_map=None), out)
    return out


def random_batch(rng: random.Random, block_size: int, max_blocks: int = 8):
    """A batch of requests at random starts (consecutive positions), pad rows with
    garbage positions, slots from a random block table."""
    lens = [rng.randint(1, 9) for _ in range(rng.randint(1, 5))]
    starts = [rng.randint(0, block_size * max_blocks - n) for n in lens]
    actual = sum(lens)
    padded = actual + rng.randint(0, 4)
    table = torch.tensor(
        [rng.sample(range(1, 60), max_blocks) for _ in lens], dtype=torch.int32
    )
    qsl = [0]
    positions, slots = [], []
    for r, (n, s) in enumerate(zip(lens, starts)):
        qsl.append(qsl[-1] + n)
        for p in range(s, s + n):
            positions.append(p)
            slots.append(int(table[r, p // block_size]) * block_size + p % block_size)
    positions += [rng.randint(0, 1000) for _ in range(padded - actual)]  # pad rows: any value
    slots += [-1] * (padded - actual)
    return (
        torch.tensor(qsl, dtype=torch.int32),
        torch.tensor(slots, dtype=torch.int64),
        table,
        len(lens),
        actual,
        padded,
        torch.tensor(positions, dtype=torch.int64),
    )


# --- the builder -------------------------------------------------------------------
@pytest.mark.parametrize("kernel_size", [2, 4, 6])
@pytest.mark.parametrize("block_size", [4, 16])
def test_builder_map_equals_the_reference_in_a_persistent_buffer(kernel_size, block_size):
    rng = random.Random(kernel_size * 100 + block_size)
    builder = SconvMetadataBuilder(64, kernel_size=kernel_size, tap_map=True)
    assert builder.builds_tap_map and builder.tap_map_buffer is not None
    assert builder.tap_map_buffer.shape == (64, kernel_size - 1)
    ptr = builder.tap_map_buffer.data_ptr()
    seen_rows = seen_slots = False
    for i in range(6):
        qsl, slots, table, num_reqs, actual, padded, positions = random_batch(rng, block_size)
        # Stale contents of a previous step must not survive in the rows of this one.
        builder.tap_map_buffer.fill_(77)
        meta = builder.build(qsl, slots, table, num_reqs, actual, padded, block_size=block_size, positions=positions)
        assert meta.tap_map is not None
        assert meta.tap_map.shape == (padded, kernel_size - 1) and meta.tap_map.dtype == torch.int64
        assert meta.tap_map.data_ptr() == ptr
        want = reference_map(meta, positions, kernel_size)
        assert torch.equal(meta.tap_map, want)
        assert not (meta.tap_map == 77).any()
        seen_rows |= bool((want <= -2).any())
        seen_slots |= bool((want >= 0).any())
    # The maps are not trivial: they name rows of x and cache slots.
    assert seen_rows and seen_slots


def test_builder_map_sees_same_step_writers_and_survives_two_builds():
    """Through the runtime: a prefix hit on blocks written in the same step (the map
    names the writer row), then a second step: same buffer, new contents."""
    runtime = PagedConvRuntime(32, 4, 4, max_num_tokens=64, max_blocks_per_req=16, tap_map=True)
    step = runtime.step([("A", 0, 3)], pad_to=5)
    first = step.metadata.tap_map
    assert first is not None and first.shape == (5, 3)
    assert torch.equal(first, reference_map(step.metadata, step.positions, 4))
    ptr = first.data_ptr()
    step = runtime.step([ScheduledChunk("B", 8, 4, prefix_from="A"), ("A", 3, 10)], pad_to=16)
    second = step.metadata.tap_map
    assert second is not None and second.shape == (16, 3)
    assert second.data_ptr() == ptr == runtime.builder.tap_map_buffer.data_ptr()
    want = reference_map(step.metadata, step.positions, 4)
    assert torch.equal(second, want)
    # B's first rows read positions 5..7, which A writes in this very step.
    b_rows = step.token_slices["B"]
    codes = second[b_rows][0]
    assert all(int(c) >= 0 and (int(c) >> 32) > 0 for c in codes), codes


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(tap_map=True), ValueError, "tap_map=True needs kernel_size"),
        (dict(kernel_size=1), ValueError, "kernel_size must be >= 2"),
        (dict(kernel_size=4.0), TypeError, "kernel_size must be an int"),
        (dict(kernel_size=4, tap_map="yes"), TypeError, "tap_map must be"),
    ],
)
def test_builder_constructor_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        SconvMetadataBuilder(16, **kwargs)


def _args(**overrides):
    args = dict(
        query_start_loc=torch.tensor([0, 2, 5], dtype=torch.int32),
        slot_mapping=torch.tensor([4, 5, 8, 9, 10, -1, -1, -1], dtype=torch.int64),
        block_table=torch.tensor([[1, 2, 3], [2, 4, 5]], dtype=torch.int32),
        num_reqs=2,
        num_actual_tokens=5,
        num_padded_tokens=8,
        block_size=4,
        positions=torch.tensor([0, 1, 0, 1, 2, 0, 0, 0], dtype=torch.int64),
    )
    args.update(overrides)
    return args


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        (dict(block_size=None), TypeError, "block_size must be an int"),
        (dict(block_size=0), ValueError, "block_size must be >= 1"),
        (dict(positions=torch.zeros(7, dtype=torch.int64)), ValueError, "at least num_padded_tokens"),
        (dict(positions=torch.zeros(2, 8, dtype=torch.int64)), ValueError, "positions must be 1-D"),
        (dict(positions=torch.zeros(8)), TypeError, "positions must be int64"),
        (dict(positions=torch.zeros(8, dtype=torch.int32)), TypeError, "positions must be int64"),
        (dict(positions=torch.zeros(16, dtype=torch.int64)[::2]), ValueError, "positions must be contiguous"),
        (dict(positions=torch.zeros(8, dtype=torch.int64, device="meta")), ValueError, "the batch is on meta"),
        (dict(positions=[0] * 8), TypeError, "positions must be a torch.Tensor"),
        (dict(positions=None), TypeError, "positions must be a torch.Tensor"),
        (dict(block_table=torch.zeros(2, 3, dtype=torch.int64)), TypeError, "block_table must be int32"),
    ],
)
def test_builder_build_errors_come_before_any_launch(overrides, error, match):
    builder = SconvMetadataBuilder(16, kernel_size=4, tap_map=True)
    builder.seq_idx_buffer.fill_(77)
    builder.tap_map_buffer.fill_(77)
    with pytest.raises(error, match=match):
        builder.build(**_args(**overrides))
    assert (builder.seq_idx_buffer == 77).all() and (builder.tap_map_buffer == 77).all()
    # The same arguments, fixed, build the map.
    assert builder.build(**_args()).tap_map is not None


def test_positions_are_checked_even_when_no_map_is_built():
    builder = SconvMetadataBuilder(16)
    with pytest.raises(ValueError, match="at least num_padded_tokens"):
        builder.build(**_args(positions=torch.zeros(3, dtype=torch.int64)))


def test_no_map_without_positions_or_when_disabled():
    # auto mode on CPU: no buffer, no map (the CPU reference does not use it)
    auto = SconvMetadataBuilder(16, kernel_size=4)
    assert not auto.builds_tap_map and auto.tap_map_buffer is None
    assert auto.build(**_args()).tap_map is None
    # no kernel size, or disabled: never
    assert SconvMetadataBuilder(16).build(**_args()).tap_map is None
    off = SconvMetadataBuilder(16, kernel_size=4, tap_map=False)
    assert off.tap_map_buffer is None and off.build(**_args()).tap_map is None
    # positions and the block size are part of every batch: required (checked above)
    on = SconvMetadataBuilder(16, kernel_size=4, tap_map=True)
    assert on.build(**_args()).tap_map is not None
    # the runtime: auto on CPU builds none, tap_map=True always
    assert PagedConvRuntime(8, 4, 4, max_num_tokens=16).step([("a", 0, 3)]).metadata.tap_map is None
    forced = PagedConvRuntime(8, 4, 4, max_num_tokens=16, tap_map=True).step([("a", 0, 3)])
    assert forced.metadata.tap_map is not None and forced.metadata.tap_map.shape == (3, 3)


def test_dataclass_default_is_no_map():
    meta = SconvMetadata(
        positions=torch.zeros(1, dtype=torch.int64),
        block_table=torch.zeros(1, 1, dtype=torch.int32),
        slot_mapping=torch.zeros(1, dtype=torch.int64),
        seq_idx=torch.zeros(1, dtype=torch.int32),
        query_start=torch.zeros(1, dtype=torch.int32),
        block_size=4,
    )
    assert meta.tap_map is None and meta.kernel_size is None


# --- the layers ----------------------------------------------------------------------
class FusedSconvSpy:
    """Wraps inkling_model.sconv.fused_sconv and records the tap map of each call's batch."""

    def __init__(self, real):
        self.real = real
        self.maps: list[torch.Tensor | None] = []

    def __call__(self, *args, **kwargs):
        self.maps.append(args[3].tap_map)  # (x, weight, cache, batch, ...)
        return self.real(*args, **kwargs)


@pytest.fixture
def spy(monkeypatch):
    wrapper = FusedSconvSpy(sconv_module.fused_sconv)
    monkeypatch.setattr(sconv_module, "fused_sconv", wrapper)
    return wrapper


def _feeds(owner, lengths, seed):
    torch.manual_seed(seed)
    feeds = []
    for stream in Stream:
        conv = InklingShortConv(owner.stream_dim(stream), owner.layout.kernel_size, owner, stream)
        torch.nn.init.normal_(conv.weight)
        feeds.append(Feed(conv, [torch.randn(n, conv.dim) for n in lengths]))
    return feeds


@pytest.mark.parametrize("block_size", [4, 8])
def test_layers_pass_the_map_and_match_the_run_without_it(block_size, spy, unique_name):
    lengths = [3, 40, 17, 1, 29]
    outs = {}
    for with_map in (True, False):
        owner = ConvStateOwner(make_layout(), unique_name())
        feeds = _feeds(owner, lengths, seed=block_size)
        runtime = PagedConvRuntime(48, block_size, 4, max_num_tokens=128, max_blocks_per_req=16, tap_map=with_map)
        runtime.allocate_caches([owner], torch.float32, fill=float("nan"))
        spy.maps.clear()
        outs[with_map], stats = run_schedule(runtime, feeds, seed=3, max_chunk=10)
        assert stats.steps >= 8 and stats.padded_steps and stats.preemptions and stats.rejected
        assert len(spy.maps) == 4 * stats.steps  # four streams per step, one launch each
        if with_map:
            # every launch got the step's map: one buffer, shared by all four streams
            assert all(m is not None and m.shape[1] == 3 for m in spy.maps)
            assert len({m.data_ptr() for m in spy.maps}) == 1
        else:
            assert all(m is None for m in spy.maps)
        for feed, per_seq in zip(feeds, outs[with_map]):
            for x, y in zip(feed.inputs, per_seq):
                torch.testing.assert_close(y, causal_conv_ref(x, feed.conv.weight), rtol=1e-5, atol=1e-5)
    for with_map, without in zip(outs[True], outs[False]):
        for a, b in zip(with_map, without):
            assert torch.equal(a, b)


def test_layer_refuses_a_batch_of_another_kernel_size(spy, unique_name):
    """The batch names its group's kernel size: a layer of another W is refused before
    any launch (never by skipping the map silently); a matching batch hands its map on."""
    owner = ConvStateOwner(make_layout(), unique_name())
    conv = InklingShortConv(32, 4, owner, Stream.V)
    torch.nn.init.normal_(conv.weight)
    runtime = PagedConvRuntime(8, 4, 4, max_num_tokens=16, tap_map=True)
    runtime.allocate_caches([owner], torch.float32)
    step = runtime.step([("a", 0, 6)])
    x = torch.randn(6, 32)
    assert step.metadata.tap_map is not None
    other = dataclasses.replace(step.metadata, kernel_size=5, tap_map=torch.full((6, 4), -1, dtype=torch.int64))
    before = owner.cache.clone()
    with forward_metadata(other):
        with pytest.raises(ValueError, match="kernel_size 5"):
            conv(x, step.positions)
    assert torch.equal(owner.cache, before)  # refused before any launch
    with forward_metadata(step.metadata):
        y = conv(x, step.positions)
    assert spy.maps[-1] is step.metadata.tap_map
    torch.testing.assert_close(y, causal_conv_ref(x, conv.weight))


@pytest.mark.parametrize("field", ["query_start_loc", "slot_mapping", "block_table"])
def test_builder_build_names_a_list_field(field):
    builder = SconvMetadataBuilder(16, kernel_size=4, tap_map=True)
    builder.slot_mapping_buffer.fill_(77)
    builder.seq_idx_buffer.fill_(77)
    value = _args()[field].tolist()
    with pytest.raises(TypeError, match=rf"^{field} must be a torch.Tensor, got list"):
        builder.build(**_args(**{field: value}))
    assert (builder.slot_mapping_buffer == 77).all() and (builder.seq_idx_buffer == 77).all()

"""SconvMetadataBuilder, ConvStateOwner, the registry and metadata providers."""

from __future__ import annotations

import random

import pytest
import torch

from inkling_cache import ConvStateLayout, Stream
from inkling_model import (
    ConvStateOwner,
    SconvMetadata,
    SconvMetadataBuilder,
    current_metadata,
    forward_metadata,
    get_metadata_provider,
    get_owner,
    set_metadata_provider,
)


def layout(**kw) -> ConvStateLayout:
    args = dict(num_kv_heads=4, head_dim=8, hidden_size=32, kernel_size=4)
    args.update(kw)
    return ConvStateLayout.build(**args)


def expected_seq_metadata(lens: list[int], padded: int) -> tuple[list[int], list[int]]:
    seq, start = [], []
    row = 0
    for r, n in enumerate(lens):
        seq += [r] * n
        start += [row] * n
        row += n
    pad = padded - row
    return seq + [0] * pad, start + [0] * pad


@pytest.mark.parametrize("seed", range(5))
def test_builder_fills_per_token_metadata_in_persistent_buffers(seed):
    rng = random.Random(seed)
    builder = SconvMetadataBuilder(96)
    seq_ptr, start_ptr = builder.seq_idx_buffer.data_ptr(), builder.query_start_buffer.data_ptr()
    for _ in range(4):
        lens = [rng.randint(1, 9) for _ in range(rng.randint(1, 6))]
        actual = sum(lens)
        padded = actual + rng.randint(0, 5)
        qsl = torch.tensor([0] + [sum(lens[: i + 1]) for i in range(len(lens))], dtype=torch.int32)
        slots = torch.randint(0, 500, (padded,), dtype=torch.int64)
        slots[actual:] = -1
        # (a persistent table with rows past this step's requests, as vLLM's)
        table = torch.randint(0, 50, (len(lens) + rng.randint(0, 3), 7), dtype=torch.int32)
        # Stale contents from a previous, bigger step must not leak into pad rows.
        builder.seq_idx_buffer.fill_(77)
        builder.query_start_buffer.fill_(77)
        positions = torch.arange(padded, dtype=torch.int64)
        meta = builder.build(qsl, slots, table, len(lens), actual, padded, block_size=4, positions=positions)
        want_seq, want_start = expected_seq_metadata(lens, padded)
        assert meta.seq_idx.tolist() == want_seq
        assert meta.query_start.tolist() == want_start
        assert meta.slot_mapping.tolist() == slots.tolist()
        # the table cut to the step's requests (a view): its rows bound them for the tiling
        assert meta.block_table.shape == (len(lens), 7) and meta.block_table.data_ptr() == table.data_ptr()
        assert meta.num_tokens == padded and meta.num_actual_tokens == actual
        assert meta.positions.data_ptr() == positions.data_ptr() and meta.block_size == 4
        assert meta.seq_idx.data_ptr() == seq_ptr and meta.query_start.data_ptr() == start_ptr
        assert meta.seq_idx.dtype == torch.int32 and meta.query_start.dtype == torch.int32


def test_builder_pads_a_short_slot_mapping_with_minus_one():
    builder = SconvMetadataBuilder(16)
    qsl = torch.tensor([0, 2, 5], dtype=torch.int32)
    slots = torch.tensor([8, 9, 20, 21, 22], dtype=torch.int64)
    table = torch.zeros(2, 3, dtype=torch.int32)
    pos = dict(block_size=4, positions=torch.zeros(8, dtype=torch.int64))
    meta = builder.build(qsl, slots, table, 2, 5, 8, **pos)
    assert meta.slot_mapping.tolist() == [8, 9, 20, 21, 22, -1, -1, -1]
    assert meta.slot_mapping.data_ptr() == builder.slot_mapping_buffer.data_ptr()
    assert meta.block_size == 4 and meta.kernel_size is None and meta.tap_map is None
    # Between the real and the padded count: copied, the rest -1.
    six = torch.tensor([8, 9, 20, 21, 22, -1], dtype=torch.int64)
    meta = builder.build(qsl, six, table, 2, 5, 8, **pos)
    assert meta.slot_mapping.tolist() == [8, 9, 20, 21, 22, -1, -1, -1]
    assert builder.build(qsl, slots, table, 2, 5, 8, **{**pos, "block_size": 16}).block_size == 16
    with pytest.raises(ValueError, match="block_size"):
        builder.build(qsl, slots, table, 2, 5, 8, **{**pos, "block_size": 0})


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(num_padded_tokens=4), ValueError, "num_padded_tokens"),
        (dict(num_padded_tokens=40), ValueError, "max_num_tokens"),
        (dict(block_table=torch.zeros(2, 3, dtype=torch.int64)), TypeError, "int32"),
        (dict(block_table=torch.zeros(1, 3, dtype=torch.int32)), ValueError, "fewer than num_reqs"),
        (dict(slot_mapping=torch.zeros(6, dtype=torch.int32)), TypeError, "int64"),
        (dict(slot_mapping=torch.zeros(4, dtype=torch.int64)), ValueError, "at least num_actual_tokens"),
        (dict(positions=torch.zeros(8, dtype=torch.int32)), TypeError, "int64"),
        (dict(positions=torch.zeros(7, dtype=torch.int64)), ValueError, "num_padded_tokens"),
        (dict(query_start_loc=torch.tensor([0, 2], dtype=torch.int32)), ValueError, "num_reqs 2 needs"),
        (dict(num_reqs=-1), ValueError, "num_reqs"),
        (dict(num_prefill_tokens=9), ValueError, "num_prefill_tokens 9 exceeds the batch's 8 rows"),
        (dict(num_prefill_tokens=-1), ValueError, "num_prefill_tokens must be >= 0"),
    ],
)
def test_builder_rejects_bad_input(kwargs, error, match):
    builder = SconvMetadataBuilder(32)
    args = dict(
        query_start_loc=torch.tensor([0, 2, 5], dtype=torch.int32),
        slot_mapping=torch.arange(8, dtype=torch.int64),
        block_table=torch.zeros(2, 3, dtype=torch.int32),
        num_reqs=2,
        num_actual_tokens=5,
        num_padded_tokens=8,
        block_size=4,
        positions=torch.zeros(8, dtype=torch.int64),
    )
    args.update(kwargs)
    with pytest.raises(error, match=match):
        builder.build(**args)


def test_owner_registry_and_binding(unique_name):
    lay = layout()
    name = unique_name()
    owner = ConvStateOwner(lay, name)
    assert get_owner(name) is owner
    with pytest.raises(ValueError, match="already exists"):
        ConvStateOwner(lay, name)
    assert not owner.is_bound and owner.cache.numel() == 0
    assert owner.block_size == lay.block_size == 4
    # An engine may enlarge the block: the bound cache decides, never W.
    cache = torch.zeros(10, lay.num_heads, 16, lay.head_size)
    owner.bind_cache(cache)
    assert owner.is_bound and owner.cache is cache and owner.block_size == 16
    assert owner.stream_range(Stream.ATTN) == lay.stream_range(Stream.ATTN) == (16, 8)
    assert owner.stream_dim(Stream.K) == 32 and owner.stream_dim(Stream.MLP) == 32
    # A page-padded (strided) view is accepted: only D must be contiguous.
    padded = torch.zeros(10, 2 * lay.num_heads * 16 * lay.head_size)
    view = padded[:, : lay.num_heads * 16 * lay.head_size].view(10, lay.num_heads, 16, lay.head_size)
    owner.bind_cache(view)
    assert owner.block_size == 16 and owner.cache.stride(0) == 2 * lay.num_heads * 16 * lay.head_size
    owner.unbind_cache()
    assert not owner.is_bound
    replaced = ConvStateOwner(lay, name, replace=True)
    assert get_owner(name) is replaced
    del owner, replaced
    with pytest.raises(KeyError, match="no ConvStateOwner"):
        get_owner(name)


@pytest.mark.parametrize(
    ("shape", "dtype", "error", "match"),
    [
        ((10, 4, 4), torch.float32, ValueError, "4-D"),
        ((10, 2, 4, 64), torch.float32, ValueError, "heads"),
        ((10, 4, 4, 48), torch.float32, ValueError, "head size"),
        ((10, 4, 4, 64), torch.int32, TypeError, "floating"),
    ],
)
def test_bind_cache_rejects_wrong_shapes(shape, dtype, error, match, unique_name):
    owner = ConvStateOwner(layout(), unique_name())
    with pytest.raises(error, match=match):
        owner.bind_cache(torch.zeros(shape, dtype=dtype))


def test_owner_for_layer_picks_global_or_sliding_layout(unique_name):
    config = dict(
        hidden_size=64, num_hidden_layers=3, num_key_value_heads=2, head_dim=16,
        swa_num_key_value_heads=4, swa_head_dim=8, conv_kernel_size=4,
        layer_types=["hybrid_sliding", "hybrid", "hybrid_sliding"],
    )
    sliding = ConvStateOwner.for_layer(config, 0, unique_name(), tp_size=2)
    global_ = ConvStateOwner.for_layer(config, 1, unique_name(), tp_size=2)
    assert (sliding.layout.num_heads, sliding.layout.head_dim, sliding.layout.hidden_per_head) == (2, 8, 16)
    assert (global_.layout.num_heads, global_.layout.head_dim, global_.layout.hidden_per_head) == (1, 16, 32)
    with pytest.raises(ValueError, match="out of range"):
        ConvStateOwner.for_layer(config, 3, unique_name())


def meta_stub(tag: int) -> SconvMetadata:
    t = torch.full((1,), tag, dtype=torch.int64)
    return SconvMetadata(t, torch.zeros(1, 1, dtype=torch.int32), t.int(), t, t.int(), block_size=4)


def test_forward_metadata_single_dict_none_and_nesting():
    a, b = meta_stub(1), meta_stub(2)
    assert current_metadata("x") is None
    with forward_metadata(a):
        assert current_metadata("x") is a and current_metadata("y") is a
        with forward_metadata({"x": b}):
            assert current_metadata("x") is b and current_metadata("y") is None
        with forward_metadata(None):
            assert current_metadata("x") is None
        assert current_metadata("y") is a
    assert get_metadata_provider() is None
    with pytest.raises(TypeError, match="forward_metadata takes"):
        with forward_metadata([a]):  # type: ignore[arg-type]
            pass


def test_engine_provider():
    a = meta_stub(3)
    seen = []

    def provider(name: str):
        seen.append(name)
        return a if name.startswith("model.layers.") else None

    assert set_metadata_provider(provider) is None
    assert current_metadata("model.layers.0.conv") is a
    assert current_metadata("draft.conv") is None
    assert seen == ["model.layers.0.conv", "draft.conv"]
    set_metadata_provider(lambda name: "not metadata")
    with pytest.raises(TypeError, match="SconvBatch or None"):
        current_metadata("model.layers.0.conv")
    with pytest.raises(TypeError, match="callable"):
        set_metadata_provider(42)  # type: ignore[arg-type]
    assert set_metadata_provider(None) is not None

"""InklingShortConv (weights, identity path, input checks) and the paged runtime
(allocation, sliding-window freeing, slot mapping, errors)."""

from __future__ import annotations

import random

import pytest
import torch

from inkling_cache import ConvStateLayout, Stream
from inkling_kernels import causal_conv_ref
from inkling_model import (
    BlockAllocator,
    ConvStateOwner,
    InklingShortConv,
    InklingShortConvAddRMSNorm,
    OutOfBlocksError,
    PagedConvRuntime,
    ScheduledChunk,
    forward_metadata,
)
from model_test_driver import Feed, run_schedule


def make_layout(tp_size: int = 1) -> ConvStateLayout:
    return ConvStateLayout.build(num_kv_heads=4, head_dim=8, hidden_size=32, kernel_size=4, tp_size=tp_size)


# --- the layer -----------------------------------------------------------------
def test_weight_is_fp32_checkpoint_shape(unique_name):
    owner = ConvStateOwner(make_layout(), unique_name())
    conv = InklingShortConv(32, 4, owner, Stream.V)
    assert conv.weight.shape == (32, 1, 4) and conv.weight.dtype == torch.float32
    assert not conv.weight.requires_grad


@pytest.mark.parametrize("stream", list(Stream))
@pytest.mark.parametrize("tp_size", [1, 2, 4])
def test_load_weight_shards_by_the_layout_channel_mapping(stream, tp_size, unique_name):
    full = torch.randn(32, 1, 4, dtype=torch.bfloat16)
    shards = []
    for rank in range(tp_size):
        layout = make_layout(tp_size)
        conv = InklingShortConv(layout.stream_dim(stream), 4, ConvStateOwner(layout, unique_name()), stream)
        conv.load_weight(full, tp_rank=rank, tp_size=tp_size)
        assert conv.weight.dtype == torch.float32
        offset, width = layout.stream_range(stream)
        for c in range(conv.dim):
            head, d = layout.channel_to_head(stream, c)
            global_channel = (rank * layout.num_heads + head) * width + d - offset
            assert torch.equal(conv.weight[c], full[global_channel].float())
        # The 2-D (channels, W) form and an already-sharded tensor load the same.
        again = InklingShortConv(conv.dim, 4, conv.owner, stream)
        again.load_weight(conv.weight[:, 0, :].clone(), tp_rank=rank, tp_size=tp_size)
        assert torch.equal(again.weight, conv.weight)
        shards.append(conv.weight)
    assert torch.equal(torch.cat(shards), full.float())


@pytest.mark.parametrize(
    ("weight", "rank", "tp", "match"),
    [
        (torch.zeros(32, 1, 4), 0, 1, "tp_size 1 != the layout's tp_size 2"),
        (torch.zeros(32, 1, 4), 2, 2, "tp_rank"),
        (torch.zeros(24, 1, 4), 0, 2, "24 channels"),
        (torch.zeros(32, 1, 3), 0, 2, "kernel 3"),
        (torch.zeros(32, 2, 4), 0, 2, "channels, 1, W"),
        (torch.zeros(32), 0, 2, "channels, 1, W"),
    ],
)
def test_load_weight_rejects_bad_tensors(weight, rank, tp, match, unique_name):
    conv = InklingShortConv(16, 4, ConvStateOwner(make_layout(2), unique_name()), Stream.ATTN)
    with pytest.raises(ValueError, match=match):
        conv.load_weight(weight, tp_rank=rank, tp_size=tp)


def test_constructor_checks_dim_kernel_and_stream(unique_name):
    owner = ConvStateOwner(make_layout(2), unique_name())
    with pytest.raises(ValueError, match="dim 32 does not match"):
        InklingShortConv(32, 4, owner, Stream.K)
    with pytest.raises(ValueError, match="kernel_size 3"):
        InklingShortConv(16, 3, owner, Stream.K)
    with pytest.raises(ValueError, match="stream must be one of"):
        InklingShortConv(16, 4, owner, 7)
    with pytest.raises(TypeError, match="ConvStateOwner"):
        InklingShortConv(16, 4, "layer", Stream.K)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="dim must be an int, got str '16'"):
        InklingShortConv("16", 4, owner, Stream.K)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="kernel_size must be an int, got float 4.0"):
        InklingShortConv(16, 4.0, owner, Stream.K)  # type: ignore[arg-type]
    fused_owner = ConvStateOwner(make_layout(1), unique_name())
    with pytest.raises(TypeError, match="dim must be an int, got bool"):
        InklingShortConvAddRMSNorm(True, 4, fused_owner, Stream.MLP)  # type: ignore[arg-type]


def test_identity_without_metadata_or_cache_returns_a_copy(unique_name):
    owner = ConvStateOwner(make_layout(), unique_name())
    conv = InklingShortConv(32, 4, owner, Stream.MLP)
    torch.nn.init.normal_(conv.weight)
    x = torch.randn(6, 32)
    runtime = PagedConvRuntime(8, 4, 4, max_num_tokens=16)
    step = runtime.step([("a", 0, 6)])
    for meta, bind in ((None, False), (step.metadata, False), (None, True)):
        if bind:
            runtime.allocate_caches([owner], torch.float32)
        with forward_metadata(meta):
            y = conv(x, step.positions)
        assert torch.equal(y, x) and y.data_ptr() != x.data_ptr()
    # With both, it convolves.
    with forward_metadata(step.metadata):
        torch.testing.assert_close(conv(x, step.positions), causal_conv_ref(x, conv.weight))


def test_forward_input_checks(unique_name):
    owner = ConvStateOwner(make_layout(), unique_name())
    conv = InklingShortConv(32, 4, owner, Stream.MLP)
    runtime = PagedConvRuntime(8, 4, 4, max_num_tokens=16)
    runtime.allocate_caches([owner], torch.bfloat16)
    step = runtime.step([("a", 0, 6)])
    with pytest.raises(ValueError, match="x must be"):
        conv(torch.randn(6, 16), step.positions)
    # The positions travel in the step's batch (checked when it is built); the
    # layer's argument is not read.
    assert torch.equal(step.metadata.positions, step.positions)
    with forward_metadata(step.metadata):
        with pytest.raises(ValueError, match="batch describes 6 tokens"):
            conv(torch.randn(5, 32), torch.arange(5))
        with pytest.raises(TypeError, match="differs from x dtype"):
            conv(torch.randn(6, 32), step.positions)
    # Slots computed for N = 4 must not be used with a cache of 8-row blocks.
    assert step.metadata.block_size == 4
    owner.bind_cache(torch.zeros(8, 4, 8, owner.layout.head_size))
    with forward_metadata(step.metadata):
        with pytest.raises(ValueError, match=r"cache.shape\[2\] = 8 differs from the batch's block_size 4"):
            conv(torch.randn(6, 32), step.positions)


# --- the runtime ------------------------------------------------------------------
def test_allocator_never_hands_out_the_null_block():
    alloc = BlockAllocator(4)
    got = sorted(alloc.allocate() for _ in range(3))
    assert got == [1, 2, 3] and alloc.num_free == 0
    with pytest.raises(OutOfBlocksError):
        alloc.allocate()
    alloc.free(2)
    assert alloc.allocate() == 2
    with pytest.raises(ValueError, match="not allocated"):
        alloc.free(0)


@pytest.mark.parametrize(("block_size", "window"), [(4, 4), (2, 4), (16, 4), (3, 5)])
def test_step_slots_and_sliding_window_freeing(block_size, window):
    rng = random.Random(block_size * 7 + window)
    runtime = PagedConvRuntime(64, block_size, window, max_num_tokens=64, max_blocks_per_req=64)
    pos = {"a": 0, "b": 0, "c": 0}
    for _ in range(30):
        chunks = [(r, p, rng.randint(1, 6)) for r, p in pos.items() if rng.random() < 0.8] or [("a", pos["a"], 1)]
        step = runtime.step(chunks)
        slots = step.metadata.slot_mapping.tolist()
        positions = step.positions.tolist()
        assert step.query_start_loc.tolist()[-1] == step.num_actual_tokens == len(slots)
        for row_idx, (r, start, n) in enumerate(chunks):
            table = runtime.block_table_row(r)
            assert step.metadata.block_table[row_idx, : len(table)].tolist() == table
            rows = step.token_slices[r]
            assert positions[rows] == list(range(start, start + n))
            for p, slot in zip(positions[rows], slots[rows]):
                assert slot == table[p // block_size] * block_size + p % block_size and slot >= block_size
            # Every block behind the window is freed; every block in it is held.
            first_read = max(0, start - (window - 1))
            for logical, block in enumerate(table):
                live = (logical + 1) * block_size > first_read
                assert (block != 0) == live, (r, start, logical, table)
            pos[r] = start + n
        # Physical blocks are never shared between requests.
        held = [b for r in pos for b in runtime.live_blocks(r)]
        assert len(held) == len(set(held)) == 63 - runtime.num_free_blocks
    for r in list(pos):
        runtime.finish(r)
    assert runtime.num_free_blocks == 63


def test_step_counts_the_prompt_rows_for_the_kernels():
    """Each step's batch carries the rows of its requests of more than 16 rows (the
    kernels' ``num_prefill_tokens`` hint), pad rows not counted."""
    runtime = PagedConvRuntime(64, 4, 4, max_num_tokens=64, max_blocks_per_req=64)
    step = runtime.step([("a", 0, 20), ("b", 0, 3), ("c", 0, 17), ("d", 0, 16)], pad_to=60)
    assert step.metadata.num_prefill_tokens == 37
    step = runtime.step([("a", 20, 1), ("b", 3, 16), ("c", 17, 1)])
    assert step.metadata.num_prefill_tokens == 0


def test_step_errors_and_rewind_rules():
    runtime = PagedConvRuntime(6, 4, 4, max_num_tokens=32, max_blocks_per_req=4, max_num_reqs=2)
    with pytest.raises(ValueError, match="must start at position 0"):
        runtime.step([("a", 3, 1)])
    runtime.step([("a", 0, 6)])
    with pytest.raises(ValueError, match="appears twice"):
        runtime.step([("a", 6, 1), ("a", 7, 1)])
    with pytest.raises(ValueError, match=r"in \[0, 6\]"):
        runtime.step([("a", 7, 1)])
    runtime.step([("a", 4, 3)])  # a speculative rewind onto written positions is fine
    with pytest.raises(ValueError, match=r"in \[4, 7\]"):
        runtime.step([("a", 3, 1)])  # but not behind the last step's start
    with pytest.raises(ValueError, match="beyond the block table"):
        runtime.step([("a", 7, 10)])
    with pytest.raises(ValueError, match="pad_to"):
        runtime.step([("a", 7, 2)], pad_to=1)
    with pytest.raises(ValueError, match="max_num_reqs"):
        runtime.step([("a", 7, 1), ("b", 0, 1), ("c", 0, 1)])
    with pytest.raises(OutOfBlocksError):
        runtime.step([("b", 0, 16)])  # 4 blocks; 5 usable, 2 held by "a"
    assert runtime.num_free_blocks == 3  # the failed step changed nothing
    runtime.preempt("a")
    assert runtime.num_free_blocks == 5 and not runtime.has_request("a")
    runtime.step([("b", 0, 16)])
    with pytest.raises(KeyError):
        runtime.finish("a")


def test_pad_rows_never_write(unique_name):
    owner = ConvStateOwner(make_layout(), unique_name())
    conv = InklingShortConv(32, 4, owner, Stream.K)
    torch.nn.init.normal_(conv.weight)
    runtime = PagedConvRuntime(8, 4, 4, max_num_tokens=16)
    (cache,) = runtime.allocate_caches([owner], torch.float32, fill=float("nan"))
    step = runtime.step([("a", 0, 3)], pad_to=8)
    assert step.metadata.slot_mapping.tolist()[3:] == [-1] * 5
    assert step.metadata.seq_idx.tolist()[3:] == [0] * 5
    x = torch.randn(8, 32)
    with forward_metadata(step.metadata):
        y = conv(x, step.positions)
    torch.testing.assert_close(y[:3], causal_conv_ref(x[:3], conv.weight))
    written = ~torch.isnan(cache[..., :8])  # K range of each head
    assert int(written.sum()) == 3 * 4 * 8  # 3 tokens x 4 heads x head_dim


def test_many_requests_long_schedule_against_full_sequence(unique_name):
    """More requests and steps than the parity tests, all four streams sharing one
    cache, block size larger than W."""
    torch.manual_seed(5)
    owner = ConvStateOwner(make_layout(), unique_name())
    feeds = []
    lengths = [3, 60, 17, 44, 1, 29, 52, 8]
    for stream in Stream:
        conv = InklingShortConv(owner.stream_dim(stream), 4, owner, stream)
        torch.nn.init.normal_(conv.weight)
        feeds.append(Feed(conv, [torch.randn(n, conv.dim) for n in lengths]))
    runtime = PagedConvRuntime(40, 8, 4, max_num_tokens=128, max_blocks_per_req=8)
    runtime.allocate_caches([owner], torch.float32, fill=float("nan"))
    outs, stats = run_schedule(runtime, feeds, seed=11, max_chunk=12)
    assert stats.steps > 20 and stats.preemptions and stats.rejected
    for feed, per_seq in zip(feeds, outs):
        for x, y in zip(feed.inputs, per_seq):
            torch.testing.assert_close(y, causal_conv_ref(x, feed.conv.weight), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("b_first", [True, False], ids=["B-first", "A-first"])
@pytest.mark.parametrize("block_size", [4, 8])
def test_prefix_hit_on_blocks_computed_in_the_same_step(b_first, block_size, unique_name):
    """docs/design.md §3.2: B starts on a prefix whose last blocks A computes in the same
    step; B's pre-forward taps name slots written in this very launch."""
    torch.manual_seed(block_size)
    owner = ConvStateOwner(make_layout(), unique_name())
    conv = InklingShortConv(32, 4, owner, Stream.ATTN)
    torch.nn.init.normal_(conv.weight)
    runtime = PagedConvRuntime(32, block_size, 4, max_num_tokens=64, max_blocks_per_req=16)
    runtime.allocate_caches([owner], torch.float32, fill=float("nan"))
    prefix = 2 * block_size
    a = torch.randn(3 * block_size + 5, 32)
    b = torch.cat([a[:prefix], torch.randn(7, 32)])  # same prompt prefix, own continuation

    outs = {"A": [], "B": []}

    def run(chunks):
        step = runtime.step(chunks)
        triples = [(c.req_id, c.start, c.num_tokens) if isinstance(c, ScheduledChunk) else c for c in chunks]
        x = torch.cat([(a if r == "A" else b)[s : s + n] for r, s, n in triples])
        with forward_metadata(step.metadata):
            y = conv(x, step.positions)
        for r, _, _ in triples:
            outs[r].append(y[step.token_slices[r]])

    run([("A", 0, 3)])
    hit = ScheduledChunk("B", prefix, 4, prefix_from="A")
    a_chunk = ("A", 3, len(a) - 3 - 2)
    run([hit, a_chunk] if b_first else [a_chunk, hit])
    table_a, table_b = runtime.block_table_row("A"), runtime.block_table_row("B")
    shared = table_b[runtime_first_live(prefix, block_size) : prefix // block_size]
    assert shared and shared == table_a[runtime_first_live(prefix, block_size) : prefix // block_size]
    assert all(runtime.allocator.ref_count(blk) == 2 for blk in shared)
    run([("B", prefix + 4, 3), ("A", len(a) - 2, 2)])
    torch.testing.assert_close(torch.cat(outs["A"]), causal_conv_ref(a, conv.weight))
    torch.testing.assert_close(torch.cat(outs["B"]), causal_conv_ref(b, conv.weight)[prefix:])
    # Each holder drops its own references; B's blocks outlive A.
    runtime.finish("A")
    assert runtime.num_free_blocks == 31 - len(runtime.live_blocks("B"))
    runtime.finish("B")
    assert runtime.num_free_blocks == 31


def runtime_first_live(start: int, block_size: int) -> int:
    return max(0, start - 3) // block_size


def test_prefix_hit_errors():
    runtime = PagedConvRuntime(16, 4, 4, max_num_tokens=64)
    runtime.step([("A", 0, 16)])
    with pytest.raises(ValueError, match="block boundary"):
        runtime.step([ScheduledChunk("B", 6, 1, prefix_from="A")])
    with pytest.raises(ValueError, match="holds positions up to 16"):
        runtime.step([ScheduledChunk("B", 20, 1, prefix_from="A")])
    with pytest.raises(ValueError, match="unknown prefix source"):
        runtime.step([ScheduledChunk("B", 4, 1, prefix_from="Z")])
    with pytest.raises(ValueError, match="already exists"):
        runtime.step([ScheduledChunk("A", 4, 1, prefix_from="A")])
    with pytest.raises(ValueError, match="already freed"):
        runtime.step([("A", 16, 1), ScheduledChunk("B", 8, 1, prefix_from="A")])
    runtime.step([ScheduledChunk("B", 16, 2, prefix_from="A")])
    assert runtime.block_table_row("B")[3] == runtime.block_table_row("A")[3]


@pytest.mark.parametrize("tap_map", [False, True])
def test_one_check_per_layer_launch(tap_map, unique_name, monkeypatch):
    """The step's batch is checked once when the runtime builds it; each layer launch
    on it then runs exactly one check (the kernels' check_conv_call): the layer and
    the metadata lookup add none."""
    import sys

    from inkling_kernels import checks

    counts: dict[str, int] = {}
    public = [n for n in dir(checks) if n.startswith("check_")]
    originals = {n: getattr(checks, n) for n in public}

    def counted(name):
        def wrapper(*args, **kwargs):
            counts[name] = counts.get(name, 0) + 1
            return originals[name](*args, **kwargs)

        return wrapper

    wrappers = {n: counted(n) for n in public}
    for mod in [m for k, m in list(sys.modules.items()) if k.startswith(("inkling_kernels", "inkling_model"))]:
        for n in public:
            if getattr(mod, n, None) is originals[n]:
                monkeypatch.setattr(mod, n, wrappers[n])
    owner = ConvStateOwner(make_layout(), unique_name())
    convs = [InklingShortConv(owner.stream_dim(s), 4, owner, s) for s in Stream]
    runtime = PagedConvRuntime(16, 4, 4, max_num_tokens=16, tap_map=tap_map)
    runtime.allocate_caches([owner], torch.float32)
    step = runtime.step([("a", 0, 5), ("b", 0, 2)], pad_to=8)
    assert counts.get("check_batch") == 1  # once per step and group
    counts.clear()
    with forward_metadata(step.metadata):
        for conv in convs:
            conv(torch.randn(8, conv.dim), step.positions)
    assert counts == {"check_conv_call": len(convs)}


def test_a_device_that_is_not_one_is_named() -> None:
    with pytest.raises(ValueError, match="device 'gpu' is not a torch device: pass e.g. 'cpu' or 'cuda'"):
        PagedConvRuntime(8, 4, 4, device="gpu")


@pytest.mark.parametrize("pad_to", [4.0, True, "4", torch.tensor(4)])
def test_a_pad_to_of_another_type_is_refused_before_any_allocation(pad_to):
    runtime = PagedConvRuntime(8, 4, 4)
    free = runtime.num_free_blocks
    positions = runtime.positions_buffer.clone()
    with pytest.raises(TypeError, match=r"pad_to must be an int .* or None"):
        runtime.step([("a", 0, 3)], pad_to=pad_to)
    # the refused step changed nothing: no request, block or buffer
    assert not runtime.has_request("a") and runtime.num_free_blocks == free
    assert torch.equal(runtime.positions_buffer, positions)
    step = runtime.step([("a", 0, 3)], pad_to=4)  # the same step, pad_to an int
    assert step.num_padded_tokens == 4 and runtime.num_written("a") == 3


def test_runtime_window_must_be_the_layers_kernel_size(unique_name):
    """A runtime whose window is smaller than the layers' conv would free blocks the
    conv still reads (wrong outputs, no error): refused when the caches are bound."""
    owner = ConvStateOwner(make_layout(), unique_name())  # W = 4
    for bad in (1, 0, True, 4.0):
        with pytest.raises(ValueError, match="sliding_window must be the layers' conv kernel size"):
            PagedConvRuntime(8, 4, bad, max_num_tokens=16)
    for window in (2, 3, 5):
        with pytest.raises(ValueError, match=f"conv kernel size 4 but this runtime was built with sliding_window={window}"):
            PagedConvRuntime(8, 4, window, max_num_tokens=16).allocate_caches([owner], torch.float32)
    assert not owner.is_bound  # nothing bound
    with pytest.raises(TypeError, match="ConvStateOwner objects"):
        PagedConvRuntime(8, 4, 4, max_num_tokens=16).allocate_caches(owner, torch.float32)  # type: ignore[arg-type]
    assert len(PagedConvRuntime(8, 4, 4, max_num_tokens=16).allocate_caches([owner], torch.float32)) == 1

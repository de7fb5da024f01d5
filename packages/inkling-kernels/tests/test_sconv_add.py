"""fused_sconv_add (the conv + residual add of fused_sconv_add_rmsnorm without the norm,
for a rank's channel shard at tp > 1): the Triton kernel with HAS_NORM off
(TRITON_INTERPRET=1 on CPU; compiled on CUDA copies of the inputs where there is a
GPU) and the public op's CPU reference, on random scheduling traces of the paged test
world, against ``dt(hidden + full-sequence causal conv)`` of each request's inputs and
against the reference op; the cache is written exactly where it must be
(:meth:`PagedWorld.run_add`)."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import torch

from inkling_kernels import SconvBatch, fused_sconv_add, fused_sconv_add_ref, fused_sconv_add_rmsnorm
from inkling_kernels.sconv_add_rmsnorm.kernel import NormConfig, choose_add_config, fused_sconv_add_triton

from _sconv_world import DTYPES, PagedWorld, bits
from test_fused_sconv import _trace as trace_items

KERNEL_DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
KERNEL_IMPLS = ("triton", "triton_map")


@pytest.mark.parametrize("kind", ["prefill", "decode", "chunked", "spec", "mixed"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_trace_kinds(kind: str, dtype: torch.dtype, case_seed: Callable[..., int]) -> None:
    """Default tiles, map-less and mapped kernel and the CPU op, one stream each of
    the packed cache (widths 8, 8, 10, 6: whole-head and masked tiles); pad rows."""
    seed = case_seed(kind, str(dtype)) % 1000
    rng = random.Random(seed)
    world = PagedWorld(dtype=dtype, num_blocks=96, seed=seed)
    batch = world.make_batch(trace_items(world, kind, rng), num_pad=2 if kind in ("mixed", "decode") else 0,
                             extra_cols=1)
    for i, impl in enumerate(("reference", *KERNEL_IMPLS)):
        world.run_add(batch, (seed + i) % len(world.streams), impl, device=KERNEL_DEVICE)


# 3 heads of a 10-channel stream (36 chunks of [1, 4], ...): tiles that do not divide
# the row, programs owning several chunks (the last ones masked), several rows.
CONFIGS = [
    NormConfig(block_t=4, block_h=1, block_j=4, num_warps=1, scan=4, split=9),  # one chunk a program
    NormConfig(block_t=2, block_h=1, block_j=4, num_warps=1, scan=8, split=4),  # 3 chunks each, 3 masked
    NormConfig(block_t=1, block_h=2, block_j=16, num_warps=2, scan=16, split=1),  # the whole row, masked
    NormConfig(block_t=8, block_h=4, block_j=8, num_warps=1, scan=16, split=2),  # masked heads
]


@pytest.mark.parametrize("config,impl", [(c, KERNEL_IMPLS[i % 2]) for i, c in enumerate(CONFIGS)] + [
    (CONFIGS[1], KERNEL_IMPLS[0])],
    ids=lambda v: v if isinstance(v, str) else f"t{v.block_t}h{v.block_h}j{v.block_j}s{v.split}")
def test_tile_configs(config: NormConfig, impl: str) -> None:
    rng = random.Random(31 + config.split)
    world = PagedWorld(num_heads=3, head_size=24, streams=((13, 10),), dtype=torch.float16, seed=5)
    batch = world.make_batch(trace_items(world, "spec", rng) + trace_items(world, "decode", rng), num_pad=2)
    world.run_add(batch, 0, impl, config=config, device=KERNEL_DEVICE)


@pytest.mark.parametrize("block_t", [1, 2, 4, 16])
@pytest.mark.parametrize("impl", KERNEL_IMPLS)
def test_row_kernel(block_t: int, impl: str) -> None:
    """The row-register kernel (``NormConfig.rows``: a program a (chunk, row tile)) on a
    batch with prompt tiles (register path) and decode, chunk-start, speculative and pad
    rows (load path), on a 2-chunk stream; map-less (the launch builds the map) and
    mapped; then the interpreter's default tile for the same mapped launch (the row
    kernel too: prompt-heavy)."""
    from inkling_kernels.sconv_add_rmsnorm.kernel import interpreter_rows_config

    rng = random.Random(50 + block_t)
    world = PagedWorld(dtype=torch.bfloat16, num_blocks=96, seed=50 + block_t)
    items = []
    for rid, (hist, n) in enumerate([(0, 37), (rng.randint(4, 60), 1), (rng.randint(5, 20), 29),
                                     (rng.randint(3, 60), 3)]):
        world.add_request(rid, hist)
        items.append((rid, n))
    rng.shuffle(items)
    batch = world.make_batch(items, num_pad=1)
    world.run_add(batch, 0, impl, config=NormConfig(block_t=block_t, block_h=1, block_j=8, num_warps=1, rows=True),
                  device=KERNEL_DEVICE)
    if impl == "triton_map" and KERNEL_DEVICE.type == "cpu":
        cfg = interpreter_rows_config(batch.sconv().positions.shape[0], world.H, world.streams[0][1], True, 4)
        assert cfg is not None and cfg.rows
        world.run_add(batch, 0, impl, device=KERNEL_DEVICE)


@pytest.mark.parametrize("kernel_size", [2, 3, 5])
def test_other_kernel_sizes(kernel_size: int) -> None:
    rng = random.Random(kernel_size)
    world = PagedWorld(kernel_size=kernel_size, streams=((4, 12),), seed=kernel_size)
    batch = world.make_batch(trace_items(world, "chunked", rng), num_pad=1)
    for impl in KERNEL_IMPLS:
        world.run_add(batch, 0, impl, device=KERNEL_DEVICE)


@pytest.mark.parametrize("hit", [12, 13], ids=["aligned", "unaligned"])
@pytest.mark.parametrize("hit_first", [True, False], ids=["B-first", "A-first"])
def test_same_step_prefix_hit(hit: int, hit_first: bool) -> None:
    """docs/design.md §3.2: A computes a prompt, B (the same prompt) hit A's first
    blocks and computes the rest in the same launch; B's pre-forward taps name slots A
    writes in it, NaN before. Small tiles, so A's and B's rows sit in different
    programs (on the interpreter programs run in order: B first reproduces a stale
    read). Both orders, both alignments, map-less and mapped; B's rows then equal A's
    at the same positions when their residual rows do."""
    world = PagedWorld(dtype=torch.bfloat16, block_size=4, num_blocks=40, seed=99)
    batch = world.prefix_hit_batch(hit, hit_first)
    prompt_len = 22
    b_len = prompt_len - hit
    a0, b0 = (b_len, 0) if hit_first else (0, prompt_len)
    pre = world.storage.clone()  # A's slots that B reads are NaN here
    cfg = NormConfig(block_t=4, block_h=2, block_j=8, num_warps=1, scan=16, split=2)
    for s in (2,):  # 2 heads of 10 channels: 2 chunks, the second masked
        hidden = (2 * world.randn(*batch.x[s].shape)).to(world.dtype)
        hidden[b0 : b0 + b_len] = hidden[a0 + hit : a0 + prompt_len]
        for impl, config in [("reference", None), *[(i, cfg) for i in KERNEL_IMPLS]]:
            world.storage.copy_(pre)
            _, out = world.run_add(batch, s, impl, hidden=hidden, config=config, device=KERNEL_DEVICE)
            assert torch.equal(bits(out[b0 : b0 + b_len]), bits(out[a0 + hit : a0 + prompt_len]))


def test_multi_step_reads_its_own_writes() -> None:
    """A prefill, then decode and speculative steps that read, as pre-forward taps,
    what the previous fused_sconv_add launches stored (map-less and mapped steps
    alternating), with sliding-window freeing in between."""
    rng = random.Random(8)
    world = PagedWorld(dtype=torch.float32, num_blocks=64, streams=((2, 16),), seed=8)
    for rid in range(3):
        world.add_request(rid, 0)
    items = [(0, 7), (1, 2), (2, 5)]
    for step in range(5):
        batch = world.make_batch(items, num_pad=step % 2)
        world.run_add(batch, 0, KERNEL_IMPLS[step % 2], device=KERNEL_DEVICE)
        world.commit(batch)
        for rid in range(3):
            world.free_out_of_window(rid)
        items = [(rid, rng.choice([1, 1, 3])) for rid in range(3)]


def test_matches_the_norm_ops_new_hidden() -> None:
    """On the CPU path the two ops' new_hidden are bit-identical (one reference), and
    so are their cache writes."""
    world = PagedWorld(dtype=torch.bfloat16, streams=((8, 8),), seed=12)
    batch = world.make_batch(trace_items(world, "mixed", random.Random(12)), num_pad=2)
    hidden = (2 * world.randn(*batch.x[0].shape)).to(world.dtype)
    ref_storage, ref_cache = world._ref_cache()
    norm_w = torch.ones(world.channels(0), dtype=world.dtype)
    new_h, _ = fused_sconv_add_rmsnorm(hidden, batch.x[0], world.weights[0], ref_cache, batch.sconv(), 8, 8,
                                       norm_w, 1e-6)
    _, out = world.run_add(batch, 0, "reference", hidden=hidden)
    assert torch.equal(bits(out), bits(new_h))
    assert torch.equal(bits(world.storage), bits(ref_storage))


def test_empty_and_pad_only_batches() -> None:
    world = PagedWorld(seed=3)
    world.add_request(0, 5)
    for batch in (world.make_batch([]), world.make_batch([], num_pad=3)):
        for impl in ("reference", *KERNEL_IMPLS):
            before = world.storage.clone()
            _, out = world.run_add(batch, 1, impl, device=KERNEL_DEVICE)
            assert out.shape == batch.x[1].shape
            assert torch.equal(bits(world.storage), bits(before))


def _world_args(tap_map: bool = False) -> tuple[PagedWorld, tuple]:
    world = PagedWorld(dtype=torch.float32, streams=((0, 8), (8, 8)), head_size=16, seed=1)
    world.add_request(0, 5)
    world.add_request(1, 0)
    batch = world.make_batch([(0, 2), (1, 3)], num_pad=1)
    sb = batch.sconv()
    if tap_map:
        from inkling_kernels import sconv_tap_map_ref

        sb = batch.sconv(tap_map=sconv_tap_map_ref(sb, torch.empty(6, 3, dtype=torch.int64)).tap_map)
    hidden = torch.randn_like(batch.x[1])
    return world, (hidden, batch.x[1], world.weights[1], world.cache, sb, 8, 8)


@pytest.mark.parametrize("tap_map", [False, True], ids=["no-map", "map"])
def test_custom_op_registration_and_fake_impl(tap_map: bool) -> None:
    schema = str(torch.ops.inkling.fused_sconv_add.default._schema)
    assert "Tensor(a!) cache" in schema and "Tensor(b!) out" in schema  # declared as mutated
    world, args = _world_args(tap_map)
    hidden, d, weight, cache, sb, off, width = args
    torch.library.opcheck(
        torch.ops.inkling.fused_sconv_add.default,
        (hidden, d, weight, cache.clone(), *sb.op_args(), off, width, torch.empty_like(d)),
        test_utils=("test_schema", "test_faketensor"),
    )


def test_compiles_with_the_op() -> None:
    world, args = _world_args()
    hidden, d, weight, cache, sb, off, width = args

    def step(h: torch.Tensor, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return fused_sconv_add(h, x, weight, c, sb, off, width) * 2

    eager_cache, compiled_cache = cache.clone(), cache.clone()
    want = step(hidden, d, eager_cache)
    got = torch.compile(step, backend="aot_eager", fullgraph=True)(hidden, d, compiled_cache)
    assert torch.equal(got, want)
    assert torch.equal(compiled_cache, eager_cache)


@pytest.mark.parametrize(
    "change, error, match",
    [
        (lambda a: {"hidden": a["hidden"][:, :-1].contiguous()}, ValueError, "hidden has shape"),
        (lambda a: {"hidden": a["hidden"][:-1]}, ValueError, "hidden has shape"),
        (lambda a: {"hidden": a["hidden"].double()}, TypeError, "hidden dtype"),
        (lambda a: {"hidden": a["hidden"].t().contiguous().t()}, ValueError, "hidden must be contiguous"),
        (lambda a: {"hidden": a["hidden"].tolist()}, TypeError, "hidden must be a torch.Tensor"),
        (lambda a: {"hidden": a["hidden"].to("meta")}, ValueError, "hidden is on meta"),
        (lambda a: {"d": a["d"][:, :-1].contiguous()}, ValueError, "channels"),
        (lambda a: {"d": a["d"].double(), "hidden": a["hidden"].double()}, TypeError, "bfloat16, float16 or float32"),
        (lambda a: {"batch": a["batch"].positions}, TypeError, "SconvBatch"),
        (lambda a: {"weight": a["weight"][..., :3]}, ValueError, "kernel_size"),
        (lambda a: {"stream_offset": 12}, ValueError, "outside"),
        (lambda a: {"stream_width": 4}, ValueError, "H\\*stream_width"),
        (lambda a: {"cache": a["cache"].half()}, TypeError, "cache dtype"),
    ],
)
def test_validation_errors(change, error, match) -> None:
    """Bad arguments raise, saying what to change, before any launch (the cache is
    untouched), on the public op, the reference and the Triton entry point."""
    names = ["hidden", "d", "weight", "cache", "batch", "stream_offset", "stream_width"]
    world, args = _world_args()
    kw = dict(zip(names, args))
    kw.update(change(kw))
    before = world.storage.clone()
    for fn in (fused_sconv_add, fused_sconv_add_ref, fused_sconv_add_triton):
        with pytest.raises(error, match=match):
            fn(*(kw[k] for k in names))
    assert torch.equal(bits(world.storage), bits(before))


@pytest.mark.parametrize(
    "config, match",
    [
        (NormConfig(1, 1, 8, 1, split=3), "split must be 1..2"),  # 2 heads x 1 chunk
        (NormConfig(1, 1, 8, 1, split=0), "split must be"),
        (NormConfig(1, 1, 8, 1, row_loop=True), "row_loop"),
        (NormConfig(3, 1, 8, 1), "powers of two"),
        (NormConfig(1, 1, 8, 1, scan=12), "powers of two"),
    ],
)
def test_config_checks(config: NormConfig, match: str) -> None:
    world, args = _world_args()
    before = world.storage.clone()
    with pytest.raises(ValueError, match=match):
        fused_sconv_add_triton(*args, config=config)
    assert torch.equal(bits(world.storage), bits(before))


def test_out_checks() -> None:
    _, args = _world_args()
    for bad in (args[1].new_empty(args[1].shape[::-1]).t(), args[1].new_empty(args[1].shape[0], 3),
                args[1].half()):
        with pytest.raises((ValueError, TypeError), match="out must"):
            fused_sconv_add_triton(*args, out=bad)


@pytest.mark.parametrize("heads,width", [(8, 768), (1, 768), (16, 384), (4, 384), (3, 20), (8, 128)])
@pytest.mark.parametrize("mapped", [False, True], ids=["no-map", "map"])
def test_default_config(heads: int, width: int, mapped: bool) -> None:
    """Every chunk of a row on its own program (split = the row's chunks, any block_t,
    no row loop), with fused_sconv's two-load tile for the same launch (block_h *
    block_j = its BLOCK_C; its rows and warps)."""
    from inkling_kernels.sconv.kernel import choose_config

    for t in (1, 16, 64, 1024, 2048, 8192):
        cfg = choose_add_config(t, heads, width, mapped)
        conv = choose_config(t, heads, width, mapped, one_load=False)
        chunks = -(-heads // cfg.block_h) * -(-width // cfg.block_j)
        assert cfg.split == chunks and not cfg.row_loop
        assert cfg.block_h * cfg.block_j == conv.block_c and (cfg.block_h == 1 or cfg.block_j == width)
        assert (cfg.block_t, cfg.num_warps) == (conv.block_t, conv.num_warps)
        assert 16 <= cfg.scan <= 256
        assert cfg.block_t * 4 * cfg.scan <= 1024 * cfg.num_warps or cfg.scan == 16


def test_large_launch_without_a_map_builds_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A map-less launch of at least MAP_MIN_WORK elements builds the step's tap map
    first (one map launch), as fused_sconv does, and gives the same result as the
    reference; ``auto_map=False`` stays map-less (no map launch)."""
    from inkling_kernels.sconv import kernel as sconv_kernel
    from inkling_kernels.tap_map import kernel as tap_map_kernel

    builds: list[int] = []
    real = tap_map_kernel.launch_sconv_tap_map

    def counting(*args: object, **kwargs: object) -> object:
        builds.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(tap_map_kernel, "launch_sconv_tap_map", counting)
    monkeypatch.setattr(sconv_kernel, "MAP_MIN_WORK", 1)  # every launch counts as large
    rng = random.Random(8)
    world = PagedWorld(dtype=torch.float32, seed=8)
    batch = world.make_batch(trace_items(world, "mixed", rng), num_pad=1)
    sb = batch.sconv()
    off, width = world.streams[2]
    d, hidden = batch.x[2], torch.randn_like(batch.x[2])
    want = fused_sconv_add_ref(hidden, d, world.weights[2], world.cache.clone(), sb, off, width)
    dev = KERNEL_DEVICE
    meta = (sb.positions, sb.block_table, sb.seq_idx, sb.slot_mapping, sb.query_start)
    db = SconvBatch(*(m.to(dev) for m in meta), sb.block_size, sb.kernel_size, None)
    for auto_map, expected_builds in ((True, 1), (False, 0)):
        builds.clear()
        got = fused_sconv_add_triton(hidden.to(dev), d.to(dev), world.weights[2].to(dev), world.cache.clone().to(dev),
                                     db, off, width, auto_map=auto_map)
        assert len(builds) == expected_builds
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)

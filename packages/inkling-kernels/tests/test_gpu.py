"""GPU checks of the compiled kernels (skipped without CUDA; CI has none).

Run on a GPU machine:  python -m pytest -q packages/inkling-kernels/tests/test_gpu.py
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
import torch

from inkling_kernels import (
    SconvBatch,
    causal_conv_ref,
    fused_sconv,
    fused_sconv_ref,
    sconv_seq_metadata,
    sconv_seq_metadata_ref,
    sconv_tap_map,
    sconv_tap_map_ref,
)

from inkling_kernels.sconv.kernel import SconvConfig
from inkling_kernels.sconv_add_rmsnorm import rms_norm_ref
from inkling_kernels.sconv_add_rmsnorm.kernel import NormConfig

from _sconv_world import TOL, PagedWorld, assert_add_close, bits

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# (name, H per rank, D, stream offset, stream width): Inkling 975B layers.
SHAPES = [
    ("attn-global", 8, 2048, 256, 768),
    ("k-global", 8, 2048, 0, 128),
    ("mlp-sliding", 16, 1024, 640, 384),
    ("attn-global-tp8", 1, 2048, 256, 768),
    ("v-sliding", 16, 1024, 128, 128),
]


def _mixed(world: PagedWorld, rng: random.Random, scale: int = 1) -> list[tuple[int, int]]:
    items = []
    rid = len(world.reqs)
    plan = [(0, rng.randint(100, 300)), (0, rng.randint(1, 40))]
    plan += [(rng.randint(1, 600), 1) for _ in range(40 * scale)]
    plan += [(rng.randint(5, 500), 4) for _ in range(4)]
    plan += [(rng.randint(10, 900), rng.randint(50, 120)) for _ in range(2)]
    for history, n in plan:
        world.add_request(rid, history)
        items.append((rid, n))
        rid += 1
    rng.shuffle(items)
    return items


def _gpu_copy(world: PagedWorld) -> tuple[torch.Tensor, torch.Tensor]:
    storage = world.storage.cuda()
    cache = storage.as_strided(world.cache.shape, world.cache.stride())
    return storage, cache


CASES = [(shape, torch.bfloat16, n) for shape in SHAPES for n in (4, 16)] + [
    (shape, dtype, 4) for shape in SHAPES[:2] for dtype in (torch.float16, torch.float32)
]


def _batch(meta: list[torch.Tensor], block_size: int, kernel_size: int = 4, device: str = "cuda") -> SconvBatch:
    return SconvBatch(*[m.to(device) for m in meta], block_size, kernel_size)


def _gpu_map(meta: list[torch.Tensor], block_size: int, kernel_size: int = 4) -> SconvBatch:
    """The step's batch with its tap map built on the GPU, checked against the
    reference map."""
    rows = meta[0].shape[0]
    got = torch.full((rows, kernel_size - 1), 99, dtype=torch.int64, device="cuda")
    batch = sconv_tap_map(_batch(meta, block_size, kernel_size), got)
    want = torch.empty(rows, kernel_size - 1, dtype=torch.int64)
    sconv_tap_map_ref(_batch(meta, block_size, kernel_size, "cpu"), want)
    assert torch.equal(got.cpu(), want), "GPU tap map differs from the reference map"
    return batch


# How a conv launch gets its taps: the map-less kernel (forced), the public op on a
# batch without a map (map-less below MAP_MIN_WORK, a map built for the call above),
# the public op on a batch carrying the step's map.
PATHS = ["no-map", "auto", "map"]
# "rows": the step's map and the row-register kernel on choose_config's tile for it
# (forced: by default only launches of >= 1024 rows and >= ROWS_TOKENS_PER_REQUEST rows a request take it).
ROWS_CONFIG = SconvConfig(block_t=8, block_c=256, num_warps=2, rows=True)


def _conv(path: str, x: torch.Tensor, weight: torch.Tensor, cache: torch.Tensor,
          meta: list[torch.Tensor], off: int, width: int, n: int) -> torch.Tensor:
    from inkling_kernels.sconv.kernel import fused_sconv_triton

    if path == "no-map":
        return fused_sconv_triton(x, weight, cache, _batch(meta, n), off, width, auto_map=False)
    if path == "rows":  # the row-register kernel, forced (the default only above 1024 rows)
        return fused_sconv_triton(x, weight, cache, _gpu_map(meta, n), off, width, config=ROWS_CONFIG)
    batch = _gpu_map(meta, n) if path == "map" else _batch(meta, n)
    return fused_sconv(x, weight, cache, batch, off, width)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("shape,dtype,block_size", CASES, ids=[f"{c[0][0]}-{c[1]}-N{c[2]}" for c in CASES])
def test_inkling_shapes_vs_reference(
    shape: tuple, dtype: torch.dtype, block_size: int, path: str, case_seed: Callable[..., int]
) -> None:
    name, heads, head_size, off, width = shape
    rng = random.Random(case_seed(name, str(dtype), block_size) % 10_000)
    world = PagedWorld(num_heads=heads, head_size=head_size, block_size=block_size, streams=((off, width),),
                       dtype=dtype, num_blocks=400 if block_size == 4 else 160, page_pad=64, seed=rng.randint(0, 999))
    batch = world.make_batch(_mixed(world, rng), num_pad=5)
    storage, cache = _gpu_copy(world)
    args = [batch.positions, batch.block_table, batch.seq_idx, batch.slot_mapping, batch.query_start]
    out = _conv(path, batch.x[0].cuda(), world.weights[0].cuda(), cache, args, off, width, block_size)
    torch.cuda.synchronize()
    ref = world.run(batch, 0, "reference")  # CPU reference + oracle, updates the world's cache
    torch.testing.assert_close(out.cpu(), ref, **TOL[dtype])
    assert torch.equal(bits(storage.cpu()), bits(world.storage))


# One load a tap (SconvConfig.tap_select) on the tiles it is proposed for (16 x 128,
# launches of T x C >= 2^20) and the small-launch tiles, on the step's map.
ONE_LOAD_TILES = [(16, 128, 4), (4, 128, 2), (1, 128, 1)]


def _config_vs_reference(shape: tuple, cfg: SconvConfig, seed: int, prompts_first: bool = False) -> None:
    """``fused_sconv_triton`` with ``cfg`` on the step's GPU map, Inkling shape ``shape``
    (bf16, N 16), a mixed batch (prompts, decodes, spec, chunks, pad rows): against the
    reference and the cache, bit for bit. ``prompts_first``: the batch's requests of more
    than 16 rows first."""
    from inkling_kernels.sconv.kernel import fused_sconv_triton

    _, heads, head_size, off, width = shape
    rng = random.Random(seed)
    world = PagedWorld(num_heads=heads, head_size=head_size, block_size=16, streams=((off, width),),
                       dtype=torch.bfloat16, num_blocks=160, page_pad=64, seed=rng.randint(0, 999))
    items = _mixed(world, rng, scale=2)
    if prompts_first:
        items.sort(key=lambda item: item[1] <= 16)  # (stable: prompts, then decodes, each shuffled)
    batch = world.make_batch(items, num_pad=5)
    storage, cache = _gpu_copy(world)
    meta = [batch.positions, batch.block_table, batch.seq_idx, batch.slot_mapping, batch.query_start]
    mapped = _gpu_map(meta, 16)
    out = fused_sconv_triton(batch.x[0].cuda(), world.weights[0].cuda(), cache, mapped, off, width, config=cfg)
    torch.cuda.synchronize()
    ref = world.run(batch, 0, "reference")
    torch.testing.assert_close(out.cpu(), ref, **TOL[torch.bfloat16])
    assert torch.equal(bits(storage.cpu()), bits(world.storage))


@pytest.mark.parametrize("tile", ONE_LOAD_TILES, ids=[f"{t}x{c}w{w}" for t, c, w in ONE_LOAD_TILES])
@pytest.mark.parametrize("shape", SHAPES, ids=[s[0] for s in SHAPES])
def test_one_load_tap_vs_reference(shape: tuple, tile: tuple[int, int, int], case_seed: Callable[..., int]) -> None:
    """The mapped kernel with ``tap_select``, its tiles holding rows with taps in this
    forward and in the cache."""
    cfg = SconvConfig(block_t=tile[0], block_c=tile[1], num_warps=tile[2], tap_select=True)
    _config_vs_reference(shape, cfg, case_seed("one-load", shape[0], *tile) % 10_000)


ROWS_TILES = [(8, 256, 2), (16, 256, 1), (16, 1024, 4)]


@pytest.mark.parametrize("tile", ROWS_TILES, ids=[f"{t}x{c}w{w}" for t, c, w in ROWS_TILES])
@pytest.mark.parametrize("shape", SHAPES, ids=[s[0] for s in SHAPES])
def test_rows_kernel_vs_reference(shape: tuple, tile: tuple[int, int, int], case_seed: Callable[..., int]) -> None:
    """The row-register kernel (``SconvConfig.rows``): prompt tiles take its register
    path, tiles with decodes, spec or a chunk's first rows its load path."""
    if shape[1] * shape[4] % tile[1]:
        pytest.skip(f"{tile[1]}-channel tiles do not divide C={shape[1] * shape[4]}")
    cfg = SconvConfig(block_t=tile[0], block_c=tile[1], num_warps=tile[2], rows=True)
    _config_vs_reference(shape, cfg, case_seed("rows", shape[0], *tile) % 10_000)


@pytest.mark.parametrize("shape", SHAPES, ids=[s[0] for s in SHAPES])
def test_rows_kernel_prompts_first_vs_reference(shape: tuple, case_seed: Callable[..., int]) -> None:
    """The row-register kernel on a batch whose decodes follow its prompts (their
    load-path tiles last in the grid)."""
    _config_vs_reference(shape, ROWS_CONFIG, case_seed("rows-prompts-first", shape[0]) % 10_000, prompts_first=True)


@pytest.mark.parametrize("shape", SHAPES, ids=[s[0] for s in SHAPES])
def test_rows_kernel_int64_offsets(shape: tuple, case_seed: Callable[..., int], monkeypatch: pytest.MonkeyPatch) -> None:
    """The row-register kernel with int64 cache offsets (what a cache of 2^31 elements or
    more takes; forced here by lowering the limit)."""
    import inkling_kernels.sconv.kernel as sconv_kernel

    monkeypatch.setattr(sconv_kernel, "ROWS_OFFSET32_LIMIT", 0)
    _config_vs_reference(shape, ROWS_CONFIG, case_seed("rows64", shape[0]) % 10_000)


def _replay_step(world: PagedWorld, rng: random.Random, st: dict[str, torch.Tensor], rows: int, reqs: int) -> Any:
    """A new random batch of ``rows`` rows (decodes, short chunks, pad rows) from new
    requests with long histories; its metadata copied into the static buffers ``st``."""
    items = []
    rid = len(world.reqs)
    n_left = rows - rng.randint(0, 8)
    while n_left > 0 and len(items) < reqs:
        n = min(n_left, rng.choice([1, 1, 1, 4, 17]))
        world.add_request(rid, rng.randint(0, 2000))
        items.append((rid, n))
        rid += 1
        n_left -= n
    batch = world.make_batch(items, num_pad=rows - sum(n for _, n in items))
    st["positions"].copy_(batch.positions)
    st["table"].zero_()
    st["table"][: batch.block_table.shape[0], : batch.block_table.shape[1]].copy_(batch.block_table)
    st["seq"].copy_(batch.seq_idx)
    st["slots"].copy_(batch.slot_mapping)
    st["qs"].copy_(batch.query_start)
    return batch


class _GraphSetup:
    """A CPU world and its GPU copy, with the static buffers a captured launch reads
    (hidden, x and the step's metadata; rewritten before each replay by _replay_step)."""

    T, R, MAX_BLOCKS = 96, 48, 1024
    off, width = 256, 768

    def __init__(self, heads: int, seed: int) -> None:
        T, R = self.T, self.R
        self.world = PagedWorld(num_heads=heads, head_size=2048, streams=((self.off, self.width),),
                                dtype=torch.bfloat16, num_blocks=3000, seed=seed)
        self.storage, self.cache = _gpu_copy(self.world)
        self.st = dict(
            hidden=torch.zeros(T, heads * self.width, dtype=torch.bfloat16, device="cuda"),
            x=torch.zeros(T, heads * self.width, dtype=torch.bfloat16, device="cuda"),
            positions=torch.zeros(T, dtype=torch.int64, device="cuda"),
            table=torch.zeros(R, self.MAX_BLOCKS, dtype=torch.int32, device="cuda"),
            seq=torch.zeros(T, dtype=torch.int32, device="cuda"),
            slots=torch.full((T,), -1, dtype=torch.int64, device="cuda"),
            qs=torch.zeros(T, dtype=torch.int32, device="cuda"),
        )
        self.weight = self.world.weights[0].cuda()
        self.tap_map = torch.zeros(T, 3, dtype=torch.int64, device="cuda")

    def capture(self, op, mapped: bool):
        """Warm ``op(batch)`` up on a side stream, then capture it (with ``mapped`` the
        tap-map build first) over the static buffers: ``(graph, static output)``."""
        st = self.st

        def launch() -> torch.Tensor:
            batch = SconvBatch(st["positions"], st["table"], st["seq"], st["slots"], st["qs"], 4, 4)
            if mapped:
                batch = sconv_tap_map(batch, self.tap_map)
            return op(batch)

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            launch()  # warm-up/compile outside capture (writes pad rows only: slot -1)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = launch()
        return graph, static_out


@pytest.mark.parametrize("mapped", [False, True, "rows"], ids=["no-map", "map", "rows"])
def test_cuda_graph_replay_with_changing_metadata(mapped: bool | str) -> None:
    """Capture one launch with static buffers; replay it over different batches
    (different request mixes, pad rows) written into those buffers. With ``mapped``
    the graph holds the tap-map build too (two launches) before the conv; "rows": the
    row-register kernel after it."""
    from inkling_kernels.sconv.kernel import fused_sconv_triton

    rng = random.Random(7)
    g = _GraphSetup(heads=8, seed=7)
    st, width = g.st, g.width
    if mapped == "rows":
        graph, static_out = g.capture(
            lambda batch: fused_sconv_triton(st["x"], g.weight, g.cache, batch, g.off, width, config=ROWS_CONFIG),
            True)
    else:
        graph, static_out = g.capture(
            lambda batch: fused_sconv(st["x"], g.weight, g.cache, batch, g.off, width), mapped)
    world, storage, T, R = g.world, g.storage, g.T, g.R
    for step in range(6):
        batch = _replay_step(world, rng, st, T, R)
        storage.copy_(world.storage)  # same pre-state as the CPU world
        st["x"].copy_(batch.x[0])
        graph.replay()
        torch.cuda.synchronize()
        ref = world.run(batch, 0, "reference")
        torch.testing.assert_close(static_out.cpu(), ref, **TOL[torch.bfloat16])
        assert torch.equal(bits(storage.cpu()), bits(world.storage)), f"cache differs at step {step}"


def _hazard_case(prompt_len: int, hit: int, b_first: bool, seed: int = 0, device: str = "cuda"):
    """A computes a prompt; B (same prompt) hit A's first blocks, computes the rest."""
    g = torch.Generator().manual_seed(seed)
    heads, head_size, off, width, n, w = 8, 2048, 256, 768, 4, 4
    c = heads * width
    blocks = torch.randperm(2 * prompt_len // n, generator=g) + 1
    table_a = blocks[: prompt_len // n]
    # B shares A's blocks up to its hit (the partial block too, when the hit is not
    # block-aligned: both then write identical values into its tail).
    shared = -(-hit // n)
    table_b = torch.cat([table_a[:shared], blocks[prompt_len // n : 2 * prompt_len // n - shared]])
    prompt = torch.randn(prompt_len, c, generator=g).to(torch.bfloat16)
    weight = (torch.randn(c, 1, w, generator=g) * 0.5)
    pos_a = torch.arange(prompt_len)
    pos_b = torch.arange(hit, prompt_len)
    slot_a = table_a[pos_a // n] * n + pos_a % n
    slot_b = table_b[pos_b // n] * n + pos_b % n
    parts = [(prompt, pos_a, slot_a, 0), (prompt[hit:], pos_b, slot_b, 1)]
    if b_first:
        parts.reverse()
    x = torch.cat([p[0] for p in parts]).contiguous()
    positions = torch.cat([p[1] for p in parts])
    slots = torch.cat([p[2] for p in parts])
    table = torch.zeros(2, prompt_len // n, dtype=torch.int32)
    table[0], table[1] = table_a, table_b
    seq = torch.cat([torch.full((len(p[1]),), p[3], dtype=torch.int32) for p in parts])
    qs = torch.cat([torch.full((len(parts[0][1]),), 0, dtype=torch.int32),
                    torch.full((len(parts[1][1]),), len(parts[0][1]), dtype=torch.int32)])
    full = causal_conv_ref(prompt, weight)
    expected = torch.cat([full if p[3] == 0 else full[hit:] for p in parts])
    pre_slots = table_a[torch.arange(hit - (w - 1), hit) // n] * n + torch.arange(hit - (w - 1), hit) % n
    cache = torch.randn(2 * prompt_len // n + 1, heads, n, head_size, device=device).to(torch.bfloat16)
    return dict(x=x, weight=weight, cache=cache, positions=positions, table=table, seq=seq, slots=slots, qs=qs,
                off=off, width=width, n=n, expected=expected, pre_slots=pre_slots)


@pytest.mark.parametrize("path", PATHS + ["rows"])
@pytest.mark.parametrize("b_first", [True, False], ids=["B-first", "A-first"])
@pytest.mark.parametrize("prompt_len,hit,launches", [(1024, 512, 200), (8192, 4096, 100), (1024, 513, 200),
                                                    (128, 64, 200), (128, 65, 200), (128, 66, 200)])
def test_same_step_hazard_many_launches(b_first: bool, prompt_len: int, hit: int, launches: int,
                                        path: str) -> None:
    """Hits of 512/4096 tokens are block-aligned (what engines produce); 513 is not:
    every path is exact at any alignment (one hazard rule). The 128-token prompts
    (T <= 256) take the map-less kernel's one-chunk scan; the 8192 + 4096-row launch
    takes the row-register kernel by default ("auto", "map"), all of them with "rows"."""
    case = _hazard_case(prompt_len, hit, b_first)
    d = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in case.items()}
    expected = d["expected"]
    meta = [d["positions"], d["table"], d["seq"], d["slots"], d["qs"]]
    stale = 0
    for _ in range(launches):
        ps = d["pre_slots"]
        d["cache"][ps // d["n"], :, ps % d["n"], d["off"]: d["off"] + d["width"]] = float("nan")
        out = _conv(path, d["x"], d["weight"], d["cache"], meta, d["off"], d["width"], d["n"])
        bad = ~torch.isclose(out.float(), expected.float(), rtol=1.6e-2, atol=1.6e-2)
        stale += int(bad.any(dim=1).any())
    assert stale == 0, f"{stale} of {launches} launches had a stale tap"


def test_seq_metadata_gpu() -> None:
    rng = random.Random(3)
    for _ in range(20):
        lens = [rng.choice([0, 1, 1, 4, 300]) for _ in range(rng.randint(1, 300))]
        qsl = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
        num_actual = sum(lens)
        num_padded = num_actual + rng.randint(0, 50)
        out = [torch.full((num_padded + 3,), 77, dtype=torch.int32) for _ in range(4)]
        sconv_seq_metadata_ref(qsl, len(lens), num_actual, out[0], out[1], num_padded)
        g = [o.cuda() for o in out[2:]]
        sconv_seq_metadata(qsl.cuda(), len(lens), num_actual, g[0], g[1], num_padded)
        assert torch.equal(g[0].cpu(), out[0]) and torch.equal(g[1].cpu(), out[1])


def test_fused_sconv_ref_on_cuda_matches() -> None:
    """The reference itself runs on CUDA tensors too (used by benchmarks)."""
    case = _hazard_case(256, 128, True, seed=1)
    d = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in case.items()}
    batch = _batch([d["positions"], d["table"], d["seq"], d["slots"], d["qs"]], d["n"])
    out = fused_sconv_ref(d["x"], d["weight"], d["cache"], batch, d["off"], d["width"])
    torch.testing.assert_close(out.float(), d["expected"].float(), rtol=1.6e-2, atol=1.6e-2)


# --- fused_sconv_kv: K and V in one launch, on the slices of a qkv tensor ---------

# (name, KV heads per rank, D, q heads per rank): 975B attention layers, K at 0 and V
# at 128 (head_dim 128).
KV_SHAPES = [("global", 8, 2048, 64), ("sliding", 16, 1024, 64), ("global-tp8", 1, 2048, 8),
             ("sliding-tp8", 2, 1024, 8)]
KV_STREAMS = ((0, 128), (128, 128))


def _kv_conv(path: str, qkv: torch.Tensor, q_cols: int, world: PagedWorld, cache: torch.Tensor,
             meta: list[torch.Tensor], n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One fused_sconv_kv launch on GPU copies: the map-less kernel (forced), the public
    op without a map (auto) or on the batch carrying the step's map, or the row kernel
    (rows, one launch for K and V)."""
    from inkling_kernels import fused_sconv_kv
    from inkling_kernels.sconv_kv.kernel import fused_sconv_kv_triton

    c = world.channels(0)
    k, v = qkv[:, q_cols : q_cols + c], qkv[:, q_cols + c :]
    weights = (world.weights[0].cuda(), world.weights[1].cuda())
    if path == "no-map":
        return fused_sconv_kv_triton(k, v, *weights, cache, _batch(meta, n), 0, 128, 128, auto_map=False)
    if path == "rows":  # the row kernel, forced: one launch for K and V
        return fused_sconv_kv_triton(k, v, *weights, cache, _gpu_map(meta, n), 0, 128, 128, config=ROWS_CONFIG)
    batch = _gpu_map(meta, n) if path == "map" else _batch(meta, n)
    return fused_sconv_kv(k, v, *weights, cache, batch, 0, 128, 128)


def _qkv(world: PagedWorld, batch: Any, q_cols: int) -> torch.Tensor:
    rows = batch.positions.shape[0]
    return torch.cat([torch.randn(rows, q_cols).to(world.dtype), batch.x[0], batch.x[1]], dim=1).cuda()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", KV_SHAPES, ids=[s[0] for s in KV_SHAPES])
def test_kv_inkling_shapes_vs_reference(shape: tuple, dtype: torch.dtype, path: str,
                                        case_seed: Callable[..., int]) -> None:
    name, heads, head_size, q_heads = shape
    rng = random.Random(case_seed(name, str(dtype)) % 10_000)
    world = PagedWorld(num_heads=heads, head_size=head_size, streams=KV_STREAMS, dtype=dtype,
                       num_blocks=400, page_pad=64, seed=rng.randint(0, 999))
    batch = world.make_batch(_mixed(world, rng), num_pad=5)
    storage, cache = _gpu_copy(world)
    meta = [batch.positions, batch.block_table, batch.seq_idx, batch.slot_mapping, batch.query_start]
    outs = _kv_conv(path, _qkv(world, batch, q_heads * 128), q_heads * 128, world, cache, meta, 4)
    torch.cuda.synchronize()
    refs = world.run_kv(batch, "reference")  # CPU: two fused_sconv references + oracle
    for out, ref in zip(outs, refs):
        torch.testing.assert_close(out.cpu(), ref, **TOL[dtype])
    assert torch.equal(bits(storage.cpu()), bits(world.storage))


@pytest.mark.parametrize("mapped", [False, True, "rows"], ids=["no-map", "map", "rows"])
def test_kv_cuda_graph_replay_with_changing_metadata(mapped: bool | str) -> None:
    """One captured K+V launch (with the map build when ``mapped``; "rows": the
    row-register kernel, one launch for both streams, after it) on static buffers, k and v
    slices of a static qkv buffer; replayed over different batches."""
    from inkling_kernels import fused_sconv_kv
    from inkling_kernels.sconv_kv.kernel import fused_sconv_kv_triton

    rng = random.Random(8)
    heads, head_size, q_cols = 8, 2048, 64 * 128
    world = PagedWorld(num_heads=heads, head_size=head_size, streams=KV_STREAMS, dtype=torch.bfloat16,
                       num_blocks=3000, seed=8)
    T, R, max_blocks, c = 96, 48, 1024, heads * 128
    storage, cache = _gpu_copy(world)
    st = dict(
        qkv=torch.zeros(T, q_cols + 2 * c, dtype=torch.bfloat16, device="cuda"),
        positions=torch.zeros(T, dtype=torch.int64, device="cuda"),
        table=torch.zeros(R, max_blocks, dtype=torch.int32, device="cuda"),
        seq=torch.zeros(T, dtype=torch.int32, device="cuda"),
        slots=torch.full((T,), -1, dtype=torch.int64, device="cuda"),
        qs=torch.zeros(T, dtype=torch.int32, device="cuda"),
    )
    weights = (world.weights[0].cuda(), world.weights[1].cuda())
    tap_map = torch.zeros(T, 3, dtype=torch.int64, device="cuda")

    def launch() -> tuple[torch.Tensor, torch.Tensor]:
        batch = SconvBatch(st["positions"], st["table"], st["seq"], st["slots"], st["qs"], 4, 4)
        if mapped:
            batch = sconv_tap_map(batch, tap_map)
        _, k, v = st["qkv"].split([q_cols, c, c], dim=-1)
        if mapped == "rows":
            return fused_sconv_kv_triton(k, v, *weights, cache, batch, 0, 128, 128, config=ROWS_CONFIG)
        return fused_sconv_kv(k, v, *weights, cache, batch, 0, 128, 128)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        launch()  # warm-up/compile outside capture (pad rows only: slot -1)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_k, static_v = launch()
    for step in range(6):
        batch = _replay_step(world, rng, st, T, R)
        storage.copy_(world.storage)
        st["qkv"].copy_(torch.cat([torch.randn(T, q_cols).to(torch.bfloat16), batch.x[0], batch.x[1]], dim=1))
        graph.replay()
        torch.cuda.synchronize()
        ref_k, ref_v = world.run_kv(batch, "reference")
        torch.testing.assert_close(static_k.cpu(), ref_k, **TOL[torch.bfloat16])
        torch.testing.assert_close(static_v.cpu(), ref_v, **TOL[torch.bfloat16])
        assert torch.equal(bits(storage.cpu()), bits(world.storage)), f"cache differs at step {step}"


@pytest.mark.parametrize("path", PATHS + ["rows"])
@pytest.mark.parametrize("b_first", [True, False], ids=["B-first", "A-first"])
@pytest.mark.parametrize("hit", [512, 513], ids=["aligned", "unaligned"])
def test_kv_same_step_hazard_many_launches(b_first: bool, hit: int, path: str) -> None:
    """A computes a 1024-token prompt, B hits its first ``hit`` tokens in the same
    launch; B's pre-forward K and V slots are NaN before every launch."""
    world = PagedWorld(num_heads=8, head_size=2048, streams=KV_STREAMS, dtype=torch.bfloat16,
                       num_blocks=600, seed=hit)
    batch = world.prefix_hit_batch(hit, b_first, prompt_len=1024)
    poisoned = world.storage.clone()
    qkv = _qkv(world, batch, 0)
    meta = [batch.positions, batch.block_table, batch.seq_idx, batch.slot_mapping, batch.query_start]
    refs = world.run_kv(batch, "reference", q_cols=0)
    storage, cache = _gpu_copy(world)
    stale = 0
    for _ in range(100):
        storage.copy_(poisoned)
        outs = _kv_conv(path, qkv, 0, world, cache, meta, 4)
        stale += int(any(
            (~torch.isclose(o.float().cpu(), r.float(), rtol=1.6e-2, atol=1.6e-2)).any() for o, r in zip(outs, refs)
        ))
    assert stale == 0, f"{stale} of 100 launches had a stale tap"


# --- fused_sconv_add: conv + residual add on a rank's channel shard (tp > 1) -------

# (name, H per rank, D, stream offset, stream width): the ATTN and MLP streams of the
# 975B layers, whole rows (tp 1) and a rank's shard (tp 8 / tp 4).
ADD_SHAPES = [
    ("attn-global", 8, 2048, 256, 768),
    ("attn-global-tp8", 1, 2048, 256, 768),
    ("mlp-sliding", 16, 1024, 640, 384),
    ("mlp-sliding-tp4", 4, 1024, 640, 384),
]
ADD_CASES = [(shape, torch.bfloat16, n) for shape in ADD_SHAPES for n in (4, 16)] + [
    (ADD_SHAPES[1], dtype, 4) for dtype in (torch.float16, torch.float32)
]


@pytest.mark.parametrize("impl", ["triton", "triton_map"], ids=["no-map", "map"])
@pytest.mark.parametrize("shape,dtype,block_size", ADD_CASES, ids=[f"{c[0][0]}-{c[1]}-N{c[2]}" for c in ADD_CASES])
def test_add_inkling_shapes_vs_reference(
    shape: tuple, dtype: torch.dtype, block_size: int, impl: str, case_seed: Callable[..., int]
) -> None:
    """The compiled kernel (default tiles) on a mixed batch with pad rows: against the
    reference op, dt(hidden + the full-sequence conv) and the cache, bit for bit
    (PagedWorld.run_add)."""
    name, heads, head_size, off, width = shape
    rng = random.Random(case_seed("add", name, str(dtype), block_size) % 10_000)
    world = PagedWorld(num_heads=heads, head_size=head_size, block_size=block_size, streams=((off, width),),
                       dtype=dtype, num_blocks=400 if block_size == 4 else 160, page_pad=64, seed=rng.randint(0, 999))
    batch = world.make_batch(_mixed(world, rng), num_pad=5)
    world.run_add(batch, 0, impl, device="cuda")


@pytest.mark.parametrize("impl", ["triton", "triton_map"], ids=["no-map", "map"])
def test_add_large_batch(impl: str) -> None:
    """T > 1024 (the large-batch tiles: several rows a program): a 1500-token prefill,
    a 600-token chunk after 700 and 300 decodes, on a tp 8 shard."""
    world = PagedWorld(num_heads=1, head_size=2048, streams=((256, 768),), dtype=torch.bfloat16,
                       num_blocks=1200, seed=17)
    rng = random.Random(17)
    plan = [(0, 1500), (700, 600)] + [(rng.randint(1, 900), 1) for _ in range(300)]
    for rid, (history, _) in enumerate(plan):
        world.add_request(rid, history)
    items = [(rid, n) for rid, (_, n) in enumerate(plan)]
    rng.shuffle(items)
    batch = world.make_batch(items, num_pad=3)
    assert batch.positions.shape[0] > 2048
    world.run_add(batch, 0, impl, device="cuda")


@pytest.mark.parametrize("mapped", [False, True], ids=["no-map", "map"])
@pytest.mark.parametrize("heads", [8, 1], ids=["tp1", "tp8"])
def test_add_cuda_graph_replay_with_changing_metadata(heads: int, mapped: bool) -> None:
    """fused_sconv_add captured once with static buffers (hidden, d, metadata; with
    ``mapped`` the tap-map build too), replayed over different batches written into
    them; each replay against the reference on the CPU world and its cache."""
    from inkling_kernels import fused_sconv_add

    rng = random.Random(11 + heads)
    g = _GraphSetup(heads=heads, seed=11)
    st, width = g.st, g.width
    graph, static_out = g.capture(
        lambda batch: fused_sconv_add(st["hidden"], st["x"], g.weight, g.cache, batch, g.off, width), mapped)
    world, storage, T, R = g.world, g.storage, g.T, g.R
    for step in range(6):
        batch = _replay_step(world, rng, st, T, R)
        hidden = (2 * torch.randn(T, heads * width)).to(torch.bfloat16)
        storage.copy_(world.storage)  # same pre-state as the CPU world
        st["x"].copy_(batch.x[0])
        st["hidden"].copy_(hidden)
        graph.replay()
        torch.cuda.synchronize()
        _, ref = world.run_add(batch, 0, "reference", hidden=hidden)
        assert_add_close(static_out.cpu(), ref, hidden)
        assert torch.equal(bits(storage.cpu()), bits(world.storage)), f"cache differs at step {step}"


@pytest.mark.parametrize("path", ["no-map", "map"])
@pytest.mark.parametrize("b_first", [True, False], ids=["B-first", "A-first"])
@pytest.mark.parametrize("prompt_len,hit,launches", [(1024, 512, 200), (1024, 513, 200), (8192, 4096, 50)])
def test_add_same_step_hazard_many_launches(b_first: bool, prompt_len: int, hit: int, launches: int,
                                            path: str) -> None:
    """fused_sconv_add under a same-step prefix hit (A computes a prompt, B hit its
    first ``hit`` tokens), B's pre-forward slots NaN before every launch; the public op
    on a batch without a map (the map-less kernel) or with the step's map."""
    from inkling_kernels import fused_sconv_add

    case = _hazard_case(prompt_len, hit, b_first, seed=2)
    d = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in case.items()}
    hidden = (2 * torch.randn(case["x"].shape)).to(torch.bfloat16)
    want = (hidden.float() + case["expected"].float()).to(torch.bfloat16)
    meta = [d["positions"], d["table"], d["seq"], d["slots"], d["qs"]]
    batch = _gpu_map(meta, d["n"]) if path == "map" else _batch(meta, d["n"])
    hidden_gpu, want_gpu = hidden.cuda(), want.cuda()  # (compared on the GPU: 50-200 launches)
    stale = 0
    for _ in range(launches):
        ps = d["pre_slots"]
        d["cache"][ps // d["n"], :, ps % d["n"], d["off"]: d["off"] + d["width"]] = float("nan")
        out = fused_sconv_add(hidden_gpu, d["x"], d["weight"], d["cache"], batch, d["off"], d["width"])
        try:
            assert_add_close(out, want_gpu, hidden_gpu)
        except AssertionError:
            stale += 1
    assert stale == 0, f"{stale} of {launches} launches had a stale tap"


# The row-register kernel of fused_sconv_add_rmsnorm / fused_sconv_add (NormConfig.rows):
# the tiles the heuristic picks (rows_norm_config), forced on launches of any size.
NORM_ROWS_CONFIGS = {
    "norm-2x512": NormConfig(block_t=2, block_h=1, block_j=512, num_warps=4, rows=True),
    "norm-1x256": NormConfig(block_t=1, block_h=1, block_j=256, num_warps=2, rows=True),
}
ADD_ROWS_CONFIGS = {  # fused_sconv_add: prompts (4 rows), mixed and speculative batches (2 rows)
    "add-4x256": NormConfig(block_t=4, block_h=1, block_j=256, num_warps=2, rows=True),
    "add-2x256": NormConfig(block_t=2, block_h=1, block_j=256, num_warps=2, rows=True),
}


# (2 x 512 needs rows of whole 512-channel chunks: the TP 1 row of 6144, not the TP 8
# shard of 768, which the heuristic never gives it)
@pytest.mark.parametrize("heads,name", [(8, "norm-2x512"), (8, "norm-1x256"), (1, "norm-1x256"), (8, "add-4x256"),
                                        (1, "add-4x256"), (1, "add-2x256")])
def test_norm_rows_cuda_graph_replay_with_changing_metadata(heads: int, name: str) -> None:
    """The row-register add/norm kernel captured once with the tap-map build before
    it, replayed over different batches (request mixes, pad rows) written into the
    static buffers: new_hidden (and normed) against the reference on the CPU world,
    the cache bit for bit."""
    from inkling_kernels.sconv_add_rmsnorm.kernel import fused_sconv_add_rmsnorm_triton, fused_sconv_add_triton

    rng = random.Random(23 + heads)
    g = _GraphSetup(heads=heads, seed=23)
    st, width = g.st, g.width
    norm_w = (1 + 0.2 * torch.randn(heads * width)).to(torch.bfloat16)
    norm_w_gpu, eps = norm_w.cuda(), 1e-5
    if name.startswith("add"):
        graph, static_out = g.capture(lambda batch: fused_sconv_add_triton(
            st["hidden"], st["x"], g.weight, g.cache, batch, g.off, width, config=ADD_ROWS_CONFIGS[name]), True)
    else:
        graph, static_out = g.capture(lambda batch: fused_sconv_add_rmsnorm_triton(
            st["hidden"], st["x"], g.weight, g.cache, batch, g.off, width, norm_w_gpu, eps,
            config=NORM_ROWS_CONFIGS[name]), True)
    world, storage, T, R = g.world, g.storage, g.T, g.R
    for step in range(6):
        batch = _replay_step(world, rng, st, T, R)
        hidden = (2 * torch.randn(T, heads * width)).to(torch.bfloat16)
        storage.copy_(world.storage)
        st["x"].copy_(batch.x[0])
        st["hidden"].copy_(hidden)
        graph.replay()
        torch.cuda.synchronize()
        _, ref = world.run_add(batch, 0, "reference", hidden=hidden)
        new_h = static_out if name.startswith("add") else static_out[0]
        assert_add_close(new_h.cpu(), ref, hidden)
        if not name.startswith("add"):  # (pad rows too: their new_hidden is hidden + d, normed from it)
            want = rms_norm_ref(ref, norm_w, eps)
            torch.testing.assert_close(static_out[1].cpu().float(), want.float(), rtol=2e-2, atol=2e-2)
        assert torch.equal(bits(storage.cpu()), bits(world.storage)), f"cache differs at step {step}"


@pytest.mark.parametrize("name", list(NORM_ROWS_CONFIGS) + list(ADD_ROWS_CONFIGS) + ["default"])
@pytest.mark.parametrize("b_first", [True, False], ids=["B-first", "A-first"])
def test_norm_rows_same_step_hazard_many_launches(b_first: bool, name: str) -> None:
    """The row-register add/norm kernel under a same-step prefix hit (A computes a
    1024-token prompt, B hit its first 512 tokens), B's pre-forward slots NaN before
    every launch, with the step's tap map; "default": the public op's own choice
    (the row kernel: 1536 rows, 2 requests)."""
    from inkling_kernels.sconv_add_rmsnorm.kernel import fused_sconv_add_rmsnorm_triton, fused_sconv_add_triton

    case = _hazard_case(1024, 512, b_first, seed=3)
    d = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in case.items()}
    hidden = (2 * torch.randn(case["x"].shape)).to(torch.bfloat16)
    want = (hidden.float() + case["expected"].float()).to(torch.bfloat16)
    norm_w = (1 + 0.2 * torch.randn(want.shape[1])).to(torch.bfloat16)
    want_n = rms_norm_ref(want, norm_w, 1e-5).cuda()
    meta = [d["positions"], d["table"], d["seq"], d["slots"], d["qs"]]
    batch = _gpu_map(meta, d["n"])
    hidden_gpu, want_gpu, norm_w_gpu = hidden.cuda(), want.cuda(), norm_w.cuda()
    stale = 0
    for _ in range(50):
        ps = d["pre_slots"]
        d["cache"][ps // d["n"], :, ps % d["n"], d["off"]: d["off"] + d["width"]] = float("nan")
        args = (hidden_gpu, d["x"], d["weight"], d["cache"], batch, d["off"], d["width"])
        try:
            if name.startswith("add"):
                assert_add_close(fused_sconv_add_triton(*args, config=ADD_ROWS_CONFIGS[name]), want_gpu, hidden_gpu)
            else:
                new_h, normed = fused_sconv_add_rmsnorm_triton(*args, norm_w_gpu, 1e-5,
                                                               config=NORM_ROWS_CONFIGS.get(name))
                assert_add_close(new_h, want_gpu, hidden_gpu)
                torch.testing.assert_close(normed.float(), want_n.float(), rtol=2e-2, atol=2e-2)
        except AssertionError:
            stale += 1
    assert stale == 0, f"{stale} of 50 launches had a stale tap"


class _DecodeGraphSetup(_GraphSetup):
    T, R = 8, 8  # a decode-sized launch: the split-row path of fused_sconv_add_rmsnorm


@pytest.mark.parametrize("warm_on_capture_stream", [False, True], ids=["cold-stream", "warmed-stream"])
def test_norm_split_path_captured_on_a_fresh_stream(warm_on_capture_stream: bool,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine picks its own capture stream: a graph captured on a stream no eager
    launch ran on takes the same split-row path (the per-stream scratch is made inside
    the capture) and its replays match the reference, the cache bit for bit."""
    from inkling_kernels.sconv_add_rmsnorm import kernel as K

    monkeypatch.setattr(K, "_SCRATCH", {})  # as in a process that never launched on this stream
    splits: list[int] = []
    real_launch = K._launch

    def spy(*args: Any) -> Any:
        splits.append(args[11])  # (..., cfg, block_t, split, scratch)
        return real_launch(*args)

    monkeypatch.setattr(K, "_launch", spy)
    rng = random.Random(41)
    g = _DecodeGraphSetup(heads=8, seed=41)
    st, width, T = g.st, g.width, g.T
    norm_w = (1 + 0.2 * torch.randn(8 * width)).to(torch.bfloat16)
    norm_w_gpu, eps = norm_w.cuda(), 1e-5
    want_split = K.choose_norm_config(T, 8, width).split
    assert want_split > 1

    def launch() -> Any:
        batch = SconvBatch(st["positions"], st["table"], st["seq"], st["slots"], st["qs"], 4, 4)
        return K.fused_sconv_add_rmsnorm_triton(st["hidden"], st["x"], g.weight, g.cache, batch, g.off, width,
                                          norm_w_gpu, eps)

    launch()  # compile on the default stream
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    if warm_on_capture_stream:
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            launch()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
    splits.clear()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        static_out = launch()
    assert splits == [want_split], f"captured with split {splits}, eager takes {want_split}"
    world, storage, R = g.world, g.storage, g.R
    for step in range(6):
        batch = _replay_step(world, rng, st, T, R)
        hidden = (2 * torch.randn(T, 8 * width)).to(torch.bfloat16)
        storage.copy_(world.storage)
        st["x"].copy_(batch.x[0])
        st["hidden"].copy_(hidden)
        graph.replay()
        graph.replay()  # twice: the row counters must be back at 0 after each replay
        torch.cuda.synchronize()
        _, ref = world.run_add(batch, 0, "reference", hidden=hidden)
        assert_add_close(static_out[0].cpu(), ref, hidden)
        torch.testing.assert_close(static_out[1].cpu().float(), rms_norm_ref(ref, norm_w, eps).float(),
                                   rtol=2e-2, atol=2e-2)
        assert torch.equal(bits(storage.cpu()), bits(world.storage)), f"cache differs at step {step}"

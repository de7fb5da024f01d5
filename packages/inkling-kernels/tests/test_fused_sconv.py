"""fused_sconv: the Triton kernel (interpreted on CPU) and the CPU reference path,
over randomly generated scheduling traces, against the full-sequence causal conv."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import torch

from _sconv_world import DTYPES, IMPLS, Batch, PagedWorld, count_launches, needs_interpreter



def _trace(world: PagedWorld, kind: str, rng: random.Random) -> list[tuple[int, int]]:
    """Adds requests to `world` and returns the batch items (rid, n_new)."""
    items: list[tuple[int, int]] = []
    rid = len(world.reqs)

    def add(history: int, n: int) -> None:
        nonlocal rid
        world.add_request(rid, history)
        items.append((rid, n))
        rid += 1

    if kind in ("prefill", "mixed"):
        for _ in range(2):
            add(0, rng.randint(1, 9))
    if kind in ("decode", "mixed"):
        for _ in range(rng.randint(2, 4)):
            add(rng.randint(1, 400), 1)
    if kind in ("chunked", "mixed"):
        for _ in range(2):
            add(rng.randint(1, 30), rng.randint(2, 7))
    if kind in ("spec", "mixed"):
        for _ in range(2):
            add(rng.randint(3, 60), 3)
    rng.shuffle(items)
    return items


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("kind", ["prefill", "decode", "chunked", "spec", "mixed"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_trace_kinds(impl: str, kind: str, dtype: torch.dtype, case_seed: Callable[..., int]) -> None:
    seed = case_seed(kind, str(dtype)) % 1000
    rng = random.Random(seed)
    world = PagedWorld(dtype=dtype, num_blocks=96, seed=seed)
    items = _trace(world, kind, rng)
    batch = world.make_batch(items, num_pad=2 if kind == "mixed" else 0, extra_cols=1)
    for s in range(len(world.streams)):  # several streams share one packed cache
        world.run(batch, s, impl)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("block_size", [1, 4, 8, 16, 32])
def test_block_sizes(impl: str, block_size: int) -> None:
    rng = random.Random(block_size)
    world = PagedWorld(block_size=block_size, kernel_size=4, dtype=torch.bfloat16,
                       num_blocks=200 if block_size < 8 else 40, seed=block_size)
    items = _trace(world, "mixed", rng)
    batch = world.make_batch(items, num_pad=1)
    for s in (0, 2):
        world.run(batch, s, impl)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("kernel_size", [2, 3, 4, 5])
def test_kernel_sizes(impl: str, kernel_size: int) -> None:
    rng = random.Random(10 + kernel_size)
    world = PagedWorld(kernel_size=kernel_size, block_size=4, dtype=torch.float16, seed=kernel_size)
    items = _trace(world, "mixed", rng)
    batch = world.make_batch(items, num_pad=1)
    for s in (1, 3):
        world.run(batch, s, impl)


@pytest.mark.parametrize("impl", IMPLS)
def test_page_strided_cache(impl: str) -> None:
    """A non-contiguous cache view (pages padded to a larger stride), as engines
    hand out when the conv page is padded up to the attention page."""
    rng = random.Random(5)
    world = PagedWorld(page_pad=24, dtype=torch.bfloat16, seed=5)
    assert not world.cache.is_contiguous()
    items = _trace(world, "mixed", rng)
    batch = world.make_batch(items, num_pad=2)
    for s in range(len(world.streams)):
        world.run(batch, s, impl)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "weight_dtype,weight_3d,activation,residual",
    [
        ("act", False, None, True),
        ("fp32", False, "silu", True),
        ("act", True, "silu", False),
        ("fp32", True, None, False),
    ],
)
def test_weights_and_epilogue(impl: str, weight_dtype: str, weight_3d: bool,
                              activation: str | None, residual: bool) -> None:
    rng = random.Random(7)
    dtype = torch.bfloat16
    world = PagedWorld(dtype=dtype, weight_dtype=dtype if weight_dtype == "act" else torch.float32,
                       weight_3d=weight_3d, seed=7)
    batch = world.make_batch(_trace(world, "mixed", rng), num_pad=1)
    world.run(batch, 2, impl, activation=activation, residual=residual)


def small_scan(monkeypatch: pytest.MonkeyPatch, scan: int) -> None:
    """The map-less kernel's hazard scan in chunks of ``scan`` slots (its default is
    sized to the tile: at least 16, so small test batches would scan in one chunk)."""
    import inkling_kernels.sconv.kernel as K

    monkeypatch.setattr(K, "_scan_chunk", lambda cfg, taps_p2: scan)


@needs_interpreter
def test_tile_configs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Explicit tiles: several requests per tile, channel tiles straddling the stream
    width (masked lanes), and a scan chunk smaller than T."""
    from inkling_kernels.sconv.kernel import SconvConfig

    for i, (cfg, scan) in enumerate([
        (SconvConfig(block_t=16, block_c=8, num_warps=1), 4),
        (SconvConfig(block_t=4, block_c=16, num_warps=1), 8),
        (SconvConfig(block_t=32, block_c=4, num_warps=2), 32),
    ]):
        small_scan(monkeypatch, scan)
        rng = random.Random(20 + i)
        world = PagedWorld(dtype=torch.float32, seed=20 + i)
        batch = world.make_batch(_trace(world, "mixed", rng), num_pad=3)
        for s in (0, 2):
            world.run(batch, s, "triton", config=cfg)


@needs_interpreter
@pytest.mark.parametrize("kind", ["decode", "prefill", "mixed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_one_load_tap(kind: str, dtype: torch.dtype) -> None:
    """``tap_select`` (mapped launches: one load a tap, its address picked per row from
    the x row or the cache slot): every check of the suite on each stream, with tiles
    whose rows mix taps from this forward and from the cache."""
    from inkling_kernels.sconv.kernel import SconvConfig

    for i, cfg in enumerate([SconvConfig(block_t=4, block_c=16, num_warps=2, tap_select=True),
                             SconvConfig(block_t=1, block_c=8, num_warps=1, tap_select=True)]):
        seed = 60 + 7 * i + ["decode", "prefill", "mixed"].index(kind)
        rng = random.Random(seed)
        world = PagedWorld(dtype=dtype, seed=seed)
        batch = world.make_batch(_trace(world, kind, rng), num_pad=2)
        for s in range(3):
            world.run(batch, s, "triton_map", config=cfg)


# The row-register kernel (SconvConfig.rows, rows_kernel.py) on tiles small enough that
# the suite's batches hold tiles of both kinds: every tap a register row or absent (inside
# a prompt) and tiles with cache or other-row taps (decodes, a chunk's first rows, spec).
# (rows, channels, warps, channels per load-path chunk: several chunks per tile)
ROWS_CONFIGS = [(8, 4, 1, 2), (4, 4, 1, 4), (16, 4, 2, 1), (8, 8, 2, 4)]


def _long_prompts(world: PagedWorld, rng: random.Random, kind: str) -> list[tuple[int, int]]:
    """Prompts long enough to fill whole row tiles, plus decodes and chunks (mixed)."""
    items = []
    for _ in range(2):
        world.add_request(len(world.reqs), 0 if kind != "chunked" else rng.randint(1, 30))
        items.append((len(world.reqs) - 1, rng.randint(20, 40)))
    if kind == "mixed":
        items += _trace(world, "mixed", rng)
    rng.shuffle(items)
    return items


@needs_interpreter
@pytest.mark.parametrize("kind", ["prefill", "chunked", "mixed", "decode", "spec"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_rows_kernel(kind: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """``SconvConfig.rows``: the row-register kernel, on each stream whose channel
    count its tiles divide, against the reference and the cache oracle (every check of
    the suite); its load path in one chunk or several, its cache offsets int32 or int64.
    Each (kind, dtype) runs half of the tilings, so that every tiling meets every kind
    in one dtype and each dtype meets every tiling (CI time under the interpreter)."""
    import inkling_kernels.sconv.kernel as K
    from inkling_kernels.sconv.kernel import SconvConfig

    kind_index = ["prefill", "chunked", "mixed", "decode", "spec"].index(kind)
    parity = (kind_index + [torch.float32, torch.bfloat16].index(dtype)) % 2
    for i, (bt, bc, nw, sub) in enumerate(ROWS_CONFIGS):
        if i % 2 != parity:
            continue
        monkeypatch.setattr(K, "ROWS_LOAD_PATH_CHANNELS", sub)
        monkeypatch.setattr(K, "ROWS_OFFSET32_LIMIT", 2**31 if i % 2 else 0)  # int32 / int64 cache offsets
        seed = 300 + 11 * i + kind_index
        rng = random.Random(seed)
        world = PagedWorld(dtype=dtype, seed=seed, num_blocks=96)
        items = _long_prompts(world, rng, kind) if kind in ("prefill", "chunked", "mixed") else _trace(world, kind, rng)
        batch = world.make_batch(items, num_pad=rng.randint(0, 3))
        cfg = SconvConfig(block_t=bt, block_c=bc, num_warps=nw, rows=True)
        for s, (_, width) in enumerate(world.streams):
            if world.H * width % bc == 0:
                world.run(batch, s, "triton_map", config=cfg)


@needs_interpreter
@pytest.mark.parametrize("activation", [None, "silu"])
@pytest.mark.parametrize("residual", [True, False])
def test_rows_kernel_epilogue(activation: str | None, residual: bool) -> None:
    """The row-register kernel's SiLU / residual on both of its paths, bf16 weights."""
    from inkling_kernels.sconv.kernel import SconvConfig

    rng = random.Random(41)
    world = PagedWorld(dtype=torch.bfloat16, weight_dtype=torch.bfloat16, seed=41, num_blocks=96)
    batch = world.make_batch(_long_prompts(world, rng, "mixed"), num_pad=1)
    world.run(batch, 0, "triton_map", config=SconvConfig(block_t=8, block_c=4, num_warps=1, rows=True),
              activation=activation, residual=residual)


@needs_interpreter
@pytest.mark.parametrize("hit", [12, 13], ids=["aligned", "unaligned"])
@pytest.mark.parametrize("hit_first", [True, False], ids=["B-first", "A-first"])
def test_rows_kernel_same_step_prefix_hit(hit: int, hit_first: bool) -> None:
    """The same-step hazard (test_same_step_prefix_hit) on the row-register kernel: B's
    taps that A writes in this launch come from A's rows of x (register rows or loads)."""
    from inkling_kernels.sconv.kernel import SconvConfig

    world = PagedWorld(dtype=torch.bfloat16, block_size=4, num_blocks=40, seed=99)
    batch = world.prefix_hit_batch(hit, hit_first)
    for s in range(len(world.streams)):
        world.run(batch, s, "triton_map", config=SconvConfig(block_t=4, block_c=4, num_warps=1, rows=True))


def test_rows_kernel_unfit() -> None:
    """An explicit ``rows`` config that cannot take the launch says why, before any
    launch; the default tiling falls back to the tile kernel instead."""
    from inkling_kernels.sconv.kernel import SconvConfig, fused_sconv_triton
    from inkling_kernels.sconv.rows_kernel import rows_unfit

    assert rows_unfit(8192, 6144, 6144, 4, 8, 256) is None
    assert "multiple" in rows_unfit(8192, 6000, 6000, 4, 8, 256)
    assert "64-bit" in rows_unfit(8192, 6144, 6144, 10, 8, 256)
    assert "int32" in rows_unfit(400_000, 6144, 6144, 4, 8, 256)
    world = PagedWorld(seed=8)
    batch = world.make_batch(_trace(world, "mixed", random.Random(8)), num_pad=1)
    off, width = world.streams[2]  # 2 heads x 10 channels: not a multiple of 8
    mapped = batch.sconv(tap_map=world.tap_map(batch))
    with pytest.raises(ValueError, match=r"rows=True\) cannot take this launch.*multiple"):
        fused_sconv_triton(batch.x[2], world.weights[2], world.cache, mapped, off, width,
                           config=SconvConfig(block_t=8, block_c=8, num_warps=1, rows=True))
    with pytest.raises(ValueError, match="needs the step's tap map"):
        fused_sconv_triton(batch.x[0], world.weights[0], world.cache, batch.sconv(), *world.streams[0],
                           config=SconvConfig(block_t=8, block_c=8, num_warps=1, rows=True), auto_map=False)


def test_tap_select_default() -> None:
    """``fused_sconv``'s mapped launches of >= 1024 rows and >= ROWS_TOKENS_PER_REQUEST rows a request (a
    known bound on the requests), over a multiple of 256 channels, take the row-register
    kernel (8 x 256, two warps; the K+V launch too); other mapped one-stream launches of
    ``T * C >= MAP_MIN_WORK`` take 16-row tiles with one load a tap; smaller and map-less
    launches, the two-stream (K+V) launch and ``fused_sconv_add``'s mirrored tiles keep
    the two-load tiles (``fused_sconv_add_rmsnorm``'s kernel has only those)."""
    from inkling_kernels.sconv.kernel import MAP_MIN_WORK, ROWS_TOKENS_PER_REQUEST, SconvConfig, choose_config
    from inkling_kernels.sconv_add_rmsnorm.kernel import choose_add_config

    shapes = [(8192, 8, 768, True), (256, 8, 768, True), (256, 1, 768, True), (8192, 8, 128, True),
              (8192, 8, 768, False), (64, 8, 768, True), (1024, 8, 128, True), (2048, 16, 32, True),
              (4096, 2, 200, True), (16384, 16, 128, True), (2303, 8, 768, True), (4096, 16, 128, True)]
    base = {shape: choose_config(*shape, one_load=False) for shape in shapes}  # the two-load tiles
    assert not any(c.tap_select or c.rows for c in base.values())
    counts = {"rows": 0, "one-load": 0}
    row_cfg = SconvConfig(block_t=8, block_c=256, num_warps=2, rows=True)
    for (t, h, w, mapped), cfg in base.items():
        got = choose_config(t, h, w, mapped)
        add = choose_add_config(t, h, w, mapped)
        assert (add.block_t, add.num_warps) == (cfg.block_t, cfg.num_warps)
        tiles = _one_load_or(cfg, t, h, w, mapped and t * h * w >= MAP_MIN_WORK)
        assert got == tiles  # no request bound: never the row kernel
        per = ROWS_TOKENS_PER_REQUEST
        few, many = max(1, t // per), t // per + 1  # requests: enough rows each, or fewer
        if mapped and t >= 1024 and h * w % 256 == 0:
            counts["rows"] += 1
            assert choose_config(t, h, w, mapped, num_requests=few) == row_cfg
            assert choose_config(t, h, w, mapped, one_load=False, num_requests=1) == row_cfg
            assert choose_config(t, h, w, mapped, rows=False, num_requests=1) == tiles
        else:
            assert choose_config(t, h, w, mapped, num_requests=few) == tiles
        assert choose_config(t, h, w, mapped, num_requests=many) == tiles
        assert choose_config(t, h, w, mapped, one_load=False, num_requests=many) == cfg
        counts["one-load"] += tiles != cfg
    assert counts == {"rows": 7, "one-load": 9}


def _one_load_or(two_load: object, t: int, h: int, w: int, on: bool) -> object:
    """The one-load tile choose_config gives a large mapped launch (``on``), else the
    two-load tile."""
    from inkling_kernels.sconv.kernel import SconvConfig

    if not on:
        return two_load
    bc = min(128, w & -w if w % 32 == 0 else 1 << (w - 1).bit_length())
    return SconvConfig(block_t=16, block_c=bc, num_warps=max(1, min(4, 16 * bc // 512)), tap_select=True)


@needs_interpreter
def test_tap_select_default_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A mapped launch of at least MAP_MIN_WORK elements with fewer than
    ROWS_TOKENS_PER_REQUEST rows a request (so not the row kernel) runs the default
    one-load tiles: against the reference and the cache oracle. The rule is checked at
    its real sizes (1024 rows from 145 requests, 8 heads x 128); the launch runs with
    both thresholds lowered for the interpreter's sake (154 rows: a 130-token chunk
    after a history and 24 decodes, 25 requests; 2 heads x 128)."""
    import inkling_kernels.sconv.kernel as K

    grids = _count_row_launches(monkeypatch)
    cfg = K.choose_config(1024, 8, 128, True, num_requests=145)
    assert cfg.tap_select and not cfg.rows
    monkeypatch.setattr(K, "ROWS_MIN_TOKENS", 128)
    monkeypatch.setattr(K, "MAP_MIN_WORK", 2**15)
    cfg = K.choose_config(154, 2, 128, True, num_requests=25)
    assert cfg.tap_select and not cfg.rows
    rng = random.Random(5)
    world = PagedWorld(num_heads=2, head_size=128, streams=((0, 128),), dtype=torch.bfloat16, num_blocks=400, seed=5)
    plan = [(37, 130)] + [(rng.randint(0, 50), 1) for _ in range(24)]
    for rid, (history, _) in enumerate(plan):
        world.add_request(rid, history)
    items = [(rid, n) for rid, (_, n) in enumerate(plan)]
    rng.shuffle(items)
    batch = world.make_batch(items)
    assert batch.positions.shape[0] == 154 and batch.block_table.shape[0] == 25
    world.run(batch, 0, "triton_map")
    assert grids == []


@needs_interpreter
def test_rows_default_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A mapped launch that choose_config's row-kernel rule takes runs the row-register
    kernel by default: against the reference and the cache oracle. The rule itself is
    checked at its real sizes (1094 rows from 16 requests, 8 heads x 128); the launch
    runs with ``ROWS_MIN_TOKENS`` lowered to 128 so that the interpreter runs 20 programs
    rather than 548 (154 rows from 16 requests: a 90-token prompt, a 50-token chunk after
    a history, 14 decodes; 2 heads x 128)."""
    import inkling_kernels.sconv.kernel as K

    calls = _count_row_launches(monkeypatch)
    assert K.choose_config(1094, 8, 128, True, num_requests=16).rows
    assert not K.choose_config(1094, 8, 128, True, num_requests=1094 // K.ROWS_TOKENS_PER_REQUEST + 1).rows
    assert not K.choose_config(154, 2, 128, True, num_requests=16).rows
    monkeypatch.setattr(K, "ROWS_MIN_TOKENS", 128)
    world = PagedWorld(num_heads=2, head_size=128, streams=((0, 128),), dtype=torch.bfloat16, num_blocks=260, seed=6)
    world.run(_rows_rule_batch(world, random.Random(6)), 0, "triton_map")
    assert len(calls) == 1


def test_rows_rule_prompt_row_hint() -> None:
    """With the batch's ``num_prefill_tokens`` the rule goes by the share of prompt rows
    (>= half), not rows per request: the two cannot be told apart by T and the request
    count alone (2048 + 255 decodes and 114 x 9 speculative rows both bring 9 rows a
    request; the row kernel wins on the first and loses on the second)."""
    import inkling_kernels.sconv.kernel as K

    def rows(t: int, r: int, prefill: int | None) -> bool:
        return K.choose_config(t, 8, 768, True, num_requests=r, num_prefill_tokens=prefill).rows

    assert rows(2303, 256, None) and rows(2303, 256, 2048)  # 2048-token prompt + 255 decodes
    assert rows(1026, 114, None) and not rows(1026, 114, 0)  # 114 x 9 speculative
    assert rows(1024, 128, None) and not rows(1024, 128, 0)  # 128 x 8 speculative
    assert not rows(1279, 256, None) and rows(1279, 256, 1024)  # 1024-token prompt + 255 decodes
    assert rows(1024, 513, 512) and not rows(1024, 513, 511)  # half the rows in the prompt
    assert not rows(1000, 1, 1000) and not rows(8192, 1, 8192 - 4096 - 1)
    assert rows(8192, 8192, 8192)  # the hint wins over a padded block table
    assert not K.choose_config(8192, 8, 768, False, num_requests=1, num_prefill_tokens=8192).rows  # no map


@needs_interpreter
def test_rows_hint_reaches_the_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hint travels with the batch to the launch: a batch of 5 rows a request whose
    rows are mostly one prompt's takes the row kernel with it and the tiles without it;
    a batch of 8-row speculative requests the reverse; every launch against the
    reference and the cache oracle (``ROWS_MIN_TOKENS`` lowered to 64 for the
    interpreter)."""
    import inkling_kernels.sconv.kernel as K

    calls = _count_row_launches(monkeypatch)
    monkeypatch.setattr(K, "ROWS_MIN_TOKENS", 64)
    world = PagedWorld(num_heads=2, head_size=128, streams=((0, 128),), dtype=torch.bfloat16, num_blocks=300, seed=8)
    rng = random.Random(8)
    mixed = [(0, 76)] + [(rng.randint(3, 40), 1) for _ in range(19)]  # 95 rows, 20 requests
    spec = [(rng.randint(3, 40), 8) for _ in range(12)]  # 96 rows, 12 requests
    for base, (plan, prefill) in enumerate(((mixed, 76), (spec, 0))):
        for hint in (None, prefill):
            rid0 = 100 * (2 * base + (hint is not None))
            for i, (history, _) in enumerate(plan):
                world.add_request(rid0 + i, history)
            batch = world.make_batch([(rid0 + i, n) for i, (_, n) in enumerate(plan)])
            batch.num_prefill_tokens = hint
            before = len(calls)
            world.run(batch, 0, "triton_map")
            took_rows = len(calls) > before
            assert took_rows == (hint is not None if plan is mixed else hint is None), (plan is mixed, hint)


def _count_row_launches(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """A list that records the grid of each launch of the row kernel
    (:func:`count_launches`)."""
    import inkling_kernels.sconv.kernel as K

    return count_launches(monkeypatch, K, "_rows_sconv_kernel")


def _rows_rule_batch(world: PagedWorld, rng: random.Random) -> Batch:
    """154 rows from 16 requests (a 90-token prompt, a 50-token chunk after a history,
    14 decodes; shuffled): 9.6 rows a request, just inside the rule's 8."""
    plan = [(0, 90), (37, 50)] + [(rng.randint(0, 50), 1) for _ in range(14)]
    for rid, (history, _) in enumerate(plan):
        world.add_request(rid, history)
    items = [(rid, n) for rid, (_, n) in enumerate(plan)]
    rng.shuffle(items)
    batch = world.make_batch(items)
    assert (batch.positions.shape[0], batch.block_table.shape[0]) == (154, 16)
    return batch


@pytest.mark.parametrize("impl", IMPLS)
def test_multi_step(impl: str) -> None:
    """Many steps of mixed chunked prefill, decode and speculative verification with
    rejected drafts, sliding-window block freeing (freed blocks are reused, so a
    stale read would show) and random batch order; every step is compared with the
    full-sequence causal conv of the accepted tokens (PagedWorld.run)."""
    rng = random.Random(1234)
    world = PagedWorld(dtype=torch.bfloat16, block_size=4, num_blocks=48, seed=1234)
    streams = (0, 2)
    prompts: dict[int, int] = {}  # rid -> tokens of prompt left to prefill
    next_rid = 0
    for step in range(14):
        while len(prompts) < 4 and rng.random() < 0.7:
            world.add_request(next_rid, 0)
            prompts[next_rid] = rng.randint(1, 14)
            next_rid += 1
        items: list[tuple[int, int]] = []
        accepted: dict[int, int] = {}
        for rid, left in prompts.items():
            if left > 0:  # (chunked) prefill
                n = min(left, rng.randint(1, 6))
                prompts[rid] = left - n
                items.append((rid, n))
            elif rng.random() < 0.5:  # speculative verify: last token + drafts
                n = rng.randint(2, 4)
                items.append((rid, n))
                accepted[rid] = rng.randint(1, n)
            else:  # decode
                items.append((rid, 1))
        rng.shuffle(items)
        batch = world.make_batch(items, num_pad=rng.randint(0, 2))
        for s in streams:
            world.run(batch, s, impl)
        world.commit(batch, accepted)
        for rid in list(prompts):
            world.free_out_of_window(rid)
            if prompts[rid] == 0 and world.reqs[rid].length > 20 and rng.random() < 0.3:
                req = world.reqs.pop(rid)  # finished: its blocks go back
                world.free.extend(b for b in req.table if b != 0)
                del prompts[rid]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("hit", [12, 13], ids=["aligned", "unaligned"])
@pytest.mark.parametrize("hit_first", [True, False], ids=["B-first", "A-first"])
def test_same_step_prefix_hit(impl: str, hit: int, hit_first: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/design.md §3.2: request A computes a prompt; request B, the same prompt, hits
    A's first blocks (registered as cached when allocated) and computes the rest in
    the same call. B's pre-forward taps name slots that A writes in this call; they
    are NaN before it. B placed first reproduces the stale read on the interpreter
    (programs run in order); the result must be right in both orders, and at any
    alignment of the hit on every path (an unaligned hit shares A's partial block)."""
    from inkling_kernels.sconv.kernel import SconvConfig

    small_scan(monkeypatch, 8)
    world = PagedWorld(dtype=torch.bfloat16, block_size=4, num_blocks=40, seed=99)
    batch = world.prefix_hit_batch(hit, hit_first)
    for s in range(len(world.streams)):
        # Small tiles, so A's and B's rows sit in different programs.
        cfg = SconvConfig(block_t=4, block_c=8, num_warps=1)
        world.run(batch, s, impl, config=cfg if impl != "reference" else None)


@pytest.mark.parametrize("impl", IMPLS)
def test_empty_batch(impl: str) -> None:
    world = PagedWorld(seed=3)
    batch = world.make_batch([], num_pad=0)
    world.run(batch, 0, impl)


@pytest.mark.parametrize("impl", IMPLS)
def test_pad_only_batch(impl: str) -> None:
    world = PagedWorld(seed=4)
    batch = world.make_batch([], num_pad=3)
    world.run(batch, 1, impl)


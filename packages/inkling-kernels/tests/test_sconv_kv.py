"""fused_sconv_kv: the K and V convs in one launch, from column slices of a qkv
tensor, against two fused_sconv reference calls and the full-sequence causal conv
(PagedWorld.run_kv), on the CPU reference path and the Triton kernel (interpreted
here), with and without the step's tap map; validation before any launch; the custom
op's schema, fake and compile behaviour."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
import torch

from inkling_kernels import SconvBatch, fused_sconv_kv, fused_sconv_kv_ref, sconv_tap_map
from inkling_kernels.sconv.kernel import SconvConfig
from inkling_kernels.sconv_kv.kernel import fused_sconv_kv_triton

from _sconv_world import IMPLS, PagedWorld, needs_interpreter
from test_fused_sconv import _count_row_launches, _long_prompts, _rows_rule_batch, _trace, small_scan

# Small tiles: several programs per batch, channel tiles narrower than a head (with
# the map-less hazard scan in 8-slot chunks: small_scan).
SMALL = SconvConfig(block_t=4, block_c=8, num_warps=1)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "kind,dtype",
    [("prefill", torch.float32), ("decode", torch.bfloat16), ("chunked", torch.float32),
     ("spec", torch.bfloat16), ("mixed", torch.float32), ("mixed", torch.bfloat16), ("mixed", torch.float16)],
    ids=str,
)
def test_trace_kinds(impl: str, kind: str, dtype: torch.dtype, case_seed: Callable[..., int]) -> None:
    seed = case_seed(kind, str(dtype)) % 1000
    rng = random.Random(seed)
    world = PagedWorld(dtype=dtype, num_blocks=96, seed=seed)
    batch = world.make_batch(_trace(world, kind, rng), num_pad=2 if kind == "mixed" else 0, extra_cols=1)
    world.run_kv(batch, impl)


LAYOUTS: dict[str, dict[str, Any]] = {
    # V's columns before K's inside D, and a qkv without q columns (k at column 0).
    "v-before-k": dict(run=dict(streams=(1, 0), q_cols=0)),
    # An engine's page-padded cache (a strided view), N = 8 with W = 3.
    "strided-pages-N8-W3": dict(world=dict(page_pad=24, block_size=8, kernel_size=3)),
    # Weights in the activation dtype, 2-D; the epilogue variants of fused_sconv.
    "2d-weights-silu": dict(world=dict(weight_dtype=torch.bfloat16, weight_3d=False), run=dict(activation="silu")),
    "no-residual": dict(run=dict(activation="silu", residual=False)),
    # Heads of 12 columns in tiles of 8: masked lanes in every second tile.
    "wide-heads-small-tiles": dict(world=dict(streams=((0, 12), (12, 12)), head_size=24), tiles=SMALL),
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layouts_and_epilogues(impl: str, layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = LAYOUTS[layout]
    if "tiles" in spec:
        small_scan(monkeypatch, 8)
    world = PagedWorld(dtype=torch.bfloat16, seed=11, **spec.get("world", {}))
    batch = world.make_batch(_trace(world, "mixed", random.Random(11)), num_pad=2)
    config = spec.get("tiles") if impl != "reference" else None
    world.run_kv(batch, impl, config=config, **spec.get("run", {}))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("hit", [12, 13], ids=["aligned", "unaligned"])
@pytest.mark.parametrize("hit_first", [True, False], ids=["B-first", "A-first"])
def test_same_step_prefix_hit(impl: str, hit: int, hit_first: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same-step hazard (docs/design.md §3.2) in both request orders: B's
    pre-forward K and V slots, written by A in this very launch, are NaN before it;
    both streams must read A's rows (one launch inserts both streams, then convolves)."""
    small_scan(monkeypatch, 8)
    world = PagedWorld(dtype=torch.bfloat16, block_size=4, num_blocks=40, seed=99)
    batch = world.prefix_hit_batch(hit, hit_first)
    world.run_kv(batch, impl, config=SMALL if impl != "reference" else None)


@needs_interpreter
@pytest.mark.parametrize("kind", ["mixed", "decode"])
def test_rows_kernel(kind: str) -> None:
    """``SconvConfig(rows=True)`` on the K+V launch: the row-register kernel once per
    stream, each reading its column slice of qkv: both outputs and the cache against
    the references, with prompts long enough for its register path."""
    rng = random.Random(17)
    world = PagedWorld(dtype=torch.bfloat16, num_blocks=96, seed=17)
    items = _long_prompts(world, rng, "mixed") if kind == "mixed" else _trace(world, "decode", rng)
    batch = world.make_batch(items, num_pad=1, extra_cols=1)
    world.run_kv(batch, "triton_map", config=SconvConfig(block_t=8, block_c=8, num_warps=1, rows=True))


@needs_interpreter
def test_rows_default_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A mapped K+V launch inside the row-kernel rule (154 rows from 16 requests: a
    prompt, a chunk after a history, 14 decodes; K and V 2 heads x 128 each;
    ``ROWS_MIN_TOKENS`` lowered to 128 for the interpreter's sake) takes the row-register
    kernel by default, one launch for both streams (column slices of one qkv tensor);
    with V in its own tensor (another row stride), a launch per stream. Both outputs and
    the cache against the references."""
    import inkling_kernels.sconv.kernel as K

    grids = _count_row_launches(monkeypatch)
    monkeypatch.setattr(K, "ROWS_MIN_TOKENS", 128)
    for v_copy, launches in ((False, [2]), (True, [1, 1])):
        world = PagedWorld(num_heads=2, head_size=256, streams=((0, 128), (128, 128)), dtype=torch.bfloat16,
                           num_blocks=260, seed=7)
        world.run_kv(_rows_rule_batch(world, random.Random(7)), "triton_map", v_copy=v_copy)
        assert [g[2] for g in grids] == launches
        grids.clear()


@needs_interpreter
@pytest.mark.parametrize("hit_first", [True, False], ids=["B-first", "A-first"])
def test_rows_kernel_same_step_prefix_hit(hit_first: bool) -> None:
    """The same-step hazard on the K+V launch through the row-register kernel."""
    world = PagedWorld(dtype=torch.bfloat16, block_size=4, num_blocks=40, seed=99)
    batch = world.prefix_hit_batch(13, hit_first)
    world.run_kv(batch, "triton_map", config=SconvConfig(block_t=4, block_c=8, num_warps=1, rows=True))


@pytest.mark.parametrize("impl", IMPLS)
def test_multi_step(impl: str) -> None:
    """Steps of chunked prefill, decode and speculative verification with rejected
    drafts and sliding-window block reuse: every step's K and V against the
    full-sequence conv of the accepted tokens."""
    rng = random.Random(77)
    world = PagedWorld(dtype=torch.float32, block_size=4, num_blocks=48, seed=77)
    for rid in range(3):
        world.add_request(rid, 0)
    for step in range(5):
        items = [(rid, rng.choice([1, 3, 5] if step < 2 else [1, 3])) for rid in range(3)]
        rng.shuffle(items)
        batch = world.make_batch(items, num_pad=rng.randint(0, 2))
        world.run_kv(batch, impl)
        world.commit(batch, {rid: 1 for rid, n in items if n == 3})  # rejected drafts
        for rid in range(3):
            world.free_out_of_window(rid)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("pads", [0, 3], ids=["empty", "pad-only"])
def test_empty_and_pad_only_batches(impl: str, pads: int) -> None:
    world = PagedWorld(seed=3)
    world.run_kv(world.make_batch([], num_pad=pads), impl)


@needs_interpreter
def test_one_launch_for_both_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    """The public op on the Triton path launches the fused kernel once, with two
    streams; the map build (when the batch has none) is not a conv launch."""
    from inkling_kernels.sconv import kernel

    launches: list[int] = []
    real = kernel._fused_sconv_kernel

    class Counting:
        def __getitem__(self, grid: Any) -> Callable[..., Any]:
            def launch(*args: Any, **kwargs: Any) -> Any:
                launches.append(kwargs["STREAMS"])
                return real[grid](*args, **kwargs)

            return launch

    monkeypatch.setattr(kernel, "_fused_sconv_kernel", Counting())
    monkeypatch.setenv("INKLING_KERNELS_CPU_BACKEND", "triton")
    world = PagedWorld(dtype=torch.float32, seed=5)
    batch = world.make_batch(_trace(world, "mixed", random.Random(5)), num_pad=1)
    for mapped in (False, True):
        sb = batch.sconv()
        if mapped:
            sb = sconv_tap_map(sb, torch.zeros(sb.num_tokens, 3, dtype=torch.int64))
        qkv = torch.cat([batch.x[0], batch.x[1]], dim=1)
        k, v = qkv[:, :16], qkv[:, 16:]
        ref = fused_sconv_kv_ref(k, v, world.weights[0], world.weights[1], world.cache.clone(), sb, 0, 8, 8)
        launches.clear()
        out = fused_sconv_kv(k, v, world.weights[0], world.weights[1], world.cache.clone(), sb, 0, 8, 8)
        assert launches == [2]
        for got, want in zip(out, ref):
            torch.testing.assert_close(got, want)


# --- validation -----------------------------------------------------------------


def _base() -> dict[str, Any]:
    world = PagedWorld(dtype=torch.bfloat16, seed=0)
    world.add_request(0, 6)
    world.add_request(1, 0)
    b = world.make_batch([(0, 2), (1, 3)], num_pad=1)
    qkv = torch.cat([torch.randn(b.x[0].shape[0], 4).to(torch.bfloat16), b.x[0], b.x[1]], dim=1)
    return dict(
        k=qkv[:, 4:20], v=qkv[:, 20:], k_weight=world.weights[0], v_weight=world.weights[1],
        cache=world.cache, batch=b.sconv(), k_offset=0, v_offset=8, head_dim=8,
        activation=None, residual=True,
    )


def _call(fn: Callable[..., Any], kw: dict[str, Any]) -> Any:
    names = ("k", "v", "k_weight", "v_weight", "cache", "batch", "k_offset", "v_offset", "head_dim")
    return fn(*[kw[n] for n in names], activation=kw["activation"], residual=kw["residual"])


BAD: list[tuple[str, Callable[[dict[str, Any]], dict[str, Any]], type[Exception], str]] = [
    ("k column stride", lambda k: dict(k=torch.cat([k["k"], k["k"]], 1)[:, ::2]), ValueError, "unit column stride"),
    ("k rows overlap", lambda k: dict(k=k["k"].as_strided(k["k"].shape, (4, 1))), ValueError, "rows overlap"),
    ("v 1-D", lambda k: dict(v=k["v"][0]), ValueError, "v must be 2-D"),
    ("v fewer rows", lambda k: dict(v=k["v"][:-1]), ValueError, "v has 5 rows but the batch"),
    ("v other heads", lambda k: dict(v=torch.cat([k["v"], k["v"]], 1)), ValueError, "v has 32 channels"),
    ("v dtype", lambda k: dict(v=k["v"].float()), TypeError, "differs from v dtype"),
    ("k int", lambda k: dict(k=k["k"].to(torch.int32)), TypeError, "k must be bfloat16"),
    ("v device", lambda k: dict(v=k["v"].to("meta")), ValueError, "v is on meta"),
    ("k_weight channels", lambda k: dict(k_weight=k["k_weight"][:-1]), ValueError, "k_weight has 15 channels"),
    ("v_weight W", lambda k: dict(v_weight=k["v_weight"][..., :3]), ValueError, "v_weight's kernel size 3"),
    ("k_weight fp16", lambda k: dict(k_weight=k["k_weight"].half()), TypeError, "k_weight must be float32 or k's"),
    ("same offsets", lambda k: dict(v_offset=0), ValueError, "overlap inside D"),
    ("overlapping ranges", lambda k: dict(v_offset=4), ValueError, "overlap inside D"),
    ("v outside D", lambda k: dict(v_offset=30), ValueError, r"\(v_offset\) lies outside"),
    ("head_dim vs k", lambda k: dict(head_dim=4), ValueError, "k has 16 channels but the cache"),
    ("head_dim 0", lambda k: dict(head_dim=0), ValueError, "head_dim must be >= 1"),
    ("offset float", lambda k: dict(k_offset=0.0), TypeError, "k_offset must be an int"),
    ("cache block", lambda k: dict(cache=k["cache"][:, :, :2]), ValueError, "block dimension"),
    ("activation", lambda k: dict(activation="gelu"), ValueError, "silu"),
    ("batch", lambda k: dict(batch=None), TypeError, "SconvBatch"),
]


@pytest.mark.parametrize("name,change,exc,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_args_raise_before_any_launch(name: str, change: Callable[[dict[str, Any]], dict[str, Any]],
                                          exc: type[Exception], msg: str) -> None:
    kw = _base()
    cache = kw["cache"]
    before = cache.clone()
    kw.update(change(kw))
    for fn in (fused_sconv_kv, fused_sconv_kv_ref, fused_sconv_kv_triton):
        with pytest.raises(exc, match=msg):
            _call(fn, kw)
    assert torch.equal(cache, before)  # raised before anything was written


def test_weights_of_different_kernel_sizes_without_batch_w() -> None:
    """A batch that names no kernel size leaves W to the weights: K's and V's must agree."""
    kw = _base()
    b = kw["batch"]
    kw["batch"] = SconvBatch(b.positions, b.block_table, b.seq_idx, b.slot_mapping, b.query_start, b.block_size)
    kw["v_weight"] = kw["v_weight"][..., :3]
    with pytest.raises(ValueError, match="share W"):
        _call(fused_sconv_kv, kw)


def test_one_check_per_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    from inkling_kernels import checks, sconv_kv
    from inkling_kernels.sconv_kv import reference

    calls: list[str] = []
    real = checks.check_kv_call

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append("kv")
        return real(*args, **kwargs)

    for mod in (sconv_kv, reference):
        monkeypatch.setattr(mod, "check_kv_call", counted)
    monkeypatch.setattr(checks, "check_conv_call", lambda *a, **k: calls.append("conv"))
    kw = _base()
    for _ in range(3):
        _call(fused_sconv_kv, kw)
    assert calls == ["kv"] * 3


# --- the custom op ----------------------------------------------------------------


def _op_args(kw: dict[str, Any], cache: torch.Tensor) -> tuple[Any, ...]:
    return (kw["k"], kw["v"], kw["k_weight"], kw["v_weight"], cache, *kw["batch"].op_args(),
            kw["k_offset"], kw["v_offset"], kw["head_dim"], kw["activation"], kw["residual"],
            torch.empty(kw["k"].shape, dtype=kw["k"].dtype), torch.empty(kw["v"].shape, dtype=kw["v"].dtype))


def test_custom_op_schema_fake_and_opcheck() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    schema = str(torch.ops.inkling.fused_sconv_kv.default._schema)
    assert "Tensor(a!) cache" in schema and "Tensor(b!) k_out" in schema and "Tensor(c!) v_out" in schema
    kw = _base()
    torch.library.opcheck(torch.ops.inkling.fused_sconv_kv.default, _op_args(kw, kw["cache"].clone()))
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fk = {n: mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for n, t in kw.items()}
        k_out, v_out = _call(fused_sconv_kv, fk)
        assert k_out.shape == kw["k"].shape and k_out.is_contiguous() and v_out.dtype == kw["v"].dtype
        with pytest.raises(ValueError, match="overlap inside D"):
            _call(fused_sconv_kv, {**fk, "v_offset": 0})


def test_torch_compile_on_qkv_views() -> None:
    """Split a qkv projection inside a compiled function and convolve K and V in one
    op: the outputs and the cache mutation equal the eager run."""
    kw = _base()
    qkv = torch.cat([torch.zeros(kw["k"].shape[0], 4, dtype=torch.bfloat16), kw["k"], kw["v"]], dim=1)

    def fn(qkv: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
        _, k, v = qkv.split([4, 16, 16], dim=-1)
        k_out, v_out = fused_sconv_kv(k, v, kw["k_weight"], kw["v_weight"], cache, kw["batch"], 0, 8, 8)
        return torch.cat([k_out, v_out], dim=1) * 2

    cache_eager, cache_c = kw["cache"].clone(), kw["cache"].clone()
    eager = fn(qkv, cache_eager)
    out = torch.compile(fn, backend="aot_eager", fullgraph=True)(qkv, cache_c)
    torch.testing.assert_close(out, eager)
    assert torch.equal(cache_c, cache_eager)

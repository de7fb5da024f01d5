"""Input validation (before any launch), how often it runs, and the torch custom-op
registration."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

from inkling_kernels import SconvBatch, fused_sconv, fused_sconv_ref

from _sconv_world import PagedWorld


def _base() -> dict[str, Any]:
    world = PagedWorld(dtype=torch.bfloat16, seed=0)
    world.add_request(0, 6)
    world.add_request(1, 0)
    b = world.make_batch([(0, 2), (1, 3)], num_pad=1)
    off, width = world.streams[2]
    return dict(
        x=b.x[2], weight=world.weights[2], cache=world.cache, positions=b.positions,
        block_table=b.block_table, seq_idx=b.seq_idx, slot_mapping=b.slot_mapping,
        query_start=b.query_start, stream_offset=off, stream_width=width,
        block_size=world.N, activation=None, residual=True,
    )


BATCH_FIELDS = ("positions", "block_table", "seq_idx", "slot_mapping", "query_start", "block_size")


def _batch(kw: dict[str, Any], **extra: Any) -> SconvBatch:
    return SconvBatch(**{n: kw[n] for n in BATCH_FIELDS}, **extra)


def _call(fn: Callable[..., torch.Tensor], kw: dict[str, Any]) -> torch.Tensor:
    """Call a conv entry point on a batch (built here, so that the batch's own checks
    count as the call's)."""
    return fn(kw["x"], kw["weight"], kw["cache"], _batch(kw), kw["stream_offset"], kw["stream_width"],
              activation=kw["activation"], residual=kw["residual"])


def _transposed_d(c: torch.Tensor) -> torch.Tensor:
    return c.transpose(2, 3).contiguous().transpose(2, 3)


BAD: list[tuple[str, str, Callable[[dict[str, Any]], Any], type[Exception], str]] = [
    ("x 1-D", "x", lambda k: k["x"].flatten(), ValueError, "2-D"),
    ("x int", "x", lambda k: k["x"].to(torch.int32), TypeError, "bfloat16, float16 or float32"),
    ("x strided", "x", lambda k: torch.cat([k["x"], k["x"]], 1)[:, ::2], ValueError, "contiguous"),
    ("cache dtype", "cache", lambda k: k["cache"].float(), TypeError, "same dtype"),
    ("cache 3-D", "cache", lambda k: k["cache"][0], ValueError, "4-D"),
    ("cache D stride", "cache", lambda k: _transposed_d(k["cache"]), ValueError, "stride 1"),
    ("block size", "cache", lambda k: k["cache"][:, :, :2], ValueError, "block dimension"),
    ("weight channels", "weight", lambda k: k["weight"][:-1], ValueError, "channels"),
    ("weight W=1", "weight", lambda k: k["weight"][..., :1], ValueError, ">= 2"),
    ("weight (C,2,W)", "weight", lambda k: k["weight"].expand(-1, 2, -1), ValueError, r"\(dim, 1, W\)"),
    ("weight fp16", "weight", lambda k: k["weight"].half(), TypeError, "float32 or x's dtype"),
    ("weight 4-D", "weight", lambda k: k["weight"][None], ValueError, "weight must be"),
    ("positions length", "positions", lambda k: k["positions"][:-1], ValueError, "one entry per token"),
    ("positions int32", "positions", lambda k: k["positions"].int(), TypeError, "int64"),
    ("slots float", "slot_mapping", lambda k: k["slot_mapping"].float(), TypeError, "int64"),
    ("slots int32", "slot_mapping", lambda k: k["slot_mapping"].int(), TypeError, "int64"),
    ("seq_idx int64", "seq_idx", lambda k: k["seq_idx"].long(), TypeError, "int32"),
    ("seq_idx device", "seq_idx", lambda k: k["seq_idx"].to("meta"), ValueError, "is on meta"),
    ("query_start strided", "query_start", lambda k: torch.stack([k["query_start"]] * 2, 1)[:, 0], ValueError, "contiguous"),
    ("block_table 1-D", "block_table", lambda k: k["block_table"][0], ValueError, "2-D"),
    ("block_table float", "block_table", lambda k: k["block_table"].float(), TypeError, "int32"),
    ("block_table int64", "block_table", lambda k: k["block_table"].long(), TypeError, "int32"),
    ("x rows vs batch", "x", lambda k: k["x"][:-1], ValueError, "rows but the batch"),
]

KW_BAD: list[tuple[str, str, Any, type[Exception], str]] = [
    ("stream outside D", "stream_offset", 30, ValueError, "outside"),
    ("stream width vs x", "stream_width", 8, ValueError, "channels but the cache has"),
    ("offset float", "stream_offset", 1.0, TypeError, "int"),
    ("negative width", "stream_width", 0, ValueError, ">= 1"),
    ("activation", "activation", "gelu", ValueError, "silu"),
    ("residual", "residual", 1, TypeError, "bool"),
    ("block_size 0", "block_size", 0, ValueError, ">= 1"),
]


def _impls() -> list[Callable[..., torch.Tensor]]:
    from inkling_kernels.sconv.kernel import fused_sconv_triton

    return [fused_sconv, fused_sconv_ref, fused_sconv_triton]


@pytest.mark.parametrize("name,key,mutate,exc,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_tensor_args(name: str, key: str, mutate: Callable[[dict[str, Any]], Any],
                         exc: type[Exception], msg: str) -> None:
    kw = _base()
    cache = kw["cache"]
    before = cache.clone()
    kw[key] = mutate(kw)
    for fn in _impls():
        with pytest.raises(exc, match=msg):
            _call(fn, kw)
    assert torch.equal(cache, before)  # raised before anything was written


@pytest.mark.parametrize("name,key,value,exc,msg", KW_BAD, ids=[b[0] for b in KW_BAD])
def test_bad_scalar_args(name: str, key: str, value: Any, exc: type[Exception], msg: str) -> None:
    kw = _base()
    kw[key] = value
    for fn in _impls():
        with pytest.raises(exc, match=msg):
            _call(fn, kw)


@pytest.mark.parametrize("value,exc,msg", [
    (-1, ValueError, ">= 0"), (7, ValueError, "exceeds the batch's 6 rows"), (2.0, TypeError, "int"),
    (True, TypeError, "int"),
])
def test_bad_prefill_token_hint(value: Any, exc: type[Exception], msg: str) -> None:
    """The batch's ``num_prefill_tokens`` hint is checked when the batch is built, and
    with it a message that says what to count."""
    kw = _base()
    with pytest.raises(exc, match=msg):
        _batch(kw, num_prefill_tokens=value)


def test_prefill_token_hint_travels_through_the_ops() -> None:
    """``op_args`` / ``split_op_args`` keep the hint (the custom ops' schema carries it),
    checked again inside the op's fake implementation; the results do not depend on it."""
    kw = _base()
    for hint in (None, 0, 3, 6):
        batch = _batch(kw, kernel_size=4, num_prefill_tokens=hint)
        args = (*batch.op_args(), "rest")
        back, rest = SconvBatch.split_op_args(args, check=True)
        assert back.num_prefill_tokens == hint and rest == ("rest",)
        assert ("prefill_rows" in repr(back)) == (hint is not None)
    outs = []
    for hint in (None, 5):
        cache = kw["cache"].clone()
        outs.append((fused_sconv(kw["x"], kw["weight"], cache, _batch(kw, num_prefill_tokens=hint),
                                 kw["stream_offset"], kw["stream_width"]), cache))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    args = (kw["x"], kw["weight"], kw["cache"], *_batch(kw, num_prefill_tokens=2).op_args(), kw["stream_offset"],
            kw["stream_width"], kw["activation"], kw["residual"], torch.empty_like(kw["x"]))
    torch.library.opcheck(torch.ops.inkling.fused_sconv.default, args)


def test_prefill_token_count() -> None:
    """Rows of the requests with more than ``decode_max_rows`` rows (default 16: up to 15
    drafts are speculative verifications); a bad threshold raises."""
    from inkling_kernels import prefill_token_count

    assert prefill_token_count([2048] + [1] * 255) == 2048
    assert prefill_token_count([8] * 128) == 0 and prefill_token_count([9] * 114) == 0
    assert prefill_token_count([16, 17, 3]) == 17 and prefill_token_count([9, 8], decode_max_rows=8) == 9
    assert prefill_token_count(torch.tensor([3, 40, 1])) == 40 and prefill_token_count([]) == 0
    for bad in (0, True, 2.5):
        with pytest.raises(ValueError, match="decode_max_rows"):
            prefill_token_count([1], decode_max_rows=bad)


def test_custom_ops_registered() -> None:
    assert hasattr(torch.ops.inkling, "fused_sconv")
    assert hasattr(torch.ops.inkling, "sconv_seq_metadata")
    schema = str(torch.ops.inkling.fused_sconv.default._schema)
    assert "Tensor(a!) cache" in schema and "Tensor(b!) out" in schema  # declared as mutated


def test_fake_impl() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    kw = _base()
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fk = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
        out = _call(fused_sconv, fk)
        assert out.shape == kw["x"].shape and out.dtype == kw["x"].dtype
        fk["stream_width"] = 8
        with pytest.raises(ValueError, match="channels"):
            _call(fused_sconv, fk)


def test_torch_compile_and_opcheck() -> None:
    kw = _base()
    cache_eager = kw["cache"].clone()
    eager = _call(fused_sconv, {**kw, "cache": cache_eager})

    def fn(**k: Any) -> torch.Tensor:
        return _call(fused_sconv, k) * 2

    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    cache_c = kw["cache"].clone()
    out = compiled(**{**kw, "cache": cache_c})
    torch.testing.assert_close(out, eager * 2)
    assert torch.equal(cache_c, cache_eager)  # the mutation survives compilation

    args = (kw["x"], kw["weight"], kw["cache"], *_batch(kw).op_args(), kw["stream_offset"],
            kw["stream_width"], kw["activation"], kw["residual"], torch.empty_like(kw["x"]))
    torch.library.opcheck(torch.ops.inkling.fused_sconv.default, args)
    qsl = torch.tensor([0, 2, 5], dtype=torch.int32)
    bufs = (torch.zeros(8, dtype=torch.int32), torch.zeros(8, dtype=torch.int32))
    torch.library.opcheck(torch.ops.inkling.sconv_seq_metadata.default, (qsl, 2, 5, bufs[0], bufs[1], 7))


def test_eager_calls_skip_the_dispatcher_and_traced_calls_keep_the_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """An eager call on plain tensors runs the op's implementation without the
    dispatcher's host cost; under torch.compile, on fake tensors (in or out of their
    mode, test_fake_impl has the former) and where autograd records the call, the call
    is the op."""
    from torch._library.custom_ops import CustomOpDef
    from torch._subclasses.fake_tensor import FakeTensorMode

    kw = _base()
    eager = _call(fused_sconv, {**kw, "cache": kw["cache"].clone()})
    graphs = []

    def record(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        graphs.append(gm)
        return gm.forward

    traced = torch.compile(lambda **k: _call(fused_sconv, k), backend=record, fullgraph=True)(
        **{**kw, "cache": kw["cache"].clone()})
    torch.testing.assert_close(traced, eager)
    assert any("inkling.fused_sconv" in str(n.target) for g in graphs for n in g.graph.nodes)

    # fake tensors used after their mode: the op's fake implementation, no launch
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    assert _call(fused_sconv, fake).shape == kw["x"].shape
    # autograd records the op, not the implementation's copies: the cache stays a plain buffer
    cache = kw["cache"].clone()
    with torch.enable_grad():
        out = _call(fused_sconv, {**kw, "x": kw["x"].float().requires_grad_().to(kw["x"].dtype), "cache": cache})
    assert not cache.requires_grad and cache.grad_fn is None
    torch.testing.assert_close(out.detach(), eager)

    calls = []

    def counting(original: Any) -> Any:
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            name = (getattr(self, "_qualname", None) or getattr(self, "_qualified_op_name", None)
                    or getattr(getattr(self, "_schema", None), "name", ""))
            if "inkling" in name:
                calls.append(name)
            return original(self, *args, **kwargs)

        return call

    for cls in (CustomOpDef, torch._ops.OpOverloadPacket, torch._ops.OpOverload):
        monkeypatch.setattr(cls, "__call__", counting(cls.__call__))
    torch.testing.assert_close(_call(fused_sconv, {**kw, "cache": kw["cache"].clone()}), eager)
    assert not calls, f"eager call went through the dispatcher: {calls}"

    # a model passes its weights as parameters (vLLM's own subclasses add a
    # __torch_function__): they dispatch as plain tensors, so the call stays direct
    class WeightParameter(torch.nn.Parameter):
        @classmethod
        def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return super().__torch_function__(func, types, args, kwargs or {})

    for weight in (torch.nn.Parameter(kw["weight"].clone(), requires_grad=False),
                   WeightParameter(kw["weight"].clone(), requires_grad=False)):
        got = _call(fused_sconv, {**kw, "weight": weight, "cache": kw["cache"].clone()})
        torch.testing.assert_close(got, eager)
        assert not calls, f"eager call with a {type(weight).__name__} weight went through the dispatcher: {calls}"
    # a parameter autograd would track keeps the op
    with torch.enable_grad():
        _call(fused_sconv, {**kw, "weight": torch.nn.Parameter(kw["weight"].clone()), "cache": kw["cache"].clone()})
    assert calls, "a weight that requires grad must go through the op (autograd records it)"


def test_tap_map_ops_compile_and_opcheck() -> None:
    """sconv_tap_map is a mutating custom op with a fake impl; a batch carrying the
    map survives torch.compile (map build + conv in one graph)."""
    from inkling_kernels import sconv_tap_map

    assert "Tensor(a!) tap_map_out" in str(torch.ops.inkling.sconv_tap_map.default._schema)
    kw = _base()
    batch = _batch(kw, kernel_size=4)
    rows = kw["x"].shape[0]
    tap_map = torch.zeros(rows, 3, dtype=torch.int64)
    torch.library.opcheck(torch.ops.inkling.sconv_tap_map.default, (*batch.op_args(), tap_map))

    def fn(cache: torch.Tensor, tm: torch.Tensor) -> torch.Tensor:
        mapped = sconv_tap_map(batch, tm)
        return fused_sconv(kw["x"], kw["weight"], cache, mapped, kw["stream_offset"], kw["stream_width"])

    cache_eager, cache_c = kw["cache"].clone(), kw["cache"].clone()
    eager_map, compiled_map = torch.zeros_like(tap_map), torch.zeros_like(tap_map)
    eager = fn(cache_eager, eager_map)
    out = torch.compile(fn, backend="aot_eager", fullgraph=True)(cache_c, compiled_map)
    torch.testing.assert_close(out, eager)
    assert torch.equal(compiled_map, eager_map) and torch.equal(cache_c, cache_eager)
    args = (kw["x"], kw["weight"], kw["cache"], *batch.with_tap_map(eager_map).op_args(),
            kw["stream_offset"], kw["stream_width"], kw["activation"], kw["residual"], torch.empty_like(kw["x"]))
    torch.library.opcheck(torch.ops.inkling.fused_sconv.default, args)


def test_cpu_backend_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """INKLING_KERNELS_CPU_BACKEND=triton routes CPU tensors to the Triton kernels
    (interpreted here), with the same results; other values are refused."""
    from inkling_kernels import sconv_tap_map, uses_triton
    from inkling_kernels.sconv import kernel

    calls = []
    real = kernel.launch_fused_sconv

    def counting(x: torch.Tensor, cache: torch.Tensor, batch: SconvBatch, *args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(batch.tap_map is not None)
        return real(x, cache, batch, *args, **kwargs)

    monkeypatch.setattr(kernel, "launch_fused_sconv", counting)
    kw = _base()
    ref = _call(fused_sconv_ref, {**kw, "cache": kw["cache"].clone()})
    assert not uses_triton(torch.device("cpu"))
    _call(fused_sconv, {**kw, "cache": kw["cache"].clone()})
    assert calls == []
    monkeypatch.setenv("INKLING_KERNELS_CPU_BACKEND", "triton")
    assert uses_triton(torch.device("cpu"))
    mapped = sconv_tap_map(_batch(kw, kernel_size=4), torch.zeros(kw["x"].shape[0], 3, dtype=torch.int64))
    out = fused_sconv(kw["x"], kw["weight"], kw["cache"].clone(), mapped, kw["stream_offset"], kw["stream_width"])
    assert calls == [True]
    torch.testing.assert_close(out, ref, rtol=1.6e-2, atol=1.6e-2)
    monkeypatch.setenv("INKLING_KERNELS_CPU_BACKEND", "cuda")
    with pytest.raises(ValueError, match="INKLING_KERNELS_CPU_BACKEND"):
        uses_triton(torch.device("cpu"))
    # without the interpreter Triton has no CPU driver: refused before any launch
    monkeypatch.setenv("INKLING_KERNELS_CPU_BACKEND", "triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    calls.clear()
    for op in (lambda: uses_triton(torch.device("cpu")),
               lambda: fused_sconv(kw["x"], kw["weight"], kw["cache"].clone(), mapped, kw["stream_offset"],
                                   kw["stream_width"])):
        with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
            op()
    assert calls == []


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_checks_run_once_per_launch(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The validation budget: a batch is checked once when built (per step and
    KV-cache group); each eager conv launch on it then runs exactly one check of its
    own (check_conv_call), on the reference and on the Triton path alike, with or
    without a tap map, for fused_sconv, fused_sconv_add_rmsnorm and fused_sconv_add."""
    from inkling_kernels import checks, fused_sconv_add, fused_sconv_add_rmsnorm, sconv_tap_map

    counts: dict[str, int] = {}

    def counted(name: str) -> Callable[..., Any]:
        real = getattr(checks, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            counts[name] = counts.get(name, 0) + 1
            return real(*args, **kwargs)

        return wrapper

    public = [n for n in dir(checks) if n.startswith("check_")]
    assert {"check_add_extras", "check_batch", "check_conv_call", "check_norm_extras", "check_tap_map_call"} <= set(public)
    # Every module that imported a check by name sees the counting wrapper.
    import sys

    originals = {name: getattr(checks, name) for name in public}
    wrappers = {name: counted(name) for name in public}
    for mod in [m for name, m in list(sys.modules.items()) if name.startswith("inkling_kernels")]:
        for name in public:
            if getattr(mod, name, None) is originals[name]:
                monkeypatch.setattr(mod, name, wrappers[name])
    monkeypatch.setenv("INKLING_KERNELS_CPU_BACKEND", backend)

    kw = _base()
    batch = _batch(kw, kernel_size=4)
    assert counts == {"check_batch": 1}
    mapped = sconv_tap_map(batch, torch.zeros(kw["x"].shape[0], 3, dtype=torch.int64))
    counts.clear()
    launches = 0
    for b in (batch, mapped):
        for _ in range(3):  # e.g. three layers of the group
            fused_sconv(kw["x"], kw["weight"], kw["cache"], b, kw["stream_offset"], kw["stream_width"])
            launches += 1
    assert counts == {"check_conv_call": launches}

    # The fused conv + norm: one conv check plus its own extras, once each.
    world = PagedWorld(dtype=torch.float32, seed=1, streams=((0, 8), (8, 8)), head_size=16)
    world.add_request(0, 5)
    b2 = world.make_batch([(0, 3)], num_pad=1)
    nb = b2.sconv()
    hidden = torch.randn_like(b2.x[1])
    counts.clear()
    fused_sconv_add_rmsnorm(hidden, b2.x[1], world.weights[1], world.cache, nb, 8, 8,
                            torch.ones(world.channels(1)), 1e-6)
    assert counts == {"check_conv_call": 1, "check_norm_extras": 1}
    # The fused conv + add (no norm): the conv check plus its own extras.
    counts.clear()
    fused_sconv_add(hidden, b2.x[1], world.weights[1], world.cache, nb, 8, 8)
    assert counts == {"check_conv_call": 1, "check_add_extras": 1}


# Each op folder's public names: the op and its reference (the folder's ``__all__``) and
# the checked launcher ``<op>_triton`` (its ``kernel.py``); oracles that are no op's
# entry point are named here. The dispatch targets (``launch_<op>``, ``reference_<op>``)
# stay out of ``__all__``.
OP_FOLDERS = {
    "sconv": (["fused_sconv"], {"causal_conv_ref"}),
    "sconv_kv": (["fused_sconv_kv"], set()),
    "sconv_add_rmsnorm": (["fused_sconv_add_rmsnorm", "fused_sconv_add"], {"rms_norm_ref"}),
    "gathered_rmsnorm": (["gathered_rms_norm"], set()),
    "seq_metadata": (["sconv_seq_metadata"], set()),
    "tap_map": (["sconv_tap_map"], set()),
}


@pytest.mark.parametrize("folder", sorted(OP_FOLDERS))
def test_each_op_has_at_most_three_entry_points(folder: str) -> None:
    import importlib
    import inspect

    ops, oracles = OP_FOLDERS[folder]
    package = importlib.import_module(f"inkling_kernels.{folder}")
    assert set(package.__all__) == {name for op in ops for name in (op, f"{op}_ref")} | oracles
    kernel = importlib.import_module(f"inkling_kernels.{folder}.kernel")
    launchers = {name for name, fn in vars(kernel).items()
                 if name.endswith("_triton") and inspect.isfunction(fn) and fn.__module__ == kernel.__name__}
    assert launchers <= {f"{op}_triton" for op in ops}, f"{folder}/kernel.py: {sorted(launchers)}"


def test_attention_entry_points() -> None:
    """The attention: the op (PyTorch, the CPU path), its oracle, its launcher and the
    device predicate; the KV write and its launcher. Tile configs stay in kernel.py."""
    from inkling_kernels import rel_attention

    assert set(rel_attention.__all__) == {
        "paged_rel_attention", "rel_attention_ref", "paged_rel_attention_triton", "rel_attention_uses_triton",
        "write_kv", "write_kv_triton",
    }


Inputs = dict[str, torch.Tensor]


def _out_cases(
    block_table: torch.Tensor | None = None,
) -> tuple[dict[str, tuple[Callable[..., Any], int, torch.Tensor]], torch.Tensor, dict[str, Inputs]]:
    """Each conv op as ``call(cache, out)`` on one batch (its block table replaced by
    ``block_table`` when given), its result count and the tensor its outputs are shaped
    like; the cache; each op's activation inputs by name."""
    from inkling_kernels import fused_sconv_add, fused_sconv_add_rmsnorm, fused_sconv_kv

    world = PagedWorld(dtype=torch.float32, seed=3)
    world.add_request(0, 5)
    world.add_request(1, 0)
    b = world.make_batch([(0, 3), (1, 2)], num_pad=1)
    batch = SconvBatch(positions=b.positions, block_table=b.block_table if block_table is None else block_table,
                       seq_idx=b.seq_idx, slot_mapping=b.slot_mapping, query_start=b.query_start,
                       block_size=world.N)
    (k_off, head), (v_off, _), (off, width) = world.streams[0], world.streams[1], world.streams[2]
    x, k, v = b.x[2], b.x[0], b.x[1]
    hidden, norm_weight = torch.randn_like(x), torch.rand(x.shape[1]) + 0.5
    return {
        "fused_sconv": (lambda c, out: fused_sconv(x, world.weights[2], c, batch, off, width, out=out), 1, x),
        "fused_sconv_kv": (lambda c, out: fused_sconv_kv(k, v, world.weights[0], world.weights[1], c, batch,
                                                         k_off, v_off, head, out=out), 2, k),
        "fused_sconv_add": (lambda c, out: fused_sconv_add(hidden, x, world.weights[2], c, batch, off, width,
                                                           out=out), 1, x),
        "fused_sconv_add_rmsnorm": (lambda c, out: fused_sconv_add_rmsnorm(
            hidden, x, world.weights[2], c, batch, off, width, norm_weight, 1e-6, out=out), 2, x),
    }, world.cache, {
        "fused_sconv": {"x": x},
        "fused_sconv_kv": {"k": k, "v": v},
        "fused_sconv_add": {"hidden": hidden, "d": x},
        "fused_sconv_add_rmsnorm": {"hidden": hidden, "d": x},
    }


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("op", ["fused_sconv", "fused_sconv_kv", "fused_sconv_add", "fused_sconv_add_rmsnorm"])
def test_out_receives_the_result(op: str, backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``out=``: the op writes into the caller's tensors (NaN-poisoned first) and returns
    them, with the values and cache writes of a call that allocates; bad outputs are
    refused before anything runs (the cache untouched)."""
    monkeypatch.setenv("INKLING_KERNELS_CPU_BACKEND", backend)
    cases, cache, _ = _out_cases()
    call, count, like = cases[op]
    fresh_cache = cache.clone()
    fresh = call(fresh_cache, None)
    fresh = fresh if count == 2 else (fresh,)
    given_cache = cache.clone()
    outs = tuple(torch.full(like.shape, float("nan")) for _ in range(count))
    got = call(given_cache, outs if count == 2 else outs[0])
    got = got if count == 2 else (got,)
    assert all(g is o for g, o in zip(got, outs))
    for g, want in zip(got, fresh):
        assert torch.equal(g, want)
    assert torch.equal(given_cache, fresh_cache)

    def good() -> list[torch.Tensor]:
        return [torch.empty(like.shape) for _ in range(count)]

    bad = [
        (lambda o: o[0][:-1], ValueError, "shape"),
        (lambda o: o[0].double(), TypeError, "float32"),
        (lambda o: torch.empty(like.shape[1], like.shape[0]).t(), ValueError, "contiguous"),
        (lambda o: "tensor", TypeError, "torch.Tensor"),
    ]
    for make, error, match in bad:
        outs = good()
        outs[0] = make(outs)
        untouched = cache.clone()
        with pytest.raises(error, match=match):
            call(untouched, tuple(outs) if count == 2 else outs[0])
        assert torch.equal(untouched, cache)
    if count == 2:
        one = torch.empty(like.shape)
        with pytest.raises(ValueError, match="one tensor for both"):
            call(cache.clone(), (one, one))
        with pytest.raises(TypeError, match="pair of tensors"):
            call(cache.clone(), one)


OPS = ["fused_sconv", "fused_sconv_kv", "fused_sconv_add", "fused_sconv_add_rmsnorm"]


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("op", OPS)
def test_out_sharing_memory_with_an_input_is_refused(op: str, backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``out=`` sharing memory with an input (the op's own rows: ``out=x``, ``out=d``,
    ``out=hidden``, k or v; the cache) or with the op's other output raises before
    anything runs, on both paths: the kernels read other rows of the inputs while they
    write, so the Triton path would return wrong values. Two outputs side by side in
    one buffer are fine."""
    monkeypatch.setenv("INKLING_KERNELS_CPU_BACKEND", backend)
    cases, cache, inputs = _out_cases()
    call, count, like = cases[op]
    t, c = like.shape
    before = cache.clone()
    aliases = [*inputs[op].items(), ("cache", cache.as_strided((t, c), (c, 1), cache.storage_offset()))]
    snapshot = [a.clone() for _, a in aliases]
    for name, alias in aliases:
        for slot in range(count):
            outs = [torch.empty(like.shape) for _ in range(count)]
            outs[slot] = alias
            with pytest.raises(ValueError, match=rf"out(\[{slot}\])? overlaps {name} in memory"):
                call(cache, tuple(outs) if count == 2 else outs[0])
            assert torch.equal(cache, before)
            assert all(torch.equal(a, b) for (_, a), b in zip(aliases, snapshot))
    if count == 2:
        pair = torch.empty(t + 1, c)
        with pytest.raises(ValueError, match=r"out\[1\] overlaps out\[0\]"):
            call(cache, (pair[:t], pair[1:]))
        assert torch.equal(cache, before)
        fresh = call(cache.clone(), None)
        side_by_side = torch.empty(2 * t, c)
        got = call(cache.clone(), (side_by_side[:t], side_by_side[t:]))
        assert all(torch.equal(g, f) for g, f in zip(got, fresh))


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_out_one_row_after_x_in_the_same_buffer_is_refused(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A partial overlap (out one row after x in one buffer, as an in-place shift would
    place it) is refused; out right after x's last row is fine."""
    from inkling_kernels.sconv.kernel import fused_sconv_triton

    monkeypatch.setenv("INKLING_KERNELS_CPU_BACKEND", backend)
    kw = _base()
    x = kw["x"]
    t, c = x.shape
    want = _call(fused_sconv, {**kw, "cache": kw["cache"].clone()})
    buffer = torch.empty(2 * t, c, dtype=x.dtype)
    buffer[:t] = x
    for fn in (fused_sconv, fused_sconv_triton):
        with pytest.raises(ValueError, match="out overlaps x in memory"):
            fn(buffer[:t], kw["weight"], kw["cache"].clone(), _batch(kw), kw["stream_offset"], kw["stream_width"],
               out=buffer[1 : t + 1])
    got = fused_sconv(buffer[:t], kw["weight"], kw["cache"].clone(), _batch(kw), kw["stream_offset"],
                      kw["stream_width"], out=buffer[t:])
    assert got.data_ptr() == buffer[t:].data_ptr() and torch.equal(got, want)


def test_overlap_check_skips_tensors_without_memory_and_tracing() -> None:
    """The overlap check reads addresses on the host only: fake and meta tensors (no
    memory) pass, and a compiled graph with ``out=`` traces without a break and
    matches the eager call."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from inkling_kernels.checks import output_for

    meta = torch.empty(4, 8, device="meta")
    assert output_for("out", meta, meta, (("x", meta),)) is meta
    kw = _base()
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
        out = fake["x"]
        got = fused_sconv(fake["x"], fake["weight"], fake["cache"], _batch(fake), kw["stream_offset"],
                          kw["stream_width"], out=out)
        assert got is out

    def fn(x: torch.Tensor, cache: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return fused_sconv(x, kw["weight"], cache, _batch(kw), kw["stream_offset"], kw["stream_width"], out=out) * 2

    eager = fn(kw["x"], kw["cache"].clone(), torch.empty_like(kw["x"]))
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(kw["x"], kw["cache"].clone(), torch.empty_like(kw["x"])), eager)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_empty_cache_or_block_table_with_tokens_is_refused(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache without blocks, or a block table without rows or columns, cannot serve a
    batch with tokens: every conv op and the tap map refuse them before anything runs,
    on both paths (the reference would index out of range, the kernels mask every
    read). A batch without tokens needs neither."""
    from inkling_kernels import (
        fused_sconv_add_ref,
        fused_sconv_add_rmsnorm_ref,
        fused_sconv_kv_ref,
        sconv_tap_map,
        sconv_tap_map_ref,
    )

    monkeypatch.setenv("INKLING_KERNELS_CPU_BACKEND", backend)
    cases, cache, _ = _out_cases()
    for call, _, _ in cases.values():
        with pytest.raises(ValueError, match="cache has no blocks"):
            call(cache[:0], None)
    for table in (torch.zeros(0, 4, dtype=torch.int32), torch.zeros(1, 0, dtype=torch.int32)):
        cases, cache, _ = _out_cases(block_table=table)
        before = cache.clone()
        for call, _, _ in cases.values():
            with pytest.raises(ValueError, match=r"block_table has shape \(\d, \d\) but the batch has 6 tokens"):
                call(cache, None)
        assert torch.equal(cache, before)
    kw = _base()
    rows = kw["x"].shape[0]
    refs = (
        lambda c: fused_sconv_ref(kw["x"], kw["weight"], c, _batch(kw), kw["stream_offset"], kw["stream_width"]),
        lambda c: fused_sconv_add_ref(kw["x"], kw["x"], kw["weight"], c, _batch(kw), kw["stream_offset"],
                                      kw["stream_width"]),
        lambda c: fused_sconv_add_rmsnorm_ref(kw["x"], kw["x"], kw["weight"], c, _batch(kw), kw["stream_offset"],
                                              kw["stream_width"], torch.ones(kw["x"].shape[1]), 1e-6),
    )
    for ref in refs:
        with pytest.raises(ValueError, match="cache has no blocks"):
            ref(kw["cache"][:0])
    for table in (kw["block_table"][:0], kw["block_table"][:, :0]):
        bad = _batch({**kw, "block_table": table}, kernel_size=4)
        for tap_map in (sconv_tap_map, sconv_tap_map_ref):
            with pytest.raises(ValueError, match="block_table has shape"):
                tap_map(bad, torch.empty(rows, 3, dtype=torch.int64))
        with pytest.raises(ValueError, match="block_table has shape"):
            fused_sconv_kv_ref(kw["x"], kw["x"], kw["weight"], kw["weight"], kw["cache"], bad, 0,
                               kw["stream_width"], kw["stream_width"])
    # no tokens: an empty cache and table are fine
    empty = {**kw, "x": kw["x"][:0], "positions": kw["positions"][:0], "seq_idx": kw["seq_idx"][:0],
             "slot_mapping": kw["slot_mapping"][:0], "query_start": kw["query_start"][:0],
             "block_table": kw["block_table"][:0], "cache": kw["cache"][:0]}
    assert _call(fused_sconv, empty).shape == (0, kw["x"].shape[1])


def test_causal_conv_ref_checks_its_arguments() -> None:
    """The full-sequence oracle checks its epilogue as the ops do (an unknown activation
    used to run none, any truthy ``residual`` counted as True) and its tensors."""
    from inkling_kernels import causal_conv_ref

    x, weight = torch.randn(5, 8), torch.randn(8, 4)
    assert torch.equal(causal_conv_ref(x, weight[:, None]), causal_conv_ref(x, weight))
    assert causal_conv_ref(x, weight[:, :1]).shape == x.shape  # W = 1: the current token only
    bad = [
        (dict(activation="gelu"), ValueError, "activation must be None or 'silu'"),
        (dict(residual="no"), TypeError, "residual must be a bool"),
        (dict(weight=weight[:, None].expand(8, 2, 4)), ValueError, r"\(C, W\) or \(C, 1, W\)"),
        (dict(weight=weight[:, :0]), ValueError, "must be >= 1"),
        (dict(weight=weight.tolist()), TypeError, "weight must be a torch.Tensor"),
        (dict(weight=weight[None]), ValueError, r"\(C, W\) or \(C, 1, W\)"),
        (dict(weight=weight.int()), TypeError, "weight must be a float tensor"),
        (dict(weight=weight[:-1]), ValueError, "channels"),
        (dict(x=x.tolist()), TypeError, "x must be a torch.Tensor"),
        (dict(x=x.int()), TypeError, "x must be a float tensor"),
        (dict(x=x[None]), ValueError, r"\[L, C\]"),
    ]
    for change, exc, match in bad:
        args = {"x": x, "weight": weight, **change}
        with pytest.raises(exc, match=match):
            causal_conv_ref(args.pop("x"), args.pop("weight"), **args)

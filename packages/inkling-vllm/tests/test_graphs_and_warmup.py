"""CUDA-graph readiness of the plugin's backends and the start-up kernel warm-up,
checked without a GPU: graph-support declarations, piecewise splitting ops, metadata
in buffers of fixed address with no device sync, and the warm-up's shape coverage
against the kernels' own tile rules."""

from __future__ import annotations

import dataclasses
import os
import random
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from vllm.v1.attention.backend import AttentionCGSupport
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

import inkling_kernels.rel_attention.kernel as rel_kernel
from inkling_kernels.rel_attention.kernel import RelAttentionProblem
from inkling_vllm import attention, conv_state, warmup
from inkling_vllm.warmup import (
    ConvLaunches,
    WarmupBatch,
    attention_signature,
    candidate_batches,
    shape_classes,
    warmup_batches,
)


def _config(max_tokens: int = 64, capture: list[int] | None = None, splitting: list[str] | None = None) -> Any:
    return SimpleNamespace(
        model_config=SimpleNamespace(dtype=torch.float32),
        compilation_config=SimpleNamespace(static_forward_context={}, cudagraph_capture_sizes=capture or [],
                                           splitting_ops=splitting),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=max_tokens),
        speculative_config=None,
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
    )


def _cm(lens: list[int], pad: int, seq_lens: list[int], slot_len: int | None = None, host_lens: bool = True) -> Any:
    qsl = [0]
    for n in lens:
        qsl.append(qsl[-1] + n)
    padded = qsl[-1] + pad
    slots = torch.arange(100, 100 + (slot_len if slot_len is not None else padded), dtype=torch.int64)
    cm = SimpleNamespace(
        num_reqs=len(lens),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32),
        query_start_loc_cpu=torch.tensor(qsl, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        max_seq_len=max(seq_lens),
        num_actual_tokens=padded,
        slot_mapping=slots,
        block_table_tensor=torch.zeros(len(lens), 8, dtype=torch.int32),
    )
    if host_lens:
        cm.seq_lens_cpu_upper_bound = torch.tensor(seq_lens, dtype=torch.int32)
    return cm


# --- declarations ---------------------------------------------------------------------
def test_both_backends_declare_full_graphs_of_uniform_batches() -> None:
    """vLLM keeps its default FULL_AND_PIECEWISE mode (full decode graphs, speculative
    verification included) only if every group declares at least UNIFORM_BATCH."""
    full = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float32)
    window = SlidingWindowSpec(block_size=4, num_kv_heads=2, head_size=256, head_size_v=0,
                               dtype=torch.float32, sliding_window=4)
    for builder_cls, spec in ((attention.InklingRelAttentionMetadataBuilder, full),
                              (conv_state.InklingSconvMetadataBuilder, window)):
        support = builder_cls.get_cudagraph_support(None, spec)
        assert support.value >= AttentionCGSupport.UNIFORM_BATCH.value, builder_cls.__name__


def test_every_metadata_op_splits_piecewise_graphs() -> None:
    """Piecewise graphs are captured without metadata: an op reading it must run
    between the pieces, never inside one."""
    import inkling_model  # noqa: F401  (registers the ops)

    for op in attention.METADATA_OPS:
        namespace, name = op.split("::")
        assert hasattr(getattr(torch.ops, namespace), name), f"{op} is not a registered op"
    config = _config(splitting=["vllm::unified_attention_with_output"])
    attention.split_graphs_at_metadata_ops(config)
    attention.split_graphs_at_metadata_ops(config)  # idempotent
    ops = config.compilation_config.splitting_ops
    assert ops[0] == "vllm::unified_attention_with_output"
    assert ops[1:] == list(attention.METADATA_OPS)
    # nothing split (eager, or compilation without splitting ops): left alone
    empty = _config(splitting=None)
    attention.split_graphs_at_metadata_ops(empty)
    assert empty.compilation_config.splitting_ops is None


def test_the_model_ops_that_read_metadata_are_all_listed() -> None:
    """Every custom op the model registers that reads per-step metadata is a
    splitting op (a new op left out would be captured as its no-metadata path)."""
    import inkling_model.attention
    import inkling_model.fused_norm
    import inkling_model.sconv

    registered = set()
    for module in (inkling_model.sconv, inkling_model.fused_norm, inkling_model.attention):
        for value in vars(module).values():
            if isinstance(value, torch._ops.OpOverload) and value.name().startswith("inkling_model::"):
                registered.add(value.name())
    assert len(registered) == 5 and registered == set(attention.METADATA_OPS)


# --- persistent buffers, no sync ------------------------------------------------------
def test_attention_metadata_keeps_its_addresses_across_steps() -> None:
    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float32)
    builder = attention.InklingRelAttentionMetadataBuilder(spec, ["a"], _config(max_tokens=64), torch.device("cpu"))
    # vLLM's slot mapping covering the padded batch: a view of it
    cm = _cm([1, 1, 1], 1, [5, 9, 3])
    meta = builder.build(0, cm)
    assert meta.slot_mapping.data_ptr() == cm.slot_mapping.data_ptr()
    assert meta.query_start_loc.data_ptr() == cm.query_start_loc.data_ptr()
    assert meta.seq_lens.data_ptr() == cm.seq_lens.data_ptr()
    # a shorter one: copied into the builder's own buffer, pad rows -1, same address each step
    first = builder.build(0, _cm([1, 1, 1], 5, [5, 9, 3], slot_len=3)).slot_mapping
    second_cm = _cm([2, 1], 4, [7, 2], slot_len=3)
    second = builder.build(0, second_cm).slot_mapping
    assert first.data_ptr() == second.data_ptr()
    assert second.tolist() == [100, 101, 102, -1, -1, -1, -1]


def test_attention_builder_reads_host_lengths_without_a_device_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float32)
    builder = attention.InklingRelAttentionMetadataBuilder(spec, ["a"], _config(), torch.device("cpu"))
    cm = _cm([3, 1], 0, [10, 4])
    calls = []
    original = torch.Tensor.to

    def spy(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if self is cm.seq_lens or self._base is cm.seq_lens:
            calls.append(args)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", spy)
    meta = builder.build(0, cm)
    assert meta.seq_lens_cpu.tolist() == [10, 4]
    assert calls == []  # the device lengths were never copied
    # a runner without the host field falls back to the copy (same values)
    assert builder.build(0, _cm([3, 1], 0, [10, 4], host_lens=False)).seq_lens_cpu.tolist() == [10, 4]


def test_captured_attention_ignores_the_host_length_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """A graph replays its launch for every later batch of its size: the key split of
    a captured launch must not depend on the capture step's context lengths."""
    from inkling_model.attention import key_split_bound

    meta = SimpleNamespace(max_seq_len=77)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert key_split_bound(meta, torch.device("cuda")) is None
    assert key_split_bound(meta, torch.device("cpu")) == 77
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert key_split_bound(meta, torch.device("cuda")) == 77


# --- warm-up shape coverage -----------------------------------------------------------
PROBLEMS = [
    RelAttentionProblem(1, 1, 64, 8, 128, 16, 1024, 16, 0.1, None, (64, 0.1)),  # global, released widths
    RelAttentionProblem(1, 1, 64, 16, 128, 16, 512, 16, 0.1, 512, (64, 0.1)),  # sliding
]


@pytest.fixture
def h200(monkeypatch: pytest.MonkeyPatch) -> torch.device:
    """The tile rules as on a 132-SM GPU (they read the SM count)."""
    monkeypatch.setattr(rel_kernel, "_num_sms", lambda device: 132)
    return torch.device("cuda")


def _random_batches(rng: random.Random, n: int, max_tokens: int, max_reqs: int, max_len: int) -> list[WarmupBatch]:
    out = []
    for _ in range(n):
        t = rng.choice([rng.randint(1, 64), rng.randint(1, max_tokens)])
        kind = rng.choice(["even", "mixed", "uniform"])
        if kind == "mixed" and t >= 4:
            r = rng.randint(2, min(max_reqs, t // 2 + 1))
        elif kind == "uniform":
            r = min(t, max_reqs)
            t = r
        else:
            kind, r = "even", rng.randint(1, min(t, max_reqs))
        shortest = WarmupBatch(t, r, 1, kind).max_query_len
        s = rng.choice([shortest, rng.randint(shortest, max_len)])
        out.append(WarmupBatch(t, r, s, kind))
    return out


def _covered(chosen: list[WarmupBatch], signature: Any, conv: ConvLaunches | None = None) -> set[Any]:
    out: set[Any] = set()
    for b in chosen:
        out |= shape_classes(b, signature, conv=conv)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("limits", [(8192, 256, 8448), (64, 16, 1024), (2048, 128, 32768)])
def test_warmup_covers_every_attention_config_of_random_batches(h200: torch.device, limits: tuple[int, ...],
                                                                seed: int) -> None:
    """Every relative-attention tile config (the kernels' compile-time values) that a
    served batch can get, on every layer kind, is one some warm-up forward gets."""
    max_tokens, max_reqs, max_len = limits
    signature = attention_signature(PROBLEMS, h200)
    covered = _covered(warmup_batches(candidate_batches(max_tokens, max_reqs, max_len), signature), signature)
    rng = random.Random(seed)
    missing = [b for b in _random_batches(rng, 3000, max_tokens, max_reqs, max_len)
               if not {i for i in shape_classes(b, signature) if i[0] == "attention"} <= covered]
    assert not missing, f"{len(missing)} batches with configs no warm-up forward compiles, e.g. {missing[:3]}"


def test_coverage_check_fails_when_warmup_drops_long_contexts(h200: torch.device) -> None:
    """The coverage test can fail: without the long-context candidates, decode batches
    over long contexts get key splits nothing warmed."""
    signature = attention_signature(PROBLEMS, h200)
    short_only = [b for b in candidate_batches(8192, 256, 8448) if b.seq_len == b.max_query_len]
    covered = _covered(warmup_batches(short_only, signature), signature)
    long_decode = WarmupBatch(1, 1, 8192, "uniform")
    assert not shape_classes(long_decode, signature) <= covered


def test_warmup_batches_cover_every_candidate_class(h200: torch.device) -> None:
    signature = attention_signature(PROBLEMS, h200)
    conv = ConvLaunches.of(_layouts(False, 1))
    cands = candidate_batches(2048, 64, 4096, decode_len=4)
    chosen = warmup_batches(cands, signature, conv=conv)
    assert _covered(chosen, signature, conv) == _covered(cands, signature, conv)
    seen: set[Any] = set()
    for b in chosen:  # each kept forward compiles something new
        items = shape_classes(b, signature, conv=conv)
        assert not items <= seen
        seen |= items
        assert 1 <= b.num_reqs <= min(b.num_tokens, 64)
        assert b.max_query_len <= b.seq_len <= 4096
        if b.kind == "uniform":
            assert b.num_tokens == 4 * b.num_reqs
    # every conv shape class of the sizes served is warmed too
    for t in (1, 5, 16, 17, 300, 1024, 1100, 2048):
        conv_items = {i for i in shape_classes(WarmupBatch(t, 1, t), signature, conv=conv) if i[0] == "conv"}
        assert conv_items and conv_items <= seen


def _layouts(tiny: bool, tp: int) -> list[Any]:
    """The conv-state layouts of a global and a sliding layer: the released widths
    (hidden 6144, 8 / 16 KV heads of 128) or the tiny parity model's."""
    from inkling_cache import ConvStateLayout

    hidden, head_dim, kv_heads = (128, 64, (2, 4)) if tiny else (6144, 128, (8, 16))
    return [ConvStateLayout.build(num_kv_heads=h, head_dim=head_dim, hidden_size=hidden, kernel_size=4, tp_size=tp,
                                  block_size=4) for h in kv_heads]


def _tiny_conv() -> ConvLaunches:
    """The tiny parity model's conv launches at TP 1."""
    return ConvLaunches.of(_layouts(True, 1))


#: The library's conv classes, as the coverage checks compute them whatever a test patches.
_CONV_CLASSES = warmup.conv_classes


def _conv_gaps(chosen: list[WarmupBatch], limits: tuple[int, int, int], conv: ConvLaunches,
               seed: int) -> list[WarmupBatch]:
    """Random served batches with a conv tile none of the ``chosen`` forwards compiles."""
    covered: set[Any] = set()
    for b in chosen:
        covered |= _CONV_CLASSES(b, conv)
    batches = _random_batches(random.Random(seed), 3000, *limits)
    return [b for b in batches if not _CONV_CLASSES(b, conv) <= covered]


def _chosen(limits: tuple[int, int, int], signature: Any, v2: bool, conv: ConvLaunches) -> list[WarmupBatch]:
    """The warm-up's forwards for these limits on the first- or the second-generation
    runner (whose dummy runs share rows evenly)."""
    candidates = candidate_batches(*limits)
    return warmup_batches(warmup.v2_runnable(candidates) if v2 else candidates, signature, conv=conv)


@pytest.mark.parametrize("v2", [False, True], ids=["v1-runner", "v2-runner"])
@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("limits,tiny", [((8192, 256, 8448), False), ((2048, 128, 32768), False),
                                         ((64, 16, 1024), True)])
def test_warmup_covers_every_conv_tile_of_random_batches(h200: torch.device, limits: tuple[int, int, int],
                                                         tiny: bool, tp: int, v2: bool) -> None:
    """Every tile the conv kernels' own rules pick for a served batch, at every layer
    kind's widths, is one some warm-up forward compiles: the candidate batches reach
    every tile a served batch can get."""
    conv = ConvLaunches.of(_layouts(tiny, tp))
    chosen = _chosen(limits, attention_signature(PROBLEMS, h200), v2, conv)
    missing = _conv_gaps(chosen, limits, conv, seed=tp)
    assert not missing, f"{len(missing)} batches with conv tiles no warm-up forward compiles, e.g. {missing[:3]}"


def test_conv_coverage_check_fails_with_a_coarser_conv_class(h200: torch.device,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: a warm-up that classes its forwards by their row count's
    power of two alone (not by the tiles) leaves tiles of served batches cold."""
    monkeypatch.setattr(warmup, "conv_classes", lambda batch, conv: {batch.num_tokens.bit_length()})
    limits, conv = (8192, 256, 8448), ConvLaunches.of(_layouts(False, 1))
    chosen = warmup_batches(candidate_batches(*limits), attention_signature(PROBLEMS, h200), conv=conv)
    assert _conv_gaps(chosen, limits, conv, seed=0)


def _dummy_rows(batch: WarmupBatch) -> list[int]:
    """Each request's rows in vLLM's dummy run of ``batch``: a mixed batch's one-row
    decodes and its prompt, else equal rows with the remainder on the last request."""
    t, r = batch.num_tokens, batch.num_reqs
    return [1] * (r - 1) + [t - r + 1] if batch.kind == "mixed" else [t // r] * (r - 1) + [t // r + t % r]


@pytest.mark.parametrize("seed", [0, 1])
def test_prompt_rows_is_the_hint_the_metadata_builder_gives(seed: int) -> None:
    """A warm-up forward's prefill hint is the builder's (``prefill_token_count`` of its
    requests' rows as vLLM's dummy runs share them): an even batch whose last request
    alone brings a prompt's rows counts only those (1034 rows over 254 requests: 253
    requests of 4 rows, the last of 22)."""
    from inkling_kernels import prefill_token_count

    assert WarmupBatch(1034, 254, 7386).prompt_rows == 22
    for b in _random_batches(random.Random(seed), 2000, 8192, 256, 8448):
        assert b.prompt_rows == prefill_token_count(_dummy_rows(b)), b


class LaunchKeys:
    """Records what Triton would compile for each launch, launching nothing: with
    ``JITFunction.run`` replaced, every kernel call of the conv ops on CPU tensors
    (their CUDA path: ``INKLING_KERNELS_CPU_BACKEND=triton``, no interpreter) records
    the kernel, its compile-time values, the class Triton gives each integer argument
    it specialises (:func:`inkling_vllm.warmup.triton_int_class`), the tensors' dtypes
    and the launch options."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import inspect

        from triton.runtime.jit import JITFunction

        from inkling_kernels import _dispatch
        from inkling_vllm.warmup import triton_int_class

        monkeypatch.setenv("INKLING_KERNELS_CPU_BACKEND", "triton")
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        # nothing launches (JITFunction.run is replaced): CPU tensors may take the
        # CUDA path without the interpreter
        monkeypatch.setattr(_dispatch, "_interpreted", lambda: True)
        self.keys: list[Any] = []

        def run(kernel: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
            names = inspect.signature(kernel.fn).parameters
            bound = inspect.signature(kernel.fn).bind(*args, **{k: v for k, v in kwargs.items() if k in names})
            key = []
            for param in kernel.params:
                value = bound.arguments.get(param.name, param.default)
                if param.is_constexpr:
                    key.append((param.name, value))
                elif isinstance(value, torch.Tensor):
                    key.append((param.name, str(value.dtype)))
                elif isinstance(value, int) and not param.do_not_specialize:
                    key.append((param.name, triton_int_class(int(value))))
            options = tuple(sorted((k, v) for k, v in kwargs.items() if k not in names))
            self.keys.append((kernel.fn.__name__, tuple(key), options))

        monkeypatch.setattr(JITFunction, "run", run)

    def of(self, call: Any) -> frozenset[Any]:
        self.keys.clear()
        call()
        return frozenset(self.keys)


def _conv_batch(batch: WarmupBatch, block_size: int = 16) -> Any:
    """A step's conv metadata for ``batch`` (its requests' rows as vLLM's dummy runs
    share them), with a block table of fixed width as vLLM keeps it."""
    from inkling_kernels import SconvBatch, prefill_token_count

    r, rows = batch.num_reqs, _dummy_rows(batch)
    table = torch.arange(r * 1024, dtype=torch.int32).reshape(r, 1024) % 60 + 1
    pos, seq, start = [], [], []
    for i, n in enumerate(rows):
        pos.append(torch.arange(batch.seq_len - n, batch.seq_len))
        seq.append(torch.full((n,), i, dtype=torch.int32))
        start.append(torch.full((n,), sum(rows[:i]), dtype=torch.int32))
    positions = torch.cat(pos)
    seq_idx = torch.cat(seq)
    slots = table[seq_idx.long(), positions // block_size].long() * block_size + positions % block_size
    return SconvBatch(positions, table, seq_idx, slots, torch.cat(start), block_size, 4,
                      num_prefill_tokens=prefill_token_count(rows))


def _launch_keys(keys: LaunchKeys, batch: WarmupBatch, layouts: list[Any],
                 fused: bool = True) -> list[tuple[Any, frozenset[Any]]]:
    """(class item, what Triton compiles) of every conv launch of one forward of
    ``batch`` (sublayer tails ``fused`` or plain convs): items as
    :func:`inkling_vllm.warmup.conv_classes` names them, the keys recorded."""
    from inkling_cache import Stream
    from inkling_kernels import fused_sconv, fused_sconv_add, fused_sconv_add_rmsnorm, fused_sconv_kv, sconv_tap_map
    from inkling_kernels.seq_metadata.kernel import launch_sconv_seq_metadata

    classes = warmup.conv_classes(batch, ConvLaunches.of(layouts, fused))
    items = {item[0]: item for item in classes if item[0] in ("metadata", "tap map")}
    per_layer = [item for item in classes if item[0] in ("kv", "norm", "add", "conv")]
    sb = _conv_batch(batch)
    t, dt = sb.num_tokens, torch.bfloat16
    tap_map = torch.empty(t, 3, dtype=torch.int64)
    out = [(items["tap map"], keys.of(lambda: sconv_tap_map(sb, tap_map)))]
    qsl, rows = torch.zeros(batch.num_reqs + 1, dtype=torch.int32), torch.empty(t, dtype=torch.int32)
    out.append((items["metadata"], keys.of(
        lambda: launch_sconv_seq_metadata(qsl, batch.num_reqs, t, rows, rows, t))))
    mapped = sb.with_tap_map(tap_map)
    for layout in layouts:
        h = layout.num_heads
        cache = torch.empty(64, h, 16, layout.head_size, dtype=dt)
        (k_off, kw), (v_off, _) = layout.stream_range(Stream.K), layout.stream_range(Stream.V)
        k, w = torch.empty(t, h * kw, dtype=dt), torch.empty(h * kw, 4)
        kv = next(i for i in per_layer if i[:3] == ("kv", h, kw))
        out.append((kv, keys.of(lambda: fused_sconv_kv(k, k, w, w, cache, mapped, k_off, v_off, kw))))
        for stream in (Stream.ATTN, Stream.MLP):
            off, sw = layout.stream_range(stream)
            d, ws, nw = torch.empty(t, h * sw, dtype=dt), torch.empty(h * sw, 1, 4), torch.ones(h * sw, dtype=dt)
            item = next(i for i in per_layer if i[0] in ("norm", "add", "conv") and i[1:3] == (h, sw))
            if not fused:
                call = lambda: fused_sconv(d, ws[:, 0], cache, mapped, off, sw)  # noqa: E731
            elif layout.tp_size == 1:
                call = lambda: fused_sconv_add_rmsnorm(d, d, ws, cache, mapped, off, sw, nw, 1e-6)  # noqa: E731
            else:
                call = lambda: fused_sconv_add(d, d, ws, cache, mapped, off, sw)  # noqa: E731
            out.append((item, keys.of(call)))
    return out


def _keys_per_item(monkeypatch: pytest.MonkeyPatch, tiny: bool, tp: int, n: int,
                   fused: bool = True) -> dict[Any, set[frozenset[Any]]]:
    keys = LaunchKeys(monkeypatch)
    limits = (64, 16, 1024) if tiny else (8192, 256, 8448)
    found: dict[Any, set[frozenset[Any]]] = {}
    for batch in _random_batches(random.Random(tp), n, *limits):
        for item, launched in _launch_keys(keys, batch, _layouts(tiny, tp), fused):
            found.setdefault(item, set()).add(launched)
    return found


@pytest.mark.parametrize("tp,fused", [(1, True), (2, True), (1, False)], ids=["tp1", "tp2", "plain-tails"])
@pytest.mark.parametrize("tiny", [True, False])
def test_conv_tile_rules_decide_everything_the_launches_compile(monkeypatch: pytest.MonkeyPatch, tiny: bool,
                                                                tp: int, fused: bool) -> None:
    """The warm-up's conv classes are what Triton compiles: over random batches, each
    item of :func:`inkling_vllm.warmup.conv_classes` comes with one and the same set of
    compile keys of the real launches (kernel, compile-time values, integer
    specialisations, dtypes, launch options), so a warm-up forward that meets an item
    compiles what any served batch with that item needs."""
    found = _keys_per_item(monkeypatch, tiny, tp, 120 if tiny else 40, fused)
    assert len(found) >= 6 and all(launched for sets in found.values() for launched in sets)
    split = {item: sets for item, sets in found.items() if len(sets) > 1}
    assert not split, f"class items whose launches compile different things: {list(split)[:3]}"


def test_the_launch_check_fails_when_a_class_ignores_a_tile_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: naming the sublayers' items without their tile config
    joins launches that compile different kernels."""
    def without_sublayer_tiles(batch: WarmupBatch, conv: ConvLaunches) -> set[Any]:
        return {item[:3] if item[0] == "norm" else item for item in _CONV_CLASSES(batch, conv)}

    monkeypatch.setattr(warmup, "conv_classes", without_sublayer_tiles)
    found = _keys_per_item(monkeypatch, False, 1, 40)
    assert any(len(sets) > 1 for item, sets in found.items() if item[0] == "norm")


@pytest.mark.parametrize("bad", [dict(max_tokens=0), dict(max_reqs=-1), dict(decode_len=True)])
def test_candidate_batches_refuses_bad_limits(bad: dict[str, Any]) -> None:
    args = dict(max_tokens=64, max_reqs=8, max_seq_len=128, decode_len=1, **{})
    args.update(bad)
    with pytest.raises(ValueError, match=next(iter(bad))):
        candidate_batches(**args)


# --- the hook -------------------------------------------------------------------------
def test_hook_runs_after_vllms_own_warmup_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    calls: list[str] = []
    fake = types.ModuleType("vllm.v1.worker.gpu_worker")
    fake.kernel_warmup = lambda worker: calls.append("vllm")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm.v1.worker.gpu_worker", fake)
    import vllm.v1.worker

    monkeypatch.setattr(vllm.v1.worker, "gpu_worker", fake, raising=False)
    monkeypatch.setattr(warmup, "warm_up_kernels", lambda runner: calls.append(f"inkling:{runner}"))
    assert warmup.install_warmup_hook()
    assert warmup.install_warmup_hook()  # idempotent: wrapped once
    fake.kernel_warmup(SimpleNamespace(model_runner="R"))  # type: ignore[attr-defined]
    assert calls == ["vllm", "inkling:R"]


def test_warmup_skips_what_is_not_the_plugins_model_on_cuda() -> None:
    runner = SimpleNamespace(device=torch.device("cpu"), get_model=lambda: None)
    assert warmup.warm_up_kernels(runner) == 0
    runner = SimpleNamespace(device=torch.device("cuda"), get_model=lambda: torch.nn.Linear(1, 1))
    assert warmup.warm_up_kernels(runner) == 0


def test_warmup_runs_one_dummy_forward_per_class(monkeypatch: pytest.MonkeyPatch, h200: torch.device) -> None:
    """With the plugin's model: one eager dummy forward per chosen batch, metadata
    forced, the request count set through max_num_seqs and restored."""
    from inkling_vllm.model import InklingForCausalLM

    model = object.__new__(InklingForCausalLM)
    monkeypatch.setattr(warmup, "_attention_problems", lambda m: PROBLEMS)
    monkeypatch.setattr(warmup, "_fused_moe_shapes", lambda m: [_moe_shape(**MOE_SHAPES["tiny"])[0]])
    monkeypatch.setattr(warmup, "_conv_launches", lambda m: _tiny_conv())
    sched = SimpleNamespace(max_num_seqs=16)
    runs: list[tuple[int, int, dict[str, Any]]] = []

    def dummy_run(num_tokens: int, **kwargs: Any) -> None:
        runs.append((num_tokens, sched.max_num_seqs, kwargs))

    runner = SimpleNamespace(device=h200, get_model=lambda: model, scheduler_config=sched, max_num_tokens=64,
                             max_model_len=1024, uniform_decode_query_len=1, _dummy_run=dummy_run)
    n = warmup.warm_up_kernels(runner)
    moe = warmup._fused_moe_shapes(model)
    expected = warmup_batches(candidate_batches(64, 16, 1024, 1) + warmup.moe_batches(64, moe),
                              attention_signature(PROBLEMS, h200), moe, _tiny_conv())
    assert n == len(expected) == len(runs) == runner._inkling_warmed
    assert sched.max_num_seqs == 16
    for batch, (tokens, reqs, kw) in zip(expected, runs):
        assert (tokens, reqs) == (batch.num_tokens, batch.num_reqs)
        assert kw["force_attention"] and kw["is_profile"] and kw["profile_seq_lens"] == batch.seq_len
        assert kw["uniform_decode"] == (batch.kind == "uniform")
        assert kw["create_mixed_batch"] == (batch.kind == "mixed")
        assert str(kw["cudagraph_runtime_mode"]).endswith("NONE")


def test_warmup_on_the_second_generation_runner(monkeypatch: pytest.MonkeyPatch, h200: torch.device) -> None:
    """vLLM's ``vllm.v1.worker.gpu`` runner: rows spread evenly over ``max_num_reqs``
    requests, contexts through ``context_len``; batches it cannot form are left out."""
    from inkling_vllm.model import InklingForCausalLM

    model = object.__new__(InklingForCausalLM)
    monkeypatch.setattr(warmup, "_attention_problems", lambda m: PROBLEMS)
    monkeypatch.setattr(warmup, "_fused_moe_shapes", lambda m: [_moe_shape(**MOE_SHAPES["tiny"])[0]])
    monkeypatch.setattr(warmup, "_conv_launches", lambda m: _tiny_conv())
    runs: list[tuple[int, int, bool, int]] = []

    class Runner:
        device, max_num_reqs, max_num_tokens, max_model_len, decode_query_len = h200, 16, 64, 1024, 4

        def get_model(self) -> Any:
            return model

        def _dummy_run(self, num_tokens: int, *args: Any, uniform_decode: bool = False, context_len: int = 0,
                       skip_eplb: bool = False, **kwargs: Any) -> None:
            assert kwargs.get("is_profile")  # eager: no graph replayed or captured for the size
            runs.append((num_tokens, self.max_num_reqs, uniform_decode, context_len))

    runner = Runner()
    n = warmup.warm_up_kernels(runner)
    assert n == len(runs) > 0 and runner.max_num_reqs == 16
    for tokens, reqs, uniform, context in runs:
        if uniform:
            assert tokens == 4 * reqs
        else:
            assert tokens % reqs == 0
        assert 0 <= context and context + tokens // reqs <= 1024


@pytest.mark.parametrize("mode", ["FULL_AND_PIECEWISE", "PIECEWISE", "FULL_DECODE_ONLY", "FULL", "NONE"])
def test_the_models_build_keeps_vllms_graph_mode(mode: str) -> None:
    """Every graph mode vLLM has is served as it is (piecewise graphs included): the
    model's build only adds its splitting ops."""
    from vllm.config import CUDAGraphMode

    config = _config(splitting=["vllm::unified_attention_with_output"])
    config.compilation_config.cudagraph_mode = CUDAGraphMode[mode]
    attention.split_graphs_at_metadata_ops(config)
    assert config.compilation_config.cudagraph_mode == CUDAGraphMode[mode]
    assert config.compilation_config.splitting_ops == ["vllm::unified_attention_with_output", *attention.METADATA_OPS]


def test_dummy_run_arguments_exist_in_vllms_runner() -> None:
    """The warm-up's keyword arguments are parameters of vLLM's own ``_dummy_run``
    (the runner module imports on CPU builds too)."""
    import inspect

    try:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except Exception as exc:  # pragma: no cover - depends on the vLLM build
        pytest.skip(f"vLLM's GPU model runner does not import here: {exc}")
    params = inspect.signature(GPUModelRunner._dummy_run).parameters
    for name in ("cudagraph_runtime_mode", "force_attention", "uniform_decode", "create_mixed_batch",
                 "skip_eplb", "remove_lora", "profile_seq_lens", "is_profile"):
        assert name in params, name


def _engine_config(architectures: list[str]) -> Any:
    """What vLLM's breakable-graph decision reads of a VllmConfig."""
    from vllm.config import VllmConfig

    hf = SimpleNamespace(architectures=architectures)
    from vllm.config import CUDAGraphMode

    cfg = SimpleNamespace(model_config=SimpleNamespace(architectures=architectures, hf_config=hf, quantization=None),
                          compilation_config=SimpleNamespace(mode="VLLM_COMPILE",
                                                             cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE))
    cfg._uses_breakable_cudagraph_by_default = lambda: VllmConfig._uses_breakable_cudagraph_by_default(cfg)
    cfg._uses_breakable_cudagraph_for_batch_invariance = lambda: False
    return cfg


@pytest.mark.parametrize("opt_out", [False, True], ids=["vllm-alone", "with-plugin"])
def test_breakable_graphs_stay_off_for_the_plugins_engines(opt_out: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM turns breakable CUDA graphs on for the Inkling architectures (they would
    capture across the plugin's metadata ops, without torch.compile); with the plugin's
    opt-out an engine serving the plugin's model keeps them off, a user's explicit
    setting and other architectures keep vLLM's behaviour."""
    from vllm.config import VllmConfig

    from inkling_vllm import dispatch
    from inkling_vllm.plugin import ARCHITECTURES

    env = attention.BREAKABLE_GRAPHS_ENV
    # vLLM writes its choice into os.environ itself: recorded here, so the variable is
    # restored (or removed) after the test and later engines do not inherit it
    monkeypatch.setenv(env, "")
    # vLLM's own decision (the plugin, registered in this process, wrapped it)
    vllm_decides = VllmConfig._maybe_enable_breakable_cudagraph
    monkeypatch.setattr(VllmConfig, "_maybe_enable_breakable_cudagraph", getattr(vllm_decides, "__wrapped__", vllm_decides))
    if opt_out:
        assert attention.keep_breakable_graphs_off() and attention.keep_breakable_graphs_off()  # idempotent

    def decide(architectures: list[str], preset: str | None = None) -> tuple[bool, str | None, str]:
        if preset is None:
            monkeypatch.delenv(env, raising=False)
        else:
            monkeypatch.setenv(env, preset)
        cfg = _engine_config(architectures)
        enabled = bool(VllmConfig._maybe_enable_breakable_cudagraph(cfg))
        return enabled, os.environ.get(env), cfg.compilation_config.cudagraph_mode.name

    vllm_default = (True, "1", "FULL_AND_PIECEWISE")
    for arch in ARCHITECTURES:
        assert decide([arch]) == ((False, "0", "FULL_AND_PIECEWISE") if opt_out else vllm_default)
        # the user's breakable choice stands
        assert decide([arch], "1") == vllm_default
    assert decide(["DeepseekV4ForCausalLM"]) == vllm_default  # another model: vLLM's defaults
    monkeypatch.setattr(dispatch, "builtin_model_for", lambda cfg: object)  # the in-tree model serves
    assert decide([ARCHITECTURES[0]]) == vllm_default


def test_warmup_follows_vllms_jit_warmup_switch(monkeypatch: pytest.MonkeyPatch, h200: torch.device) -> None:
    """Off with vLLM's ``kernel_config.enable_jit_warmup`` (as ``enforce_eager`` sets
    it): no dummy forward; on (vLLM's default, or no such field): the warm-up runs."""
    from inkling_vllm.model import InklingForCausalLM

    model = object.__new__(InklingForCausalLM)
    monkeypatch.setattr(warmup, "_attention_problems", lambda m: PROBLEMS)
    monkeypatch.setattr(warmup, "_fused_moe_shapes", lambda m: [_moe_shape(**MOE_SHAPES["tiny"])[0]])
    monkeypatch.setattr(warmup, "_conv_launches", lambda m: _tiny_conv())
    runs: list[int] = []

    class Runner:
        device, max_num_reqs, max_num_tokens, max_model_len, decode_query_len = h200, 4, 16, 256, 1

        def __init__(self, enabled: bool | None) -> None:
            if enabled is not None:
                self.vllm_config = SimpleNamespace(kernel_config=SimpleNamespace(enable_jit_warmup=enabled))

        def get_model(self) -> Any:
            return model

        def _dummy_run(self, num_tokens: int, *args: Any, context_len: int = 0, **kwargs: Any) -> None:
            runs.append(num_tokens)

    assert warmup.warm_up_kernels(Runner(False)) == 0 and runs == []
    assert warmup.warm_up_kernels(Runner(True)) == len(runs) > 0
    runs.clear()
    assert warmup.warm_up_kernels(Runner(None)) == len(runs) > 0


# --- vLLM's fused MoE -------------------------------------------------------------------
def _moe_shape(experts: int, n: int, k: int, top_k: int, dtype: torch.dtype, global_experts: int = 0) -> Any:
    """A fused-MoE layer shape with vLLM's own tile-config lookup (``global_experts``:
    expert parallelism, ``experts`` of them on this rank), and its description for
    :func:`_vllm_compile_key`."""
    shape = warmup.fused_moe_shape((experts, 2 * n, k), (experts, k, n), top_k, dtype, global_experts or None)
    return shape, (experts, n, k, top_k, dtype, global_experts > 0)


#: The tiny checkpoint's MoE (fp32), a released-width one (bf16) and an expert-parallel shard.
MOE_SHAPES = {
    "tiny": dict(experts=8, n=64, k=128, top_k=2, dtype=torch.float32),
    "released": dict(experts=8, n=3072, k=6144, top_k=6, dtype=torch.bfloat16),
    "ep": dict(experts=2, n=256, k=512, top_k=2, dtype=torch.bfloat16, global_experts=8),
}


def _vllm_compile_key(shape: tuple[Any, ...], m: int) -> tuple[Any, ...]:
    """What Triton compiles for vLLM's two ``fused_moe_kernel`` launches of one MoE
    forward of ``m`` rows, found by running vLLM's own launch code on the CPU with the
    kernel replaced by a recorder and the alignment op by a no-op (its output buffers,
    whose lengths are the padded row counts, are allocated by vLLM's Python), each
    integer argument then classed by Triton's own specialiser."""
    import vllm.model_executor.layers.fused_moe.fused_moe as fm
    import vllm.model_executor.layers.fused_moe.moe_align_block_size as mab
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    experts, n, k, top_k, dtype, ep = shape
    calls: list[tuple[Any, ...]] = []

    class Recorder:
        def __getitem__(self, grid: Any) -> Any:
            return lambda *args, **kwargs: calls.append((args, kwargs))

    def spec(a: Any) -> Any:
        if isinstance(a, int) and not isinstance(a, bool):
            return native_specialize_impl(BaseBackend, a, False, True, True)
        return None if a is None else "tensor"

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fm, "fused_moe_kernel", Recorder())
        mp.setattr(mab.ops, "moe_align_block_size", lambda *a, **kw: None)
        w1, w2 = torch.empty(experts, 2 * n, k, dtype=dtype), torch.empty(experts, k, n, dtype=dtype)
        config = fm.try_get_optimal_moe_config(w1.shape, w2.shape, top_k, fm._get_config_dtype_str(dtype=dtype), m)
        ids = torch.zeros(m, top_k, dtype=torch.int32)
        expert_map = torch.arange(4 * experts, dtype=torch.int32) if ep else None
        num_align = 4 * experts if ep else experts
        sorted_ids, expert_ids, post = fm._prepare_expert_assignment(ids, config, m, top_k, num_align, expert_map,
                                                                      ignore_invalid_experts=True)
        weights = torch.empty(m, top_k)
        for a, w, c, mul, kk in ((torch.empty(m, k, dtype=dtype), w1, torch.empty(m, top_k, 2 * n, dtype=dtype), False, top_k),
                                 (torch.empty(m * top_k, n, dtype=dtype), w2, torch.empty(m, top_k, k, dtype=dtype), True, 1)):
            fm.invoke_fused_moe_triton_kernel(a, w, c, None, None, weights, sorted_ids, expert_ids, post, mul, kk,
                                              config, None, False, False, False, False, False)
    assert len(calls) == 2
    return tuple((tuple(spec(a) for a in args), tuple(sorted((key, repr(v)) for key, v in kwargs.items())))
                 for args, kwargs in calls)


@pytest.mark.parametrize("name", sorted(MOE_SHAPES))
def test_moe_compile_class_is_what_vllms_launches_compile(name: str) -> None:
    """Two row counts share a :meth:`FusedMoeShape.compile_class` exactly when vLLM's
    launch code hands Triton the same compile key for them."""
    shape, desc = _moe_shape(**MOE_SHAPES[name])
    counts = [*range(1, 700), *range(700, 8193, 37), 4096, 8192]
    by_class: dict[Any, Any] = {}
    by_key: dict[Any, Any] = {}
    for m in counts:
        cls, key = shape.compile_class(m), _vllm_compile_key(desc, m)
        assert by_class.setdefault(cls, key) == key, f"{m} rows: one class, two compile keys"
        assert by_key.setdefault(key, cls) == cls, f"{m} rows: one compile key, two classes"
    assert len(by_class) >= 6  # config buckets times specialisations


def test_triton_int_class_is_tritons_specialisation() -> None:
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    values = [*range(-40, 300), 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 16, 2**40 + 3]
    classes: dict[str, Any] = {}
    for v in values:
        spec = native_specialize_impl(BaseBackend, v, False, True, True)
        assert classes.setdefault(warmup.triton_int_class(v), spec) == spec, v
    assert len(classes) == len(set(map(repr, classes.values())))


@pytest.mark.parametrize("limits", [(64, 16, 1024), (8192, 256, 8448)])
def test_warmup_compiles_every_moe_class_a_forward_meets(h200: torch.device, limits: tuple[int, int, int]) -> None:
    """Every fused-MoE compile class of a forward of 1 to ``max_tokens`` rows is one
    some warm-up forward meets (both launches' classes for each layer shape), and the
    single-request forwards added for it are kept only where nothing else reaches a
    class."""
    max_tokens, max_reqs, max_len = limits
    shapes = [_moe_shape(**MOE_SHAPES[n])[0] for n in ("tiny", "released")]
    signature = attention_signature(PROBLEMS, h200)
    candidates = warmup.v2_runnable(candidate_batches(max_tokens, max_reqs, max_len))
    candidates += warmup.moe_batches(max_tokens, shapes)
    conv = ConvLaunches.of(_layouts(limits[0] == 64, 1))
    chosen = warmup_batches(candidates, signature, shapes, conv)
    covered: set[Any] = set()
    for b in chosen:
        covered |= shape_classes(b, signature, shapes, conv)
    missing = [(i, t) for t in range(1, max_tokens + 1) for i, s in enumerate(shapes)
               if ("moe", i, s.compile_class(t)) not in covered]
    assert not missing, f"{len(missing)} row counts whose fused-MoE class no warm-up forward compiles: {missing[:5]}"
    assert all(b.max_query_len <= b.seq_len <= max_len for b in chosen)


def test_moe_coverage_check_fails_without_the_moe_classes(h200: torch.device) -> None:
    """The coverage test can fail: on the second-generation runner, the cover of the
    attention and conv classes alone leaves row counts of the tiny engine's budget (64
    rows, 16 requests) whose fused-MoE class no forward compiles, among them 36, 44, 52
    and 60 rows, where the padded row count is divisible by 16 and the pair count is
    not; with the MoE's own forwards every count is met."""
    shape = _moe_shape(**MOE_SHAPES["tiny"])[0]
    signature = attention_signature(PROBLEMS, h200)
    chosen = warmup_batches(warmup.v2_runnable(candidate_batches(64, 16, 1024)), signature, conv=_tiny_conv())
    met = {shape.compile_class(b.num_tokens) for b in chosen}
    assert {36, 44, 52, 60} <= {t for t in range(1, 65) if shape.compile_class(t) not in met}
    with_moe = warmup.v2_runnable(candidate_batches(64, 16, 1024)) + warmup.moe_batches(64, [shape])
    met = {shape.compile_class(b.num_tokens) for b in warmup_batches(with_moe, signature, [shape], _tiny_conv())}
    assert all(shape.compile_class(t) in met for t in range(1, 65))


def test_moe_batches_take_the_fewest_rows_of_each_class() -> None:
    shape = _moe_shape(**MOE_SHAPES["tiny"])[0]
    batches = warmup.moe_batches(64, [shape])
    rows = [b.num_tokens for b in batches]
    assert rows == sorted(set(rows)) and all(b.num_reqs == 1 and b.seq_len == b.num_tokens for b in batches)
    classes = [shape.compile_class(t) for t in rows]
    assert len(set(classes)) == len(classes)  # one forward per class
    for t in range(1, 65):  # and no class is first met below its forward's rows
        assert min(r for r in rows if shape.compile_class(r) == shape.compile_class(t)) <= t

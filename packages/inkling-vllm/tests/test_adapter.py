"""The adapter without an engine: spec, errors, metadata builder, provider, plugin,
and the model's refusal of bad configs and tensors."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

from inkling_cache import ConvStateLayout, Stream
from inkling_kernels import sconv_tap_map_ref
from inkling_model import SconvMetadata, current_metadata, get_owner
from inkling_vllm import conv_state
from inkling_vllm.model import InklingForCausalLM, UnsupportedCheckpoint, check_supported_config


def fake_vllm_config(dtype: torch.dtype = torch.float32, max_tokens: int = 64, num_spec: int | None = None,
                     **model_config: Any) -> Any:
    return SimpleNamespace(
        model_config=SimpleNamespace(dtype=dtype, **model_config),
        compilation_config=SimpleNamespace(static_forward_context={}, cudagraph_capture_sizes=[]),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=max_tokens),
        speculative_config=None if num_spec is None else SimpleNamespace(num_speculative_tokens=num_spec,
                                                                         parallel_drafting=False),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
    )


@pytest.fixture
def vllm_env(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Patch what InklingConvStateLayer reads from vLLM's globals."""
    state = SimpleNamespace(config=fake_vllm_config(), tp=1)
    monkeypatch.setattr(conv_state, "get_current_vllm_config", lambda: state.config)
    monkeypatch.setattr(conv_state, "get_tensor_model_parallel_world_size", lambda: state.tp)
    return state


def make_layer(prefix: str, heads: int = 2, head_dim: int = 64, hidden: int = 128, **kw: Any) -> Any:
    return conv_state.InklingConvStateLayer(
        num_kv_heads=heads, head_dim=head_dim, hidden_size=hidden, kernel_size=4, prefix=prefix, **kw
    )


# --- the layer and its spec -------------------------------------------------------
@pytest.mark.parametrize("tp,heads,hidden", [(1, 2, 128), (2, 4, 256), (4, 8, 512)])
def test_spec_is_one_sliding_window_of_the_packed_layout(vllm_env: Any, tp: int, heads: int, hidden: int) -> None:
    vllm_env.tp = tp
    layer = make_layer(f"spec.{tp}", heads=heads, hidden=hidden)
    spec = layer.get_kv_cache_spec(vllm_env.config)
    expected = ConvStateLayout.build(num_kv_heads=heads, head_dim=64, hidden_size=hidden, kernel_size=4, tp_size=tp)
    assert isinstance(spec, SlidingWindowSpec)
    assert spec.block_size == 4 and spec.sliding_window == 4
    assert spec.num_kv_heads == heads // tp == expected.num_heads
    assert spec.head_size == expected.head_size
    assert spec.head_size_v == 0
    assert spec.dtype == torch.float32
    assert spec.page_size_bytes == expected.page_bytes("float32")
    assert vllm_env.config.compilation_config.static_forward_context[f"spec.{tp}"] is layer
    assert layer.get_attn_backend().get_name() == "INKLING_SCONV_SWA"
    assert layer.get_attn_backend().get_builder_cls() is conv_state.InklingSconvMetadataBuilder


def test_duplicate_layer_name_is_refused(vllm_env: Any) -> None:
    make_layer("dup")
    with pytest.raises(ValueError, match="duplicate layer name"):
        make_layer("dup")


@pytest.mark.parametrize("tp,heads", [(4, 2), (3, 4)])
def test_tp_that_splits_kv_heads_is_refused(vllm_env: Any, tp: int, heads: int) -> None:
    vllm_env.tp = tp
    with pytest.raises(ValueError, match=rf"tensor_parallel_size {tp}\).*(exceeds|does not divide).*use "):
        make_layer(f"tp.{tp}", heads=heads, hidden=heads * 64)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int8])
def test_unsupported_dtype_is_refused(vllm_env: Any, dtype: torch.dtype) -> None:
    vllm_env.config = fake_vllm_config(dtype)
    with pytest.raises(ValueError, match="dtype"):
        make_layer(f"dtype.{dtype}")


def test_unsupported_vllm_version_is_refused(vllm_env: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm

    monkeypatch.setattr(vllm, "__version__", "0.30.1")
    from inkling_vllm.compat import UnsupportedVllmVersion

    with pytest.raises(UnsupportedVllmVersion, match="0.30.1"):
        make_layer("old")


def test_bind_uses_the_runtime_block_size_and_accepts_strided_pages(vllm_env: Any) -> None:
    layer = make_layer("bind", heads=4, hidden=128, padding="none")  # D = 192
    assert layer.block_size == 4  # unbound: the layout's W
    # the engine enlarged the block to 16 rows and padded each page to 16384 floats
    raw = torch.zeros(10, 16384)
    view = raw[:, : 4 * 16 * 192].view(10, 4, 16, 192)
    layer.bind_kv_cache(view)
    assert layer.kv_cache is view and not view.is_contiguous()
    assert layer.block_size == 16 and layer.owner.block_size == 16
    assert get_owner("bind").cache is view


# --- metadata builder -------------------------------------------------------------
def _expected_rows(qsl: list[int], padded: int) -> tuple[list[int], list[int]]:
    seq, start = [0] * padded, [0] * padded
    for r in range(len(qsl) - 1):
        for t in range(qsl[r], qsl[r + 1]):
            seq[t], start[t] = r, qsl[r]
    return seq, start


@pytest.mark.parametrize("lens,pad", [([3, 1, 5], 0), ([1], 7), ([4, 4, 4, 4], 3), ([17], 0)])
def test_builder_maps_common_metadata(lens: list[int], pad: int) -> None:
    spec = SlidingWindowSpec(block_size=4, num_kv_heads=2, head_size=256, head_size_v=0, dtype=torch.float32, sliding_window=4)
    builder = conv_state.InklingSconvMetadataBuilder(spec, ["x"], fake_vllm_config(max_tokens=64), torch.device("cpu"))
    assert builder.get_cudagraph_support(None, spec).name == "UNIFORM_BATCH"
    qsl = [0]
    for n in lens:
        qsl.append(qsl[-1] + n)
    actual, padded = qsl[-1], qsl[-1] + pad
    g = torch.Generator().manual_seed(actual)
    slots = torch.randint(0, 1000, (padded,), generator=g, dtype=torch.int64)
    slots[actual:] = -1
    # (a persistent table with a row past this step's requests, as vLLM's can be)
    table = torch.randint(0, 50, (len(lens) + 1, 8), generator=g, dtype=torch.int32)
    cm = SimpleNamespace(
        num_reqs=len(lens),
        num_actual_tokens=padded,
        query_start_loc=torch.tensor(qsl, dtype=torch.int32),
        query_start_loc_cpu=torch.tensor(qsl, dtype=torch.int32),
        slot_mapping=slots,
        block_table_tensor=table,
        positions=torch.arange(padded + 2),
    )
    first = builder.build(0, cm)
    assert isinstance(first, SconvMetadata)
    assert first.positions.data_ptr() == cm.positions.data_ptr() and first.num_tokens == padded
    seq, start = _expected_rows(qsl, padded)
    assert first.seq_idx.tolist() == seq
    assert first.query_start.tolist() == start
    assert first.slot_mapping.tolist() == slots.tolist()
    # the table cut to the step's requests (a view: no copy); its rows bound them for the tiling
    assert first.block_table.shape == (max(len(lens), 1), 8) and first.block_table.data_ptr() == table.data_ptr()
    assert first.block_size == 4  # the group's (unified) block size
    assert first.num_prefill_tokens == sum(n for n in lens if n > 16)  # the kernels' prompt-row hint
    # persistent buffers: a second build writes the same storage
    second = builder.build(0, cm)
    assert second.seq_idx.data_ptr() == first.seq_idx.data_ptr()
    assert second.query_start.data_ptr() == first.query_start.data_ptr()


def _common_metadata(block_size: int, positions: bool = True) -> tuple[Any, torch.Tensor]:
    """Two requests at positions 5.. and 0.. (the first reads cache slots), two pad rows."""
    table = torch.tensor([[3, 7, 2, 9], [4, 6, 0, 0]], dtype=torch.int32)
    pos = [5, 6, 7, 8, 0, 1, 2, 99, 0]  # the last two rows are pad rows (any position)
    rows = [(0, p) for p in pos[:4]] + [(1, p) for p in pos[4:7]]
    slots = [int(table[r, p // block_size]) * block_size + p % block_size for r, p in rows] + [-1, -1]
    cm = SimpleNamespace(
        num_reqs=2,
        num_actual_tokens=9,
        query_start_loc=torch.tensor([0, 4, 7], dtype=torch.int32),
        query_start_loc_cpu=torch.tensor([0, 4, 7], dtype=torch.int32),
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        block_table_tensor=table,
        seq_lens=torch.tensor([9, 3], dtype=torch.int32),
    )
    positions_t = torch.tensor(pos, dtype=torch.int64)
    if positions:
        cm.positions = positions_t
    return cm, positions_t


def _spec(block_size: int = 4) -> SlidingWindowSpec:
    return SlidingWindowSpec(
        block_size=block_size, num_kv_heads=2, head_size=256, head_size_v=0, dtype=torch.float32, sliding_window=4
    )


@pytest.mark.parametrize("kernel_size", [2, 3, 4, 5])
def test_builder_takes_the_conv_kernel_size_from_the_groups_spec(kernel_size: int) -> None:
    # one source: the layers declare W (their layout's kernel size) as the sliding window
    spec = SlidingWindowSpec(block_size=4, num_kv_heads=2, head_size=256, head_size_v=0, dtype=torch.float32,
                             sliding_window=kernel_size)
    vllm_config = fake_vllm_config(hf_config=SimpleNamespace(conv_kernel_size=7))  # not read
    builder = conv_state.InklingSconvMetadataBuilder(spec, ["x"], vllm_config, torch.device("cpu"))
    assert builder._builder.kernel_size == kernel_size
    # Auto mode: the map is a CUDA-kernel aid, never built on CPU.
    assert not builder._builder.builds_tap_map
    cm, _ = _common_metadata(4)
    assert builder.build(0, cm).tap_map is None


@pytest.mark.parametrize("block_size", [4, 8])
def test_builder_passes_positions_to_the_tap_map(block_size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """What runs on CUDA, forced on CPU: the map is built from vLLM's positions."""
    real = conv_state.SconvMetadataBuilder

    def forced(*args: Any, **kwargs: Any) -> Any:
        return real(*args, **kwargs, tap_map=True)

    monkeypatch.setattr(conv_state, "SconvMetadataBuilder", forced)
    vllm_config = fake_vllm_config(hf_config=SimpleNamespace(conv_kernel_size=4))
    builder = conv_state.InklingSconvMetadataBuilder(_spec(block_size), ["x"], vllm_config, torch.device("cpu"))
    cm, positions = _common_metadata(block_size)
    meta = builder.build(0, cm)
    assert meta.tap_map is not None and meta.tap_map.shape == (9, 3)
    want = torch.full((9, 3), -7, dtype=torch.int64)
    sconv_tap_map_ref(meta, want)
    assert torch.equal(meta.tap_map, want) and torch.equal(meta.positions, positions)
    # Row 0 (position 5) reads positions 4, 3, 2 from the cache of request 0.
    table = cm.block_table_tensor
    assert meta.tap_map[0].tolist() == [int(table[0, p // block_size]) * block_size + p % block_size for p in (4, 3, 2)]
    # Persistent: the second step's map lives in the same buffer.
    again = builder.build(0, cm)
    assert again.tap_map is not None and again.tap_map.data_ptr() == meta.tap_map.data_ptr()
    # A CommonAttentionMetadata without positions (older runners): the positions are
    # derived from the sequence lengths (pad rows 0), and so is the same map.
    mapped = meta.tap_map.clone()
    cm_old, _ = _common_metadata(block_size, positions=False)
    old = builder.build(0, cm_old)
    assert old.positions.tolist() == positions[:7].tolist() + [0, 0]
    assert torch.equal(old.tap_map[:7], mapped[:7])
    # Positions that do not cover the padded batch are refused, not misread.
    cm.positions = positions[:5]
    with pytest.raises(ValueError, match="at least num_padded_tokens"):
        builder.build(0, cm)


@pytest.mark.parametrize("num_spec", [None, 3])
def test_builder_asks_for_decodes_first(num_spec: int | None) -> None:
    """The conv group asks vLLM to put decode requests (1 token, or 1 + the draft tokens
    of a verification) ahead of prompts in each step's batch."""
    spec = SlidingWindowSpec(block_size=4, num_kv_heads=2, head_size=256, head_size_v=0, dtype=torch.float32,
                             sliding_window=4)
    builder = conv_state.InklingSconvMetadataBuilder(spec, ["x"], fake_vllm_config(num_spec=num_spec),
                                                     torch.device("cpu"))
    assert builder.reorder_batch_threshold == 1 + (num_spec or 0)


@pytest.mark.parametrize("num_spec", [None, 3, 19])
def test_builder_counts_prompt_rows(num_spec: int | None) -> None:
    """The batch's ``num_prefill_tokens`` (the kernels' hint): rows of the requests of
    more rows than vLLM's decode threshold (1 + the draft tokens) and than 16."""
    builder = conv_state.InklingSconvMetadataBuilder(_spec(), ["x"], fake_vllm_config(num_spec=num_spec, max_tokens=128),
                                                     torch.device("cpu"))
    decode_max = max(16, 1 + (num_spec or 0))
    for lens in ([1, 16, 17, 20, 21, 4], [21, 20, 17, 16, 4, 1], [17, 20, 21]):
        qsl = [0]
        for n in lens:
            qsl.append(qsl[-1] + n)
        cm = SimpleNamespace(
            num_reqs=len(lens), num_actual_tokens=qsl[-1], query_start_loc=torch.tensor(qsl, dtype=torch.int32),
            query_start_loc_cpu=torch.tensor(qsl, dtype=torch.int32), slot_mapping=torch.full((qsl[-1],), -1),
            block_table_tensor=torch.zeros(len(lens), 4, dtype=torch.int32), positions=torch.arange(qsl[-1]),
        )
        batch = builder.build(0, cm)
        assert batch.num_prefill_tokens == sum(n for n in lens if n > decode_max), lens


def test_builder_refuses_other_specs() -> None:
    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float32)
    with pytest.raises(TypeError, match="SlidingWindowSpec"):
        conv_state.InklingSconvMetadataBuilder(spec, ["x"], fake_vllm_config(), torch.device("cpu"))


# --- metadata provider ------------------------------------------------------------
def test_provider_reads_the_forward_context(monkeypatch: pytest.MonkeyPatch) -> None:
    meta = SconvMetadata(
        positions=torch.zeros(1, dtype=torch.int64),
        block_table=torch.zeros(1, 1, dtype=torch.int32),
        slot_mapping=torch.zeros(1, dtype=torch.int64),
        seq_idx=torch.zeros(1, dtype=torch.int32),
        query_start=torch.zeros(1, dtype=torch.int32),
        block_size=4,
    )
    ctx = SimpleNamespace(attn_metadata=None)
    available = {"v": False}
    monkeypatch.setattr(conv_state, "is_forward_context_available", lambda: available["v"])
    monkeypatch.setattr(conv_state, "get_forward_context", lambda: ctx)
    conv_state.install_metadata_provider()
    assert current_metadata("layer.a") is None  # no forward context at all
    available["v"] = True
    assert current_metadata("layer.a") is None  # profiling pass: not a dict
    ctx.attn_metadata = [{"layer.a": meta}]  # micro-batched: refused, never skipped
    with pytest.raises(NotImplementedError, match="micro-batched"):
        current_metadata("layer.a")
    ctx.attn_metadata = {"layer.b": meta}
    assert current_metadata("layer.a") is None  # nothing for this layer
    ctx.attn_metadata = {"layer.a": meta, "layer.c": object()}
    assert current_metadata("layer.a") is meta
    assert current_metadata("layer.c") is None  # someone else's metadata type


# --- model config / weights -------------------------------------------------------
def tiny_spec(**overrides: Any) -> Any:
    from inkling_cache import text_spec
    from inkling_vllm.demo.tiny import tiny_config

    return text_spec({**tiny_config(), "model_type": "inkling_text", **overrides})


def test_supported_config_passes() -> None:
    check_supported_config(tiny_spec())


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"layer_types": ["hybrid", "linear", "hybrid", "hybrid"]}, "layer_types"),
        ({"mlp_layer_types": ["dense", "sparse"]}, "mlp_layer_types"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"model_type": "inkling_unknown"}, "model_type"),
    ],
)
def test_bad_configs_are_refused(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises((UnsupportedCheckpoint, ValueError), match=message):
        check_supported_config(tiny_spec(**overrides))


@pytest.mark.parametrize(
    "raw,hf_value,fused",
    [(None, None, True), ({}, None, True), ({"inkling_fused_conv_norm": False}, True, False),
     (None, False, False), ({"inkling_fused_conv_norm": True}, None, True)],
)
def test_fused_tails_switch(raw: Any, hf_value: Any, fused: bool) -> None:
    """The fused sublayer tails are on by default; the config key turns them off
    (config.json / hf_overrides first, then vLLM's parsed config)."""
    from inkling_vllm.model import _fused_tails

    hf = SimpleNamespace() if hf_value is None else SimpleNamespace(inkling_fused_conv_norm=hf_value)
    assert _fused_tails(SimpleNamespace(model_config=SimpleNamespace(hf_config=hf)), raw) is fused


@pytest.mark.parametrize("value", ["false", 0, 1, "yes"])
def test_fused_tails_switch_refuses_non_booleans(value: Any) -> None:
    from inkling_vllm.model import _fused_tails

    config = SimpleNamespace(model_config=SimpleNamespace(hf_config=SimpleNamespace()))
    with pytest.raises(UnsupportedCheckpoint, match="'inkling_fused_conv_norm' must be true or false"):
        _fused_tails(config, {"inkling_fused_conv_norm": value})


@pytest.mark.parametrize("value,padding", [(None, "pow2"), ("none", "none"), (8, "8"), ("multiple:4", "multiple:4")])
def test_conv_padding_key(value: Any, padding: str) -> None:
    from inkling_vllm.model import _conv_padding

    config = SimpleNamespace(model_config=SimpleNamespace(hf_config=SimpleNamespace()))
    assert _conv_padding(config, {"inkling_conv_state_padding": value}) == padding


@pytest.mark.parametrize("value", ["bogus", 0, False, "", -8])
def test_conv_padding_key_refuses_what_the_layers_cannot_parse(value: Any) -> None:
    """Refused when the model is built, naming the key (not first inside a layer)."""
    from inkling_vllm.model import _conv_padding

    config = SimpleNamespace(model_config=SimpleNamespace(hf_config=SimpleNamespace()))
    with pytest.raises(UnsupportedCheckpoint, match="'inkling_conv_state_padding' is"):
        _conv_padding(config, {"inkling_conv_state_padding": value})


@pytest.fixture
def no_tp(monkeypatch: pytest.MonkeyPatch) -> None:
    from inkling_vllm import model

    monkeypatch.setattr(model, "get_tensor_model_parallel_rank", lambda: 0)
    monkeypatch.setattr(model, "get_tensor_model_parallel_world_size", lambda: 1)


def _stub_model() -> Any:
    stub = torch.nn.Module()
    stub.spec = tiny_spec()  # type: ignore[assignment]
    stub._load_one = InklingForCausalLM._load_one.__get__(stub)  # type: ignore[attr-defined]
    return stub


def test_unknown_tensors_are_refused_at_load_naming_them(no_tp: None) -> None:
    with pytest.raises(UnsupportedCheckpoint, match="model.layers.0.self_attn.no_such_proj.weight"):
        InklingForCausalLM.load_weights(_stub_model(), [("model.layers.0.self_attn.no_such_proj.weight", torch.zeros(2))])


def test_moe_weights_for_a_dense_layer_are_refused_at_load(no_tp: None) -> None:
    with pytest.raises(UnsupportedCheckpoint, match="dense layer"):
        InklingForCausalLM.load_weights(_stub_model(), [("model.layers.0.mlp.experts.gate_up_proj", torch.zeros(2, 2))])


# --- plugin -----------------------------------------------------------------------
def test_entry_point_is_declared() -> None:
    eps = importlib.metadata.entry_points(group="vllm.general_plugins")
    assert any(ep.value == "inkling_vllm.plugin:register" for ep in eps)


def test_register_is_reentrant_and_points_at_our_model() -> None:
    from vllm import ModelRegistry

    from inkling_vllm import plugin

    plugin.register()
    plugin.register()
    for arch in plugin.ARCHITECTURES:
        entry = ModelRegistry.models[arch]
        assert getattr(entry, "module_name", None) == "inkling_vllm.model"
        assert getattr(entry, "class_name", None) == "InklingForCausalLM"


def test_register_keeps_breakable_graphs_off_on_every_platform() -> None:
    """vLLM's breakable graphs (on by default for the Inkling architectures, CPU
    included) switch torch.compile off; registering the plugin installs the opt-out
    whatever the platform (here: a fresh process on this machine's)."""
    code = (
        "from inkling_vllm import plugin; plugin.register(); "
        "from vllm.config import VllmConfig; from vllm.platforms import current_platform; "
        "print(current_platform.device_type, "
        "getattr(VllmConfig._maybe_enable_breakable_cudagraph, '_inkling_opt_out', False))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    device_type, opted_out = out.stdout.split()[-2:]
    assert opted_out == "True", f"no opt-out installed on {device_type}"


def test_plugin_import_is_lazy() -> None:
    code = "import sys, inkling_vllm.plugin; print('vllm' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


def test_stream_widths_match_the_model_layers(vllm_env: Any) -> None:
    layer = make_layer("widths", heads=4, hidden=128)
    assert layer.owner.stream_dim(Stream.K) == 4 * 64
    assert layer.owner.stream_dim(Stream.ATTN) == 128


def test_warmup_reads_the_models_conv_launches(vllm_env: Any) -> None:
    """The kernel warm-up finds a model's conv-state layers (a global and a sliding
    layer kind; layers of one kind merge) and whether its sublayer tails are fused."""
    from torch import nn

    from inkling_vllm import warmup

    model = nn.Module()
    model.model = nn.Module()
    model.model.layers = nn.ModuleList([nn.Module() for _ in range(3)])
    for i, heads in enumerate((2, 4, 2)):
        model.model.layers[i].conv_state = make_layer(f"warm.{i}", heads=heads)
    model.model.fused = False
    launches = warmup._conv_launches(model)
    layouts = [ConvStateLayout.build(num_kv_heads=h, head_dim=64, hidden_size=128, kernel_size=4, tp_size=1)
               for h in (2, 4)]
    assert launches == warmup.ConvLaunches.of(layouts, fused=False)
    assert len(launches.kinds) == 2 and launches.tp_size == 1 and not launches.fused

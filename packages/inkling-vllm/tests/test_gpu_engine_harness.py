"""The GPU engine harness's host-side logic (runs anywhere): the parity verdicts, the
profiler's outside-kernel share, the released-width benchmark model and the table of
ours / peer."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from inkling_vllm.demo import gpu_engine


def _reference() -> dict:
    return {"s": {"tokens": [[1, 2, 3], [4, 5, 6]], "logprobs": [[-1.0, -2.0, -0.5, -0.1], [-3.0, -1.0, -0.2, -0.3]],
                  "margins": [[0.5, 0.01, 0.3], [0.2, 0.2, 0.2]]}}


def test_compare_counts_identical_sequences_and_locates_divergence() -> None:
    got = {"tokens": [[1, 2, 3], [4, 9, 6]]}
    verdict = gpu_engine.compare(got, _reference(), "s")
    assert verdict["identical"] == 1 and verdict["sequences"] == 2
    assert verdict["differ_at"] == [{"sequence": 1, "position": 1, "reference_margin": 0.2}]
    assert gpu_engine.compare({"tokens": [[1, 2, 3], [4, 5, 6]]}, _reference(), "s")["identical"] == 2


def test_compare_bounds_logprobs_only_before_the_first_divergence() -> None:
    # prompt of 2 tokens (1 teacher-forced logprob) + 3 generated; sequence 1 diverges at
    # its first generated token: only its prompt logprob may be compared
    got = {"tokens": [[1, 2, 3], [7, 5, 6]],
           "logprobs": [[-1.0, -2.25, -0.5, -0.1], [-3.5, -9.0, -9.0, -9.0]]}
    verdict = gpu_engine.compare(got, _reference(), "s")
    assert verdict["first_divergence"] == [3, 0]
    assert verdict["max_abs_dlogprob"] == pytest.approx(0.5)


def _event(start: float, end: float, device: str = "DeviceType.CUDA") -> SimpleNamespace:
    return SimpleNamespace(device_type=device, time_range=SimpleNamespace(start=start, end=end))


def test_busy_share_is_the_union_of_kernel_intervals() -> None:
    events = [_event(0, 10), _event(5, 20), _event(30, 40), _event(0, 100, "DeviceType.CPU")]
    share = gpu_engine._busy_share(SimpleNamespace(events=lambda: events))
    assert share["busy_us"] == 30 and share["span_us"] == 40
    assert share["outside_kernels"] == pytest.approx(0.25)
    assert gpu_engine._busy_share(SimpleNamespace(events=lambda: []))["kernels"] == 0


def test_busy_share_splits_idle_time_into_launch_and_host_gaps() -> None:
    share = gpu_engine.busy_share([(0, 10), (5, 20), (30, 40), (100, 110)])  # gaps of 10 and 60 µs
    assert share["busy_us"] == 40 and share["span_us"] == 110
    assert share["launch_gaps"] == pytest.approx(10 / 110)
    assert share["host_gaps"] == pytest.approx(60 / 110)
    assert share["launch_gaps"] + share["host_gaps"] == pytest.approx(share["outside_kernels"])


def test_bench_model_has_the_released_layer_widths() -> None:
    text = gpu_engine.bench_config()["text_config"]
    assert text["hidden_size"] == 6144 and text["num_hidden_layers"] == 4
    assert (text["num_attention_heads"], text["head_dim"]) == (64, 128)
    assert (text["num_key_value_heads"], text["swa_num_key_value_heads"]) == (8, 16)
    assert text["d_rel"] == 16 and text["n_routed_experts"] == 8 and text["num_experts_per_tok"] == 6
    assert text["n_shared_experts"] == 2 and text["local_layer_ids"] == [0, 2] and text["dense_mlp_idx"] == 2
    smoke = gpu_engine.bench_config(smoke=True)["text_config"]
    assert smoke["hidden_size"] < 1024 and smoke["local_layer_ids"] == [0, 2]


def test_every_engine_runs_known_scenarios() -> None:
    for name, (kwargs, env, scenarios) in gpu_engine.ENGINES.items():
        assert scenarios and set(scenarios) <= set(gpu_engine.SCENARIOS), name
        assert set(env) <= {"INKLING_CONV_STATE", "INKLING_MTP_MIN_ACCEPTANCE"}, name


def _bench_record(prefill: float, decode: float, **extra: object) -> dict[str, object]:
    return {"graphs": "on", "prefill": {"prompt": 8192, "ttft_ms_median": 1.0, "tokens_per_s": prefill},
            "decode": [{"concurrency": 64, "context": 1024, "step_ms_median": 1.0, "tokens_per_s": decode}], **extra}


def test_report_gives_ours_over_peer_per_case(tmp_path, capsys) -> None:
    assert gpu_engine.bench_key("on", "ours") == "graphs-on"
    assert gpu_engine.bench_key("on", "peer") == "graphs-on-peer"
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"device": {}, "cases": {
        "graphs-on": _bench_record(3000.0, 900.0),
        "graphs-on-peer": _bench_record(2000.0, 600.0, peer_metadata_launches=12),
        "graphs-off": _bench_record(1.0, 1.0),
        "graphs-off-peer": _bench_record(1.0, 1.0, peer_metadata_launches=0),
    }}))
    gpu_engine.cmd_report(SimpleNamespace(parity=None, bench=str(bench)))
    out = capsys.readouterr().out
    assert "| graphs-on | prefill 8192 (TTFT) | 3000 | 2000 | 1.50 |" in out
    assert "| graphs-on | decode 64 x 1024 | 900 | 600 | 1.50 |" in out
    assert "| graphs-off | not compared: the peer's conv never ran | | | |" in out


def test_a_child_that_ran_out_of_time_gives_its_last_partial_record(tmp_path: Path, capsys: Any) -> None:
    """The benchmark child prints a PARTIAL record after start-up and each case; its
    RESULT wins, and without one the last PARTIAL stands, marked incomplete, and the
    report says how far it got."""
    started = {"graphs": "on", "startup_s": 300.0, "decode": [], "prefill": {}}
    one = {**started, "prefill": {"prompt": 8192, "ttft_ms_median": 180.0, "tokens_per_s": 45511.0}}
    text = "noise\nPARTIAL " + json.dumps(started) + "\nPARTIAL " + json.dumps(one) + "\nTIMEOUT"
    rec = gpu_engine._last_record(text)
    assert rec == {**one, "incomplete": True}
    assert gpu_engine._last_record(text + "\nRESULT " + json.dumps(started)) == started
    assert gpu_engine._last_record("nothing") is None
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"device": {}, "cases": {"graphs-on": rec, "graphs-off": {**started, "incomplete": True}}}))
    assert gpu_engine.main(["report", "--bench", str(bench)]) == 0
    out = capsys.readouterr().out
    assert "| graphs-on | prefill 8192 (TTFT) | 180.0 | 45511 | |" in out
    assert "| graphs-off | ran out of time (started in 300.0 s) |" in out


def test_bench_graph_settings_are_configs_vllm_accepts() -> None:
    from vllm.config import CompilationConfig, CompilationMode, CUDAGraphMode

    assert gpu_engine.bench_compilation("off") is None
    for graphs, mode, graph_mode in (("on", None, None), ("on-nocompile", CompilationMode.NONE,
                                                             CUDAGraphMode.FULL_DECODE_ONLY)):
        config = CompilationConfig(**gpu_engine.bench_compilation(graphs))
        assert config.cudagraph_mode == graph_mode, graphs  # None: vLLM's default, resolved later
        assert config.mode == mode, graphs  # None: vLLM's default (compiled) is resolved later
        assert config.cudagraph_capture_sizes == gpu_engine.BENCH_CAPTURE_SIZES
    assert gpu_engine.bench_key("on-nocompile", "peer") == "graphs-on-nocompile-peer"


def test_bench_model_grows_by_layers_and_carries_an_mtp_head_on_request() -> None:
    """Deeper benchmark models continue sliding / global in turn after the first two
    dense layers; an MTP head is declared where both vLLM and the plugin look for it."""
    from inkling_vllm.drafting import mtp_head

    config = gpu_engine.bench_config(layers=8, mtp_layers=1)
    text = config["text_config"]
    assert text["num_hidden_layers"] == 8 and text["local_layer_ids"] == [0, 2, 4, 6]
    assert text["num_nextn_predict_layers"] == 1 and config["mtp_config"] == {"num_nextn_predict_layers": 1}
    assert mtp_head(config).num_layers == 1
    assert mtp_head(gpu_engine.bench_config()).num_layers == 0 and "mtp_config" not in gpu_engine.bench_config()
    assert gpu_engine.bench_key("on", "ours", 1, 16) == "graphs-on-mtp1-L16"
    assert gpu_engine.bench_key("on", "ours", 1, 16, gate=False) == "graphs-on-mtp1-nogate-L16"
    assert gpu_engine.bench_key("on", "ours", 0, 4, gate=False) == "graphs-on"  # no drafts: no gate
    assert gpu_engine.bench_key("on", "ours", 1, 4, head="predictive") == "graphs-on-mtp1-predictive"
    assert gpu_engine.bench_key("on", "ours", 0, 4, head="predictive") == "graphs-on"  # no drafts: no head
    assert gpu_engine.bench_key("on", "ours", 2, 40, head_depths=2) == "graphs-on-mtp2-h2-L40"
    assert gpu_engine.bench_key("on", "ours", 0, 40, head_depths=2) == "graphs-on-L40"  # no drafts: no head
    assert gpu_engine.bench_config(mtp_layers=2)["mtp_config"] == {"num_nextn_predict_layers": 2}


def test_bench_refuses_a_head_without_depth_blocks(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        gpu_engine.main(["bench", "out.json", "--tokenizer", ".", "--drafts", "2", "--head-depths", "0"])
    assert exc.value.code == 2 and "--head-depths: must be at least 1, not 0" in capsys.readouterr().err


def _tiny_models(hidden: int = 8) -> tuple[Any, Any]:
    """Stand-ins with the plugin's parameter names: a target of two layers (dense and
    MoE) and a one-depth MTP head."""
    import torch
    from torch import nn

    def linear(rows: int, cols: int) -> nn.Linear:
        return nn.Linear(cols, rows, bias=False)

    def layer(moe: bool) -> nn.Module:
        mlp = nn.Module()
        if moe:
            mlp.experts = nn.Module()
            mlp.experts.w2_weight = nn.Parameter(torch.randn(4, hidden, 2 * hidden))
            mlp.shared_experts = nn.Module()
            mlp.shared_experts.down_proj = linear(hidden, 2 * hidden)
        else:
            mlp.down_proj = linear(hidden, 2 * hidden)
        block = nn.Module()
        block.self_attn = nn.Module()
        block.self_attn.o_proj = linear(hidden, hidden)
        block.self_attn.qkv_proj = linear(3 * hidden, hidden)
        block.mlp = mlp
        return block

    target = nn.Module()
    target.model = nn.Module()
    target.model.layers = nn.ModuleList([layer(False), layer(True)])
    target.model.norm = nn.Module()
    target.model.norm.weight = nn.Parameter(torch.rand(hidden))
    depth = nn.Module()
    depth.input_proj = linear(hidden, 2 * hidden)
    depth.embed_norm = nn.Module()
    depth.embed_norm.weight = nn.Parameter(torch.rand(hidden))
    depth.transformer_block = layer(False)
    head = nn.Module()
    head.layers = nn.ModuleList([depth])
    return target, head


def test_predictive_head_rewrite_makes_every_layer_pass_its_input_through() -> None:
    """The benchmark's predictive head: every output projection zero (so each residual
    stream carries its input), the target's final norm and the head's embed_norm of
    unit weight, the head's input projection [0 | I] (it reads only the next token's
    embedding); other weights untouched. A model without those parts is refused."""
    import torch
    from torch import nn

    target, head = _tiny_models()
    qkv = target.model.layers[0].self_attn.qkv_proj.weight.clone()
    assert gpu_engine.make_head_predictive(target) == {"output_projections": 5, "final_norm": 1, "input_proj": 0,
                                                      "embed_norm": 0}
    assert gpu_engine.make_head_predictive(head) == {"output_projections": 2, "final_norm": 0, "input_proj": 1,
                                                    "embed_norm": 1}
    for model in (target, head):
        for name, param in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight", "w2_weight")):
                assert not param.any(), name
    assert torch.equal(target.model.layers[0].self_attn.qkv_proj.weight, qkv)
    assert torch.equal(target.model.norm.weight, torch.ones(8))
    depth = head.layers[0]
    assert torch.equal(depth.embed_norm.weight, torch.ones(8))
    x = torch.randn(3, 16)
    assert torch.equal(depth.input_proj(x), x[:, 8:])  # drops the previous hidden state
    renamed = nn.Module()
    renamed.model = nn.Module()
    renamed.model.layers = nn.ModuleList([nn.Linear(4, 4)])
    renamed.model.norm = nn.Module()
    renamed.model.norm.weight = nn.Parameter(torch.ones(4))
    with pytest.raises(ValueError, match="expected an o_proj and an MLP down projection"):
        gpu_engine.make_head_predictive(renamed)


def test_report_gives_drafting_over_no_drafting(tmp_path: Path, capsys: Any) -> None:
    """Both drafting tables put each run beside the same engine without drafts."""
    spec = _bench_record(3000.0, 450.0)
    spec["decode"][0]["acceptance"] = 0.004  # type: ignore[index]
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"device": {}, "cases": {
        "graphs-on": _bench_record(3000.0, 500.0), "graphs-on-mtp1": spec,
        "graphs-on-mtp1-nogate": _bench_record(3000.0, 350.0),
        "graphs-on-mtp1-predictive": _bench_record(3000.0, 800.0)}}))

    def case(conc: int, rate: float, **extra: float) -> dict[str, float]:
        return {"concurrency": conc, "tokens": 256, "tokens_per_s": rate, **extra}

    draft = tmp_path / "draft.json"
    draft.write_text(json.dumps({"device": {}, "prompt": 64, "runs": [
        {"checkpoint": "pred", "drafts": 0, "cases": [case(1, 100.0), case(16, 1000.0)]},
        {"checkpoint": "pred", "drafts": 3, "cases": [case(1, 250.0, acceptance=0.75, tokens_per_draft_step=3.25)]},
        {"checkpoint": "rand", "drafts": 3, "error": "boom"},
    ]}))
    assert gpu_engine.main(["report", "--bench", str(bench), "--draft", str(draft)]) == 0
    out = capsys.readouterr().out
    assert "| graphs-on-mtp1 | decode 64 x 1024 | 500 | 450 | 0.90 | 0.004 |" in out
    assert "| graphs-on-mtp1-nogate | decode 64 x 1024 | 500 | 350 | 0.70 |  |" in out
    assert "| graphs-on-mtp1-predictive | decode 64 x 1024 | 500 | 800 | 1.60 |  |" in out
    assert "| pred | 3 | 1 x 256 | 250 | 2.50 | 0.750 | 3.25 |" in out
    assert "| pred | 0 | 16 x 256 | 1000 | 1.00 |  |  |" in out
    assert "| rand | 3 | failed to run |" in out


def test_report_gives_no_ratio_for_a_case_the_kv_cache_could_not_hold(tmp_path: Path, capsys: Any) -> None:
    """A decode case where fewer requests ran than it asked for (its KV cache too small,
    as for a deep model with a drafter's caches beside it) times other steps: the report
    names how many ran instead of a ratio; a head of several depth blocks is put beside
    the same engine without drafts."""
    short = _bench_record(3000.0, 700.0)
    short["decode"][0]["running_min"] = 42  # type: ignore[index]
    full = _bench_record(3000.0, 500.0)
    full["decode"][0]["running_min"] = 64  # type: ignore[index]
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"device": {}, "cases": {
        "graphs-on-L40": full, "graphs-on-mtp2-h2-L40": short, "graphs-on-mtp1-L40": _bench_record(3000.0, 480.0)}}))
    assert gpu_engine.main(["report", "--bench", str(bench)]) == 0
    out = capsys.readouterr().out
    assert "| graphs-on-mtp2-h2-L40 | decode 64 x 1024 | 500 | 700 | n/a: 42 of 64 running |  |" in out
    assert "| graphs-on-mtp1-L40 | decode 64 x 1024 | 500 | 480 | 0.96 |  |" in out
    assert gpu_engine.kv_bound(short["decode"][0]) and not gpu_engine.kv_bound(full["decode"][0])  # type: ignore[index]


def test_tokens_per_step_adds_the_accepted_drafts_once() -> None:
    """vLLM counts accepted drafts over all requests: 64 requests accepting 32 drafts
    in 16 steps emit 66 tokens a step (not 64 x 1.03)."""
    assert gpu_engine.tokens_per_step(64, 32.0, 16) == 66.0
    assert gpu_engine.tokens_per_step(1, 0.0, 15) == 1.0


@pytest.mark.parametrize(("case", "message"), [
    ("64x1k", "'64x1k' is not REQUESTSxCONTEXT"),
    ("0x1024", "'0x1024': REQUESTS 1-256"),
    ("300x1024", "'300x1024': REQUESTS 1-256"),
    ("32x9000", "CONTEXT 1-8192 (its prompt length)"),
])
def test_bench_refuses_a_decode_case_it_cannot_run(capsys: Any, case: str, message: str) -> None:
    with pytest.raises(SystemExit):
        gpu_engine.main(["bench", "out.json", "--tokenizer", ".", "--decode", case])
    assert message in capsys.readouterr().err


def test_bench_takes_any_decode_case_the_engine_holds() -> None:
    """Cases beyond the default set (a deep model whose KV cache holds fewer requests)."""
    assert gpu_engine._decode_shape("32x1024") == "32x1024"
    assert gpu_engine._decode_shape("0256x04096") == "256x4096"


def test_counters_record_each_compile_by_kernel_name_and_specialisation(monkeypatch: Any) -> None:
    import torch
    from triton import knobs
    from triton.runtime.jit import JitFunctionInfo

    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", torch.cuda.CUDAGraph.replay)
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", None)
    counters = gpu_engine.Counters()
    counters.arm()
    # called as Triton 3.6 calls it after a compile (JITFunction._call_hook)
    signature = "fused_moe_kernel[num_warps=4](a_ptr: ('*bf16', 'D'), EM: ('i32', ''))"
    knobs.runtime.jit_post_compile_hook(key=("k",), repr=signature,
                                        fn=JitFunctionInfo("vllm.fused_moe", "fused_moe_kernel", None),
                                        compile={}, is_manual_warmup=False, already_compiled=False)
    assert counters.compiles == ["vllm.fused_moe.fused_moe_kernel"]
    assert counters.compile_signatures == [signature]


def test_bench_capture_sizes_reach_each_engine_and_vllm_accepts_them(tmp_path: Path, capsys: Any,
                                                                     monkeypatch: Any) -> None:
    """``--capture-sizes`` (a quicker start-up: only the sizes the cases run) goes to
    every engine child and becomes a compilation config vLLM accepts; 0 is refused."""
    from vllm.config import CompilationConfig

    config = CompilationConfig(**gpu_engine.bench_compilation("on", [64, 1, 32, 1]))
    assert config.cudagraph_capture_sizes == [1, 32, 64]
    assert gpu_engine.bench_compilation("on")["cudagraph_capture_sizes"] == gpu_engine.BENCH_CAPTURE_SIZES
    children: list[list[str]] = []
    monkeypatch.setattr(gpu_engine, "_child", lambda argv, *a, **k: (children.append(argv), (None, "stopped"))[1])
    assert gpu_engine.main(["bench", str(tmp_path / "b.json"), "--tokenizer", ".", "--graphs", "on",
                            "--drafts", "0", "1", "--capture-sizes", "1", "32"]) == 0
    assert len(children) == 2
    for argv in children:
        at = argv.index("--capture-sizes")
        assert argv[at + 1:at + 3] == ["1", "32"]
    with pytest.raises(SystemExit):
        gpu_engine.main(["bench", "out.json", "--tokenizer", ".", "--capture-sizes", "0"])
    assert "must be at least 1" in capsys.readouterr().err

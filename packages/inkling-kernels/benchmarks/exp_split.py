# Experiment: a mixed batch whose prompt comes first (an engine that orders prompts
# before decodes) as one mapped fused_sconv launch, or as two launches of the same op on
# row slices: the decode rows first, then the prompt rows. Does the split reach the
# decodes-first single launch (vLLM's order), and what does each part cost alone?
# Cold: CUDA-graph replay over bench_sconv's input sets (not L2-resident); hot: one set
# replayed. The split's out and cache are checked against the single launch first.
# --ncu: no timing; each variant launched once between cudaProfilerStart/Stop for
# `ncu --profile-from-start off` (ncu flushes the caches before each kernel: cold).
# GPU, from the repo root: PYTHONPATH=packages/inkling-kernels/src:packages/inkling-cache/src python3 packages/inkling-kernels/benchmarks/exp_split.py --json $OUT/split.json
"""The prompt-first mixed batch as one launch or two (see the header above)."""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import sys
from typing import Any, Callable

import torch
import triton

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import bench_sconv as bs  # noqa: E402  (the case setup, time_graph and copy_baseline)

from inkling_kernels import SconvBatch, fused_sconv  # noqa: E402


def _slice(s: bs.Inputs, lo: int, hi: int) -> tuple[torch.Tensor, SconvBatch]:
    """Rows ``lo:hi`` of a set as a batch of their own (whole requests only; x-row tap
    codes are absolute rows, so a slice not starting at 0 must hold only cache taps)."""
    codes = s.tap_map[lo:hi]
    if lo > 0 and bool((codes <= -2).any()):
        raise ValueError("a slice past row 0 holds x-row taps: split at a decode-only range")
    batch = SconvBatch(s.positions[lo:hi], s.table, s.seq[lo:hi], s.slots[lo:hi], s.qs[lo:hi] - lo,
                       block_size=bs.N, kernel_size=bs.W).with_tap_map(s.tap_map[lo:hi].contiguous())
    return s.x[lo:hi], batch


CASES = [
    ("prompt 2048 first + 255 decodes", [(0, 2048)] + [(bs._hist(i), 1) for i in range(255)], 2048),
    ("prompt 1024 first + 255 decodes", [(0, 1024)] + [(bs._hist(i), 1) for i in range(255)], 1024),
    ("255 decodes + prompt 2048 (vLLM's order)", [(bs._hist(i), 1) for i in range(255)] + [(0, 2048)], None),
]


def _per_set(label: str) -> int:
    """Launches per input set: two for the split variants, else one."""
    return 2 if label.startswith("split") else 1


def _whole_batch(label: str) -> bool:
    """Whether the variant moves the whole batch (its share of copy is meaningful)."""
    return label == "single" or label.startswith("split")


def run_case(name: str, requests: list[tuple[int, int]], split: int | None, reps: int,
             gen: torch.Generator, ncu: bool) -> dict[str, Any]:
    case = bs.Case(name, bs.ATTN_GLOBAL, requests, 0.0)
    _, _, off, width = case.stream
    nbytes = bs.min_bytes(case)
    num_sets = max(2, min(16, -(-int(256e6) // nbytes)))
    cache, weight, sets = bs.build(case, num_sets, gen)

    def single(s: bs.Inputs) -> Callable[[], Any]:
        return lambda: fused_sconv(s.x, weight, cache, s.mapped, off, width)

    # label -> the launches over every input set
    variants: dict[str, list[Callable[[], Any]]] = {"single": [single(s) for s in sets]}
    if split is not None:
        t = sets[0].x.shape[0]
        parts = [(_slice(s, split, t), _slice(s, 0, split)) for s in sets]

        def run(xb: tuple[torch.Tensor, SconvBatch]) -> Callable[[], Any]:
            return lambda: fused_sconv(xb[0], weight, cache, xb[1], off, width)

        variants["split: decodes, then prompt"] = [f for d, p in parts for f in (run(d), run(p))]
        variants["split: prompt, then decodes"] = [f for d, p in parts for f in (run(p), run(d))]
        variants["decode part alone"] = [run(d) for d, _ in parts]
        variants["prompt part alone"] = [run(p) for _, p in parts]
        # the split gives the single launch's out and cache, bit for bit
        s = sets[0]
        ref_cache = cache.clone()
        want = fused_sconv(s.x, weight, ref_cache, s.mapped, off, width)
        got_cache = cache.clone()
        d, p = parts[0]
        got = torch.cat([fused_sconv(p[0], weight, got_cache, p[1], off, width),
                         fused_sconv(d[0], weight, got_cache, d[1], off, width)])
        torch.cuda.synchronize()
        if not (torch.equal(got, want) and torch.equal(got_cache, ref_cache)):
            raise AssertionError(f"{name}: the split differs from the single launch")
    res: dict[str, Any] = dict(case=name, T=sets[0].x.shape[0], bytes=nbytes, sets=num_sets, split=split)
    if ncu:
        for fs in variants.values():  # compile and warm up outside the profiled range
            for f in fs:
                f()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        for label, fs in variants.items():
            torch.cuda.nvtx.range_push(label)
            for f in fs[:_per_set(label)]:
                f()
            torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        return res
    for label, fs in variants.items():
        per_set = _per_set(label)
        cold = bs.time_graph(fs, reps) * per_set  # µs per set
        hot = bs.time_graph(fs[:per_set] * 16, reps) * per_set
        res[label] = dict(cold_us=cold, hot_us=hot)
        print(f"{name:45s} {label:30s} cold {cold:7.2f} µs  hot {hot:7.2f} µs", flush=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", type=pathlib.Path, default=None)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--ncu", action="store_true", help="launch each variant once for ncu; no timing")
    args = ap.parse_args()
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    out: dict[str, Any] = dict(
        device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        command=" ".join(sys.argv),
    )
    if not args.ncu:
        out["copy_baseline"] = bs.copy_baseline()
        copy = out["copy_baseline"]["GBps"]
        print(f"copy baseline {copy:.0f} GB/s", flush=True)
    out["cases"] = [run_case(n, r, s, args.reps, gen, args.ncu) for n, r, s in CASES]
    if not args.ncu:
        for r in out["cases"]:
            whole = {label: v for label, v in r.items() if isinstance(v, dict) and _whole_batch(label)}
            for v in whole.values():
                v["of_copy_cold"] = r["bytes"] / (v["cold_us"] * 1e-6) / 1e9 / copy
                v["of_copy_hot"] = r["bytes"] / (v["hot_us"] * 1e-6) / 1e9 / copy
            print(r["case"], {label: round(v["of_copy_cold"], 3) for label, v in whole.items()})
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

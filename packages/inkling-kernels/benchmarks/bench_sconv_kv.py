"""Benchmark fused_sconv_kv (the K and V convs in one launch, on the column slices of
the QKV projection output) against what the model did before: two ``.contiguous()``
copies and two fused_sconv launches; on the Inkling 975B attention shapes (H200).

Per case (T tokens, one layer's packed cache): CUDA-graph replay medians per step
(bench_sconv.time_graph: several input sets per graph, so the working set exceeds
L2), with the step's tap map (the model path on CUDA) and without one:

- ``kv``: ``fused_sconv_kv(k, v, ...)`` on the slices of ``qkv`` (one launch);
- ``two + copies``: ``fused_sconv(k.contiguous(), ...)``, the same for v (the old path);
- ``two``: the two launches on already-contiguous k and v (launch cost alone);
- with ``--rows``, mapped only, where the channels are a multiple of 256: ``kv rows``,
  ``fused_sconv_kv`` with ``SconvConfig(rows=True)`` forced (the row-register kernel, K
  and V in one launch; the default of prefill-sized mapped launches, where ``kv`` is the
  same launch), checked against ``two + copies`` before it is timed.

Shapes (KV heads of 128 per rank, q = 64 query heads of 128 per model): global layers
8 KV heads (D 2048), sliding 16 (D 1024), at TP1 and TP8.

    PYTHONPATH=packages/inkling-kernels/src python3 packages/inkling-kernels/benchmarks/bench_sconv_kv.py \
        --json kv.json --md kv.md
    ... --dry-run     # no GPU: build every case on the CPU (one set) and check kv == two
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import pathlib
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_sconv import DTYPE, N, W, Case, Inputs, _hist, build, time_graph  # noqa: E402

from inkling_kernels import fused_sconv, fused_sconv_kv  # noqa: E402
from inkling_kernels.sconv.kernel import SconvConfig  # noqa: E402
from inkling_kernels.sconv_kv.kernel import fused_sconv_kv_triton  # noqa: E402

ROWS = SconvConfig(block_t=8, block_c=256, num_warps=2, rows=True)

HEAD_DIM = 128
Q_HEADS = 64


@dataclass(frozen=True)
class Shape:
    name: str
    kv_heads: int  # per rank
    head_size: int  # D of the packed cache
    q_heads: int  # per rank


SHAPES = [
    Shape("global tp1", 8, 2048, Q_HEADS),
    Shape("sliding tp1", 16, 1024, Q_HEADS),
    Shape("global tp8", 1, 2048, Q_HEADS // 8),
    Shape("sliding tp8", 2, 1024, Q_HEADS // 8),
]

STEPS: list[tuple[str, list[tuple[int, int]]]] = [
    ("decode 1", [(_hist(0), 1)]),
    ("decode 64", [(_hist(i), 1) for i in range(64)]),
    ("decode 256", [(_hist(i), 1) for i in range(256)]),
    ("spec 64x4", [(_hist(i), 4) for i in range(64)]),
    ("prefill 8192", [(0, 8192)]),
    ("mixed 2048+255", [(0, 2048)] + [(_hist(i), 1) for i in range(255)]),
]


@dataclass
class KVSet:
    inputs: Inputs
    qkv: torch.Tensor  # [T, q + 2 C]
    k_dense: torch.Tensor  # contiguous copies (the "two" timing)
    v_dense: torch.Tensor

    def slices(self, shape: Shape) -> tuple[torch.Tensor, torch.Tensor]:
        q, c = shape.q_heads * HEAD_DIM, shape.kv_heads * HEAD_DIM
        _, k, v = self.qkv.split([q, c, c], dim=-1)
        return k, v


def min_bytes(shape: Shape, requests: list[tuple[int, int]]) -> int:
    """Both streams: read x, write the slot and out, the weights and pre-forward taps."""
    c = shape.kv_heads * HEAD_DIM
    t = sum(n for _, n in requests)
    taps = sum(min(W - 1, hist) for hist, _ in requests)
    return 2 * (3 * t * c * DTYPE.itemsize + c * W * 4 + taps * c * DTYPE.itemsize)


def setup(shape: Shape, requests: list[tuple[int, int]], num_sets: int, gen: torch.Generator,
          device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[KVSet]]:
    """One layer's cache, the K and V weights and ``num_sets`` steps of inputs."""
    case = Case("kv", (shape.kv_heads, shape.head_size, 0, HEAD_DIM), requests, float("nan"))
    cache, k_weight, sets = build(case, num_sets, gen, device)
    v_weight = torch.randn_like(k_weight) * 0.5
    c, q = shape.kv_heads * HEAD_DIM, shape.q_heads * HEAD_DIM
    out = []
    for s in sets:
        t = s.x.shape[0]
        qkv = torch.randn(t, q + 2 * c, device=device, dtype=DTYPE)
        kv = KVSet(s, qkv, torch.empty(0), torch.empty(0))
        k, v = kv.slices(shape)
        kv.k_dense, kv.v_dense = k.contiguous(), v.contiguous()
        out.append(kv)
    return cache, k_weight, v_weight, out


def launches(shape: Shape, cache: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor, sets: list[KVSet],
             mapped: bool, rows: bool = False) -> dict[str, list[Callable[[], Any]]]:
    def batch(s: KVSet) -> Any:
        return s.inputs.mapped if mapped else s.inputs.batch

    def kv(s: KVSet) -> Any:
        k, v = s.slices(shape)
        return fused_sconv_kv(k, v, wk, wv, cache, batch(s), 0, HEAD_DIM, HEAD_DIM)

    def two_copies(s: KVSet) -> Any:
        k, v = s.slices(shape)
        return (fused_sconv(k.contiguous(), wk, cache, batch(s), 0, HEAD_DIM),
                fused_sconv(v.contiguous(), wv, cache, batch(s), HEAD_DIM, HEAD_DIM))

    def two(s: KVSet) -> Any:
        return (fused_sconv(s.k_dense, wk, cache, batch(s), 0, HEAD_DIM),
                fused_sconv(s.v_dense, wv, cache, batch(s), HEAD_DIM, HEAD_DIM))

    def kv_rows(s: KVSet) -> Any:
        k, v = s.slices(shape)
        return fused_sconv_kv_triton(k, v, wk, wv, cache, batch(s), 0, HEAD_DIM, HEAD_DIM, config=ROWS)

    fns = [("kv", kv), ("two + copies", two_copies), ("two", two)]
    if rows and mapped and shape.kv_heads * HEAD_DIM % ROWS.block_c == 0:
        fns.append(("kv rows", kv_rows))
    return {name: [lambda s=s, f=f: f(s) for s in sets] for name, f in fns}


def spot_check(shape: Shape, cache: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor, s: KVSet) -> float:
    """Max |kv - two| over both outputs (on copies of the cache); the caches must match."""
    c1, c2 = cache.clone(), cache.clone()
    got = launches(shape, c1, wk, wv, [s], mapped=True)["kv"][0]()
    want = launches(shape, c2, wk, wv, [s], mapped=True)["two + copies"][0]()
    if not torch.equal(c1, c2):
        raise AssertionError(f"{shape.name}: the caches differ between kv and two launches")
    return max(float((a.float() - b.float()).abs().max()) for a, b in zip(got, want))


def bench(shape: Shape, step: str, requests: list[tuple[int, int]], reps: int, gen: torch.Generator,
          rows: bool = False) -> dict[str, Any]:
    nbytes = min_bytes(shape, requests)
    num_sets = max(2, min(16, math.ceil(256e6 / nbytes)))
    cache, wk, wv, sets = setup(shape, requests, num_sets, gen, "cuda")
    res: dict[str, Any] = dict(shape=shape.name, step=step, T=sets[0].qkv.shape[0], C=shape.kv_heads * HEAD_DIM,
                               bytes=nbytes, sets=num_sets)
    if rows and "kv rows" in launches(shape, cache, wk, wv, sets[:1], True, rows):
        c1, c2 = cache.clone(), cache.clone()
        got = launches(shape, c1, wk, wv, sets[:1], True, rows)["kv rows"][0]()
        want = launches(shape, c2, wk, wv, sets[:1], True)["two + copies"][0]()
        if not torch.equal(c1, c2):
            raise AssertionError(f"{shape.name} {step}: kv rows wrote another cache than two launches")
        res["max_abs_kv_rows_vs_two"] = max(float((a.float() - b.float()).abs().max()) for a, b in zip(got, want))
        if res["max_abs_kv_rows_vs_two"] > 1.6e-2 * 8:  # (bf16 outputs of |x| up to ~8)
            raise AssertionError(f"{shape.name} {step}: kv rows differs from two launches by "
                                 f"{res['max_abs_kv_rows_vs_two']}")
        del c1, c2
    for mapped in (True, False):
        for name, fns in launches(shape, cache, wk, wv, sets, mapped, rows).items():
            res[f"{name}{'' if mapped else ', no map'} us"] = time_graph(fns, reps)
    res["max_abs_kv_vs_two"] = spot_check(shape, cache, wk, wv, sets[0])
    del cache, sets
    torch.cuda.empty_cache()
    return res


def dry_run(gen: torch.Generator) -> None:
    """CPU: build every case (one set, the CPU reference path) and check kv == two."""
    for shape in SHAPES:
        for step, requests in STEPS:
            cache, wk, wv, sets = setup(shape, requests, 1, gen, "cpu")
            k, v = sets[0].slices(shape)
            assert k.stride() == (sets[0].qkv.shape[1], 1)  # a slice of qkv, not a copy
            err = spot_check(shape, cache, wk, wv, sets[0])
            print(f"{shape.name:12s} {step:16s} T={k.shape[0]:5d} C={k.shape[1]:5d} D={cache.shape[-1]} "
                  f"max|kv-two|={err:.3g}", flush=True)
            assert err == 0.0


def markdown(results: list[dict[str, Any]]) -> str:
    cols = ["kv us", "two + copies us", "two us", "kv, no map us", "two + copies, no map us", "two, no map us"]
    lines = ["| shape | step | T | C | " + " | ".join(c.replace(" us", " µs") for c in cols)
             + " | (two + copies) / kv | two / kv | max abs kv vs two |",
             "|" + "---|" * (len(cols) + 7)]
    for r in results:
        lines.append(f"| {r['shape']} | {r['step']} | {r['T']} | {r['C']} | "
                     + " | ".join(f"{r[c]:.2f}" for c in cols)
                     + f" | {r['two + copies us'] / r['kv us']:.2f}x | {r['two us'] / r['kv us']:.2f}x"
                     + f" | {r['max_abs_kv_vs_two']:.3g} |")
    rows = [r for r in results if "kv rows us" in r]
    if rows:
        lines += ["", "| shape | step | T | kv µs | kv rows µs | kv / kv rows | max abs kv rows vs two |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['shape']} | {r['step']} | {r['T']} | {r['kv us']:.2f} | {r['kv rows us']:.2f} | "
                  f"{r['kv us'] / r['kv rows us']:.2f}x | {r['max_abs_kv_rows_vs_two']:.3g} |" for r in rows]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=pathlib.Path, default=None)
    ap.add_argument("--md", type=pathlib.Path, default=None)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--only", default=None, help="substring filter on 'shape step'")
    ap.add_argument("--dry-run", action="store_true", help="CPU: build the cases and check kv == two launches")
    ap.add_argument("--rows", action="store_true", help="also time kv on the row-register kernel (mapped, checked first)")
    args = ap.parse_args()
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    if args.dry_run:
        dry_run(gen)
        return 0
    results = []
    for shape in SHAPES:
        for step, requests in STEPS:
            if args.only and args.only not in f"{shape.name} {step}":
                continue
            r = bench(shape, step, requests, args.reps, gen, args.rows)
            results.append(r)
            print(json.dumps(r), flush=True)
    md = markdown(results)
    import triton

    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                command=" ".join(sys.argv),
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), N=N, W=W)
    if args.json:
        args.json.write_text(json.dumps(dict(meta, cases=results), indent=1))
    if args.md:
        args.md.write_text(md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())

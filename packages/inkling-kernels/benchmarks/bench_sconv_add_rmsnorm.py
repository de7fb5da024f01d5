"""Benchmark (and GPU check) of fused_sconv_add_rmsnorm at the Inkling 975B shapes.

Compares, by CUDA-graph replay (median of replays, each replay running the op
``--iters`` times), the fused op with the unfused sequences it replaces:

* ``unfused eager``: ``fused_sconv`` + ``hidden + s`` + transformers' RMSNorm written
  in torch ops (what a model without the fusion runs);
* ``unfused F.rms_norm``: ``fused_sconv`` + add + ``torch.nn.functional.rms_norm``;
* ``unfused compiled``: ``fused_sconv`` + one torch.compile'd (inductor) add+RMSNorm
  kernel: the best unfused composition (``--no-compile`` skips it).

Shapes: hidden 6144 on the global-layer layout of the 975B config at tp 1 (8 KV
heads, ATTN stream width 768 in D 2048), bf16, W = N = 4. Bytes counted for GB/s are
the fused op's minimum: read hidden and d, write new_hidden, normed and the slots,
read pre-forward taps and the weights. The device's copy bandwidth is measured in
the same run.

Before timing, ``--check`` compares the compiled kernel with the fp32 reference on
the same shapes (and on the same-step prefix-hit case in both batch orders, many
launches each, and under graph replay with the metadata changing between replays).

Run (GPU machine, from the repository root):

    PYTHONPATH=packages/inkling-cache/src:packages/inkling-kernels/src \\
        python3 packages/inkling-kernels/benchmarks/bench_sconv_add_rmsnorm.py --check --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
import traceback
from dataclasses import dataclass

if "--dry-run" in sys.argv:  # CPU, Triton interpreter, tiny shapes: exercises the script
    os.environ["TRITON_INTERPRET"] = "1"

import torch
import triton

from inkling_cache import ConvStateLayout, Stream
from inkling_kernels import SconvBatch, fused_sconv, prefill_token_count
from inkling_kernels.sconv_add_rmsnorm import (
    fused_sconv_add_rmsnorm,
    fused_sconv_add_rmsnorm_ref,
)
from inkling_kernels.sconv_add_rmsnorm.kernel import NormConfig, choose_norm_config, sconv_add_rmsnorm_triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_sconv import events_copy_rates  # noqa: E402  (the copy baseline's timer)

DRY = "--dry-run" in sys.argv
OLD = None  # --old-kernel's module
try:  # vLLM's fused add + RMSNorm kernel, where vLLM is installed
    if DRY:
        raise ImportError
    from vllm._custom_ops import fused_add_rms_norm as VLLM_ADD_NORM
except Exception:
    VLLM_ADD_NORM = None
DEVICE = "cpu" if DRY else "cuda"
HIDDEN = 64 if DRY else 6144
HEAD_DIM = 8 if DRY else 128
EPS = 1e-5
# Same-step hazard case: A computes HAZ_PROMPT tokens, B hits HAZ_HIT of them.
HAZ_PROMPT, HAZ_HIT, HAZ_LAUNCHES = (24, 12, 3) if DRY else (1024, 512, 200)


@dataclass
class Case:
    name: str
    requests: list[tuple[int, int]]  # (history, new tokens) in batch order


DRY_CASES = [
    Case("decode 1 req", [(30, 1)]),
    Case("decode 4 reqs", [(3 + 5 * i, 1) for i in range(4)]),
    Case("prefill 20", [(0, 20)]),
    Case("chunked 9 after 14", [(14, 9)]),
    Case("mixed 10 prefill + 3 decodes", [(0, 10)] + [(2 + 7 * i, 1) for i in range(3)]),
]

CASES = DRY_CASES if DRY else [
    Case("decode 1 req", [(1000, 1)]),
    Case("decode 64 reqs", [(200 + 37 * i, 1) for i in range(64)]),
    Case("decode 256 reqs", [(200 + 13 * i, 1) for i in range(256)]),
    Case("spec verify 64 x 4", [(300 + 29 * i, 4) for i in range(64)]),
    Case("prefill 8192", [(0, 8192)]),
    Case("chunked 8192 after 8190", [(8190, 8192)]),
    Case("mixed 2048 prefill + 255 decodes", [(0, 2048)] + [(100 + 17 * i, 1) for i in range(255)]),
]


@dataclass
class Problem:
    hidden: torch.Tensor
    d: torch.Tensor
    weight: torch.Tensor
    cache: torch.Tensor
    positions: torch.Tensor
    block_table: torch.Tensor
    seq_idx: torch.Tensor
    slot_mapping: torch.Tensor
    query_start: torch.Tensor
    offset: int
    width: int
    block_size: int
    norm_weight: torch.Tensor
    pre_taps: int
    prefill: int | None = None  # the batch's prompt-row hint (SconvBatch.num_prefill_tokens)

    def batch(self, tap_map: torch.Tensor | None = None) -> SconvBatch:
        return SconvBatch(self.positions, self.block_table, self.seq_idx, self.slot_mapping, self.query_start,
                          self.block_size, kernel_size=self.weight.shape[-1], tap_map=tap_map,
                          num_prefill_tokens=self.prefill)

    def args(self, tap_map: torch.Tensor | None = None) -> tuple:
        return (self.hidden, self.d, self.weight, self.cache, self.batch(tap_map), self.offset, self.width,
                self.norm_weight, EPS)

    def sconv_args(self, tap_map: torch.Tensor | None = None) -> tuple:
        return (self.d, self.weight, self.cache, self.batch(tap_map), self.offset, self.width)


def build(requests: list[tuple[int, int]], layout: ConvStateLayout, dtype: torch.dtype, seed: int,
          *, shared: dict[int, int] | None = None) -> Problem:
    """Random physical blocks for each request's live window (older entries: null
    block 0). ``shared`` maps request -> request whose blocks it reuses (prefix hit)."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    n, width = layout.block_size, layout.kernel_size
    offset, ws = layout.stream_range(Stream.ATTN)
    spans = []
    for hist, new in requests:
        first = max(0, hist - (width - 1)) // n
        last = (hist + new - 1) // n
        spans.append((first, last))
    num_blocks = 1 + sum(last - first + 1 for first, last in spans)
    physical = list(range(1, num_blocks))
    rng.shuffle(physical)
    max_blocks = max(last for _, last in spans) + 1
    table = torch.zeros(len(requests), max_blocks, dtype=torch.int32)
    for r, (first, last) in enumerate(spans):
        for b in range(first, last + 1):
            table[r, b] = physical.pop()
    for r, src in (shared or {}).items():
        hist = requests[r][0]
        table[r, : hist // n] = table[src, : hist // n]
    pos, seq, qs, slots = [], [], [], []
    pre_taps = 0
    for r, (hist, new) in enumerate(requests):
        start = len(pos)
        pre_taps += min(hist, width - 1)
        for p in range(hist, hist + new):
            pos.append(p)
            seq.append(r)
            qs.append(start)
            slots.append(int(table[r, p // n]) * n + p % n)
    t = len(pos)
    dev = DEVICE
    cache = torch.randn(num_blocks, layout.num_heads, n, layout.head_size, generator=gen).to(dtype)
    return Problem(
        hidden=torch.randn(t, HIDDEN, generator=gen).to(dtype).to(dev),
        d=torch.randn(t, HIDDEN, generator=gen).to(dtype).to(dev),
        # channel-contiguous, as InklingShortConvAddRMSNorm keeps it (vector loads)
        weight=(0.5 * torch.randn(width, HIDDEN, generator=gen)).to(dev).t().unsqueeze(1),
        cache=cache.to(dev),
        positions=torch.tensor(pos, dtype=torch.int64, device=dev),
        block_table=table.to(dev),
        seq_idx=torch.tensor(seq, dtype=torch.int32, device=dev),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
        query_start=torch.tensor(qs, dtype=torch.int32, device=dev),
        offset=offset,
        width=ws,
        block_size=n,
        norm_weight=(1 + 0.2 * torch.randn(HIDDEN, generator=gen)).to(dtype).to(dev),
        pre_taps=pre_taps,
        prefill=prefill_token_count(new for _, new in requests),
    )


def min_bytes(p: Problem) -> int:
    el = p.d.element_size()
    t, c = p.d.shape
    return (5 * t * c + p.pre_taps * c) * el + p.weight.numel() * 4 + c * el


def reference(p: Problem) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    cache = p.cache.clone()
    args = list(p.args())
    args[3] = cache
    out = fused_sconv_add_rmsnorm_ref(*args)
    return out[0], out[1], cache


def graph_time_us(fn, iters: int, replays: int) -> float:
    """Median time of one ``fn()`` over graph replays; each replay runs ``fn`` enough
    times (>= ``iters``) to last about 1.5 ms, so the device stays busy."""
    if DRY:  # no graphs on the CPU: one wall-clock call
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6
    first = _graph_time_us(fn, 5, 3)
    iters = max(iters, min(2000, int(1500.0 / max(first, 0.5))))
    return _graph_time_us(fn, iters, replays)


def _graph_time_us(fn, iters: int, replays: int) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    # captured on the warm-up stream: the split path's scratch is made per stream
    with torch.cuda.graph(graph, stream=side):
        for _ in range(iters):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / iters)
    del graph
    return statistics.median(times)


def copy_bandwidth_gbs() -> float:
    """Device copy rate, GB/s counting bytes read + written: CUDA events around a
    plain loop of ``b.copy_(a)`` calls (``bench_sconv.events_copy_rates``) (no graph) over 1 and 2 GiB bf16
    tensors, median of COPY_LOOPS loops per size, the larger of the two medians (the
    method of bench_sconv.py since issue 14; a graph-timed copy reads ~2.7 TB/s)."""
    if DRY:
        return 1.0
    best = 0.0
    for nbytes in (1 << 30, 2 << 30):
        a = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=DEVICE)
        a.view(torch.uint8).random_(0, 255)
        b = torch.empty_like(a)
        best = max(best, statistics.median(events_copy_rates(a, b)))
        del a, b
    torch.cuda.empty_cache()
    return best


def ulp_stats(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
    """(fraction bit-exact, max |diff| in units of the dtype's epsilon times
    ``|want| + mean|want|``: about one rounding step; the mean keeps elements that
    cancel to near zero from inflating it)."""
    exact = (got == want).float().mean().item()
    w = want.float()
    unit = torch.finfo(want.dtype).eps * (w.abs() + w.abs().mean())
    return exact, ((got.float() - w).abs() / unit).max().item()


def tap_map_of(p: "Problem") -> torch.Tensor:
    """The step's tap map of p's metadata (what the model's builder passes along)."""
    from inkling_kernels import sconv_tap_map

    kernel_size = p.weight.shape[-1]
    out = torch.empty(p.d.shape[0], kernel_size - 1, dtype=torch.int64, device=p.d.device)
    sconv_tap_map(p.batch(), out)
    return out


def check(layout: ConvStateLayout, dtype: torch.dtype, report: dict) -> bool:
    ok_all = True
    rows = []
    for i, case in enumerate(CASES):
        p = build(case.requests, layout, dtype, seed=100 + i)
        want_h, want_n, want_cache = reference(p)
        tap_map = tap_map_of(p)
        variants = [(None, False), (NormConfig(4, 8, 256, 8), False), (None, True),
                    (NormConfig(1, 2, 256, 4, split=12), True), (NormConfig(1, 8, 256, 8), True)]
        if DRY:
            variants = [(None, False), (None, True), (NormConfig(1, 1, 8, 1, split=3), True)]
        for cfg, mapped in variants:
            args = list(p.args(tap_map if mapped else None))
            args[3] = p.cache.clone()
            poison = (torch.full_like(p.d, float("nan")), torch.full_like(p.d, float("nan")))
            got_h, got_n = sconv_add_rmsnorm_triton(*args, config=cfg, outputs=poison)
            eh, uh = ulp_stats(got_h, want_h)
            en, un = ulp_stats(got_n, want_n)
            cache_ok = torch.equal(args[3], want_cache)
            nan = bool(torch.isnan(got_h).any() or torch.isnan(got_n).any())
            good = cache_ok and not nan and uh <= 2.01 and un <= 4.01
            ok_all &= good
            rows.append(dict(case=case.name, config=str(cfg), tap_map=mapped, exact_h=eh, max_ulp_h=uh,
                             exact_n=en, max_ulp_n=un, cache_exact=cache_ok, nan=nan, ok=good))
            print(f"check {case.name:34s} {str(cfg) + (' +map' if mapped else ''):48s} new_h exact {eh:.4f} max {uh:.1f} ulp | "
                  f"normed exact {en:.4f} max {un:.1f} ulp | cache exact {cache_ok} | {'OK' if good else 'FAIL'}")
    report["check_cases"] = rows

    # Same-step prefix hit: A computes a 1024-token prompt, B (same prompt, 512-token
    # hit on A's blocks) reads A's in-flight slots; NaN there before every launch.
    hazard = {}
    for b_first, mapped in ((True, False), (False, False), (True, True), (False, True)):
        reqs = ([(HAZ_HIT, HAZ_PROMPT - HAZ_HIT), (0, HAZ_PROMPT)] if b_first
                else [(0, HAZ_PROMPT), (HAZ_HIT, HAZ_PROMPT - HAZ_HIT)])
        a, b = (1, 0) if b_first else (0, 1)
        p = build(reqs, layout, dtype, seed=7, shared={b: a})
        n = p.block_size
        a_rows = slice(HAZ_HIT, HAZ_HIT + HAZ_PROMPT) if b_first else slice(0, HAZ_PROMPT)
        b_rows = slice(0, HAZ_HIT) if b_first else slice(HAZ_PROMPT, HAZ_PROMPT + HAZ_HIT)
        p.d[b_rows] = p.d[a_rows][HAZ_HIT:]
        p.hidden[b_rows] = p.hidden[a_rows][HAZ_HIT:]
        # The block holding positions HAZ_HIT-N .. HAZ_HIT-1: B's pre-forward taps.
        last = HAZ_HIT // n - 1
        shared_blocks = p.block_table[a, last : last + 1].long()
        tap_map = tap_map_of(p) if mapped else None
        stale = 0
        for _ in range(HAZ_LAUNCHES):
            p.cache[shared_blocks] = float("nan")
            _, normed = fused_sconv_add_rmsnorm(*p.args(tap_map))
            stale += int(torch.isnan(normed).any().item())
        _, normed = fused_sconv_add_rmsnorm(*p.args(tap_map))
        same = torch.equal(normed[b_rows], normed[a_rows][HAZ_HIT:])
        key = ("B first" if b_first else "A first") + (", map" if mapped else "")
        hazard[key] = dict(launches=HAZ_LAUNCHES, stale=stale, b_equals_a=same)
        ok_all &= stale == 0 and same
        print(f"hazard {key}: stale taps in {stale}/{HAZ_LAUNCHES} launches; B rows == A rows: {same}")
    report["hazard"] = hazard

    if DRY:
        return ok_all
    try:
        graph_ok = check_graph_replay(layout, dtype)
    except Exception:
        traceback.print_exc()
        graph_ok = False
    report["graph_replay_ok"] = graph_ok
    return ok_all and graph_ok


def check_graph_replay(layout: ConvStateLayout, dtype: torch.dtype) -> bool:
    """Graph replay with the metadata (and inputs) changing between replays (same T)."""
    reqs_sets = [[(40 + 9 * i, 1) for i in range(64)], [(0, 40)] + [(7 * i, 1) for i in range(24)],
                 [(100, 16)] * 4]
    probs = [build(r, layout, dtype, seed=50 + k) for k, r in enumerate(reqs_sets)]
    t = probs[0].d.shape[0]
    assert all(q.d.shape[0] == t for q in probs)
    num_blocks = max(q.cache.shape[0] for q in probs)
    max_blocks = max(q.block_table.shape[1] for q in probs)
    buf = build(reqs_sets[0], layout, dtype, seed=50)
    buf.cache = torch.zeros(num_blocks, *buf.cache.shape[1:], dtype=dtype, device="cuda")
    buf.block_table = torch.zeros(64, max_blocks, dtype=torch.int32, device="cuda")
    outs = {}

    def step():
        outs["o"] = fused_sconv_add_rmsnorm(*buf.args())

    graph_ok = True
    g = torch.cuda.CUDAGraph()
    step()
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        step()
    for q in probs:
        for name in ("hidden", "d", "weight", "norm_weight", "positions", "seq_idx", "slot_mapping",
                     "query_start"):
            getattr(buf, name).copy_(getattr(q, name))
        buf.block_table.zero_()
        buf.block_table[: q.block_table.shape[0], : q.block_table.shape[1]] = q.block_table
        buf.cache.zero_()
        buf.cache[: q.cache.shape[0]] = q.cache
        want_h, want_n, _ = reference(q)
        g.replay()
        torch.cuda.synchronize()
        uh, un = ulp_stats(outs["o"][0], want_h)[1], ulp_stats(outs["o"][1], want_n)[1]
        graph_ok &= uh <= 2.01 and un <= 4.01
    print(f"graph replay with changing metadata: {'OK' if graph_ok else 'FAIL'}")
    return graph_ok


def unfused_eager(p: Problem):
    s = fused_sconv(*p.sconv_args())
    new_h = p.hidden + s
    x = new_h.float()
    y = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)).to(new_h.dtype)
    return new_h, p.norm_weight * y


def unfused_frms(p: Problem, tap_map: torch.Tensor | None = None):
    s = fused_sconv(*p.sconv_args(tap_map))
    new_h = p.hidden + s
    return new_h, torch.nn.functional.rms_norm(new_h, (new_h.shape[-1],), p.norm_weight, EPS)


def _add_norm(hidden: torch.Tensor, s: torch.Tensor, w: torch.Tensor):
    new_h = hidden + s
    x = new_h.float()
    y = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)).to(new_h.dtype)
    return new_h, w * y


# Swept with the tap map (what the model passes). Small batches: split rows; all
# sizes: whole rows in registers, several rows a program.
SWEEP_SMALL = [NormConfig(1, 1, 8, 1, split=4), NormConfig(1, 2, 8, 2, split=2)] if DRY else [
    NormConfig(1, 1, 256, 2, split=24), NormConfig(1, 2, 256, 4, split=12), NormConfig(1, 2, 256, 4, split=6),
    NormConfig(1, 4, 256, 4, split=6), NormConfig(1, 2, 256, 4, split=4), NormConfig(1, 4, 256, 8, split=3),
    NormConfig(1, 2, 256, 4, split=2),
]
SWEEP = [NormConfig(1, 8, 8, 2), NormConfig(2, 2, 8, 1)] if DRY else [
    NormConfig(1, 8, 256, 4), NormConfig(1, 8, 256, 8), NormConfig(1, 4, 256, 4), NormConfig(1, 4, 256, 2),
    NormConfig(2, 8, 256, 8), NormConfig(2, 4, 256, 4), NormConfig(4, 8, 256, 8), NormConfig(4, 8, 256, 16),
    NormConfig(4, 4, 256, 8),
]


def bench(layout: ConvStateLayout, dtype: torch.dtype, args, report: dict) -> None:
    if not DRY:  # bring the clocks up before measuring
        a = torch.randn(8192, 8192, device=DEVICE, dtype=torch.bfloat16)
        t0 = time.time()
        while time.time() - t0 < 1.0:
            a @ a
        torch.cuda.synchronize()
    copy_gbs = copy_bandwidth_gbs()
    report["copy_gbs"] = copy_gbs
    print(f"device copy bandwidth (read + write): {copy_gbs:.0f} GB/s")
    compiled = None
    if not args.no_compile and not DRY:
        try:
            compiled = torch.compile(_add_norm, dynamic=True)
        except Exception:  # pragma: no cover - reported, not fatal
            traceback.print_exc()
    rows = []
    report["bench"] = rows
    for i, case in enumerate(CASES):
        try:
            rows.append(bench_case(i, case, layout, dtype, args, copy_gbs, compiled))
        except Exception:
            traceback.print_exc()
        if args.json:  # keep what is done if the run is cut short
            with open(args.json, "w") as fh:
                json.dump(report, fh, indent=1)
    report["copy_gbs_end"] = copy_bandwidth_gbs()
    print(f"device copy bandwidth at the end: {report['copy_gbs_end']:.0f} GB/s")


def bench_case(i, case, layout, dtype, args, copy_gbs, compiled) -> dict:
    if True:
        p = build(case.requests, layout, dtype, seed=200 + i)
        t = p.d.shape[0]
        nbytes = min_bytes(p)
        row = dict(case=case.name, T=t, C=HIDDEN, min_bytes=nbytes)
        heur = choose_norm_config(t, layout.num_heads, p.width)
        row["heuristic"] = str(heur)
        tap_map = tap_map_of(p)
        row["fused_us"] = graph_time_us(lambda: fused_sconv_add_rmsnorm(*p.args()), args.iters, args.replays)
        if OLD is not None:  # the kernel of the tree named by --old-kernel, same run
            row["old_us"] = graph_time_us(lambda: OLD.sconv_add_rmsnorm_triton(*p.args()), args.iters, args.replays)
            row["old_map_us"] = graph_time_us(
                lambda: OLD.sconv_add_rmsnorm_triton(*p.args(tap_map)), args.iters, args.replays)
        if OLD is not None and args.rounds > 1:
            # new and old alternating, `rounds` times, with and without the map; each
            # value is the median of its rounds (the single timings above are replaced)
            pair = {
                "fused_map_us": lambda: fused_sconv_add_rmsnorm(*p.args(tap_map)),
                "old_map_us": lambda: OLD.sconv_add_rmsnorm_triton(*p.args(tap_map)),
                "fused_us": lambda: fused_sconv_add_rmsnorm(*p.args()),
                "old_us": lambda: OLD.sconv_add_rmsnorm_triton(*p.args()),
            }
            got: dict[str, list[float]] = {k: [] for k in pair}
            for _ in range(args.rounds):
                for key, fn in pair.items():
                    got[key].append(graph_time_us(fn, args.iters, args.replays))
            for key, vals in got.items():
                row[key] = statistics.median(vals)
                row[key.replace("_us", "_rounds_us")] = vals
            row["new_over_old_map"] = row["fused_map_us"] / row["old_map_us"]
            row["new_over_old_nomap"] = row["fused_us"] / row["old_us"]
        sweep = {}
        configs = (SWEEP_SMALL if t <= 512 else []) + SWEEP
        for cfg in configs if args.sweep else []:
            try:
                sweep[str(cfg)] = graph_time_us(
                    lambda cfg=cfg: sconv_add_rmsnorm_triton(*p.args(tap_map), config=cfg), args.iters, args.replays)
            except Exception as exc:  # e.g. out of resources for a config
                sweep[str(cfg)] = f"error: {type(exc).__name__}"

        row["sweep_us"] = sweep
        numeric = {k: v for k, v in sweep.items() if isinstance(v, float)}
        if numeric:
            best = min(numeric, key=numeric.get)
            row["best_config"], row["best_us"] = best, numeric[best]
        if args.no_unfused:  # new vs old only
            if "fused_map_us" not in row:
                row["fused_map_us"] = graph_time_us(
                    lambda: fused_sconv_add_rmsnorm(*p.args(tap_map)), args.iters, args.replays)
            print(f"  {case.name} T={t}: NEW map {row['fused_map_us']:.2f} | OLD map "
                  f"{row.get('old_map_us', float('nan')):.2f} | new nomap {row['fused_us']:.2f} | OLD nomap "
                  f"{row.get('old_us', float('nan')):.2f} | ratio map {row.get('new_over_old_map', float('nan')):.3f} "
                  f"nomap {row.get('new_over_old_nomap', float('nan')):.3f} | {heur}", flush=True)
            return row
        row["sconv_only_us"] = graph_time_us(lambda: fused_sconv(*p.sconv_args()), args.iters, args.replays)
        if "fused_map_us" not in row:
            row["fused_map_us"] = graph_time_us(
                lambda: fused_sconv_add_rmsnorm(*p.args(tap_map)), args.iters, args.replays)
        row["sconv_only_map_us"] = graph_time_us(
            lambda: fused_sconv(*p.sconv_args(tap_map)), args.iters, args.replays)
        row["unfused_eager_us"] = graph_time_us(lambda: unfused_eager(p), args.iters, args.replays)
        row["unfused_frms_us"] = graph_time_us(lambda: unfused_frms(p), args.iters, args.replays)
        if compiled is not None:
            try:
                def unfused_compiled():
                    s = fused_sconv(*p.sconv_args())
                    return compiled(p.hidden, s, p.norm_weight)
                for _ in range(2):
                    unfused_compiled()
                row["unfused_compiled_us"] = graph_time_us(unfused_compiled, args.iters, args.replays)

                def unfused_map_compiled():
                    s = fused_sconv(*p.sconv_args(tap_map))
                    return compiled(p.hidden, s, p.norm_weight)
                for _ in range(2):
                    unfused_map_compiled()
                row["unfused_map_compiled_us"] = graph_time_us(unfused_map_compiled, args.iters, args.replays)
            except Exception:
                traceback.print_exc()
        row["unfused_map_frms_us"] = graph_time_us(lambda: unfused_frms(p, tap_map), args.iters, args.replays)
        if VLLM_ADD_NORM is not None:  # vLLM's fused add + RMSNorm kernel (in place)
            try:
                res = p.hidden.clone()  # (accumulates over the timed calls: timing only)

                def unfused_map_vllm():
                    s = fused_sconv(*p.sconv_args(tap_map))
                    VLLM_ADD_NORM(s, res, p.norm_weight, EPS)
                    return s, res
                row["unfused_map_vllm_us"] = graph_time_us(unfused_map_vllm, args.iters, args.replays)
            except Exception:
                traceback.print_exc()
        row["fused_gbs"] = nbytes / (row["fused_us"] * 1e-6) / 1e9
        row["fused_map_gbs"] = nbytes / (row["fused_map_us"] * 1e-6) / 1e9
        best_unfused = min(v for k, v in row.items() if k.startswith("unfused") and isinstance(v, float))
        print(f"{case.name:34s} T={t:5d} fused {row['fused_us']:8.2f} us ({row['fused_gbs']:6.0f} GB/s, "
              f"{row['fused_gbs'] / copy_gbs:.2f} of copy) | best sweep {row.get('best_us', float('nan')):8.2f} "
              f"{row.get('best_config', '')} | sconv only {row['sconv_only_us']:8.2f} | unfused eager "
              f"{row['unfused_eager_us']:8.2f} F.rms {row['unfused_frms_us']:8.2f} | with map: fused "
              f"{row['fused_map_us']:8.2f} sconv only {row['sconv_only_map_us']:8.2f} | compiled "
              f"{row.get('unfused_compiled_us', float('nan')):8.2f} | speedup vs best unfused "
              f"{best_unfused / row['fused_us']:.2f}x", flush=True)
        print(f"  {case.name}: NEW map {row['fused_map_us']:.2f} | OLD map {row.get('old_map_us', float('nan')):.2f} "
              f"nomap {row.get('old_us', float('nan')):.2f} | new nomap {row['fused_us']:.2f} | sconv+map + compiled "
              f"{row.get('unfused_map_compiled_us', float('nan')):.2f} + F.rms {row['unfused_map_frms_us']:.2f} "
              f"+ vllm {row.get('unfused_map_vllm_us', float('nan')):.2f}", flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="GPU correctness checks first")
    parser.add_argument("--no-bench", action="store_true")
    parser.add_argument("--sweep", action="store_true", help="also time a set of tile configs")
    parser.add_argument("--no-compile", action="store_true", help="skip the inductor baseline")
    parser.add_argument("--iters", type=int, default=20, help="ops per graph replay")
    parser.add_argument("--replays", type=int, default=15)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--dry-run", action="store_true", help="CPU + interpreter, tiny shapes")
    parser.add_argument("--rounds", type=int, default=1,
                        help="with --old-kernel: time new and old alternating this many rounds (medians)")
    parser.add_argument("--no-unfused", action="store_true", help="time only the new and the old kernel")
    parser.add_argument("--extra-decode", default="",
                        help="comma-separated batch sizes: extra decode cases (one token a request)")
    parser.add_argument("--old-kernel", help="module of an older kernel.py to time beside (e.g. main's, "
                        "copied next to kernel.py as kernel_main.py: inkling_kernels.sconv_add_rmsnorm.kernel_main)")
    args = parser.parse_args()
    global OLD
    for n in (int(x) for x in args.extra_decode.split(",") if x.strip()):
        CASES.append(Case(f"decode {n} reqs", [(200 + 11 * i, 1) for i in range(n)]))
    if args.old_kernel:
        import importlib
        OLD = importlib.import_module(args.old_kernel)
    torch.manual_seed(0)
    dtype = torch.float32 if DRY else torch.bfloat16  # the interpreter truncates to bf16
    layout = ConvStateLayout.build(num_kv_heads=8, head_dim=HEAD_DIM, hidden_size=HIDDEN, kernel_size=4)
    report: dict = dict(
        device="cpu (dry run)" if DRY else torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
        cuda=torch.version.cuda, python=platform.python_version(), date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        command=" ".join(sys.argv), layout=dict(num_heads=layout.num_heads, head_size=layout.head_size,
                                                attn_range=list(layout.stream_range(Stream.ATTN))),
    )
    print(json.dumps({k: v for k, v in report.items()}, indent=None))
    ok = True
    t0 = time.time()
    if args.check:
        try:
            ok = check(layout, dtype, report)
        except Exception:
            traceback.print_exc()
            ok = False
        report["check_ok"] = ok
        print(f"checks {'passed' if ok else 'FAILED'} in {time.time() - t0:.1f} s", flush=True)
    if not args.no_bench:
        bench(layout, dtype, args, report)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)
    print(f"total {time.time() - t0:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark fused_sconv and sconv_seq_metadata on the Inkling 975B shapes (H200).

Timing: each case builds several independent input sets (so the working set is
well beyond L2), captures one CUDA graph that launches the op once per set, and
reports the median replay time divided by the number of sets. Bandwidth counts the
minimum bytes (read x + write slot + write out + weights + pre-forward taps) and is
compared with a device-to-device copy measured in the same run (read + write): the
baseline ("of copy") is a plain loop of ``copy_`` calls over 1 and 2 GiB bf16 tensors
timed with CUDA events (copy_baseline), which reaches what the device copies (about
4.2 TB/s on an H200); the same copies replayed from a captured CUDA graph (time_graph)
read about 2.7 TB/s there, so that figure (the baseline before issue 14) is kept as a
second column only ("of graph copy").

The peer (vLLM 0.33.0's in-tree ops) is imported from --peer-dir, written there by
fetch_peer.py; without it the peer columns are skipped.

    PYTHONPATH=packages/inkling-kernels/src python3 packages/inkling-kernels/benchmarks/bench_sconv.py \
        --peer-dir .peer --json results.json
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import datetime
import importlib.util
import json
import math
import pathlib
import statistics
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch
import triton

from inkling_kernels import (
    SconvBatch, decodes_follow_prompts, fused_sconv, fused_sconv_vllm, prefill_token_count, sconv_seq_metadata,
    sconv_tap_map,
)
from inkling_kernels.sconv.kernel import SconvConfig, choose_config, fused_sconv_triton

W = 4
N = 4
DTYPE = torch.bfloat16
# (H per rank, D, stream offset, stream width) of the 975B layers
ATTN_GLOBAL = (8, 2048, 256, 768)
ATTN_GLOBAL_TP8 = (1, 2048, 256, 768)
K_GLOBAL = (8, 2048, 0, 128)
K_SLIDING = (16, 1024, 0, 128)


@dataclass
class Case:
    name: str
    stream: tuple[int, int, int, int]
    requests: list[tuple[int, int]]  # (history length, new tokens)
    peer_us: float  # docs/design.md §4, for reference only


def _hist(i: int) -> int:
    return 700 + (i * 7919) % 6000  # long, varied histories


def cases() -> list[Case]:
    return [
        Case("decode 1 req, ATTN", ATTN_GLOBAL, [(_hist(0), 1)], 2.89),
        Case("decode 64 reqs, ATTN", ATTN_GLOBAL, [(_hist(i), 1) for i in range(64)], 3.80),
        Case("decode 256 reqs, K (global)", K_GLOBAL, [(_hist(i), 1) for i in range(256)], 3.37),
        Case("decode 256 reqs, ATTN", ATTN_GLOBAL, [(_hist(i), 1) for i in range(256)], 7.63),
        Case("decode 256 reqs, ATTN, tp8", ATTN_GLOBAL_TP8, [(_hist(i), 1) for i in range(256)], 3.33),
        Case("spec verify 64x4, ATTN", ATTN_GLOBAL, [(_hist(i), 4) for i in range(64)], 7.54),
        Case("prefill 8192, ATTN", ATTN_GLOBAL, [(0, 8192)], 180.7),
        Case("chunked 8192 after 8190, ATTN", ATTN_GLOBAL, [(8190, 8192)], 180.6),
        Case("prefill 8192, K", K_GLOBAL, [(0, 8192)], 32.6),
        Case("prefill 16384, K (sliding)", K_SLIDING, [(0, 16384)], 122.0),
        Case("mixed 2048 + 255 decodes, ATTN", ATTN_GLOBAL, [(0, 2048)] + [(_hist(i), 1) for i in range(255)], 54.6),
        # the same batch in the order vLLM gives it to the plugin (decode requests first:
        # inkling_vllm's conv group asks for that)
        Case("mixed 255 decodes + 2048, ATTN", ATTN_GLOBAL, [(_hist(i), 1) for i in range(255)] + [(0, 2048)], 54.6),
    ]


@dataclass
class Inputs:
    x: torch.Tensor
    positions: torch.Tensor
    table: torch.Tensor
    seq: torch.Tensor
    slots: torch.Tensor
    qs: torch.Tensor
    tap_map: torch.Tensor  # the step's tap map (built once per step and group)
    # the batch's prompt-row hint (SconvBatch.num_prefill_tokens), as an engine sets it
    # (the vLLM plugin, inkling_model's runtime); None: the kernels go by rows a request
    prefill: int | None = None
    # whether its decode requests follow its prompt requests (SconvBatch.decodes_last)
    decodes_last: bool = False

    @property
    def meta(self) -> tuple[torch.Tensor, ...]:
        return (self.positions, self.table, self.seq, self.slots, self.qs)

    @functools.cached_property
    def batch(self) -> SconvBatch:
        """The step's batch without a map."""
        return SconvBatch(*self.meta, block_size=N, kernel_size=W, num_prefill_tokens=self.prefill,
                          decodes_last=self.decodes_last)

    @functools.cached_property
    def mapped(self) -> SconvBatch:
        """The step's batch carrying its tap map (filled by build())."""
        return self.batch.with_tap_map(self.tap_map)


def build(case: Case, num_sets: int, gen: torch.Generator, device: str = "cuda") -> tuple[torch.Tensor, torch.Tensor, list[Inputs]]:
    heads, head_size, off, width = case.stream
    c = heads * width
    per_req = []
    for hist, n in case.requests:
        first = max(0, hist - (W - 1)) // N
        last = (hist + n - 1) // N
        per_req.append((first, last))
    blocks_per_set = sum(last - first + 1 for first, last in per_req)
    num_blocks = 1 + num_sets * blocks_per_set
    cache = torch.randn(num_blocks, heads, N, head_size, device=device, dtype=DTYPE)
    perm = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()  # block 0: null block
    max_blocks = max(last for _, last in per_req) + 1
    sets = []
    cursor = 0
    for _ in range(num_sets):
        table = torch.zeros(len(case.requests), max_blocks, dtype=torch.int32)
        pos, seq, slots, qs = [], [], [], []
        for r, ((hist, n), (first, last)) in enumerate(zip(case.requests, per_req)):
            ids = perm[cursor : cursor + last - first + 1]
            cursor += last - first + 1
            table[r, first : last + 1] = torch.tensor(ids, dtype=torch.int32)
            p = torch.arange(hist, hist + n)
            row0 = len(pos) and sum(len(a) for a in pos)
            pos.append(p)
            seq.append(torch.full((n,), r, dtype=torch.int32))
            slots.append(table[r, p // N].long() * N + p % N)
            qs.append(torch.full((n,), row0, dtype=torch.int32))
        t = sum(len(a) for a in pos)
        tap_map = torch.empty(t, W - 1, dtype=torch.int64, device=device)
        sets.append(Inputs(
            x=torch.randn(t, c, device=device, dtype=DTYPE),
            positions=torch.cat(pos).to(device),
            table=table.to(device),
            seq=torch.cat(seq).to(device),
            slots=torch.cat(slots).to(device),
            qs=torch.cat(qs).to(device),
            tap_map=tap_map,
            prefill=prefill_token_count(n for _, n in case.requests),
            decodes_last=decodes_follow_prompts(n for _, n in case.requests),
        ))
        sconv_tap_map(sets[-1].batch, tap_map)
    weight = (torch.randn(c, W, device=device, generator=None) * 0.5).float()
    return cache, weight, sets


def min_bytes(case: Case) -> int:
    heads, _, _, width = case.stream
    c = heads * width
    t = sum(n for _, n in case.requests)
    taps = sum(min(W - 1, hist) for hist, _ in case.requests)
    e = DTYPE.itemsize
    return 3 * t * c * e + c * W * 4 + taps * c * e


def time_graph(launches: list[Callable[[], Any]], reps: int) -> float:
    """Median µs per launch over `reps` replays of one graph holding all launches."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in launches:  # compile / warm up outside capture
            f()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    # captured on the warm-up stream: ops that keep scratch per stream (the split rows
    # of fused_sconv_add_rmsnorm) find the one the warm-up made
    with torch.cuda.graph(g, stream=s):
        for f in launches:
            f()
    for _ in range(3):
        g.replay()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for a, b in ev:
        a.record()
        g.replay()
        b.record()
    torch.cuda.synchronize()
    ms = statistics.median(a.elapsed_time(b) for a, b in ev)
    del g
    return ms * 1000.0 / len(launches)


COPY_LOOP = 20  # copies between one pair of events
COPY_LOOPS = 5  # loops per size (median)


def events_loop_us(f: Callable[[], Any], loop: int = COPY_LOOP, loops: int = COPY_LOOPS) -> list[float]:
    """µs per call of ``f`` in each of ``loops`` plain loops of ``loop`` calls, each loop
    between two CUDA events (no graph), after a warm-up."""
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    times = []
    for _ in range(loops):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(loop):
            f()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / loop)
    return times


def events_copy_rates(a: torch.Tensor, b: torch.Tensor) -> list[float]:
    """GB/s (bytes read + written) of COPY_LOOPS loops of COPY_LOOP plain ``b.copy_(a)``
    calls (:func:`events_loop_us`)."""
    nbytes = a.numel() * a.element_size()
    return [2 * nbytes / (us * 1e-6) / 1e9 for us in events_loop_us(lambda: b.copy_(a))]


def copy_baseline() -> dict[str, Any]:
    """The copy baseline, GB/s counting bytes read + written: per size (bf16, 1 and 2
    GiB), COPY_LOOPS loops of COPY_LOOP plain ``b.copy_(a)`` calls, each loop between
    two CUDA events (no graph), after a warm-up; the median loop per size, and the
    larger of the two sizes' medians as the baseline. The same tensors are also timed
    through time_graph (four copies per graph) for the graph-timed column."""
    sizes: dict[str, Any] = {}
    for name, nbytes in [("bf16 1GiB", 1 << 30), ("bf16 2GiB", 2 << 30)]:
        a = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda")
        a.view(torch.uint8).random_(0, 255)
        b = torch.empty_like(a)
        loops = events_copy_rates(a, b)
        graph_us = time_graph([lambda a=a, b=b: b.copy_(a)] * 4, reps=20)
        sizes[name] = dict(events_GBps=statistics.median(loops), events_loops_GBps=loops,
                           graph_GBps=2 * nbytes / (graph_us * 1e-6) / 1e9)
        del a, b
    torch.cuda.empty_cache()
    return dict(sizes=sizes, GBps=max(v["events_GBps"] for v in sizes.values()),
                method=f"CUDA events around a plain loop of {COPY_LOOP} copy_ calls, bf16 1 and 2 GiB, "
                       f"median of {COPY_LOOPS} loops per size, the larger size median")


def copy_bandwidth() -> dict[str, float]:
    """Device-to-device copy timed through time_graph (the baseline before issue 14,
    now the "of graph copy" column), GB/s counting bytes read + written; three ways."""
    out = {}
    for name, dtype, nbytes in [("uint8 1GiB", torch.uint8, 1 << 30), ("fp32 2GiB", torch.float32, 2 << 30),
                                ("bf16 512MiB", torch.bfloat16, 1 << 29)]:
        a = torch.empty(nbytes // dtype.itemsize, dtype=dtype, device="cuda")
        a.view(torch.uint8).random_(0, 255)
        b = torch.empty_like(a)
        us = time_graph([lambda a=a, b=b: b.copy_(a)] * 4, reps=20)
        out[name] = 2 * nbytes / (us * 1e-6) / 1e9
        del a, b
    torch.cuda.empty_cache()
    return out


def same_size_copy_us(nbytes: int, num_sets: int, reps: int) -> float:
    """µs to move ``nbytes`` (read + write) as a case does: ``num_sets`` disjoint bf16
    buffer pairs of ``nbytes / 2`` each, one SM-kernel copy (``torch.mul(a, 1, out=b)``:
    a captured ``copy_`` becomes a slower copy-engine node) per pair in one CUDA graph,
    median replay / ``num_sets`` (time_graph). The copy rate a launch of this size can
    reach, beside the 1-2 GiB baseline."""
    n = max(1, nbytes // 4)  # bf16 elements read (and as many written)
    pairs = []
    for _ in range(num_sets):
        a = torch.empty(n, dtype=torch.bfloat16, device="cuda")
        a.view(torch.uint8).random_(0, 255)
        pairs.append((a, torch.empty_like(a)))
    us = time_graph([lambda a=a, b=b: torch.mul(a, 1, out=b) for a, b in pairs], reps)
    del pairs
    torch.cuda.empty_cache()
    return us


def load_peer(peer_dir: pathlib.Path | None) -> Any:
    if peer_dir is None:
        return None
    path = peer_dir / "vllm_sconv_peer.py"
    if not path.exists():
        print(f"[peer] {path} not found: peer columns skipped (run fetch_peer.py first)")
        return None
    spec = importlib.util.spec_from_file_location("vllm_sconv_peer", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def sweep_configs(case: Case) -> list[SconvConfig]:
    """The heuristic's choice plus alternatives (rows x channels per program, warps)."""
    heads, _, _, width = case.stream
    t = sum(n for _, n in case.requests)
    out = [choose_config(t, heads, width, mapped=True, num_requests=len(case.requests))]
    two_load = choose_config(t, heads, width, mapped=True, one_load=False)  # the default before session 12
    if two_load not in out:
        out.append(two_load)
    if t <= 1024:
        cand = [(1, 256, 1), (2, 256, 1), (2, 256, 2), (4, 256, 2), (4, 256, 4), (8, 256, 4),
                (8, 256, 8), (16, 256, 4), (1, 128, 1), (2, 128, 1), (4, 128, 1), (4, 128, 2),
                (8, 128, 2), (8, 128, 4), (1, 512, 2), (2, 512, 4), (2, 64, 1), (4, 64, 1),
                (8, 64, 1), (8, 64, 2), (16, 128, 4), (16, 128, 8), (4, 512, 8)]
    else:
        cand = [(4, 256, 4), (8, 256, 4), (8, 256, 8), (16, 256, 8), (32, 256, 8),
                (8, 128, 4), (16, 128, 4), (32, 128, 4), (16, 128, 8), (32, 128, 8), (64, 128, 8),
                (16, 64, 2), (32, 64, 4)]
    for bt, bc, nw in cand:
        cfg = SconvConfig(block_t=bt, block_c=bc, num_warps=nw)
        if width % bc == 0 and cfg not in out:
            out.append(cfg)
    # programmatic dependent launch on the heuristic's tile and the best small-batch ones
    pdl = [(out[0].block_t, out[0].block_c, out[0].num_warps)]
    if t <= 1024:
        pdl += [(1, 128, 1), (2, 128, 1), (4, 128, 2), (4, 256, 4), (8, 128, 4), (8, 256, 8), (4, 64, 1)]
    for bt, bc, nw in pdl:
        cfg = SconvConfig(block_t=bt, block_c=bc, num_warps=nw, pdl=True)
        if width % bc == 0 and cfg not in out:
            out.append(cfg)
    # one load a tap (session 10: 16x128/4w with it was the fastest row at T x C >= 2^20)
    for bt, bc, nw in ((out[0].block_t, out[0].block_c, out[0].num_warps), (16, 128, 4), (8, 128, 4),
                       (4, 128, 2), (16, 256, 8), (16, 64, 2)):
        cfg = SconvConfig(block_t=bt, block_c=bc, num_warps=nw, tap_select=True)
        if width % bc == 0 and cfg not in out:
            out.append(cfg)
    return out


def bench_case(case: Case, peer: Any, reps: int, sweep: bool, gen: torch.Generator,
               sweep_hot: bool = False) -> dict[str, Any]:
    heads, head_size, off, width = case.stream
    nbytes = min_bytes(case)
    num_sets = max(2, min(16, math.ceil(256e6 / nbytes)))
    cache, weight, sets = build(case, num_sets, gen)
    t = sets[0].x.shape[0]

    def ours(cfg: SconvConfig | None, mapped: bool = False) -> list[Callable[[], Any]]:
        if cfg is None and mapped:  # the public op on the step's batch (the model path)
            return [lambda s=s: fused_sconv(s.x, weight, cache, s.mapped, off, width) for s in sets]
        if cfg is None:  # the drop-in with vLLM's signature (no map: built per call when large)
            return [lambda s=s: fused_sconv_vllm(s.x, weight, cache, *s.meta, off, width, N) for s in sets]
        return [lambda s=s: fused_sconv_triton(s.x, weight, cache, s.mapped if mapped else s.batch, off, width,
                                               config=cfg, auto_map=False) for s in sets]

    res: dict[str, Any] = dict(case=case.name, T=t, C=heads * width, bytes=nbytes, sets=num_sets,
                               peer_us_brief=case.peer_us)
    heur = choose_config(t, heads, width)
    res["config"] = dataclasses.asdict(heur)
    res["config_map"] = dataclasses.asdict(choose_config(t, heads, width, mapped=True,
                                                         num_requests=len(case.requests)))
    res["ours_map_us"] = time_graph(ours(None, mapped=True), reps)
    # The map is built once per step and KV-cache group (two launches), then shared
    # by the 4 streams x layers of the group.
    res["map_build_us"] = time_graph([lambda s=s: sconv_tap_map(s.batch, s.tap_map) for s in sets], reps)
    res["ours_us"] = time_graph(ours(None), reps)  # the drop-in
    res["ours_mapless_us"] = time_graph(ours(heur), reps)  # the map-less kernel alone
    res["ours_noscan_us"] = time_graph(ours(dataclasses.replace(heur, hazard_scan=False)), reps)
    if peer is not None:
        res["peer_us"] = time_graph(
            [lambda s=s: peer.fused_sconv(s.x, weight, cache, s.positions, s.table, s.seq, s.slots, s.qs,
                                          off, width, N) for s in sets], reps)
    # "hot": the same set replayed (as single-set graph timings do): L2-resident
    # when the working set fits in L2 (decode), the same as cold otherwise.
    hot = [ours(None)[0]] * 16
    res["ours_hot_us"] = time_graph(hot, reps)
    res["ours_map_hot_us"] = time_graph([ours(None, mapped=True)[0]] * 16, reps)
    if peer is not None:
        s0 = sets[0]
        res["peer_hot_us"] = time_graph(
            [lambda: peer.fused_sconv(s0.x, weight, cache, s0.positions, s0.table, s0.seq, s0.slots, s0.qs,
                                      off, width, N)] * 16, reps)
    # correctness spot check of this very data: ours vs the reference on set 0
    from inkling_kernels import fused_sconv_ref

    s = sets[0]
    c2 = cache.clone()
    ref = fused_sconv_ref(s.x, weight, c2, s.batch, off, width)
    got = fused_sconv_vllm(s.x, weight, cache, *s.meta, off, width, N)
    res["max_abs_err_vs_ref"] = float((got.float() - ref.float()).abs().max())
    got = fused_sconv(s.x, weight, cache, s.mapped, off, width)
    res["max_abs_err_vs_ref_map"] = float((got.float() - ref.float()).abs().max())
    got = fused_sconv_triton(s.x, weight, cache, s.batch, off, width, auto_map=False)
    res["max_abs_err_vs_ref_mapless"] = float((got.float() - ref.float()).abs().max())
    if sweep:  # tiles of the mapped kernel, each checked against the reference on set 0
        rows = []
        for cfg in sweep_configs(case):
            try:
                got = fused_sconv_triton(s.x, weight, cache, s.mapped, off, width, config=cfg, auto_map=False)
                err = float((got.float() - ref.float()).abs().max())
                us = time_graph(ours(cfg, mapped=True), reps)
                hot_us = time_graph([ours(cfg, mapped=True)[0]] * 16, reps) if sweep_hot else None
            except Exception as e:  # a config that fails to compile: report, go on
                rows.append((dataclasses.asdict(cfg), None, repr(e)[:120]))
                continue
            note = f"err {err:.3g}" + (f", hot {hot_us:.2f}" if hot_us is not None else "")
            rows.append((dataclasses.asdict(cfg), us, note))
        rows.sort(key=lambda r: r[1] if r[1] is not None else 1e9)
        res["sweep"] = rows
    del cache, sets
    torch.cuda.empty_cache()
    return res


# (name, query lengths, pad rows) of the sconv_seq_metadata cases
METADATA_CASES = [
    ("decode 256", [1] * 256, 0),
    ("spec 64x4", [4] * 64, 0),
    ("mixed 2048 + 255", [2048] + [1] * 255, 0),
    ("prefill 8192", [8192], 0),
    ("decode 200 padded to 256", [1] * 200, 56),
]


def bench_metadata(peer: Any, reps: int) -> list[dict[str, Any]]:
    out = []
    for name, lens, pad in METADATA_CASES:
        qsl = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
        na = sum(lens)
        npad = na + pad
        seq = torch.empty(npad, dtype=torch.int32, device="cuda")
        qs = torch.empty_like(seq)
        r: dict[str, Any] = dict(case=name, R=len(lens), T=npad)
        r["ours_us"] = time_graph([lambda: sconv_seq_metadata(qsl, len(lens), na, seq, qs, npad)] * 20, reps)
        if peer is not None:
            ps, pq = torch.empty_like(seq), torch.empty_like(seq)
            r["peer_us"] = time_graph([lambda: peer.sconv_seq_metadata(qsl, len(lens), na, ps, pq, npad)] * 20, reps)
            sconv_seq_metadata(qsl, len(lens), na, seq, qs, npad)
            r["equal_to_peer"] = bool(torch.equal(seq, ps) and torch.equal(qs, pq))
        out.append(r)
    return out


def bench_hazard(peer: Any, launches: int) -> list[dict[str, Any]]:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
    from test_gpu import _hazard_case  # the GPU test's case builder

    out = []
    def mapless(*args: Any) -> torch.Tensor:
        return fused_sconv_triton(*args[:3], SconvBatch(*args[3:8], block_size=args[10], kernel_size=W),
                                  args[8], args[9], auto_map=False)

    impls = [("ours, drop-in", fused_sconv_vllm), ("ours, map-less kernel", mapless), ("ours, map", None)] + (
        [("peer", peer.fused_sconv)] if peer is not None else [])
    for prompt_len, hit in [(1024, 512), (8192, 4096), (1024, 513)]:
        for b_first in (False, True):
            case = _hazard_case(prompt_len, hit, b_first)
            d = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in case.items()}
            w2 = d["weight"][:, 0, :].contiguous()
            tap_map = torch.empty(d["x"].shape[0], W - 1, dtype=torch.int64, device="cuda")
            mapped = sconv_tap_map(SconvBatch(d["positions"], d["table"], d["seq"], d["slots"], d["qs"], d["n"], W),
                                   tap_map)
            for name, fn in impls:
                if fn is None:
                    def fn(x: torch.Tensor, w: torch.Tensor, cache: torch.Tensor, *rest: Any) -> torch.Tensor:
                        return fused_sconv(x, w, cache, mapped, rest[5], rest[6])
                stale = 0
                for _ in range(launches):
                    ps = d["pre_slots"]
                    d["cache"][ps // d["n"], :, ps % d["n"], d["off"] : d["off"] + d["width"]] = float("nan")
                    o = fn(d["x"], w2, d["cache"], d["positions"], d["table"], d["seq"], d["slots"], d["qs"],
                           d["off"], d["width"], d["n"])
                    bad = ~torch.isclose(o.float(), d["expected"].float(), rtol=1.6e-2, atol=1.6e-2)
                    stale += int(bad.any())
                out.append(dict(prompt=prompt_len, hit=hit, order="B first" if b_first else "A first",
                                impl=name, stale=stale, launches=launches))
    return out


def markdown(results: dict[str, Any]) -> str:
    bw = results["copy_GBps"]
    gbw = results["copy_graph_GBps"]
    sizes = results["copy_baseline"]["sizes"]
    lines = [
        f"Copy baseline (read + write, same run): **{bw:.0f} GB/s** ({results['copy_baseline']['method']}: "
        + ", ".join(f"{k} {v['events_GBps']:.0f}" for k, v in sizes.items()) + ").",
        f"Graph-timed copy (time_graph, the baseline before issue 14; column \"of graph copy\"): {gbw:.0f} GB/s, "
        f"best of {len(results['copy_all'])} (" + ", ".join(f"{k} {v:.0f}" for k, v in results["copy_all"].items())
        + "; on the baseline's tensors: " + ", ".join(f"{k} {v['graph_GBps']:.0f}" for k, v in sizes.items()) + ").",
        "",
        "ours = fused_sconv on the step's batch with its tap map (the model/vLLM path on CUDA); map = its build,",
        "once per step and KV-cache group; no map = the drop-in fused_sconv_vllm (vLLM's signature: the",
        "map-less kernel, or a map built for the call when T*C >= 2**20); map-less = that kernel alone.",
        "",
        "| case | T | C | ours µs | GB/s | of copy | of graph copy | peer µs | peer of copy | peer/ours | map build µs | no map µs | peer/no map | map-less µs | map-less, no hazard scan µs | hot µs: ours / no map / peer | tiles: map; map-less |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["cases"]:
        ours = r["ours_map_us"]
        gbps = r["bytes"] / (ours * 1e-6) / 1e9
        peer = r.get("peer_us")
        pgbps = r["bytes"] / (peer * 1e-6) / 1e9 if peer else None
        cfg, cfgm = r["config"], r["config_map"]
        lines.append(
            f"| {r['case']} | {r['T']} | {r['C']} | {ours:.2f} | {gbps:.0f} | {gbps / bw:.2f} | {gbps / gbw:.2f} | "
            + (f"{peer:.2f} | {pgbps / bw:.2f} | {peer / ours:.2f}x" if peer else "— | — | —")
            + f" | {r['map_build_us']:.2f} | {r['ours_us']:.2f} | "
            + (f"{peer / r['ours_us']:.2f}x" if peer else "—")
            + f" | {r.get('ours_mapless_us', float('nan')):.2f} | {r['ours_noscan_us']:.2f}"
            + f" | {r['ours_map_hot_us']:.2f} / {r['ours_hot_us']:.2f} / "
            + f"{r.get('peer_hot_us', float('nan')):.2f}"
            + f" | {cfgm['block_t']}x{cfgm['block_c']}/{cfgm['num_warps']}w; "
            + f"{cfg['block_t']}x{cfg['block_c']}/{cfg['num_warps']}w |"
        )
    lines += ["", "| sconv_seq_metadata | R | T | ours µs | peer µs | same output |", "|---|---|---|---|---|---|"]
    for r in results["metadata"]:
        lines.append(f"| {r['case']} | {r['R']} | {r['T']} | {r['ours_us']:.2f} | "
                     + (f"{r['peer_us']:.2f} | {r['equal_to_peer']} |" if "peer_us" in r else "— | — |"))
    if results.get("hazard"):
        lines += ["", "| same-step hazard | order | impl | launches with a stale tap |", "|---|---|---|---|"]
        for r in results["hazard"]:
            lines.append(f"| A {r['prompt']}, B hits {r['hit']} | {r['order']} | {r['impl']} | "
                         f"{r['stale']} / {r['launches']} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer-dir", type=pathlib.Path, default=None)
    ap.add_argument("--json", type=pathlib.Path, default=None)
    ap.add_argument("--md", type=pathlib.Path, default=None)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--sweep", action="store_true", help="also time alternative tile configs")
    ap.add_argument("--sweep-hot", action="store_true", help="the sweep also times each config hot")
    ap.add_argument("--hazard-launches", type=int, default=200)
    ap.add_argument("--only", default=None, help="substring filter on case names ('|'-separated alternatives)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the inputs and of the cache blocks' placement")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    peer = load_peer(args.peer_dir)
    results: dict[str, Any] = dict(
        device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        command=" ".join(sys.argv), peer=peer is not None,
    )
    results["copy_baseline"] = copy_baseline()
    results["copy_GBps"] = results["copy_baseline"]["GBps"]  # the "of copy" baseline
    results["copy_method"] = "events"
    results["copy_all"] = copy_bandwidth()  # graph-timed, as before issue 14
    results["copy_graph_GBps"] = max(results["copy_all"].values())
    print(f"copy baseline {results['copy_baseline']}", flush=True)
    print(f"graph-timed copy {results['copy_all']}", flush=True)
    results["cases"] = []
    for case in cases():
        if args.only and not any(part in case.name for part in args.only.split("|")):
            continue
        r = bench_case(case, peer, args.reps, args.sweep, gen, args.sweep_hot)
        results["cases"].append(r)
        print(json.dumps({k: v for k, v in r.items() if k != "sweep"}), flush=True)
        if args.sweep:
            for cfg, us, err in r["sweep"][:12]:
                print("   ", cfg, us, err or "", flush=True)
    results["metadata"] = bench_metadata(peer, args.reps)
    results["hazard"] = bench_hazard(peer, args.hazard_launches) if args.hazard_launches else []
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    md = markdown(results)
    if args.md:
        args.md.write_text(md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())

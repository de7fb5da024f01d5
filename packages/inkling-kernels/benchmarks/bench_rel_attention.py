"""Paged relative-logit attention on the GPU: the Triton kernel against the PyTorch
path, FlexAttention (same bias as a score_mod, same pages through a block mask) and
plain SDPA without the bias (the speed floor), plus a copy-bandwidth baseline.

Run on a GPU machine from the repository root:

    PYTHONPATH=packages/inkling-kernels/src:packages/inkling-cache/src \\
      python3 packages/inkling-kernels/benchmarks/bench_rel_attention.py --json out.json --md out.md

(``--sweep-rows bias``: of each case's tilings only the default and the ``bias``
rows; ``--only`` picks cases by a substring of their names.)

Shapes: Inkling 975B global layer at tp 1: 64 query heads, 8 KV heads, head dim 128,
d_rel 16, extent 1024, log scaling, bf16; the cache in Inkling's page layout
``[num_blocks, Hkv, N, 2*Dh]`` with random physical pages.

Timing: each op is captured ``iters`` times into one CUDA graph (so host launch cost
is excluded; the PyTorch path, which loops on the host, is timed eagerly), replayed
``samples`` times between CUDA events; the median per call is reported.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from inkling_kernels.rel_attention import paged_rel_attention
from inkling_kernels.rel_attention.kernel import (
    RelAttentionConfig,
    check_paged_rel_attention_triton_args,
    choose_rel_attention_config,
    paged_rel_attention_triton,
)

HQ, DH, DREL, EXTENT = 64, 128, 16, 1024
LOG_SCALING = (4096, 0.1)
DT = torch.bfloat16


@dataclass
class Case:
    name: str
    kind: str  # "decode" | "prefill"
    mix: list[tuple[int, int]]  # (context already cached, query rows)
    hkv: int = 8
    n: int = 64
    window: int | None = None
    num_pad: int = 0


CASES = [
    Case("decode 1 x 32k", "decode", [(32767, 1)]),
    Case("decode 64 x 32k", "decode", [(32767, 1)] * 64),
    Case("decode 256 x 8k", "decode", [(8191, 1)] * 256),
    Case("decode 64 x 32k, N=16, Hkv=16", "decode", [(32767, 1)] * 64, hkv=16, n=16),
    Case("spec verify 64 x 4 @ 8k", "decode", [(8188, 4)] * 64),
    Case("prefill 8k", "prefill", [(0, 8192)]),
    Case("chunked prefill 8k after 8k", "prefill", [(8192, 8192)]),
    Case("mixed 2048 after 2048 + 255 decodes @ 4k", "prefill", [(2048, 2048)] + [(4095, 1)] * 255, num_pad=9),
    # fewer query heads a KV head (group 4, 2): taller block-diagonal MMAs by default
    Case("prefill 8k, Hkv=16", "prefill", [(0, 8192)], hkv=16),
    Case("prefill 8k, Hkv=32", "prefill", [(0, 8192)], hkv=32),
    # a sliding layer (window = extent = 512, no log scaling): every key tile is near
    Case("sliding prefill 8k, window 512", "prefill", [(0, 8192)], window=512),
    Case("sliding decode 256 x 8k, window 512", "decode", [(8191, 1)] * 256, window=512),
    # Inkling's sliding layers as served: 64 query / 16 KV heads (group 4)
    Case("sliding prefill 8k, window 512, Hkv=16", "prefill", [(0, 8192)], window=512, hkv=16),
    Case("sliding decode 256 x 8k, window 512, Hkv=16", "decode", [(8191, 1)] * 256, window=512, hkv=16),
]


def sweep_configs(case: Case, default: RelAttentionConfig) -> dict[str, RelAttentionConfig]:
    """The default tiling and a few neighbours, timed in the same run."""
    d = default

    def alt(**kw: Any) -> RelAttentionConfig:
        return RelAttentionConfig(**{**d.__dict__, **kw})

    out = {"default": d}
    # the near tiles' bias the other way (band: small MMA + gather; diag: one
    # block-diagonal MMA); on prefill shapes also the session-8 default (band, 32-key
    # near tiles), diag on 32-key near tiles and diag with 16 queries a tile
    other = "band" if d.bias == "diag" else "diag"
    out[f"bias {other}"] = alt(bias=other)
    if case.kind == "prefill":
        out["bias band near32"] = alt(bias="band", near_block_n=32)
        out["bias diag near32"] = alt(bias="diag", near_block_n=32)
        out["bias diag q16 w8"] = alt(bias="diag", block_q=16, num_warps=8)
        if d.block_q > 8:  # the block-diagonal MMA 128 deep (d_rel 16), as measured on Hkv 8
            out["bias diag q8"] = alt(bias="diag", block_q=8)
    out["pdl"] = alt(pdl=not d.pdl)  # programmatic dependent launch the other way
    if case.kind == "decode" and len(case.mix) <= 4:  # few long requests: the split sizing
        # (sessions 5-6 timed 32-128 splits, fused combine, 1-3 stages, 32-key tiles,
        # 2 warps; session 10 call 1 launch overlap (pdl), 16-64 splits x 2-3 stages,
        # near cost 2-8, 8 warps, 128-key tiles: RESULTS_rel_attention.md). Call 2:
        # whole waves (33 splits x 8 heads = 2 programs on each of 132 SMs), the cost
        # weight of a near tile, and a register cap for 3 programs an SM.
        for s in (32, 33):
            for cost in (2, 3, 4):
                for st in (2, 3):
                    out[f"s{s} c{cost} st{st} pdl"] = alt(num_splits=s, near_cost=cost, num_stages=st, pdl=True)
        out["s33 c3 st3"] = alt(num_splits=33, near_cost=3, num_stages=3)
        for regs in (128, 160):
            for s in (33, 48, 49):
                out[f"s{s} c3 st3 pdl r{regs}"] = alt(num_splits=s, near_cost=3, num_stages=3, pdl=True,
                                                      max_registers=regs)
        return out
    if case.kind == "decode" and d.num_splits > 1:
        out["2 launches"] = alt(fused_combine=False)
        out["splits x2"] = alt(num_splits=2 * d.num_splits)
        out["splits x2, 2 launches"] = alt(num_splits=2 * d.num_splits, fused_combine=False)
        return out
    if case.kind == "decode":
        out["w4" if d.num_warps != 4 else "w2"] = alt(num_warps=4 if d.num_warps != 4 else 2)
        out["stages 3"] = alt(num_stages=3)
        out["w4 st3"] = alt(num_warps=4, num_stages=3)
        out["w4 pdl"] = alt(num_warps=4, pdl=True)
        out["w8"] = alt(num_warps=8)
        out["bn128 w4"] = alt(block_n=128, num_warps=4)
        out["splits x2"] = alt(num_splits=min(64, 2 * d.num_splits))
        out["near cost 1"] = alt(near_cost=1)  # key splits count near and far tiles alike
        out["near cost 8"] = alt(near_cost=8)
        if d.num_splits >= 32:  # few long requests: more programs in flight
            out["s128 t2"] = alt(num_splits=128, min_split_tiles=2)
            out["s128 t2 st3"] = alt(num_splits=128, min_split_tiles=2, num_stages=3)
            out["s256 t1 w2"] = alt(num_splits=256, min_split_tiles=1, num_warps=2)
            out["s128 t2 w8"] = alt(num_splits=128, min_split_tiles=2, num_warps=8)
            out["st4"] = alt(num_stages=4)
            out["bn32 s128"] = alt(block_n=32, num_splits=128, min_split_tiles=4)
    else:
        gp = 1 << max(0, (HQ // case.hkv - 1).bit_length())
        out["near 64"] = alt(near_block_n=None)
        out["near 16"] = alt(near_block_n=16)
        out["stages 2"] = alt(num_stages=2)
        out["stages 4"] = alt(num_stages=4)
        out["bn128, near 32"] = alt(block_n=128, near_block_n=32)
        out["m128 w8 st2"] = alt(block_q=128 // gp, num_warps=8, num_stages=2)
        out["m128 w8 near64"] = alt(block_q=128 // gp, num_warps=8, near_block_n=None)
        out["m128 w4"] = alt(block_q=128 // gp, num_warps=4)
    return out


# ----------------------------------------------------------------------------- timing


def _events() -> tuple[torch.cuda.Event, torch.cuda.Event]:
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def compiled_kernels() -> dict[tuple[str, Any], Any]:
    """Every compiled build of the op's Triton kernels so far, by (kernel, key)."""
    from inkling_kernels.rel_attention import kernel as kmod

    found: dict[tuple[str, Any], Any] = {}
    for fn in (kmod._rel_attention_kernel, kmod._combine_kernel):
        for caches in fn.device_caches.values():
            for key, kern in caches[0].items():
                found[(fn.__name__, key)] = kern
    return found


def kernel_info(kern: Any) -> dict[str, Any]:
    """Registers, spills, shared memory of a compiled kernel, and how many of its
    programs fit on one SM by each (65536 registers, 228 KB shared on an H100/H200)."""
    md = kern.metadata
    regs = getattr(kern, "n_regs", None)
    threads = md.num_warps * 32
    info = {"regs": regs, "spills": getattr(kern, "n_spills", None), "shared": md.shared,
            "warps": md.num_warps, "stages": md.num_stages}
    if regs:
        info["fit_by_regs"] = 65536 // (max(regs, 1) * threads)
    info["fit_by_shared"] = (233472 // md.shared) if md.shared else None
    return info


def time_graph(fn: Callable[[], Any], target_ms: float = 20.0, samples: int = 9) -> tuple[float, str]:
    """Median ms per call: ``iters`` calls captured in one CUDA graph, replayed."""
    fn()
    torch.cuda.synchronize()
    s, e = _events()
    s.record()
    fn()
    e.record()
    e.synchronize()
    one = max(s.elapsed_time(e), 1e-3)
    iters = int(max(1, min(100, target_ms / one)))
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # captured on the stream that ran the warm-up call (the fused split combine
        # keeps its ticket counters per stream; a stream new to it would capture a
        # zeroing of fresh counters into the graph)
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(iters):
                fn()
        graph.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(samples):
            s.record()
            graph.replay()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) / iters)
        del graph
        return statistics.median(times), "graph"
    except Exception as exc:  # noqa: BLE001 - fall back to eager timing, say so
        print(f"    (graph capture failed: {type(exc).__name__}: {str(exc)[:120]}; eager timing)")
        torch.cuda.synchronize()
        return time_eager(fn, target_ms, samples), "eager"


def time_eager(fn: Callable[[], Any], target_ms: float = 20.0, samples: int = 9) -> float:
    fn()
    torch.cuda.synchronize()
    s, e = _events()
    s.record()
    fn()
    e.record()
    e.synchronize()
    one = max(s.elapsed_time(e), 1e-3)
    iters = int(max(1, min(100, target_ms / one)))
    times = []
    for _ in range(samples):
        s.record()
        for _ in range(iters):
            fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / iters)
    return statistics.median(times)


def copy_bandwidth(gib: float = 2.0) -> float:
    """GB/s (read + write) of a plain device-to-device ``copy_`` loop, CUDA events."""
    n = int(gib * (1 << 30)) // 2
    src = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = time_eager(lambda: dst.copy_(src), target_ms=50.0, samples=9)
    del src, dst
    return 2 * n * 2 / (ms * 1e-3) / 1e9


def warm_clocks(seconds: float = 1.0) -> None:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t0 = time.time()
    while time.time() - t0 < seconds:
        a @ a
    torch.cuda.synchronize()


# ----------------------------------------------------------------------------- worlds


@dataclass
class World:
    case: Case
    q: torch.Tensor
    r: torch.Tensor
    rel_proj: torch.Tensor
    page: torch.Tensor
    kc: torch.Tensor
    vc: torch.Tensor
    positions: torch.Tensor
    table: torch.Tensor
    qsl: torch.Tensor
    sl: torch.Tensor
    qsl_cpu: torch.Tensor
    sl_cpu: torch.Tensor
    out: torch.Tensor

    @property
    def kv_bytes(self) -> int:
        """K and V bytes the queries must read (each visible key once per KV head)."""
        c = self.case
        keys = 0
        for ctx, t in c.mix:
            lo = 0 if c.window is None else max(0, ctx - c.window + 1)
            keys += ctx + t - lo
        return keys * c.hkv * DH * 2 * self.page.element_size()

    def kwargs(self) -> dict[str, Any]:
        return dict(scale=1.0 / DH, window=self.case.window,
                    log_scaling=LOG_SCALING if self.case.window is None else None)


def build(case: Case, seed: int = 0, device: str = "cuda") -> World:
    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(seed)
    n, hkv = case.n, case.hkv
    lens = [c + t for c, t in case.mix]
    per_req = [-(-length // n) for length in lens]
    nb = sum(per_req) + 1
    page = torch.empty((nb, hkv, n, 2 * DH), dtype=DT, device=dev)
    page.normal_(generator=g)
    kv = page.unflatten(-1, (2, DH)).transpose(1, 2)
    perm = torch.randperm(nb, generator=g, device=dev).to(torch.int32)
    width = max(per_req)
    table = torch.zeros(len(lens), width, dtype=torch.int32, device=dev)
    at = 0
    for i, cnt in enumerate(per_req):
        table[i, :cnt] = perm[at:at + cnt]
        at += cnt
    rows = sum(t for _, t in case.mix)
    total = rows + case.num_pad
    q = torch.randn(total, HQ, DH, generator=g, device=dev)
    q = (q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + 1e-6)).to(DT)
    r = torch.randn(total, HQ, DREL, generator=g, device=dev).to(DT)
    extent = case.window or EXTENT
    rel_proj = (torch.randn(DREL, extent, generator=g, device=dev) * 0.5).to(DT)
    starts = [0]
    for _, t in case.mix:
        starts.append(starts[-1] + t)
    pos = torch.cat([torch.arange(c, c + t) for c, t in case.mix] + [torch.zeros(case.num_pad, dtype=torch.int64)])
    qsl_cpu = torch.tensor(starts, dtype=torch.int32)
    sl_cpu = torch.tensor(lens, dtype=torch.int32)
    return World(case=case, q=q, r=r, rel_proj=rel_proj, page=page, kc=kv[..., 0, :], vc=kv[..., 1, :],
                 positions=pos.to(dev), table=table, qsl=qsl_cpu.to(dev), sl=sl_cpu.to(dev),
                 qsl_cpu=qsl_cpu, sl_cpu=sl_cpu, out=torch.empty_like(q))


# ----------------------------------------------------------------------------- ops


def triton_fn(w: World, config: Any, op: Callable[..., Any] | None = None) -> Callable[[], Any]:
    """``op``: another build of ``paged_rel_attention_triton`` (``--baseline``)."""
    max_len = int(w.sl_cpu.max())
    args = (w.q, w.r, w.rel_proj, w.kc, w.vc, w.positions, w.table, w.qsl, w.sl)
    kw = w.kwargs()
    run = op or paged_rel_attention_triton
    return lambda: run(*args, **kw, out=w.out, max_seq_len=max_len, config=config)


def load_baseline(module: str) -> Any:
    """``module.kernel`` of a copy of the op under another package name (e.g. the
    main branch's ``rel_attention`` copied to ``relattn_main`` on the PYTHONPATH)."""
    import importlib

    return importlib.import_module(f"{module}.kernel")


def torch_fn(w: World) -> Callable[[], Any]:
    args = (w.q, w.r, w.rel_proj, w.kc, w.vc, w.positions, w.table, w.qsl_cpu, w.sl_cpu)
    kw = w.kwargs()
    return lambda: paged_rel_attention(*args, **kw, out=w.out)


def _tau(pos: torch.Tensor, log_scaling: tuple[int, float] | None) -> torch.Tensor:
    if log_scaling is None:
        return torch.ones(pos.shape, dtype=torch.float32, device=pos.device)
    nf, alpha = log_scaling
    return 1.0 + alpha * torch.log(torch.clamp((pos.float() + 1.0) / nf, min=1.0))


_FLEX: Any = None


def flex_fn(w: World, mode: str, kernel_options: dict[str, Any] | None = None
            ) -> tuple[Callable[[], Any], Callable[[], torch.Tensor]]:
    """FlexAttention with the relative bias and tau as a score_mod.

    ``mode="paged"``: queries [R, Hq, max_qlen, Dh]; K/V are the *same physical
    pages* re-laid out as Flex needs them ([1, Hkv, num_blocks * N, Dh]: Flex reads
    a cache as one long sequence, while Inkling's page is [Hkv, N, 2*Dh], which no
    single stride can express); the block mask lists, per request and 128-query
    block, the physical pages (block size N) it may see (fully visible pages as
    full blocks), and the mask/score mods map a physical key index back to its
    logical position. ``mode="dense"``: K/V gathered per request to [R, Hkv, L, Dh]
    (outside the timing). The bias table ``rl = r @ rel_proj`` (fp32) is recomputed
    inside the timed call. Returns (timed fn, fn giving the output as [T, Hq, Dh])."""
    global _FLEX
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

    if _FLEX is None:
        _FLEX = torch.compile(flex_attention, dynamic=False)
    c = w.case
    dev = w.q.device
    n, hkv, nb = c.n, c.hkv, w.page.shape[0]
    reqs = len(c.mix)
    qlens = [t for _, t in c.mix]
    ctxs = [x for x, _ in c.mix]
    lens = [x + t for x, t in c.mix]
    ql = max(qlens)
    starts = w.qsl_cpu.tolist()
    extent = w.rel_proj.shape[1]
    window = c.window
    qf = torch.zeros(reqs, HQ, ql, DH, dtype=DT, device=dev)
    for b in range(reqs):
        qf[b, :, :qlens[b]] = w.q[starts[b]:starts[b + 1]].transpose(0, 1)
    rows = w.q.shape[0]
    rl = torch.empty(rows, HQ, extent, dtype=torch.float32, device=dev)
    tau = _tau(w.positions, w.kwargs()["log_scaling"])
    ctx_t = torch.tensor(ctxs, dtype=torch.int64, device=dev)
    qs_t = torch.tensor(starts[:-1], dtype=torch.int64, device=dev)
    qlen_t = torch.tensor(qlens, dtype=torch.int64, device=dev)
    r32, p32 = w.r.float(), w.rel_proj.float()

    def bias_of(b: Any, h: Any, q_idx: Any, logical: Any) -> Any:
        qpos = ctx_t[b] + q_idx
        d = qpos - logical
        row = qs_t[b] + torch.minimum(q_idx, qlen_t[b] - 1)
        bias = torch.where((d >= 0) & (d < extent), rl[row, h, torch.clamp(d, 0, extent - 1)], 0.0)
        return tau[row], bias

    if mode == "paged":
        kf = w.page[..., :DH].permute(1, 0, 2, 3).reshape(1, hkv, nb * n, DH).contiguous()
        vf = w.page[..., DH:].permute(1, 0, 2, 3).reshape(1, hkv, nb * n, DH).contiguous()
        table_cpu = w.table.cpu()
        p2l = torch.zeros(nb, dtype=torch.int64)  # int64 throughout: Flex indexes big caches in int64
        p2o = torch.full((nb,), -1, dtype=torch.int64)
        for b in range(reqs):
            cnt = -(-lens[b] // n)
            p2l[table_cpu[b, :cnt].long()] = torch.arange(cnt, dtype=torch.int64)
            p2o[table_cpu[b, :cnt].long()] = b
        p2l, p2o = p2l.to(dev), p2o.to(dev)
        qb = 128
        nqb = -(-ql // qb)
        maxp = nb  # BlockMask wants as many index columns as there are (physical) blocks
        kv_num = torch.zeros(reqs, 1, nqb, dtype=torch.int32)
        kv_idx = torch.zeros(reqs, 1, nqb, maxp, dtype=torch.int32)
        full_num = torch.zeros(reqs, 1, nqb, dtype=torch.int32)
        full_idx = torch.zeros(reqs, 1, nqb, maxp, dtype=torch.int32)
        for b in range(reqs):
            for i in range(nqb):
                if i * qb >= qlens[b]:
                    continue
                a = ctxs[b] + i * qb
                last = ctxs[b] + min((i + 1) * qb, qlens[b]) - 1
                lo_pos = 0 if window is None else max(0, a - window + 1)
                pages = list(range(lo_pos // n, last // n + 1))
                full_lo = 0 if window is None else last - window + 1
                full = [p for p in pages if p * n >= full_lo and p * n + n - 1 <= a]
                full_set = set(full)
                part = [p for p in pages if p not in full_set]
                kv_num[b, 0, i] = len(part)
                full_num[b, 0, i] = len(full)
                if part:
                    kv_idx[b, 0, i, :len(part)] = table_cpu[b, part]
                if full:
                    full_idx[b, 0, i, :len(full)] = table_cpu[b, full]

        def logical_of(kv_idx_: Any) -> Any:
            return p2l[kv_idx_ // n] * n + kv_idx_ % n

        def mask_mod(b: Any, h: Any, q_idx: Any, kv: Any) -> Any:
            logical = logical_of(kv)
            qpos = ctx_t[b] + q_idx
            ok = (logical <= qpos) & (p2o[kv // n] == b)
            if window is not None:
                ok = ok & (qpos - logical < window)
            return ok

        def score_mod(score: Any, b: Any, h: Any, q_idx: Any, kv: Any) -> Any:
            t, bias = bias_of(b, h, q_idx, logical_of(kv))
            return t * (score + bias)

        bm = BlockMask.from_kv_blocks(
            kv_num.to(dev), kv_idx.to(dev), full_num.to(dev), full_idx.to(dev),
            BLOCK_SIZE=(qb, n), mask_mod=mask_mod, seq_lengths=(ql, nb * n),
        )
    else:
        lmax = max(lens)
        kf = torch.zeros(reqs, hkv, lmax, DH, dtype=DT, device=dev)
        vf = torch.zeros_like(kf)
        for b in range(reqs):
            cnt = -(-lens[b] // n)
            blk = w.page[w.table[b, :cnt].long()]  # [cnt, Hkv, N, 2Dh]
            seq = blk.permute(1, 0, 2, 3).reshape(hkv, cnt * n, 2 * DH)[:, :lens[b]]
            kf[b, :, :lens[b]] = seq[..., :DH]
            vf[b, :, :lens[b]] = seq[..., DH:]
        len_t = torch.tensor(lens, dtype=torch.int64, device=dev)

        def mask_mod(b: Any, h: Any, q_idx: Any, kv: Any) -> Any:
            qpos = ctx_t[b] + q_idx
            ok = (kv <= qpos) & (kv < len_t[b])
            if window is not None:
                ok = ok & (qpos - kv < window)
            return ok

        def score_mod(score: Any, b: Any, h: Any, q_idx: Any, kv: Any) -> Any:
            t, bias = bias_of(b, h, q_idx, kv)
            return t * (score + bias)

        bm = create_block_mask(mask_mod, reqs, None, ql, lmax, device=dev)

    state: dict[str, torch.Tensor] = {}

    def run() -> None:
        torch.matmul(r32, p32, out=rl)
        state["o"] = _FLEX(qf, kf, vf, score_mod=score_mod, block_mask=bm, scale=1.0 / DH, enable_gqa=True,
                           kernel_options=kernel_options)

    def result() -> torch.Tensor:
        run()
        o = state["o"]
        got = torch.zeros_like(w.q)
        for b in range(reqs):
            got[starts[b]:starts[b + 1]] = o[b, :, :qlens[b]].transpose(0, 1)
        return got

    return run, result


# Flex (Inductor) indexes a K/V operand of 2^31 or more elements with int32 offsets
# and fails to compile it (torch 2.11); such caches are timed in parts.
FLEX_MAX_ELEMENTS = (1 << 31) - 1


def sub_world(w: World, b0: int, b1: int) -> World:
    """Requests ``b0 .. b1 - 1`` of ``w`` as a world of their own: their pages copied
    (same contents) into a cache of just those pages, the block table renumbered."""
    c = w.case
    dev = w.q.device
    per_req = [-(-(x + t) // c.n) for x, t in c.mix[b0:b1]]
    pages = torch.cat([w.table[b, :cnt].long() for b, cnt in zip(range(b0, b1), per_req)])
    page = torch.cat([w.page[pages], torch.zeros_like(w.page[:1])])  # + a spare page, as in build()
    kv = page.unflatten(-1, (2, DH)).transpose(1, 2)
    table = torch.zeros(b1 - b0, max(per_req), dtype=torch.int32, device=dev)
    at = 0
    for i, cnt in enumerate(per_req):
        table[i, :cnt] = torch.arange(at, at + cnt, dtype=torch.int32, device=dev)
        at += cnt
    starts = w.qsl_cpu.tolist()
    r0, r1 = starts[b0], starts[b1]
    qsl_cpu = w.qsl_cpu[b0:b1 + 1] - r0
    sl_cpu = w.sl_cpu[b0:b1].clone()
    sub = Case(f"{c.name} [{b0}:{b1}]", c.kind, c.mix[b0:b1], hkv=c.hkv, n=c.n, window=c.window)
    return World(case=sub, q=w.q[r0:r1], r=w.r[r0:r1], rel_proj=w.rel_proj, page=page, kc=kv[..., 0, :],
                 vc=kv[..., 1, :], positions=w.positions[r0:r1], table=table, qsl=qsl_cpu.to(dev),
                 sl=sl_cpu.to(dev), qsl_cpu=qsl_cpu, sl_cpu=sl_cpu, out=torch.empty_like(w.q[r0:r1]))


def flex_parts(w: World) -> int:
    """How many request groups Flex needs so that each group's re-laid-out K (and V)
    stays under ``FLEX_MAX_ELEMENTS`` (1: the whole batch at once)."""
    c = w.case
    per_req = [-(-(x + t) // c.n) * c.n * c.hkv * DH for x, t in c.mix]
    parts = 1
    while True:
        size = -(-len(per_req) // parts)
        groups = [per_req[i:i + size] for i in range(0, len(per_req), size)]
        if all(sum(g) + c.n * c.hkv * DH < FLEX_MAX_ELEMENTS for g in groups) or size == 1:
            return parts
        parts += 1


def flex_split_fn(w: World, parts: int, kernel_options: dict[str, Any] | None = None
                  ) -> tuple[Callable[[], Any], Callable[[], torch.Tensor]]:
    """Flex over ``parts`` request groups in turn (each its own paged cache of the
    same pages, see :func:`sub_world`): the timed call runs all of them."""
    reqs = len(w.case.mix)
    size = -(-reqs // parts)
    starts = w.qsl_cpu.tolist()
    subs = []
    for b0 in range(0, reqs, size):
        b1 = min(reqs, b0 + size)
        subs.append((starts[b0], starts[b1], flex_fn(sub_world(w, b0, b1), "paged", kernel_options)))

    def run() -> None:
        for _, _, (sub_run, _) in subs:
            sub_run()

    def result() -> torch.Tensor:
        got = torch.zeros_like(w.q)
        for r0, r1, (_, sub_result) in subs:
            got[r0:r1] = sub_result()
        return got

    return run, result


def sdpa_fn(w: World) -> tuple[Callable[[], Any], str]:
    """Plain SDPA (torch's fastest backend) without the bias, K/V gathered dense per
    request outside the timing: the floor. Requests of equal (context, rows) run as
    one batched call (lower-right causal mask when rows < keys)."""
    from torch.nn.attention.bias import causal_lower_right

    c = w.case
    dev = w.q.device
    groups: dict[tuple[int, int], list[int]] = {}
    for i, key in enumerate(c.mix):
        groups.setdefault(key, []).append(i)
    starts = w.qsl_cpu.tolist()
    calls = []
    for (ctx, qlen), idx in groups.items():
        length = ctx + qlen
        cnt = -(-length // c.n)
        kd = torch.empty(len(idx), c.hkv, length, DH, dtype=DT, device=dev)
        vd = torch.empty_like(kd)
        qd = torch.empty(len(idx), HQ, qlen, DH, dtype=DT, device=dev)
        for j, b in enumerate(idx):
            blk = w.page[w.table[b, :cnt].long()]
            seq = blk.permute(1, 0, 2, 3).reshape(c.hkv, cnt * c.n, 2 * DH)[:, :length]
            kd[j], vd[j] = seq[..., :DH], seq[..., DH:]
            qd[j] = w.q[starts[b]:starts[b] + qlen].transpose(0, 1)
        if qlen == 1:
            mask, causal = None, False
        elif qlen == length:
            mask, causal = None, True
        else:
            mask, causal = causal_lower_right(qlen, length), False
        calls.append((qd, kd, vd, mask, causal))

    from torch.nn.attention import SDPBackend, sdpa_kernel

    def make(backend: Any, expand: bool) -> Callable[[], Any]:
        group = HQ // c.hkv
        local = [(qd, kd.repeat_interleave(group, 1) if expand else kd,
                  vd.repeat_interleave(group, 1) if expand else vd, mask, causal)
                 for qd, kd, vd, mask, causal in calls]

        def run() -> None:
            with sdpa_kernel(backend):
                for qd, kd, vd, mask, causal in local:
                    F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask, is_causal=causal, scale=1.0 / DH,
                                                   enable_gqa=not expand)

        return run

    for name, backend, expand in (("flash", SDPBackend.FLASH_ATTENTION, False),
                                  ("cudnn", SDPBackend.CUDNN_ATTENTION, False),
                                  ("flash, K/V expanded to Hq", SDPBackend.FLASH_ATTENTION, True)):
        fn = make(backend, expand)
        try:
            fn()
            torch.cuda.synchronize()
            return fn, name
        except Exception as exc:  # noqa: BLE001
            print(f"    sdpa {name}: {type(exc).__name__}: {str(exc)[:150]}")
    raise RuntimeError("no SDPA backend ran")


# ----------------------------------------------------------------------------- main


def _err(got: torch.Tensor, want: torch.Tensor, rows: int) -> float:
    return (got[:rows].float() - want[:rows].float()).abs().max().item()


def run_case(case: Case, args: argparse.Namespace, t_start: float) -> dict[str, Any]:
    print(f"== {case.name}", flush=True)
    t_case = time.time()
    w = build(case)
    rows = sum(t for _, t in case.mix)
    res: dict[str, Any] = {"case": case.name, "kind": case.kind, "rows": rows, "hkv": case.hkv, "n": case.n,
                           "kv_bytes": w.kv_bytes}
    prob = check_paged_rel_attention_triton_args(
        w.q, w.r, w.rel_proj, w.kc, w.vc, w.positions, w.table, w.qsl, w.sl, 1.0 / DH, case.window,
        w.kwargs()["log_scaling"], None, 1 << 24)
    default = choose_rel_attention_config(prob, w.q.device, int(w.sl_cpu.max()))
    res["default_config"] = default.__dict__
    configs = {"default": default}
    sweep_ok = args.sweep_only is None or case.name in args.sweep_only.split("|")
    if not args.no_sweep and sweep_ok and time.time() - t_start < args.budget_s:
        configs = sweep_configs(case, default)
        if args.sweep_rows is not None:
            configs = {k: v for k, v in configs.items() if k == "default" or args.sweep_rows in k}
    want = None
    if not args.no_torch:
        try:
            want = torch_fn(w)().clone()
            res["torch_ms"] = time_eager(torch_fn(w), target_ms=1.0, samples=3)
            print(f"  torch path {res['torch_ms']:.3f} ms", flush=True)
        except Exception as exc:  # noqa: BLE001
            res["torch_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            print("  torch path failed:", res["torch_error"], flush=True)
    res["triton"] = {}
    if args.baseline:
        # before/after in the same run: the baseline build's default and ours,
        # alternating `rounds` times; the value is the median of the round medians
        base = load_baseline(args.baseline)
        bprob = base.check_paged_rel_attention_triton_args(
            w.q, w.r, w.rel_proj, w.kc, w.vc, w.positions, w.table, w.qsl, w.sl, 1.0 / DH, case.window,
            w.kwargs()["log_scaling"], None, 1 << 24)
        bcfg = base.choose_rel_attention_config(bprob, w.q.device, int(w.sl_cpu.max()))
        pair = {"baseline": (triton_fn(w, bcfg, base.paged_rel_attention_triton), bcfg),
                "default": (triton_fn(w, default), default)}
        rounds: dict[str, list[float]] = {"baseline": [], "default": []}
        errs: dict[str, Any] = {}
        try:
            for _ in range(args.rounds):
                for name, (fn, _cfg) in pair.items():
                    fn()
                    errs[name] = _err(w.out, want, rows) if want is not None else None
                    rounds[name].append(time_graph(fn)[0])
            for name, (_fn, cfg) in pair.items():
                res["triton"][name] = {"ms": statistics.median(rounds[name]), "rounds_ms": rounds[name],
                                       "timing": "graph", "max_err_vs_torch": errs[name], "config": cfg.__dict__}
                print(f"  triton {name:12s} {res['triton'][name]['ms']:.4f} ms  rounds "
                      f"{[round(x, 4) for x in rounds[name]]}  err {errs[name]}", flush=True)
            res["after_over_before"] = res["triton"]["default"]["ms"] / res["triton"]["baseline"]["ms"]
        except Exception as exc:  # noqa: BLE001
            res["baseline_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            print("  before/after failed:", res["baseline_error"], flush=True)
    for name, cfg in configs.items():
        if name in res["triton"]:
            continue
        try:
            fn = triton_fn(w, cfg)
            before = set(compiled_kernels())
            fn()
            built = {k[0]: kernel_info(v) for k, v in compiled_kernels().items() if k not in before}
            err = _err(w.out, want, rows) if want is not None else None
            ms, how = time_graph(fn)
            res["triton"][name] = {"ms": ms, "timing": how, "max_err_vs_torch": err, "config": cfg.__dict__,
                                   "kernels": built}
            print(f"  triton {name:12s} {ms:.4f} ms  err {err}  {built}", flush=True)
        except Exception as exc:  # noqa: BLE001
            res["triton"][name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            print(f"  triton {name} failed: {exc}", flush=True)
    ok = {k: v["ms"] for k, v in res["triton"].items() if "ms" in v and k != "baseline"}
    if args.retime_top and len(ok) > 1:
        # the fastest rows and the default again, alternating, `rounds` times: the
        # value becomes the median of all its timings (one sweep pass is noisy at 1-2 %)
        top = sorted(ok, key=ok.get)[:args.retime_top]
        names = list(dict.fromkeys((["default"] if "default" in ok else []) + top))
        fns = {k: triton_fn(w, configs[k]) for k in names}
        for _ in range(args.rounds):
            for k in names:
                res["triton"][k].setdefault("rounds_ms", [res["triton"][k]["ms"]]).append(time_graph(fns[k])[0])
        for k in names:
            res["triton"][k]["ms"] = ok[k] = statistics.median(res["triton"][k]["rounds_ms"])
            print(f"  retimed {k:24s} {ok[k]:.4f} ms  {[round(x, 4) for x in res['triton'][k]['rounds_ms']]}",
                  flush=True)
    if ok:
        res["triton_ms"] = ok.get("default", min(ok.values()))
        res["triton_best"] = min(ok, key=ok.get)
        res["triton_best_ms"] = ok[res["triton_best"]]
    try:
        if args.no_sdpa:
            raise RuntimeError("skipped (--no-sdpa)")
        fn, res["sdpa_backend"] = sdpa_fn(w)
        res["sdpa_ms"], res["sdpa_timing"] = time_graph(fn)
        print(f"  sdpa (no bias, {res['sdpa_backend']}) {res['sdpa_ms']:.4f} ms", flush=True)
        del fn
    except Exception as exc:  # noqa: BLE001
        res["sdpa_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        print("  sdpa failed:", res["sdpa_error"], flush=True)
    if not args.no_flex:
        parts = flex_parts(w)
        if parts > 1:  # too large for one Flex call: the same paged cache in parts
            attempts = [(f"paged, {parts} parts", None)]
        else:
            attempts = [("paged", None), ("paged", {"BLOCK_N": min(64, case.n), "BLOCK_M": 64}), ("dense", None)]
        for mode, opts in attempts:
            tag = mode if opts is None else f"{mode} {opts}"
            try:
                t0 = time.time()
                if parts > 1:
                    run, result = flex_split_fn(w, parts, opts)
                else:
                    run, result = flex_fn(w, mode, opts)
                got = result()
                res["flex_compile_s"] = time.time() - t0
                res["flex_err_vs_torch"] = _err(got, want, rows) if want is not None else None
                res["flex_ms"], res["flex_timing"] = time_graph(run)
                res["flex_mode"] = tag
                print(f"  flex ({tag}) {res['flex_ms']:.4f} ms  err {res['flex_err_vs_torch']}", flush=True)
                break
            except Exception as exc:  # noqa: BLE001
                res[f"flex_error {tag}"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                print(f"  flex {tag} failed:", res[f"flex_error {tag}"], flush=True)
                traceback.print_exc(limit=2)
    res["case_wall_s"] = time.time() - t_case
    print(f"  ({res['case_wall_s']:.0f} s)", flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="rel_attention_bench.json")
    ap.add_argument("--md", default="rel_attention_bench.md")
    ap.add_argument("--only", default=None, help="run the cases whose names contain one of these ('|'-separated)")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--budget-s", type=float, default=480.0, help="skip sweeps once this much time has passed")
    ap.add_argument("--sweep-only", default=None, help="sweep tilings only in these cases (names ('|'-separated)")
    ap.add_argument("--sweep-rows", default=None,
                    help="time only the default and the sweep rows whose names contain this (e.g. 'diag')")
    ap.add_argument("--no-sdpa", action="store_true")
    ap.add_argument("--baseline", default=None,
                    help="package holding another build of the op (its .kernel module), timed against ours")
    ap.add_argument("--rounds", type=int, default=2,
                    help="alternating rounds (--baseline before/after, --retime-top)")
    ap.add_argument("--retime-top", type=int, default=0,
                    help="after a sweep, time the default and this many fastest rows again, alternating")
    args = ap.parse_args()
    t_start = time.time()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch._dynamo.config.cache_size_limit = 64
    props = torch.cuda.get_device_properties(0)
    import triton

    meta: dict[str, Any] = {
        "device": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
        "triton": triton.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "command": " ".join(sys.argv),
    }
    try:
        meta["driver"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception:  # noqa: BLE001
        meta["driver"] = "?"
    print(meta, flush=True)
    warm_clocks()
    meta["copy_gbs_start"] = copy_bandwidth()
    print(f"copy baseline {meta['copy_gbs_start']:.0f} GB/s", flush=True)
    results: list[dict[str, Any]] = []

    def dump() -> None:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)
        with open(args.md, "w") as f:
            f.write(render(meta, results))

    for case in CASES:
        if args.only and not any(part in case.name for part in args.only.split("|")):
            continue
        results.append(run_case(case, args, t_start))
        torch.cuda.empty_cache()
        dump()
    meta["copy_gbs_end"] = copy_bandwidth()
    meta["wall_s"] = time.time() - t_start
    dump()
    print(render(meta, results))


def _f(x: Any, fmt: str = "{:.3f}") -> str:
    return "n/a" if x is None else fmt.format(x)


def render(meta: dict[str, Any], results: list[dict[str, Any]]) -> str:
    copy = meta.get("copy_gbs_start")
    lines = [
        "| case | Triton (default) ms | best config (ms) | PyTorch path ms | FlexAttention ms | SDPA no bias ms "
        "| vs torch | vs Flex | / SDPA | K/V GB/s | share of copy |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        t = r.get("triton_ms")
        gbs = r["kv_bytes"] / (t * 1e-3) / 1e9 if t else None
        share = gbs / copy if gbs and copy else None
        best = f"{r.get('triton_best')} ({_f(r.get('triton_best_ms'), '{:.4f}')})"
        lines.append(
            f"| {r['case']} | {_f(t, '{:.4f}')} | {best} | {_f(r.get('torch_ms'))} | "
            f"{_f(r.get('flex_ms'), '{:.4f}')} | {_f(r.get('sdpa_ms'), '{:.4f}')} | "
            f"{_f(r['torch_ms'] / t if t and r.get('torch_ms') else None, '{:.1f}x')} | "
            f"{_f(r['flex_ms'] / t if t and r.get('flex_ms') else None, '{:.2f}x')} | "
            f"{_f(t / r['sdpa_ms'] if t and r.get('sdpa_ms') else None, '{:.2f}x')} | "
            f"{_f(gbs, '{:.0f}')} | {_f(share, '{:.2f}')} |"
        )
    if any("baseline" in r.get("triton", {}) for r in results):
        lines += ["", "| case | before (baseline) ms | after (default) ms | after / before | after share of copy "
                  "| before rounds | after rounds |", "|---|---|---|---|---|---|---|"]
        for r in results:
            b, a = r["triton"].get("baseline", {}), r["triton"].get("default", {})
            if "ms" not in b or "ms" not in a:
                continue
            share = r["kv_bytes"] / (a["ms"] * 1e-3) / 1e9 / copy if copy else None
            lines.append(f"| {r['case']} | {b['ms']:.4f} | {a['ms']:.4f} | {a['ms'] / b['ms']:.3f} | "
                         f"{_f(share, '{:.2f}')} | {b.get('rounds_ms')} | {a.get('rounds_ms')} |")
    lines += ["", "All timed tilings (ms):", ""]
    for r in results:
        rows_ = ", ".join(f"{k} {v['ms']:.4f}" for k, v in r.get("triton", {}).items() if "ms" in v)
        lines.append(f"- {r['case']}: {rows_}")
    head = [f"- {k}: {v}" for k, v in meta.items()]
    return "\n".join(head) + "\n\n" + "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

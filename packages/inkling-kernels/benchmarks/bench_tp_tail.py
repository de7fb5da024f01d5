"""Where the RMSNorm goes at TP > 1: the sublayer tail on a sharded residual stream,
timed with real collectives on two GPUs.

At TP > 1 the served model (``inkling_vllm.model``) keeps the residual stream sharded
by hidden columns. After a row-parallel sublayer (o_proj, the MLP's down_proj) each
rank holds a partial sum of the full row; the tail that follows is

* **A (served until 2026-12-01)** -- reduce-scatter the partial (each rank: its ``hidden/tp``
  columns, summed), ``fused_sconv_add`` on the shard (conv + residual add, slot store,
  one launch), all-gather the new residual shard into the full row, RMSNorm of the
  full row on every rank (the next column-parallel GEMM reads the full normed row).
* **B (norm on the shard)** -- the same reduce-scatter and conv + add, the shard's
  sum of squares per row, an all-reduce of those ``T`` floats, the shard normalised
  with the full row's statistic, all-gather of the *normed* shard. The norm's
  elementwise work is split over the ranks instead of repeated by each; the price is
  a third collective (tiny, latency-bound).

B is timed two ways, bracketing what a kernel that emits the partial sums of squares
with the conv + add would cost: **B lower bound** (the sums of squares cost nothing:
the all-reduce moves a preallocated ``[T]`` buffer, the shard scale reads it) and **B
unfused** (a separate compiled sum-of-squares kernel on the new shard). If the lower
bound is not faster than A, no kernel change can make B win.

The all-gather along the last dimension is done as vLLM's ``all_gather(dim=-1)``
does it: gather into ``[tp, T, shard]``, then lay the rows out as ``[T, hidden]``
(one copy); the reduce-scatter likewise (transpose, reduce-scatter, transpose back).
Both schemes do the same reduce-scatter. **served** is the tail as inkling_vllm.model
runs it since: A with the reduce-scatter of the column blocks laid out as row blocks,
the all-gather along dim 0 and ``gathered_rms_norm`` reading the pieces. The norms are the faster of a
torch.compile'd RMSNorm and ``F.rms_norm`` (A: full row; B: the compiled shard scale).
Collectives: torch.distributed's NCCL backend, captured in the CUDA graph.

Shapes: the 975B model, hidden 6144, a global layer's ATTN stream (head dim 128),
bf16, at the tp of the run (2 on a two-GPU machine: shard 3072); steps of
bench_sconv_kv.STEPS (decode 1/64/256, spec 64x4, prefill 8192, mixed 2048+255).
Timing: bench_sconv.time_graph (several input sets per graph, median of replays) on
every rank; a case's figure is the slower rank's. Correctness first (set 0): both
schemes' normed full rows against rms_norm_ref of the all-gathered new residual,
and the new residual shard against fused_sconv_ref + add.

    PYTHONPATH=packages/inkling-kernels/src:packages/inkling-cache/src \\
        python3 packages/inkling-kernels/benchmarks/bench_tp_tail.py --json tail.json --md tail.md
    ... --dry-run   # CPU, gloo, TRITON_INTERPRET=1, tiny shapes, every path, no timing
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import pathlib
import platform
import sys
import time
import traceback
from typing import Any, Callable

DRY = "--dry-run" in sys.argv
if DRY:  # before Triton is imported
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ["INKLING_KERNELS_CPU_BACKEND"] = "triton"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_layer import DRY_STEPS, EPS, HEAD_DIM, HIDDEN, Layer, LayerShape, dry_time, norm_impls  # noqa: E402
from bench_sconv import DTYPE, N, W, copy_baseline, time_graph  # noqa: E402
from bench_sconv_add_rmsnorm import ulp_stats  # noqa: E402
from bench_sconv_kv import STEPS  # noqa: E402

from inkling_cache import ConvStateLayout  # noqa: E402
from inkling_kernels import fused_sconv_add, fused_sconv_ref, gathered_rms_norm  # noqa: E402
from inkling_kernels.sconv_add_rmsnorm import rms_norm_ref  # noqa: E402

TOL_ULP_NORMED = 8.01 if DRY else 4.01


def shape_for(tp: int) -> LayerShape:
    kv_heads, hidden, q_heads = (2, 256, 2) if DRY else (8, HIDDEN, 64)
    layout = ConvStateLayout.build(num_kv_heads=kv_heads, head_dim=HEAD_DIM, hidden_size=hidden,
                                   kernel_size=W, tp_size=tp, block_size=N)
    return LayerShape("global", layout, q_heads // tp)


class Comm:
    """The three collectives of the tails, along the last dimension as vLLM does them."""

    def __init__(self, tp: int) -> None:
        self.tp = tp

    def reduce_scatter(self, x: torch.Tensor) -> torch.Tensor:
        """[T, hidden] partial sums -> [T, hidden/tp] this rank's columns, summed."""
        if DRY:  # gloo has no reduce_scatter_tensor: all-reduce, keep this rank's columns
            y = x.clone()
            dist.all_reduce(y)
            return y.chunk(self.tp, dim=-1)[dist.get_rank()].contiguous()
        src = x.t().contiguous()  # [hidden, T]: the shards are row blocks
        out = torch.empty(x.shape[1] // self.tp, x.shape[0], dtype=x.dtype, device=x.device)
        dist.reduce_scatter_tensor(out, src)
        return out.t().contiguous()

    def reduce_scatter_blocks(self, x: torch.Tensor) -> torch.Tensor:
        """The same result with the column blocks laid out as row blocks first (one
        copy of contiguous ``shard``-wide runs, not an element transpose) and no copy
        after: reduce-scatter along dim 0 of ``[tp * T, shard]`` returns ``[T, shard]``."""
        t, h = x.shape
        blocks = x.view(t, self.tp, h // self.tp).transpose(0, 1).reshape(self.tp * t, h // self.tp)
        if DRY:
            y = blocks.clone()
            dist.all_reduce(y)
            return y[dist.get_rank() * t:(dist.get_rank() + 1) * t].contiguous()
        out = torch.empty(t, h // self.tp, dtype=x.dtype, device=x.device)
        dist.reduce_scatter_tensor(out, blocks)
        return out

    def all_gather_pieces(self, x: torch.Tensor) -> torch.Tensor:
        """[T, shard] -> [tp, T, shard]: the all-gather along dim 0, no copy after it."""
        out = torch.empty(self.tp, *x.shape, dtype=x.dtype, device=x.device)
        if DRY:
            dist.all_gather(list(out.unbind(0)), x)
        else:
            dist.all_gather_into_tensor(out, x)
        return out

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """[T, shard] -> [T, shard * tp] (rank order; one layout copy, as vLLM's dim=-1)."""
        return self.all_gather_pieces(x).permute(1, 0, 2).reshape(x.shape[0], -1)

    @staticmethod
    def all_reduce(x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x)
        return x


@triton.jit
def _scale_kernel(x_ptr, ss_ptr, w_ptr, out_ptr, T, C, inv_hidden, eps,
                  BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    m = (rows < T)[:, None] & (cols < C)[None, :]
    offs = rows.to(tl.int64)[:, None] * C + cols[None, :]
    x = tl.load(x_ptr + offs, mask=m, other=0.0)
    rstd = 1.0 / tl.sqrt_rn(tl.load(ss_ptr + rows, mask=rows < T, other=1.0) * inv_hidden + eps)
    y = (x.to(tl.float32) * rstd[:, None]).to(x.dtype).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < C, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, (w[None, :] * y).to(x.dtype), mask=m)


def scale_triton(x: torch.Tensor, sumsq: torch.Tensor, w: torch.Tensor, hidden: int) -> torch.Tensor:
    """The shard's RMSNorm with the full row's sum of squares: one Triton kernel."""
    t, c = x.shape
    out = torch.empty_like(x)
    bt, bc = (1, 1024) if t < 512 else (8, 512)
    _scale_kernel[(triton.cdiv(t, bt), triton.cdiv(c, bc))](x, sumsq, w, out, t, c, 1.0 / hidden, EPS,
                                                             BLOCK_T=bt, BLOCK_C=bc, num_warps=4)
    return out


def _sumsq(x: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return (xf * xf).sum(-1)


def _scale(x: torch.Tensor, sumsq: torch.Tensor, w: torch.Tensor, hidden: int) -> torch.Tensor:
    """The shard's RMSNorm with the full row's sum of squares (rms_norm_ref's rounding)."""
    y = (x.float() * torch.rsqrt(sumsq[:, None] / hidden + EPS)).to(x.dtype)
    return (w.float() * y.float()).to(x.dtype)


class Tails:
    def __init__(self, lay: Layer, comm: Comm, norm: Callable[..., Any], sumsq: Callable[..., Any],
                 scale: Callable[..., Any]) -> None:
        self.lay, self.comm, self.norm, self.sumsq_fn, self.scale_fn = lay, comm, norm, sumsq, scale
        rank, tp = dist.get_rank(), comm.tp
        self.shard_cols = slice(rank * lay.shape.shard, (rank + 1) * lay.shape.shard)
        dist.broadcast(lay.nw_attn, 0)  # one norm weight for the whole row on every rank
        self.nw_shard = lay.nw_attn[self.shard_cols].contiguous()
        gen = torch.Generator(device="cpu").manual_seed(1234 + rank)
        dev = lay.cache.device
        # per set: this rank's partial sum of the o_proj output (the reduce-scatter's input)
        self.partial = [(torch.randn(s.hidden.shape[0], lay.shape.hidden, generator=gen) / tp).to(DTYPE).to(dev)
                        for s in lay.sets]
        self.ss_buf = [torch.ones(s.hidden.shape[0], dtype=torch.float32, device=dev) for s in lay.sets]
        # per-chunk partial sums (a kernel without a cross-program reduction would emit [T, 16])
        self.ss_wide = [torch.ones(s.hidden.shape[0], 16, dtype=torch.float32, device=dev) for s in lay.sets]
        self.symm: list[torch.Tensor] | None = None
        self.symm_error = None
        if not DRY:  # a one-shot all-reduce over symmetric memory (NVLink loads), where torch has it
            try:
                import torch.distributed._symmetric_memory as symm_mem

                self.group_name = dist.group.WORLD.group_name
                self.symm = []
                for s in lay.sets:
                    buf = symm_mem.empty(s.hidden.shape[0], dtype=torch.float32, device=dev)
                    buf.fill_(1.0)
                    symm_mem.rendezvous(buf, self.group_name)
                    self.symm.append(buf)
                torch.ops.symm_mem.one_shot_all_reduce(self.symm[0], "sum", self.group_name)
                torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 -- reported; NCCL variants remain
                self.symm, self.symm_error = None, repr(exc)[:300]
        self.hidden_size = lay.shape.hidden

    def conv_add(self, i: int, cache: torch.Tensor, blocks: bool = False) -> torch.Tensor:
        lay, s = self.lay, self.lay.sets[i]
        d = (self.comm.reduce_scatter_blocks if blocks else self.comm.reduce_scatter)(self.partial[i])
        return fused_sconv_add(s.hidden, d, lay.w_attn, cache, s.mapped, lay.a_off, lay.hph)

    def a(self, i: int, cache: torch.Tensor, blocks: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        new_h = self.conv_add(i, cache, blocks)
        return new_h, self.norm(self.comm.all_gather(new_h), self.lay.nw_attn)

    def served(self, i: int, cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A as inkling_vllm.model runs it now: block reduce-scatter, conv + add, the
        all-gather along dim 0 and gathered_rms_norm of the pieces."""
        new_h = self.conv_add(i, cache, True)
        return new_h, gathered_rms_norm(self.comm.all_gather_pieces(new_h), self.lay.nw_attn, EPS)

    def b(self, i: int, cache: torch.Tensor, lower_bound: bool, symm: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        new_h = self.conv_add(i, cache)
        if symm:
            assert self.symm is not None
            ss = torch.ops.symm_mem.one_shot_all_reduce(self.symm[i], "sum", self.group_name)
        else:
            ss = self.ss_buf[i] if lower_bound else self.sumsq_fn(new_h)
            ss = self.comm.all_reduce(ss)
        return new_h, self.comm.all_gather(self.scale_fn(new_h, ss, self.nw_shard, self.hidden_size))

    # pieces
    def piece_rs(self, i: int) -> torch.Tensor:
        return self.comm.reduce_scatter(self.partial[i])

    def piece_rs_blocks(self, i: int) -> torch.Tensor:
        return self.comm.reduce_scatter_blocks(self.partial[i])

    def piece_ag(self, i: int) -> torch.Tensor:
        return self.comm.all_gather(self.lay.sets[i].hidden)

    def piece_ar(self, i: int) -> torch.Tensor:
        return self.comm.all_reduce(self.ss_buf[i])

    def piece_ar_wide(self, i: int) -> torch.Tensor:
        return self.comm.all_reduce(self.ss_wide[i])

    def piece_ar_symm(self, i: int) -> torch.Tensor:
        assert self.symm is not None
        return torch.ops.symm_mem.one_shot_all_reduce(self.symm[i], "sum", self.group_name)

    def piece_norm_full(self, i: int) -> torch.Tensor:
        return self.norm(self.lay.sets[i].gathered_attn, self.lay.nw_attn)

    def piece_scale(self, i: int) -> torch.Tensor:
        return self.scale_fn(self.lay.sets[i].hidden, self.ss_buf[i], self.nw_shard, self.hidden_size)

    def piece_sumsq(self, i: int) -> torch.Tensor:
        return self.sumsq_fn(self.lay.sets[i].hidden)

    def piece_conv_add(self, i: int, cache: torch.Tensor) -> torch.Tensor:
        lay, s = self.lay, self.lay.sets[i]
        return fused_sconv_add(s.hidden, s.d_attn, lay.w_attn, cache, s.mapped, lay.a_off, lay.hph)

    def check(self) -> dict[str, Any]:
        """Set 0: A and B (unfused sums of squares) against the references."""
        lay, s = self.lay, self.lay.sets[0]
        d = self.comm.reduce_scatter(self.partial[0])
        cache_ref = lay.cache.clone()
        want_h = (s.hidden.float() + fused_sconv_ref(d, lay.w_attn, cache_ref, s.batch, lay.a_off,
                                                      lay.hph).float()).to(DTYPE)
        want_n = rms_norm_ref(self.comm.all_gather(want_h), lay.nw_attn, EPS)
        res: dict[str, Any] = {}
        for name, fn in (("A", lambda c: self.a(0, c)), ("B", lambda c: self.b(0, c, False)),
                         ("A blocks", lambda c: self.a(0, c, True)), ("served", lambda c: self.served(0, c))):
            cache = lay.cache.clone()
            h, n = fn(cache)
            u_h, u_n = ulp_stats(h, want_h)[1], ulp_stats(n, want_n)[1]
            ok = torch.equal(cache, cache_ref) and u_h <= 2.01 * (2 if DRY else 1) and u_n <= TOL_ULP_NORMED
            res[name] = dict(ok=bool(ok), new_hidden_ulp=round(u_h, 3), normed_ulp=round(u_n, 3),
                             cache_exact=bool(torch.equal(cache, cache_ref)))
        return res


def run_case(step: str, requests: list[tuple[int, int]], tp: int, reps: int, gen: torch.Generator,
             impls: dict[str, Any]) -> dict[str, Any]:
    timer = dry_time if DRY else time_graph
    shape = shape_for(tp)
    t = sum(n for _, n in requests)
    per_set = t * shape.hidden * DTYPE.itemsize * 6  # partial, gathered rows, shard tensors
    num_sets = 1 if DRY else max(2, min(16, math.ceil(256e6 / per_set)))
    lay = Layer(shape, requests, num_sets, gen, None)
    comm = Comm(tp)
    res: dict[str, Any] = dict(step=step, T=t, tp=tp, shard=shape.shard, hidden=shape.hidden, sets=num_sets)
    best_norm, best_us = None, math.inf
    tails = None
    for nname, nfn in impls["norm"].items():  # A's full-row norm: the faster implementation
        tails = Tails(lay, comm, nfn, impls["sumsq"], impls["scale"])
        us = timer([lambda i=i: tails.piece_norm_full(i) for i in range(num_sets)], reps)
        res[f"norm_full_{nname}_us"] = us
        if best_norm is None or us < best_us:
            best_norm, best_us = nname, us
    res["norm_impl"] = best_norm
    best_scale, best_us = None, math.inf
    for sname, sfn in impls["scale"].items():  # B's shard scale: the faster implementation
        tails = Tails(lay, comm, impls["norm"][best_norm], impls["sumsq"], sfn)
        us = timer([lambda i=i: tails.piece_scale(i) for i in range(num_sets)], reps)
        res[f"scale_{sname}_us"] = us
        if best_scale is None or us < best_us:
            best_scale, best_us = sname, us
    res["scale_impl"] = best_scale
    tails = Tails(lay, comm, impls["norm"][best_norm], impls["sumsq"], impls["scale"][best_scale])
    res["symm_error"] = tails.symm_error
    res["check"] = tails.check()
    cache = lay.cache
    sets = range(num_sets)

    def each(f: Callable[[int], Any]) -> list[Callable[[], Any]]:
        return [lambda i=i: f(i) for i in sets]

    res["A_us"] = timer(each(lambda i: tails.a(i, cache)), reps)
    res["A_blocks_us"] = timer(each(lambda i: tails.a(i, cache, True)), reps)
    res["served_us"] = timer(each(lambda i: tails.served(i, cache)), reps)
    res["B_lower_us"] = timer(each(lambda i: tails.b(i, cache, True)), reps)
    res["B_unfused_us"] = timer(each(lambda i: tails.b(i, cache, False)), reps)
    if tails.symm is not None:
        try:
            res["B_lower_symm_us"] = timer(each(lambda i: tails.b(i, cache, True, symm=True)), reps)
            res["piece_ar_symm_us"] = timer(each(tails.piece_ar_symm), reps)
        except Exception as exc:  # noqa: BLE001
            res["symm_error"] = repr(exc)[:300]
    for name in ("rs", "rs_blocks", "ag", "ar", "ar_wide", "norm_full", "scale", "sumsq"):
        res[f"piece_{name}_us"] = timer(each(getattr(tails, f"piece_{name}")), reps)
    res["piece_conv_add_us"] = timer(each(lambda i: tails.piece_conv_add(i, cache)), reps)
    res["B_lower_over_A"] = res["B_lower_us"] / res["A_us"]
    res["B_unfused_over_A"] = res["B_unfused_us"] / res["A_us"]
    return res


def worker(rank: int, tp: int, args: argparse.Namespace, port: int) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    if not DRY:
        torch.cuda.set_device(rank)
    dist.init_process_group("gloo" if DRY else "nccl", rank=rank, world_size=tp,
                            device_id=None if DRY else torch.device("cuda", rank))
    dev = "cpu" if DRY else "cuda"
    warm = torch.ones(8, device=dev)
    dist.all_reduce(warm)  # the communicator exists before any capture
    add_norm, norm, notes = norm_impls(not DRY)
    del add_norm
    if DRY:
        sumsq, scale = _sumsq, {"triton": scale_triton, "eager": _scale}  # check the kernel
    else:
        sumsq = torch.compile(_sumsq, dynamic=True)
        scale = {"compiled": torch.compile(_scale, dynamic=True), "triton": scale_triton}
    impls = dict(norm=norm, sumsq=sumsq, scale=scale)
    results: dict[str, Any] = dict(notes=notes, cases=[])
    if rank == 0 and not DRY:
        results["copy_baseline"] = copy_baseline()
    gen = torch.Generator(device="cpu").manual_seed(2026)
    t0 = time.time()
    steps = DRY_STEPS if DRY else STEPS
    for step, requests in steps:
        if args.only and args.only not in step:
            continue
        if time.time() - t0 > args.budget_s:
            results["cases"].append(dict(step=step, skipped=f"budget {args.budget_s} s spent"))
            continue
        try:
            r = run_case(step, requests, tp, args.reps, gen, impls)
        except Exception as exc:  # noqa: BLE001 -- reported, the next case runs
            r = dict(step=step, error=repr(exc)[:500], trace=traceback.format_exc()[-2000:])
        mine = [None] * tp
        dist.all_gather_object(mine, r)
        if rank == 0:
            merged = dict(mine[0])
            for k, v in mine[0].items():  # a time is the slower rank's
                if k.endswith("_us") and isinstance(v, float):
                    merged[k] = max(m[k] for m in mine if isinstance(m.get(k), float))
                    merged[k + "_ranks"] = [m.get(k) for m in mine]
            if "A_us" in merged and isinstance(merged["A_us"], float):
                merged["B_lower_over_A"] = merged["B_lower_us"] / merged["A_us"]
                merged["B_unfused_over_A"] = merged["B_unfused_us"] / merged["A_us"]
            merged["check_ranks"] = [m.get("check") for m in mine]
            results["cases"].append(merged)
            print(f"[{time.time() - t0:6.1f}s] {step}: " + (
                f"A {merged['A_us']:.2f} µs, B lower {merged['B_lower_us']:.2f}, B unfused "
                f"{merged['B_unfused_us']:.2f}, check {merged['check_ranks']}" if "A_us" in merged
                else str(merged.get("error"))), flush=True)
    if rank == 0:
        results["meta"] = dict(
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), tp=tp,
            torch=torch.__version__, python=platform.python_version(),
            device=None if DRY else torch.cuda.get_device_name(0),
            nccl=None if DRY else ".".join(map(str, torch.cuda.nccl.version())),
            command=" ".join(sys.argv))
        if args.json:
            pathlib.Path(args.json).write_text(json.dumps(results, indent=1, default=str))
        if args.md:
            pathlib.Path(args.md).write_text(markdown(results))
        print(markdown(results), flush=True)
    dist.destroy_process_group()


def markdown(results: dict[str, Any]) -> str:
    lines = ["| step | T | A µs | A, block RS µs | served µs | B lower µs | B unfused µs | B lower / A | B lower, symm AR µs | RS | conv+add | AG | "
             "AR | AR [T,16] | AR symm | norm full | scale shard | sumsq | RS blocks | check |", "|" + "---|" * 20]

    def f(v: Any) -> str:
        return f"{v:.2f}" if isinstance(v, float) and v == v else "-"

    for c in results["cases"]:
        if "A_us" not in c:
            lines.append(f"| {c['step']} | | {c.get('error') or c.get('skipped')} |" + " |" * 17)
            continue
        ok = all(all(v["ok"] for v in r.values()) for r in c["check_ranks"])
        lines.append(
            f"| {c['step']} | {c['T']} | {f(c['A_us'])} | {f(c['A_blocks_us'])} | {f(c['served_us'])} | {f(c['B_lower_us'])} | {f(c['B_unfused_us'])} | "
            f"{c['B_lower_over_A']:.3f} | {f(c.get('B_lower_symm_us'))} | {f(c['piece_rs_us'])} | "
            f"{f(c['piece_conv_add_us'])} | {f(c['piece_ag_us'])} | {f(c['piece_ar_us'])} | "
            f"{f(c['piece_ar_wide_us'])} | {f(c.get('piece_ar_symm_us'))} | {f(c['piece_norm_full_us'])} | "
            f"{f(c['piece_scale_us'])} | {f(c['piece_sumsq_us'])} | {f(c['piece_rs_blocks_us'])} | "
            f"{'ok' if ok else 'FAIL'} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="CPU, gloo, interpreted Triton, tiny shapes")
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--only", default="", help="substring of the step names to run")
    p.add_argument("--budget-s", type=float, default=300.0, help="start no new case after this many seconds")
    p.add_argument("--json", default="")
    p.add_argument("--md", default="")
    args = p.parse_args()
    if not DRY and torch.cuda.device_count() < args.tp:
        print(f"needs {args.tp} GPUs, found {torch.cuda.device_count()}", file=sys.stderr)
        return 2
    port = 29500 + os.getpid() % 1000
    mp.spawn(worker, args=(args.tp, args, port), nprocs=args.tp, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

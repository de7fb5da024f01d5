"""gathered_rms_norm against what it replaces in the served model at tp > 1.

After a sublayer's conv + residual add on the hidden shard, each rank all-gathers the
new residual shards and RMSNorms the whole rows. Before: the all-gather along the last
dimension (vLLM's ``all_gather(dim=-1)``: gather into ``[tp, T, S]``, then one copy
into the row layout ``[T, tp * S]``) and the RMSNorm of the rows (stand-in for vLLM's
fused CUDA RMSNorm: the faster of ``F.rms_norm`` and a torch.compile'd RMSNorm, both
timed). After: the all-gather along dim 0 (no copy) and ``gathered_rms_norm`` reading
the ``[tp, T, S]`` pieces. The collective is the same on both sides and not timed here
(one GPU); the pieces are random ``[tp, T, 6144 / tp]`` bf16.

Correctness first: every timed output against ``gathered_rms_norm_ref`` (bf16, within
two rounding steps: the normalised value and the product are each rounded). Timing: bench_sconv.time_graph over
several input sets (median of replays, µs). Minimum bytes: read the pieces, write the
rows (``2 T 6144`` bf16); "of copy" against the events-timed copy baseline of the run.

    PYTHONPATH=packages/inkling-kernels/src:packages/inkling-cache/src \\
        python3 packages/inkling-kernels/benchmarks/bench_gathered_norm.py --json norm.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import sys
from typing import Any, Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_sconv import copy_baseline, time_graph  # noqa: E402
from bench_sconv_kv import STEPS  # noqa: E402

from inkling_kernels import gathered_rms_norm, gathered_rms_norm_ref  # noqa: E402
from inkling_kernels.gathered_rmsnorm.kernel import GatheredNormConfig, launch_gathered_rms_norm  # noqa: E402

HIDDEN, EPS = 6144, 1e-5


def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype)


def rows_of(p: torch.Tensor) -> torch.Tensor:
    """vLLM's all_gather(dim=-1) after the collective: [tp, T, S] -> [T, tp * S] (a copy)."""
    return p.movedim(0, 1).reshape(p.shape[1], -1)


def steps(got: torch.Tensor, want: torch.Tensor) -> float:
    unit = torch.finfo(want.dtype).eps * want.float().abs().clamp_min(1e-3)
    return float(((got.float() - want.float()).abs() / unit).max())


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--json", default="")
    p.add_argument("--reps", type=int, default=30)
    args = p.parse_args()
    compiled = torch.compile(_rms, dynamic=True)
    befores: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
        "copy + F.rms_norm": lambda x, w: F.rms_norm(rows_of(x), (HIDDEN,), w, EPS),
        "copy + compiled": lambda x, w: compiled(rows_of(x), w),
    }
    configs = {"default": None, "1x1024/4w": GatheredNormConfig(1, 1024, 4), "2x1024/8w": GatheredNormConfig(2, 1024, 8),
               "4x512/8w": GatheredNormConfig(4, 512, 8), "1x512/2w": GatheredNormConfig(1, 512, 2),
               "1x2048/8w": GatheredNormConfig(1, 2048, 8), "1x256/1w": GatheredNormConfig(1, 256, 1),
               "1x512/1w": GatheredNormConfig(1, 512, 1), "1x256/2w": GatheredNormConfig(1, 256, 2), "1x2048/4w": GatheredNormConfig(1, 2048, 4)}
    base = copy_baseline()
    res: dict[str, Any] = dict(device=torch.cuda.get_device_name(0), torch=torch.__version__,
                               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                               copy_GBps=base["GBps"], rows=[])
    print(f"copy baseline {base['GBps']:.0f} GB/s", flush=True)
    for tp in (2, 8):
        for step, reqs in STEPS:
            t = sum(n for _, n in reqs)
            nbytes = 2 * t * HIDDEN * 2
            sets = max(2, min(16, int(256e6 // nbytes) + 1))
            xs = [(2 * torch.randn(tp, t, HIDDEN // tp, device="cuda")).to(torch.bfloat16) for _ in range(sets)]
            w = (1 + 0.2 * torch.randn(HIDDEN, device="cuda")).to(torch.bfloat16)
            want = gathered_rms_norm_ref(xs[0], w, EPS)
            row: dict[str, Any] = dict(tp=tp, step=step, T=t, sets=sets, check={}, us={})
            for name, fn in befores.items():
                row["check"][name] = round(steps(fn(xs[0], w), want), 3)
                row["us"][name] = time_graph([lambda x=x, fn=fn: fn(x, w) for x in xs], args.reps)
            for name, cfg in configs.items():
                got = gathered_rms_norm(xs[0], w, EPS) if cfg is None else launch_gathered_rms_norm(xs[0], w, EPS, cfg)
                row["check"][name] = round(steps(got, want), 3)
                row["us"][name] = time_graph(
                    [lambda x=x, cfg=cfg: launch_gathered_rms_norm(x, w, EPS, cfg) for x in xs], args.reps)
            before = min(row["us"][n] for n in befores)
            row["before_us"], row["after_us"] = before, row["us"]["default"]
            row["speedup"] = before / row["after_us"]
            row["after_of_copy"] = nbytes / (row["after_us"] * 1e-6) / 1e9 / base["GBps"]
            ok = all(v <= 2.01 for v in row["check"].values())  # two roundings
            row["ok"] = ok
            res["rows"].append(row)
            print(f"tp {tp} {step:16s} T {t:5d}: before {before:8.2f} µs, gathered_rms_norm {row['after_us']:8.2f} "
                  f"({row['speedup']:.2f}x, {row['after_of_copy']:.2f} of copy) "
                  + " ".join(f"{k} {v:.2f}" for k, v in row["us"].items()) + f" check {'ok' if ok else row['check']}",
                  flush=True)
            del xs
            torch.cuda.empty_cache()
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(res, indent=1))
    return 0 if all(r["ok"] for r in res["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())

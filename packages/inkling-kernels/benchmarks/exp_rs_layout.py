"""The layout copies around a reduce-scatter along the hidden dimension, on one GPU.

vLLM's ``reduce_scatter(x, dim=-1)`` on ``x [T, hidden]`` transposes the tensor element
by element (``movedim(0, 1).contiguous()``: ``[hidden, T]``), reduce-scatters along dim 0
and transposes the ``[hidden/tp, T]`` result back. ``inkling_vllm.model`` instead lays
the column blocks out as row blocks (``[tp * T, hidden/tp]``: one copy of contiguous
``hidden/tp``-wide runs) and reduce-scatters along dim 0, which returns the
``[T, hidden/tp]`` shard as it is. The collective moves the same bytes either way;
this script times what differs -- the copies -- on one GPU, per step size (bench_sconv_kv
STEPS) and tp (2 and 8), bf16, hidden 6144, through bench_sconv.time_graph.

    PYTHONPATH=packages/inkling-kernels/src:packages/inkling-cache/src \\
        python3 packages/inkling-kernels/benchmarks/exp_rs_layout.py --json rs.json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_sconv import time_graph  # noqa: E402
from bench_sconv_kv import STEPS  # noqa: E402

HIDDEN = 6144


def vllm_copies(x: torch.Tensor, tp: int) -> torch.Tensor:
    src = x.movedim(0, 1).contiguous()  # before the collective
    shard = src[: x.shape[1] // tp]  # (the collective's output: this rank's rows)
    return shard.movedim(0, 1).contiguous()  # after it


def block_copy(x: torch.Tensor, tp: int) -> torch.Tensor:
    t, h = x.shape
    return x.reshape(t, tp, h // tp).transpose(0, 1).reshape(tp * t, h // tp)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--json", default="")
    args = p.parse_args()
    rows = []
    for tp in (2, 8):
        for step, reqs in STEPS:
            t = sum(n for _, n in reqs)
            sets = max(2, min(16, int(256e6 // (t * HIDDEN * 2)) + 1))
            xs = [torch.randn(t, HIDDEN, device="cuda").to(torch.bfloat16) for _ in range(sets)]
            want = [x[:, : HIDDEN // tp] for x in xs]
            assert all(torch.equal(vllm_copies(x, tp), w) for x, w in zip(xs, want))
            assert all(torch.equal(block_copy(x, tp)[:t], w) for x, w in zip(xs, want))
            a = time_graph([lambda x=x: vllm_copies(x, tp) for x in xs], 20)
            b = time_graph([lambda x=x: block_copy(x, tp) for x in xs], 20)
            rows.append(dict(tp=tp, step=step, T=t, vllm_transposes_us=a, block_copy_us=b, saved_us=a - b))
            print(f"tp {tp} {step:16s} T {t:5d}: vLLM transposes {a:8.2f} µs, block copy {b:8.2f} µs, "
                  f"saved {a - b:8.2f} µs", flush=True)
            del xs, want
            torch.cuda.empty_cache()
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(dict(device=torch.cuda.get_device_name(0),
                                                           torch=torch.__version__, rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

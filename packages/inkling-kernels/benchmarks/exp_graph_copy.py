"""Why a copy timed through a captured CUDA graph reads ~2.7 TB/s on an H200 while the
same copy in a plain loop reads ~4.25 TB/s (benchmarks/RESULTS.md, "of graph copy").

Hypothesis: a contiguous same-dtype ``dst.copy_(src)`` is a device-to-device
``cudaMemcpyAsync``; captured into a graph it becomes a memcpy node, which the driver
may run on a copy engine (DMA) rather than as an SM kernel. Kernels (ours, a Triton
copy, an elementwise torch kernel) are the same kernels eagerly and in a graph. So:
time four ways of moving the same bytes, each eagerly (CUDA events around a loop) and
through bench_sconv.time_graph:

* ``copy_``: contiguous bf16 ``b.copy_(a)`` (the memcpy path);
* ``mul``: ``torch.mul(a, 1, out=b)`` (an elementwise SM kernel reading and writing
  the same bytes);
* ``triton``: a plain Triton copy kernel;
* ``copy_ strided``: ``b.copy_(a)`` into a transposed view of equal bytes (torch's
  copy kernel, not a memcpy).

If only ``copy_`` drops in the graph, the graph-timed baseline measured the copy
engine, not the SMs' bandwidth, and the kernels' graph-timed figures stand against the
event-timed copy baseline.

    PYTHONPATH=packages/inkling-kernels/src:packages/inkling-cache/src \\
        python3 packages/inkling-kernels/benchmarks/exp_graph_copy.py --json copy.json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
from typing import Any, Callable

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_sconv import events_loop_us, time_graph  # noqa: E402


@triton.jit
def _copy_kernel(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(dst + offs, tl.load(src + offs, mask=m), mask=m)


def triton_copy(a: torch.Tensor, b: torch.Tensor) -> None:
    n = a.numel()
    _copy_kernel[(triton.cdiv(n, 8192),)](a, b, n, BLOCK=8192, num_warps=8)


def eager_us(f: Callable[[], Any]) -> float:
    return statistics.median(events_loop_us(f))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--json", default="")
    args = p.parse_args()
    nbytes = 1 << 30
    a = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    a.view(torch.uint8).random_(0, 255)
    b = torch.empty_like(a)
    side = 1 << 14  # a square bf16 matrix of the same bytes for the strided copy
    a2, b2 = a.view(side, -1), b.view(-1, side).t()
    ways: dict[str, Callable[[], Any]] = {
        "copy_": lambda: b.copy_(a),
        "mul": lambda: torch.mul(a, 1, out=b),
        "triton": lambda: triton_copy(a, b),
        "copy_ strided": lambda: b2.copy_(a2),
    }
    res: dict[str, Any] = dict(device=torch.cuda.get_device_name(0), torch=torch.__version__,
                               triton=triton.__version__, bytes_read_plus_written=2 * nbytes, ways={})
    for name, f in ways.items():
        e = eager_us(f)
        g = time_graph([f] * 4, reps=20)
        res["ways"][name] = dict(eager_us=e, graph_us=g, eager_GBps=2 * nbytes / e / 1e3, graph_GBps=2 * nbytes / g / 1e3)
        print(f"{name:14s} eager {e:8.1f} µs {2 * nbytes / e / 1e3:6.0f} GB/s | graph {g:8.1f} µs "
              f"{2 * nbytes / g / 1e3:6.0f} GB/s", flush=True)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

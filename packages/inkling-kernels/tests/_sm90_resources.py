"""Compile the relative-attention kernel for an H100/H200 (sm_90a) without a GPU and
print its resources as JSON: ``python _sm90_resources.py '<case json>'``.

The case gives the batch (``mix``: ``[context, new rows]`` per request), the layer
(``hkv``, ``window``, ``pad``) and optionally ``config`` (``RelAttentionConfig`` fields;
default: the tiling :func:`choose_rel_attention_config` picks on a 132-SM GPU). The
launcher runs on empty host tensors with its kernel launches recorded instead of made
(and TMA descriptors built as on an SM 9.0 GPU); each recorded launch of the
attention kernel (the far launch, where the tiling has one, and the main launch) then
goes through Triton's own argument specialisation (alignment, unit strides) and
compiler for the ``cuda:90`` target, with Triton's bundled ``ptxas``;
``cuobjdump -res-usage`` reads each cubin. Printed: the config and, per launch in
order, its pass (0: the only launch, 1: far tiles, 2: the main launch after them),
registers, stack, local memory and shared memory.

Run it in a process without ``TRITON_INTERPRET`` (the interpreter replaces the
kernels' JIT functions).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Any

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.compiler import compile as triton_compile
from triton.runtime.jit import create_function_from_signature

from inkling_kernels.rel_attention import kernel as rel_kernel

TARGET = GPUTarget("cuda", 90, 32)
SMS = 132


class _Recorder:
    """Stands in for a JIT kernel: ``kernel[grid](*args, **kwargs)`` is recorded."""

    def __init__(self, calls: list[tuple[tuple[Any, ...], dict[str, Any]]]) -> None:
        self.calls = calls

    def __getitem__(self, grid: Any) -> Any:
        return lambda *args, **kwargs: self.calls.append((args, kwargs))


def _inputs(mix: list[tuple[int, int]], hkv: int = 8, window: int | None = None, pad: int = 0,
            hq: int = 64, dh: int = 128, d_rel: int = 16, extent: int = 1024, n: int = 64
            ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Inkling 975B's shapes and page layout (K and V of a KV head side by side in a page)."""
    lens = [c + t for c, t in mix]
    per_req = [-(-length // n) for length in lens]
    page = torch.empty(sum(per_req) + 1, hkv, n, 2 * dh, dtype=torch.bfloat16)
    kv = page.unflatten(-1, (2, dh)).transpose(1, 2)
    table = torch.zeros(len(lens), max(per_req), dtype=torch.int32)
    at = 0
    for i, count in enumerate(per_req):
        table[i, :count] = torch.arange(at, at + count)
        at += count
    rows = sum(t for _, t in mix) + pad
    args = (torch.empty(rows, hq, dh, dtype=torch.bfloat16), torch.empty(rows, hq, d_rel, dtype=torch.bfloat16),
            torch.empty(d_rel, window or extent, dtype=torch.bfloat16), kv[..., 0, :], kv[..., 1, :],
            torch.zeros(rows, dtype=torch.int64), table,
            torch.tensor([0] + torch.tensor([t for _, t in mix]).cumsum(0).tolist(), dtype=torch.int32),
            torch.tensor(lens, dtype=torch.int32))
    kw = dict(scale=1.0 / dh, window=window, log_scaling=None if window else (4096, 0.1), max_seq_len=max(lens))
    return args, kw


def resources(case: dict[str, Any]) -> dict[str, Any]:
    main_kernel = rel_kernel._rel_attention_kernel
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    rel_kernel._num_sms = lambda device: SMS
    rel_kernel._tma_ok = lambda *args: True  # as on an SM 9.0 GPU with aligned 16-bit caches
    for name in ("_rel_attention_kernel", "_bias_table_kernel", "_combine_kernel"):
        setattr(rel_kernel, name, _Recorder(calls))
    args, kw = _inputs([tuple(m) for m in case["mix"]], **case.get("layer", {}))
    prob = rel_kernel.check_paged_rel_attention_triton_args(
        *args, kw["scale"], kw["window"], kw["log_scaling"], None, 1 << 24)
    if "config" in case:
        config = rel_kernel.RelAttentionConfig(**case["config"])
    else:
        config = rel_kernel.choose_rel_attention_config(prob, torch.device("cuda"), kw["max_seq_len"])
    rel_kernel.paged_rel_attention_triton(*args, **kw, config=config)
    launches = [_compile(main_kernel, args, kw, config) for args, kw in calls if "NEAR_BN" in kw]
    return dict(config=config.__dict__, launches=launches)


def _compile(kernel: Any, args: tuple[Any, ...], kw: dict[str, Any], config: Any) -> dict[str, int]:
    kw = dict(kw)
    if config.max_registers is not None:  # (passed on CUDA devices only)
        kw["maxnreg"] = config.max_registers
    backend = make_backend(TARGET)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, spec, options = binder(*args, **kw)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kw, bound, spec, options)
    compiled = triton_compile(ASTSource(kernel, signature, constexprs, attrs), target=TARGET,
                              options=options.__dict__)
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "kernel.cubin")
        with open(cubin, "wb") as f:
            f.write(compiled.asm["cubin"])
        tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        usage = subprocess.run([tool, "-res-usage", cubin], capture_output=True, text=True, check=True).stdout
    fields = dict(re.findall(r"(REG|STACK|LOCAL):(\d+)", usage))
    return dict(pass_=int(kw["PASS"]), tma=bool(kw["TMA"]), registers=int(fields["REG"]),
                stack=int(fields["STACK"]), local=int(fields["LOCAL"]), shared=int(compiled.metadata.shared))


if __name__ == "__main__":
    print(json.dumps(resources(json.loads(sys.argv[1]))))

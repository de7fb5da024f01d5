"""Compile conv launches for an H200 (sm_90) on the CPU, no GPU needed, and report per
thread what the cubin holds: registers (``cuobjdump -res-usage``, Triton's bundled
CUDA tools) and the global loads and stores by width (SASS). Used where no device is
lent to see what a kernel change does to the code (RESULTS_prefill_exp.md, session 11).

    PYTHONPATH=packages/inkling-kernels/src:packages/inkling-cache/src \\
        python3 packages/inkling-kernels/benchmarks/probe_sm90.py --case "prefill 8192, ATTN" \\
        --lib 16,128,4 16,128,4,ts --exp "sel 16x128/4w" "spec 16x128/4w"

``--lib BT,BC,NW[,ts|rows][,wt]``: the library's ``fused_sconv`` kernel on the case's
mapped batch with that tile (``ts``: one load a tap; ``rows``: the row-register kernel;
``wt``: the weights as a ``[C, W]`` view of a ``[W, C]``-contiguous tensor). ``--exp NAME``: an ``exp_prefill.py`` variant.
The case is one of bench_sconv.py's; the values do not change the code.
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import re
import subprocess
import sys
import tempfile
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))


def _capture(module: Any, name: str, launch: Any) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """Run ``launch()`` with ``module.name[grid](...)`` intercepted: the kernel and its call."""
    real = getattr(module, name)
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    class _Grab:
        def __getitem__(self, grid: Any) -> Any:
            return lambda *a, **kw: calls.append((a, kw))

    setattr(module, name, _Grab())
    try:
        launch()
    finally:
        setattr(module, name, real)
    assert len(calls) == 1, f"{len(calls)} launches"
    return real, *calls[0]


def _resources(kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any], order: bool = False) -> str:
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource, compile, make_backend
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    kwargs = dict(kwargs, debug=False, instrumentation_mode=knobs.compilation.instrumentation_mode)
    bound, spec, opts = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, spec, opts)
    compiled = compile(ASTSource(kernel, signature, constexprs, attrs), target=target, options=options.__dict__)
    tools = pathlib.Path(triton.__file__).parent / "backends/nvidia/bin"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = pathlib.Path(tmp) / "k.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        usage = subprocess.run([str(tools / "cuobjdump"), "-res-usage", str(cubin)], capture_output=True,
                               text=True, check=True).stdout
        sass = subprocess.run([str(tools / "cuobjdump"), "-sass", str(cubin)], capture_output=True, text=True,
                              check=True).stdout
    regs = re.search(r"REG:(\d+)", usage)
    loads = collections.Counter(re.findall(r"\b(LDG[\w.]*)", sass))
    stores = collections.Counter(re.findall(r"\b(STG[\w.]*)", sass))
    # every SASS instruction line reads "/*<offset>*/  OPCODE ..."; the total (NOPs and
    # the trailing BRA loop excluded) is a static proxy for the issue work per program
    ops = [m.group(1) for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][\w.]*)", sass)]
    body = [op for op in ops if op != "NOP"]
    spills = sum(1 for op in body if op.startswith(("LDL", "STL")))
    out = (f"registers {regs.group(1) if regs else '?'}; instructions {len(body)}; loads {dict(loads)}; "
           f"stores {dict(stores)}; local (spill) ops {spills}")
    if order:
        # global memory ops in program order: L/S + bits, and how many other
        # instructions sit between them (e.g. "L64 +3 L128")
        seq, gap = [], 0
        for op in body:
            if op.startswith(("LDG", "STG")):
                bits = op.rsplit(".", 1)[-1] if op.count(".") > 1 else "32"
                seq.append((f"+{gap} " if gap else "") + ("L" if op[0] == "L" else "S") + bits)
                gap = 0
            else:
                gap += 1
        out += "\n    order: " + " ".join(seq)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", required=True, help="a bench_sconv.py case name")
    ap.add_argument("--lib", nargs="*", default=[], help="library tiles BT,BC,NW[,ts|rows][,wt]")
    ap.add_argument("--exp", nargs="*", default=[], help="exp_prefill.py variant names")
    ap.add_argument("--order", action="store_true", help="also print the global loads and stores in program order")
    args = ap.parse_args()
    import torch
    import triton

    import bench_sconv as bs
    import inkling_kernels.sconv.kernel as K

    bs.sconv_tap_map = lambda batch, out: out  # the map's values do not change the code
    found = [c for c in bs.cases() if c.name == args.case]
    if not found:
        ap.error(f"no bench_sconv case {args.case!r}: {[c.name for c in bs.cases()]}")
    case = found[0]
    cache, weight, sets = bs.build(case, 1, torch.Generator().manual_seed(0), device="cpu")
    s = sets[0]
    heads, _, off, width = case.stream
    print(f"{case.name}: sm_90, triton {triton.__version__}, torch {torch.__version__}")
    for spec in args.lib:
        bt, bc, nw, *flags = spec.split(",")
        cfg = K.SconvConfig(block_t=int(bt), block_c=int(bc), num_warps=int(nw), tap_select="ts" in flags,
                            rows="rows" in flags)
        w = weight.t().contiguous().t() if "wt" in flags else weight
        kernel, a, kw = _capture(K, "_rows_sconv_kernel" if cfg.rows else "_fused_sconv_kernel",
                                 lambda: K.fused_sconv_triton(s.x, w, cache, s.mapped, off, width, config=cfg))
        print(f"  library {spec}: {_resources(kernel, a, kw, args.order)}", flush=True)
    if args.exp:
        import exp_prefill as E

        weight_t = weight.t().contiguous().t()
        for name in args.exp:
            v = next((x for x in E.VARIANTS if x.name == name), None)
            if v is None:
                ap.error(f"no exp_prefill variant {name!r}")
            tile = E.resolve_tile(v, s.x.shape[0], heads, width, False)
            out = torch.empty_like(s.x)
            kname = ("_rows_sconv_kernel" if v.rows else "_stream_sconv_kernel" if v.stream
                     else "_shift_sconv_kernel" if v.shift else "_exp_sconv_kernel")
            kernel, a, kw = _capture(E, kname, lambda: E.launch_exp(
                v, tile, s.x, weight_t if v.wt else weight, cache, s, off, width, out))
            print(f"  exp {name}: {_resources(kernel, a, kw, args.order)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Compile ``fused_sconv``'s one-stream launches for an H200 (sm_90) on the CPU, no GPU
needed, and compare the generated PTX of two trees (issue 14: the K+V kernel must leave
the one-stream code as it was).

Every launch of bench_sconv.py's cases (map, map-less, map-less without the hazard scan)
is intercepted at ``_fused_sconv_kernel[grid](...)``, specialised exactly as Triton's
launcher would (the same binder, so the same divisibility and constexprs), and compiled
to PTX for ``GPUTarget("cuda", 90, 32)``. The comparison drops what cannot matter: line
info and debug sections, the kernel's parameter declarations (parameters are named by
argument, not by position: the K+V kernel has more of them), and the STREAMS constexpr.

    PYTHONPATH=.scratch/before/packages/inkling-kernels/src \\
        python3 packages/inkling-kernels/benchmarks/compare_codegen.py --dump old.json
    PYTHONPATH=packages/inkling-kernels/src \\
        python3 packages/inkling-kernels/benchmarks/compare_codegen.py --dump new.json
    python3 packages/inkling-kernels/benchmarks/compare_codegen.py --compare old.json new.json

``--kernel sconv_add_rmsnorm`` compiles the launches of ``fused_sconv_add_rmsnorm``'s
kernel instead (:func:`_norm_launches`; the norm must keep its code when the kernel
gains ``fused_sconv_add``'s HAS_NORM-off branch), and ``fused_sconv_add``'s where the
tree has it (keys without an old launch, listed but not compared).

Exit status of --compare: 1 when a launch's PTX or constexprs differ.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import hashlib
import json
import pathlib
import re
import sys
from typing import Any


def _normalise_ptx(ptx: str, param_names: list[str]) -> str:
    ptx = ptx.split("\t.section\t.debug", 1)[0]
    out = []
    in_params = False
    for line in ptx.splitlines():
        s = line.strip()
        if s.startswith(".entry") or s.startswith(".visible .entry"):
            in_params = True
            out.append(".entry KERNEL(")
            continue
        if in_params:
            if s.startswith(")"):
                in_params = False
                out.append(")")
            continue
        if not s or s.startswith(".loc") or s.startswith(".file") or s.startswith("//") or re.fullmatch(r"\$L__tmp\d+:", s):
            continue
        def name(m: re.Match[str]) -> str:
            i = int(m.group(1))
            return f"PARAM[{param_names[i]}]" if i < len(param_names) else f"PARAM[extra{i - len(param_names)}]"
        out.append(re.sub(r"\w+_param_(\d+)", name, line.rstrip()))
    return "\n".join(out) + "\n"


def _sconv_launches(only: str | None) -> Any:
    """``(module, kernel name, drop, [(key, launch)])`` for ``fused_sconv``: every case
    of bench_sconv.py, map, map-less and map-less without the hazard scan."""
    import torch

    import inkling_kernels.sconv.kernel as K

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import bench_sconv as B

    B.sconv_tap_map = lambda batch, out: out  # the map's contents do not change the code

    def launches() -> Any:
        gen = torch.Generator().manual_seed(0)
        for case in B.cases():
            if only and only not in case.name:
                continue
            cache, weight, sets = B.build(case, 1, gen, device="cpu")
            s = sets[0]
            _, _, off, width = case.stream
            t = s.x.shape[0]
            heads = case.stream[0]
            heur = K.choose_config(t, heads, width)
            yield f"{case.name} | map", lambda: K.fused_sconv_triton(s.x, weight, cache, s.mapped, off, width)
            yield f"{case.name} | map-less", lambda: K.fused_sconv_triton(
                s.x, weight, cache, s.batch, off, width, auto_map=False)
            yield f"{case.name} | map-less, no hazard scan", lambda: K.fused_sconv_triton(
                s.x, weight, cache, s.batch, off, width, config=dataclasses.replace(heur, hazard_scan=False),
                auto_map=False)
            del cache, sets

    return K, "_fused_sconv_kernel", ("STREAMS",), launches()


def _norm_launches(only: str | None) -> Any:
    """``(module, kernel name, drop, [(key, launch)])`` for the kernel of
    ``fused_sconv_add_rmsnorm`` (and of ``fused_sconv_add``, HAS_NORM off, in a tree
    that has it: those keys have no old launch) at the 975B global layer's shape at
    tp 1 (8 heads x 768 channels at offset 256 of D 2048, bf16, N = W = 4, the weight
    channel-contiguous as the model keeps it): the default tiles at T = 1 and 16 (rows
    split over programs), 64 and 2048 (main's row loop), 8192 (whole rows in
    registers), and one forced split config; map-less and with a map each. Values do
    not change the code: the tensors are uninitialised."""
    import torch

    import inkling_kernels.sconv_add_rmsnorm.kernel as K
    from inkling_kernels import SconvBatch

    heads, head_size, off, width, n, w = 8, 2048, 256, 768, 4, 4
    c = heads * width

    def problem(t: int, mapped: bool) -> tuple[Any, ...]:
        reqs = min(t, 64)
        per = [t // reqs + (r < t % reqs) for r in range(reqs)]
        hist = 9  # pre-forward taps in every request
        nblk = [-(-(hist + k) // n) for k in per]
        table = torch.zeros(reqs, max(nblk), dtype=torch.int32)
        pos, seq, slots, qs = [], [], [], []
        nxt = 1
        for r, k in enumerate(per):
            table[r, : nblk[r]] = torch.arange(nxt, nxt + nblk[r], dtype=torch.int32)
            nxt += nblk[r]
            start = len(pos)
            for p in range(hist, hist + k):
                pos.append(p)
                seq.append(r)
                qs.append(start)
                slots.append(int(table[r, p // n]) * n + p % n)
        batch = SconvBatch(torch.tensor(pos), table, torch.tensor(seq, dtype=torch.int32), torch.tensor(slots),
                           torch.tensor(qs, dtype=torch.int32), n, w,
                           torch.zeros(t, w - 1, dtype=torch.int64) if mapped else None)
        cache = torch.empty(nxt, heads, n, head_size, dtype=torch.bfloat16)
        weight = torch.empty(w, c).t().unsqueeze(1)
        hidden, d = torch.empty(t, c, dtype=torch.bfloat16), torch.empty(t, c, dtype=torch.bfloat16)
        return hidden, d, weight, cache, batch, off, width

    def launches() -> Any:
        forced = K.NormConfig(block_t=1, block_h=2, block_j=256, num_warps=4, split=12)
        for t in (1, 16, 64, 2048, 8192):
            for mapped in (False, True):
                name = f"T {t} | {'map' if mapped else 'map-less'}"
                if only and only not in name:
                    continue
                args = problem(t, mapped)
                norm = (torch.ones(c, dtype=torch.bfloat16), 1e-6)
                yield f"{name} | norm, default", lambda: K.sconv_add_rmsnorm_triton(*args, *norm)
                if t == 1:
                    yield f"{name} | norm, {forced}", lambda: K.sconv_add_rmsnorm_triton(*args, *norm, config=forced)
                if hasattr(K, "sconv_add_triton"):
                    # (auto_map off: a large map-less launch would build a map first, a
                    # real launch, which needs a GPU)
                    yield f"{name} | no norm, default", lambda: K.sconv_add_triton(*args, auto_map=False)

    return K, "_sconv_add_rmsnorm_kernel", (), launches()


def dump(path: pathlib.Path, only: str | None, kernel: str) -> int:
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource, compile, make_backend
    from triton import knobs
    from triton.runtime.jit import create_function_from_signature

    K, kname, drop, launches = (_norm_launches if kernel == "sconv_add_rmsnorm" else _sconv_launches)(only)
    real = getattr(K, kname)
    captured: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []

    class _Grab:
        def __getitem__(self, grid: Any) -> Any:
            return lambda *a, **kw: captured.append((grid, a, kw))

    setattr(K, kname, _Grab())
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(real.signature, real.params, backend)
    results: dict[str, Any] = {}
    for key, launch in launches:
        captured.clear()
        launch()
        assert len(captured) == 1, f"{key}: {len(captured)} launches"
        grid, args, kwargs = captured[0]
        kwargs = dict(kwargs, debug=bool(real.debug or knobs.runtime.debug),
                      instrumentation_mode=knobs.compilation.instrumentation_mode)
        bound, spec, opts = binder(*args, **kwargs)
        options, signature, constexprs, attrs = real._pack_args(backend, kwargs, bound, spec, opts)
        compiled = compile(ASTSource(real, signature, constexprs, attrs), target=target, options=options.__dict__)
        params = [k for k, v in signature.items() if v != "constexpr"]
        ptx = _normalise_ptx(compiled.asm["ptx"], params)
        consts = {real.arg_names[k[0]]: (v.value if hasattr(v, "value") else v) for k, v in constexprs.items()}
        for name in drop:
            consts.pop(name, None)
        used = sorted({m for m in re.findall(r"PARAM\[(\w+)\]", ptx)})
        results[key] = dict(grid=list(grid), constexprs={k: repr(v) for k, v in consts.items()},
                            ptx_sha256=hashlib.sha256(ptx.encode()).hexdigest(), ptx_lines=ptx.count("\n"),
                            params_used=used, ptx=ptx)
        print(f"{key}: {results[key]['ptx_lines']} PTX lines, sha {results[key]['ptx_sha256'][:12]}", flush=True)
    path.write_text(json.dumps(results, indent=1))
    return 0


def compare(old_path: pathlib.Path, new_path: pathlib.Path, md: pathlib.Path | None) -> int:
    old, new = (json.loads(p.read_text()) for p in (old_path, new_path))
    lines = ["| launch | grid | PTX lines old / new | same constexprs | same PTX |", "|---|---|---|---|---|"]
    bad = 0
    for key, n in new.items():
        o = old.get(key)
        if o is None:
            lines.append(f"| {key} | {n['grid']} | — / {n['ptx_lines']} | — | (no old launch) |")
            continue
        common = o["constexprs"].keys() & n["constexprs"].keys()  # (new: the unused second stream's)
        same_c = all(o["constexprs"][k] == n["constexprs"][k] for k in common) and o["grid"] == n["grid"]
        same_c = same_c and set(o["constexprs"]) <= set(n["constexprs"])
        same_p = o["ptx_sha256"] == n["ptx_sha256"]
        bad += not (same_c and same_p)
        lines.append(f"| {key} | {n['grid']} | {o['ptx_lines']} / {n['ptx_lines']} | {same_c} | {same_p} |")
        if not same_p:
            diff = list(difflib.unified_diff(o["ptx"].splitlines(), n["ptx"].splitlines(), "old", "new", lineterm="", n=1))
            print(f"--- {key}: first PTX differences\n" + "\n".join(diff[:40]))
        if not same_c:
            print(f"--- {key}: constexprs/grid old {o['constexprs']} {o['grid']} new {n['constexprs']} {n['grid']}")
    lines.append("")
    lines.append(f"launches compared: {len(new)}; differing: {bad}")
    text = "\n".join(lines)
    if md:
        md.write_text(text + "\n")
    print(text)
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dump", type=pathlib.Path)
    ap.add_argument("--only", default=None, help="substring filter on case names")
    ap.add_argument("--kernel", choices=("sconv", "sconv_add_rmsnorm"), default="sconv",
                    help="whose launches --dump compiles (default: fused_sconv's)")
    ap.add_argument("--compare", type=pathlib.Path, nargs=2)
    ap.add_argument("--md", type=pathlib.Path, default=None)
    args = ap.parse_args()
    if args.compare:
        return compare(*args.compare, args.md)
    if args.dump:
        return dump(args.dump, args.only, args.kernel)
    ap.error("--dump or --compare")
    return 2


if __name__ == "__main__":
    sys.exit(main())

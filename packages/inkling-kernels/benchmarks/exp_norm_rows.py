# Experiment (session 19): the row-register kernel of fused_sconv_add_rmsnorm and
# fused_sconv_add (NormConfig.rows) against the tile kernel, on bench_sconv_add_rmsnorm's
# 975B ATTN shapes (TP 1, hidden 6144) and, for fused_sconv_add, the TP 8 shard (768
# channels). Every rows variant and the tile kernel are checked against the fp32
# reference before they are timed: the cache bit for bit, new_hidden and normed at least 99.9 % bit-exact and within two
# rounding steps (bench_sconv_add_rmsnorm.ulp_stats). CUDA-graph replay, medians,
# the copy baseline (CUDA events, read + write) in the same run.
# GPU, from the repo root:
#   PYTHONPATH=packages/inkling-kernels/src:packages/inkling-cache/src \
#     python3 packages/inkling-kernels/benchmarks/exp_norm_rows.py --json $OUT/norm_rows.json
"""The row-register fused conv + add (+ RMSNorm) against the tile kernel (see above)."""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import sys
import traceback

import torch
import triton

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import bench_sconv_add_rmsnorm as B  # noqa: E402  (build, Case, graph_time_us, copy baseline)

from inkling_cache import ConvStateLayout  # noqa: E402
from inkling_kernels.sconv_add_rmsnorm import fused_sconv_add_ref, fused_sconv_add_rmsnorm_ref  # noqa: E402
from inkling_kernels.sconv_add_rmsnorm.kernel import (  # noqa: E402
    NormConfig, choose_add_config, choose_norm_config, sconv_add_rmsnorm_triton, sconv_add_triton,
)

CASES = [
    B.Case("prefill 8192", [(0, 8192)]),
    B.Case("chunked 8192 after 8190", [(8190, 8192)]),
    B.Case("prefill 2048", [(0, 2048)]),
    B.Case("prefill 1024", [(0, 1024)]),
    B.Case("mixed 2048 + 255 (prompt first)", [(0, 2048)] + [(100 + 17 * i, 1) for i in range(255)]),
    B.Case("mixed 255 + 2048 (decodes first)", [(100 + 17 * i, 1) for i in range(255)] + [(0, 2048)]),
    B.Case("mixed 1024 + 255 (prompt first)", [(0, 1024)] + [(100 + 17 * i, 1) for i in range(255)]),
    B.Case("4 prompts of 512", [(0, 512)] * 4),
    B.Case("spec verify 64 x 4", [(300 + 29 * i, 4) for i in range(64)]),
    # (session 20) 7 and 8 drafts: 8 and 9 rows a request, at the rows rule's boundary
    B.Case("spec verify 128 x 8", [(300 + 29 * i, 8) for i in range(128)]),
    B.Case("spec verify 256 x 8", [(300 + 29 * i, 8) for i in range(256)]),
    B.Case("spec verify 114 x 9", [(300 + 29 * i, 9) for i in range(114)]),
    B.Case("mixed 255 + 1024 (decodes first)", [(100 + 17 * i, 1) for i in range(255)] + [(0, 1024)]),
    B.Case("decode 256", [(200 + 13 * i, 1) for i in range(256)]),
]

ROWS = [  # (block_t, block_j, warps, norm_unroll)
    (2, 256, 2, 4), (2, 256, 2, 1), (1, 256, 2, 4), (4, 256, 2, 4), (2, 512, 4, 4), (4, 512, 4, 4),
]


def _cfg(spec: tuple[int, int, int, int]) -> NormConfig:
    bt, bj, nw, un = spec
    return NormConfig(block_t=bt, block_h=1, block_j=bj, num_warps=nw, rows=True, norm_unroll=un)


def run_case(case: B.Case, layout: ConvStateLayout, norm: bool, seed: int, copy_gbs: float,
             iters: int, replays: int) -> dict:
    p = B.build(case.requests, layout, torch.float32 if B.DRY else torch.bfloat16, seed=seed)
    t = p.d.shape[0]
    tap_map = B.tap_map_of(p)
    c = p.d.shape[1]
    # bytes: read hidden and d, write new_hidden (+ normed) and the slots, the pre-forward taps
    nbytes = ((5 if norm else 4) * t * c + p.pre_taps * c) * p.d.element_size()
    row: dict = dict(case=case.name, T=t, C=c, norm=norm, min_bytes=nbytes, variants={})

    def launch(cfg: NormConfig | None, cache: torch.Tensor):
        args = list(p.args(tap_map))
        args[3] = cache
        if norm:
            return sconv_add_rmsnorm_triton(*args, config=cfg)
        return (sconv_add_triton(*args[:7], config=cfg),)

    tile = (choose_norm_config(t, layout.num_heads, p.width) if norm
            else choose_add_config(t, layout.num_heads, p.width, True))
    ref_cache = p.cache.clone()
    args = list(p.args(tap_map))
    args[3] = ref_cache
    ref = fused_sconv_add_rmsnorm_ref(*args) if norm else (fused_sconv_add_ref(*args[:7]),)
    variants = [("tile " + str(tile), tile)] + [(f"rows {s}", _cfg(s)) for s in ROWS]
    if norm:
        heur = choose_norm_config(t, layout.num_heads, p.width, True, p.block_table.shape[0], p.prefill)
    else:
        heur = choose_add_config(t, layout.num_heads, p.width, True, num_requests=p.block_table.shape[0],
                                 num_prefill_tokens=p.prefill)
    row["heuristic"] = str(heur)
    for name, cfg in variants:
        v: dict = {}
        try:
            # against the fp32 reference: the cache bit for bit, each output's fraction of
            # bit-exact elements and its largest difference in rounding steps
            cache = p.cache.clone()
            got = launch(cfg, cache)
            v["cache_exact"] = bool(torch.equal(cache, ref_cache))
            for name_o, g, w in zip(("new_h", "normed"), got, ref):
                v[name_o + "_exact_frac"], v[name_o + "_max_steps"] = B.ulp_stats(g, w)
            v["ok"] = v["cache_exact"] and all(
                v[o + "_exact_frac"] >= 0.999 and v[o + "_max_steps"] <= 2.0 for o in ("new_h", "normed")[:len(got)])
            v["us"] = B.graph_time_us(lambda cfg=cfg: launch(cfg, p.cache), iters, replays)
            v["of_copy"] = nbytes / (v["us"] * 1e-6) / 1e9 / copy_gbs
        except Exception as exc:  # e.g. out of resources
            v["error"] = f"{type(exc).__name__}: {exc}"[:300]
        row["variants"][name] = v
        print(f"  {case.name:34s} {'norm' if norm else 'add '} {name:70s} "
              + (f"{v['us']:8.2f} us {v['of_copy']:.3f}" if "us" in v else v.get("error", "")[:80])
              + (f"  ok={v['ok']}" if "ok" in v else ""), flush=True)
    tile_us = row["variants"][variants[0][0]].get("us")
    timed = {k: x["us"] for k, x in row["variants"].items() if "us" in x and x.get("ok", True)}
    if timed:
        best = min(timed, key=timed.get)
        row["best"], row["best_us"] = best, timed[best]
        if tile_us:
            row["best_over_tile"] = tile_us / timed[best]
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--replays", type=int, default=15)
    ap.add_argument("--cases", default="", help="comma-separated case-name prefixes (default: all)")
    args = ap.parse_args()
    want = [x.strip() for x in args.cases.split(",") if x.strip()]
    cases = [c for c in CASES if not want or any(c.name.startswith(w) for w in want)]
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(50):
        a @ a
    torch.cuda.synchronize()
    copy_gbs = B.copy_bandwidth_gbs()
    report: dict = dict(
        device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
        cuda=torch.version.cuda, date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        command=" ".join(sys.argv), copy_gbs=copy_gbs, rows=[],
    )
    print(f"copy baseline {copy_gbs:.0f} GB/s", flush=True)
    tp1 = ConvStateLayout.build(num_kv_heads=8, head_dim=B.HEAD_DIM, hidden_size=B.HIDDEN, kernel_size=4)
    tp8 = ConvStateLayout.build(num_kv_heads=8, head_dim=B.HEAD_DIM, hidden_size=B.HIDDEN, kernel_size=4, tp_size=8)
    for i, case in enumerate(cases):
        for layout, norm in ((tp1, True), (tp8, False)):
            if not norm:
                B.HIDDEN = tp8.num_heads * tp8.stream_range(B.Stream.ATTN)[1]
            try:
                report["rows"].append(run_case(case, layout, norm, 300 + i, copy_gbs, args.iters, args.replays))
            except Exception:
                traceback.print_exc()
            finally:
                B.HIDDEN = 6144
            if args.json:
                pathlib.Path(args.json).write_text(json.dumps(report, indent=1))
    report["copy_gbs_end"] = B.copy_bandwidth_gbs()
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(report, indent=1))
    bad = [(r["case"], k) for r in report["rows"] for k, v in r["variants"].items() if v.get("ok") is False]
    print(f"copy baseline at the end {report['copy_gbs_end']:.0f} GB/s; variants failing their check: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""Compare two bench_sconv.py runs (--json files): the tree before and after a change,
timed on the same device back to back. Prints one markdown table; exit status 1 when a
case of the new run is slower than the old one by more than --tolerance.

    python3 packages/inkling-kernels/benchmarks/compare_runs.py before.json after.json [--md out.md]

Columns (µs, cold, median; "new/old" < 1 is faster):
- map: ``fused_sconv`` with the step's tap map (the model / vLLM path on CUDA);
- map build: ``sconv_tap_map``, once per step and KV-cache group;
- drop-in: the call with vLLM's in-tree signature (before: ``fused_sconv`` without a
  map; after: ``fused_sconv_vllm``);
- hot: the drop-in replaying one input set (L2-resident for decode).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

COLUMNS = [
    ("map", "ours_map_us"),
    ("map build", "map_build_us"),
    ("drop-in", "ours_us"),
    ("drop-in hot", "ours_hot_us"),
    ("map hot", "ours_map_hot_us"),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before", type=pathlib.Path)
    ap.add_argument("after", type=pathlib.Path)
    ap.add_argument("--md", type=pathlib.Path, default=None)
    ap.add_argument("--tolerance", type=float, default=0.03, help="allowed slowdown (fraction), for noise")
    args = ap.parse_args()
    old, new = (json.loads(p.read_text()) for p in (args.before, args.after))
    by_name = {r["case"]: r for r in old["cases"]}
    def copies(run: dict) -> str:  # runs before issue 14 have only the graph-timed copy, as copy_GBps
        if run.get("copy_method") == "events":
            return f"{run['copy_GBps']:.0f} (events loop), {run.get('copy_graph_GBps', 0):.0f} (graph)"
        return f"{run.get('copy_GBps', 0):.0f} (graph)"

    lines = [
        f"device: {new.get('device')}; torch {new.get('torch')}, triton {new.get('triton')}; "
        f"copy GB/s before {copies(old)}, after {copies(new)}",
        "",
        "| case | T | C | " + " | ".join(f"{name} µs before / after (new/old)" for name, _ in COLUMNS) + " |",
        "|---|---|---|" + "---|" * len(COLUMNS),
    ]
    slower = []
    for r in new["cases"]:
        o = by_name.get(r["case"])
        if o is None:
            continue
        cells = []
        for name, key in COLUMNS:
            a, b = o.get(key), r.get(key)
            if a is None or b is None:
                cells.append("—")
                continue
            ratio = b / a
            mark = ""
            if ratio > 1 + args.tolerance:
                mark = " **slower**"
                slower.append(f"{r['case']}: {name} {a:.2f} -> {b:.2f} µs")
            cells.append(f"{a:.2f} / {b:.2f} ({ratio:.2f}){mark}")
        lines.append(f"| {r['case']} | {r['T']} | {r['C']} | " + " | ".join(cells) + " |")
    for key, title in (("metadata", "sconv_seq_metadata"),):
        olds = {m["case"]: m for m in old.get(key, [])}
        rows = [(m, olds.get(m["case"])) for m in new.get(key, []) if m["case"] in olds]
        if rows:
            lines += ["", f"| {title} | before µs | after µs | new/old |", "|---|---|---|---|"]
            for m, o in rows:
                lines.append(f"| {m['case']} | {o['ours_us']:.2f} | {m['ours_us']:.2f} | {m['ours_us'] / o['ours_us']:.2f} |")
    if new.get("hazard"):
        lines += ["", "| same-step hazard (after) | order | impl | stale launches |", "|---|---|---|---|"]
        for h in new["hazard"]:
            lines.append(f"| A {h['prompt']}, B hits {h['hit']} | {h['order']} | {h['impl']} | {h['stale']} / {h['launches']} |")
    lines += ["", f"slower than before by more than {args.tolerance:.0%}: " + ("; ".join(slower) if slower else "none")]
    text = "\n".join(lines)
    if args.md:
        args.md.write_text(text + "\n")
    print(text)
    return 1 if slower else 0


if __name__ == "__main__":
    sys.exit(main())

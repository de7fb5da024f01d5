#!/usr/bin/env bash
# session 10 experiment: the conv kernel's one-load tap, timed beside the two-load tap
OUT=${OUT:-device-out}/r
source packages/inkling-kernels/benchmarks/device_env.sh
export PYTHONPATH=$ROOT/.scratch/k14/src:$ROOT/packages/inkling-cache/src
device_info
stage "sweep"
timeout 200 python3 .scratch/k14/bench_sconv.py --peer-dir .peer --sweep --sweep-hot --reps 30 --hazard-launches 0 \
  --json "$OUT/k14.json" --md "$OUT/k14.md" > "$OUT/k14.log" 2>&1
stage "done"
tar czf "$OUT/../call.tgz" -C "$OUT" .

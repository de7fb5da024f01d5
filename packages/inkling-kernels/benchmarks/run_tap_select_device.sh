#!/usr/bin/env bash
# For the next device call (nvidia-h200): the conv kernel's sweep over every
# bench_sconv case, each row (the one-load tap `tap_select` rows included) checked
# against fused_sconv_ref on the GPU before it is timed, cold and hot, with vLLM
# 0.33.0's kernel in the same run (.peer carried: fetch_peer.py). Outputs packed in
# $OUT/call.tgz. A clean run ("err" at bf16 rounding on every row) is what the
# one-load tap needs before it becomes the mapped default at T x C >= 2^20
# (RESULTS_prefill_exp.md, session 10).
#   INKLING_COMMIT=<sha> bash packages/inkling-kernels/benchmarks/run_tap_select_device.sh
OUT=${OUT:-device-out}/r
source "$(dirname "$0")/device_env.sh"
device_info
stage "a. conv sweep, rows checked"
timeout 400 python3 $B/bench_sconv.py --peer-dir .peer --sweep --sweep-hot --reps 30 --hazard-launches 0 \
  --json "$OUT/sweep.json" --md "$OUT/sweep.md" > "$OUT/sweep.log" 2>&1
stage "done"
tar czf "$OUT/../call.tgz" -C "$OUT" .

#!/usr/bin/env bash
# Device call 2 (nvidia-h200), session 10: single-request decode in whole waves
# (33 splits), near-tile cost weights, a register cap; decode 256 x 8k (global and
# sliding) with 4 / 8 warps; the fastest rows re-timed in alternating rounds.
#   INKLING_COMMIT=<sha> bash packages/inkling-kernels/benchmarks/run_session10_call2.sh
OUT=${OUT:-device-out}/r
source "$(dirname "$0")/device_env.sh"
R=$OUT
device_info
stage "a. decode sweeps"
timeout 400 python3 $B/bench_rel_attention.py --only "decode 1 x 32k|decode 256 x 8k" --no-flex --no-sdpa \
  --budget-s 1e9 --retime-top 4 --rounds 3 --json "$R/sweep2.json" --md "$R/sweep2.md" 2>&1 | tee "$R/sweep2.log"
stage "done"
tar czf "$OUT/../call.tgz" -C "$R" .

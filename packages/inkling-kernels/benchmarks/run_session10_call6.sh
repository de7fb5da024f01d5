#!/usr/bin/env bash
# Device call 6 (nvidia-h200), session 10: the final tree's attention on the GPU (all
# rel-attention GPU tests; the decode cases' default rows re-timed).
#   INKLING_COMMIT=<sha> bash packages/inkling-kernels/benchmarks/run_session10_call6.sh
OUT=${OUT:-device-out}/r
source "$(dirname "$0")/device_env.sh"
R=$OUT
device_info
stage "a. GPU tests"
attention_gpu_tests 150
stage "b. decode defaults"
timeout 150 python3 $B/bench_rel_attention.py --only "decode|spec" --no-sweep --no-flex --no-torch \
  --budget-s 1e9 --json "$R/final.json" --md "$R/final.md" 2>&1 | tail -25 | tee "$R/final.log"
stage "done"
tar czf "$OUT/../call.tgz" -C "$R" .

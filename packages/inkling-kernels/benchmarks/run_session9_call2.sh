#!/usr/bin/env bash
# Device call 2 (nvidia-h200), session 9: GPU tests of the attention kernel with the
# new defaults, then the full bench_rel_attention.py (PyTorch path, FlexAttention,
# SDPA, the bias rows); outputs packed in $OUT/call.tgz.
#   INKLING_COMMIT=<sha> bash packages/inkling-kernels/benchmarks/run_session9_call2.sh
OUT=${OUT:-device-out}/r  # everything in r/, packed into call.tgz beside it
source "$(dirname "$0")/device_env.sh"
R=$OUT
device_info
stage "a. GPU tests"
attention_gpu_tests 120
stage "b. bench_rel_attention (full)"
timeout 420 python3 $B/bench_rel_attention.py --sweep-rows bias --budget-s 1e9 \
  --json "$R/bench.json" --md "$R/bench.md" 2>&1 | tee "$R/bench.log"
stage "done"
tar czf "$OUT/../call.tgz" -C "$R" .

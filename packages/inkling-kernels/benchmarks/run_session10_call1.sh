#!/usr/bin/env bash
# Device call 1 (nvidia-h200), session 10: GPU tests of the attention kernel (with the
# new programmatic-dependent-launch tests), the single-request decode sweep (launch
# overlap, occupancy: registers and shared memory of every build), the sliding-layer
# decode sweep, then FlexAttention on the four large decode caches in parts; outputs
# packed in $OUT/call.tgz.
#   INKLING_COMMIT=<sha> bash packages/inkling-kernels/benchmarks/run_session10_call1.sh
OUT=${OUT:-device-out}/r
source "$(dirname "$0")/device_env.sh"
R=$OUT
device_info
stage "a. GPU tests"
attention_gpu_tests 150
stage "b. decode sweeps (1 x 32k, sliding 256 x 8k)"
timeout 200 python3 $B/bench_rel_attention.py --only "decode 1 x 32k|sliding decode" --no-flex --budget-s 1e9 \
  --json "$R/sweep.json" --md "$R/sweep.md" 2>&1 | tee "$R/sweep.log"
stage "c. Flex in parts on the large decode caches"
timeout 230 python3 $B/bench_rel_attention.py --only "decode 64 x 32k|decode 256 x 8k|N=16|sliding decode" \
  --sweep-rows pdl --budget-s 1e9 --json "$R/flex.json" --md "$R/flex.md" 2>&1 | tee "$R/flex.log"
stage "done"
tar czf "$OUT/../call.tgz" -C "$R" .

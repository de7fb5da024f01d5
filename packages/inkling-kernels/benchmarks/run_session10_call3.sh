#!/usr/bin/env bash
# Device call 3 (nvidia-h200), session 10: GPU tests of the attention kernel with the
# new decode defaults, the full table (PyTorch path, FlexAttention (in request groups
# where one call cannot address the cache), SDPA), then the decode cases before/after
# against the session-start kernel (11585a3, copied to .scratch/base/relattn_main and
# carried), alternating rounds; outputs packed in $OUT/call.tgz.
#   INKLING_COMMIT=<sha> bash packages/inkling-kernels/benchmarks/run_session10_call3.sh
OUT=${OUT:-device-out}/r
source "$(dirname "$0")/device_env.sh"
R=$OUT
device_info
stage "a. GPU tests"
attention_gpu_tests 150
stage "b. full table"
timeout 300 python3 $B/bench_rel_attention.py --no-sweep --budget-s 1e9 \
  --json "$R/bench.json" --md "$R/bench.md" 2>&1 | tee "$R/bench.log"
stage "c. decode before/after"
PYTHONPATH=$PYTHONPATH:$ROOT/.scratch/base timeout 120 python3 $B/bench_rel_attention.py --only "decode|spec" \
  --baseline relattn_main --rounds 3 --no-sweep --no-flex --no-torch --no-sdpa --budget-s 1e9 \
  --json "$R/before_after.json" --md "$R/before_after.md" 2>&1 | tee "$R/before_after.log"
stage "done"
tar czf "$OUT/../call.tgz" -C "$R" .

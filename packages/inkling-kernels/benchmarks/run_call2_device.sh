#!/usr/bin/env bash
# Device call (nvidia-h200-x2): a. exp_prefill.py on GPU 0 (prefill conv variants);
# b. bench_tp_tail.py --tp 2 (second round, with the Triton shard scale and the
# symmetric-memory all-reduce); $OUT packed into $OUT/call2.tgz. From the repo root:
#   INKLING_COMMIT=<sha> bash packages/inkling-kernels/benchmarks/run_call2_device.sh
source "$(dirname "$0")/device_env.sh"
device_info
stage "a. exp_prefill"
CUDA_VISIBLE_DEVICES=0 timeout 300 python3 $B/exp_prefill.py --json "$OUT/prefill.json" --budget-s 220 2>&1 | tee "$OUT/prefill.log"
stage "b. tp tail"
timeout 200 python3 $B/bench_tp_tail.py --tp 2 --budget-s 150 --json "$OUT/tail2.json" --md "$OUT/tail2.md" 2>&1 | tee "$OUT/tail2.log"
stage "done"
tar czf "$OUT/call2.tgz" -C "$OUT" --exclude call2.tgz . 2>/dev/null

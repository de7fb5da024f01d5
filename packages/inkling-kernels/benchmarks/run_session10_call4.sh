#!/usr/bin/env bash
# Device call 4 (nvidia-h200), session 10: the conv kernel's decode tiles with
# programmatic dependent launch (cold and hot), and Inkling's sliding-layer attention
# shapes (16 KV heads) with the full table and the tiling sweep.
#   INKLING_COMMIT=<sha> bash packages/inkling-kernels/benchmarks/run_session10_call4.sh
OUT=${OUT:-device-out}/r
source "$(dirname "$0")/device_env.sh"
R=$OUT
device_info
stage "a. conv decode tiles with pdl"
timeout 200 python3 $B/bench_sconv.py --only "decode 256 reqs, ATTN" --sweep --sweep-hot --reps 30 \
  --hazard-launches 0 --json "$R/sconv.json" --md "$R/sconv.md" 2>&1 | tee "$R/sconv.log"
stage "b. sliding attention, 16 KV heads"
timeout 240 python3 $B/bench_rel_attention.py --only "window 512, Hkv=16" --budget-s 1e9 --retime-top 3 --rounds 2 \
  --json "$R/sliding.json" --md "$R/sliding.md" 2>&1 | tee "$R/sliding.log"
stage "done"
tar czf "$OUT/../call.tgz" -C "$R" .

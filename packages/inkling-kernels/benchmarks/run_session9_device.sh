#!/usr/bin/env bash
# Device call (nvidia-h200), session 9: a. GPU tests of the attention kernel (bias
# "diag" included); b. bench_rel_attention.py, the default tiling against the "diag"
# rows (prefill-like cases, then decode); c. exp_prefill.py with the shift kernels.
# From the repo root:  INKLING_COMMIT=<sha> bash packages/inkling-kernels/benchmarks/run_session9_device.sh
source "$(dirname "$0")/device_env.sh"
device_info
stage "a. GPU tests"
timeout 130 python3 -m pytest -q -n 8 -p no:cacheprovider packages/inkling-kernels/tests/test_rel_attention_triton.py \
  packages/inkling-kernels/tests/test_rel_attention.py 2>&1 | tail -30 | tee "$OUT/tests.log"
stage "b. attention: prefill-like"
timeout 110 python3 $B/bench_rel_attention.py --only "prefill 8k|mixed" --sweep-rows diag --no-flex --no-torch \
  --budget-s 1e9 --json "$OUT/diag_prefill.json" --md "$OUT/diag_prefill.md" 2>&1 | tee "$OUT/diag_prefill.log"
stage "b2. attention: decode"
timeout 80 python3 $B/bench_rel_attention.py --only "decode|spec" --sweep-rows diag --no-flex --no-torch --no-sdpa \
  --budget-s 1e9 --json "$OUT/diag_decode.json" --md "$OUT/diag_decode.md" 2>&1 | tee "$OUT/diag_decode.log"
stage "c. exp_prefill shift kernels"
timeout 230 python3 $B/exp_prefill.py --json "$OUT/prefill_shift.json" --budget-s 170 --variants "floor,fast,\
mmashift 32x64/4w,mmashift 32x64/8w,mmashift 32x128/4w,mmashift 32x128/8w,mmashift 64x64/4w,mmashift 64x64/8w,mmashift 64x128/8w,\
gathershift 32x64/4w,gathershift 32x64/8w,gathershift 32x128/4w,gathershift 32x128/8w,gathershift 64x64/4w,gathershift 64x64/8w,gathershift 64x128/8w,\
overlap 32x64/4w,overlap 32x128/4w,overlap 64x128/8w" 2>&1 | tee "$OUT/prefill_shift.log"
stage "done"

#!/usr/bin/env bash
# Device call 2 (nvidia-h200), session 9: GPU tests of the attention kernel with the
# new defaults, then the full bench_rel_attention.py (PyTorch path, FlexAttention,
# SDPA, the bias rows); outputs packed in $OUT/call.tgz.
#   INKLING_COMMIT=<sha> bash packages/inkling-kernels/benchmarks/run_session9_call2.sh
set -o pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$ROOT"
OUT=${OUT:-device-out}
mkdir -p "$OUT/r"
R=$OUT/r
export PYTHONPATH=$ROOT/packages/inkling-kernels/src:$ROOT/packages/inkling-cache/src PYTHONUNBUFFERED=1
B=packages/inkling-kernels/benchmarks
T0=$(date +%s)
stage() { echo "== $1 at +$(( $(date +%s) - T0 )) s" | tee -a "$R/stages.txt"; }
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  echo "commit ${INKLING_COMMIT:-unknown}"
  date -u +%Y-%m-%dT%H:%M:%SZ
} 2>&1 | tee "$R/device.txt"
stage "a. GPU tests"
timeout 120 python3 -m pytest -q -n 8 -p no:cacheprovider packages/inkling-kernels/tests/test_rel_attention_triton.py \
  packages/inkling-kernels/tests/test_rel_attention.py 2>&1 | tail -30 | tee "$R/tests.log"
stage "b. bench_rel_attention (full)"
timeout 420 python3 $B/bench_rel_attention.py --sweep-rows bias --budget-s 1e9 \
  --json "$R/bench.json" --md "$R/bench.md" 2>&1 | tee "$R/bench.log"
stage "done"
tar czf "$OUT/call.tgz" -C "$R" .

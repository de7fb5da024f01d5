#!/usr/bin/env bash
# Issue 14's device call (one call, about 10 minutes at most), in order:
#   1. the GPU tests (tests/test_gpu.py: the one-stream kernel with and without the tap
#      map, CUDA-graph replay, the same-step hazard, and the K+V op);
#   2. the one-stream before/after: bench_sconv.py of the old tree (.scratch/before, made
#      by `run_before_after.sh --prepare <old commit>`) then of this tree, one round;
#      this tree's run is also the main conv benchmark (copy baseline: events loop);
#   3. the K+V benchmark (bench_sconv_kv.py);
#   4. a second before/after round when time is left (noise).
# Carry .scratch and .peer. Everything lands under $OUT; each stage has its own time
# limit so that a slow stage does not take the later ones with it.
#   bash packages/inkling-kernels/benchmarks/run_issue14_device.sh
set -o pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$ROOT"
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-570}  # seconds for the whole call
T0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
lim() { local v=$(( $(left) - $1 )); [ "$v" -lt 10 ] && v=10; echo "$v"; }  # time left less a reserve
stage() { echo "== $1 at +$(( $(date +%s) - T0 )) s (left $(left) s)" | tee -a "$OUT/stages.txt"; }

{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
  date -u +%Y-%m-%dT%H:%M:%SZ
} 2>&1 | tee "$OUT/device.txt"

stage "gpu tests"
PYTHONPATH=$ROOT/packages/inkling-kernels/src timeout 200 python3 -m pytest -v -p no:cacheprovider \
  packages/inkling-kernels/tests/test_gpu.py > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?" | tee -a "$OUT/stages.txt"; tail -4 "$OUT/gpu_tests.log"

stage "before/after round 1"
OUT=$OUT/round1 timeout "$(lim 120)" bash packages/inkling-kernels/benchmarks/run_before_after.sh \
  --hazard-launches 0 > "$OUT/before_after_1.log" 2>&1
echo "before/after 1 rc=$?" | tee -a "$OUT/stages.txt"; tail -3 "$OUT/before_after_1.log"

stage "K+V benchmark"
PYTHONPATH=$ROOT/packages/inkling-kernels/src timeout "$(lim 5)" python3 \
  packages/inkling-kernels/benchmarks/bench_sconv_kv.py --json "$OUT/kv.json" --md "$OUT/kv.md" > "$OUT/kv.log" 2>&1
echo "kv rc=$?" | tee -a "$OUT/stages.txt"; tail -3 "$OUT/kv.log"

if [ "$(left)" -gt 200 ]; then
  stage "before/after round 2"
  OUT=$OUT/round2 timeout "$(lim 5)" bash packages/inkling-kernels/benchmarks/run_before_after.sh \
    --hazard-launches 0 > "$OUT/before_after_2.log" 2>&1
  echo "before/after 2 rc=$?" | tee -a "$OUT/stages.txt"
fi
stage "end"

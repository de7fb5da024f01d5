#!/usr/bin/env bash
# One device call: GPU correctness tests, then the benchmark (extra args go to it).
#   bash packages/inkling-kernels/benchmarks/run_device.sh [--sweep] [--only NAME]
# Writes logs and results under $OUT (or ./device-out).
set -o pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$ROOT"
export PYTHONPATH=$ROOT/packages/inkling-kernels/src:$ROOT/packages/inkling-cache/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv | tee "$OUT/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/device.txt"
if [ -z "$SKIP_TESTS" ]; then
  python3 -m pytest -q -p no:cacheprovider -x packages/inkling-kernels/tests/test_gpu.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -15
fi
python3 packages/inkling-kernels/benchmarks/bench_sconv.py --peer-dir .peer \
  --json "$OUT/bench.json" --md "$OUT/bench.md" "$@" 2>&1 | tee "$OUT/bench.log"

# Sourced by the run_*_device scripts (bash): the repository root as the working
# directory, $OUT (created), $B (this folder, relative), the packages on PYTHONPATH,
# T0 and two helpers:
#   stage NAME    "== NAME at +S s" (and "(left L s)" when $BUDGET is set), also to $OUT/stages.txt
#   device_info   GPU, software versions, commit ($INKLING_COMMIT where the copy has no .git)
#                 and date, also to $OUT/device.txt (a script appends its own lines after it)
#   attention_gpu_tests [LIMIT_S]
#                 the relative-logit attention's GPU tests (8 workers), tail to $OUT/tests.log
set -o pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
cd "$ROOT" || exit 1
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export PYTHONPATH=$ROOT/packages/inkling-kernels/src:$ROOT/packages/inkling-cache/src PYTHONUNBUFFERED=1
B=packages/inkling-kernels/benchmarks
T0=$(date +%s)
stage() {
  local left=""
  [ -n "${BUDGET:-}" ] && left=" (left $(( BUDGET - ($(date +%s) - T0) )) s)"
  echo "== $1 at +$(( $(date +%s) - T0 )) s$left" | tee -a "$OUT/stages.txt"
}
device_info() {
  {
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
    python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'nccl', torch.cuda.nccl.version() if torch.cuda.is_available() else None)"
    echo "commit $(git rev-parse HEAD 2>/dev/null || echo "${INKLING_COMMIT:-unknown (no .git on the device; set INKLING_COMMIT)}")"
    date -u +%Y-%m-%dT%H:%M:%SZ
  } 2>&1 | tee "$OUT/device.txt"
}
attention_gpu_tests() {
  timeout "${1:-150}" python3 -m pytest -q -n 8 -p no:cacheprovider \
    packages/inkling-kernels/tests/test_rel_attention_triton.py packages/inkling-kernels/tests/test_rel_attention.py \
    2>&1 | tail -30 | tee "$OUT/tests.log"
}

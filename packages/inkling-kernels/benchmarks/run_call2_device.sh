#!/usr/bin/env bash
# Device call (nvidia-h200-x2): a. exp_prefill.py on GPU 0 (prefill conv variants);
# b. bench_tp_tail.py --tp 2 (second round, with the Triton shard scale and the
# symmetric-memory all-reduce); $OUT packed into $OUT/call2.tgz. From the repo root:
#   INKLING_COMMIT=<sha> bash packages/inkling-kernels/benchmarks/run_call2_device.sh
set -o pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$ROOT"
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export PYTHONPATH=$ROOT/packages/inkling-kernels/src:$ROOT/packages/inkling-cache/src PYTHONUNBUFFERED=1
B=packages/inkling-kernels/benchmarks
T0=$(date +%s)
stage() { echo "== $1 at +$(( $(date +%s) - T0 )) s" | tee -a "$OUT/stages.txt"; }
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'nccl', torch.cuda.nccl.version())"
  echo "commit ${INKLING_COMMIT:-unknown}"
  date -u +%Y-%m-%dT%H:%M:%SZ
} 2>&1 | tee "$OUT/device.txt"
stage "a. exp_prefill"
CUDA_VISIBLE_DEVICES=0 timeout 300 python3 $B/exp_prefill.py --json "$OUT/prefill.json" --budget-s 220 2>&1 | tee "$OUT/prefill.log"
stage "b. tp tail"
timeout 200 python3 $B/bench_tp_tail.py --tp 2 --budget-s 150 --json "$OUT/tail2.json" --md "$OUT/tail2.md" 2>&1 | tee "$OUT/tail2.log"
stage "done"
tar czf "$OUT/call2.tgz" -C "$OUT" --exclude call2.tgz . 2>/dev/null

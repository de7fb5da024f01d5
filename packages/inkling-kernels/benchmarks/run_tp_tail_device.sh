#!/usr/bin/env bash
# One device call on a two-GPU machine (nvidia-h200-x2), each stage under its own limit:
#   a. exp_graph_copy.py: the same bytes copied four ways, eagerly and graph-timed;
#   b. bench_tp_tail.py --tp 2: the TP > 1 sublayer tail, norm after the all-gather (A,
#      served) against the norm on the shard with an all-reduce of the sums of squares (B);
#   c. GPU tests named in GPU_TESTS (pytest -n XDIST) with the time left;
# then $OUT is packed into $OUT/tail.tgz. Run from the repository root:
#   INKLING_COMMIT=<sha> bash packages/inkling-kernels/benchmarks/run_tp_tail_device.sh
set -o pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$ROOT"
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export PYTHONPATH=$ROOT/packages/inkling-kernels/src:$ROOT/packages/inkling-cache/src PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-560}
GPU_TESTS=${GPU_TESTS:-"packages/inkling-kernels/tests/test_gpu.py"}
GPU_K=${GPU_K:-"cuda_graph or add_same_step"}
XDIST=${XDIST:-16}
T0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
stage() { echo "== $1 at +$(( $(date +%s) - T0 )) s (left $(left) s)" | tee -a "$OUT/stages.txt"; }
B=packages/inkling-kernels/benchmarks
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
  nvidia-smi topo -m
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'nccl', torch.cuda.nccl.version())"
  echo "commit ${INKLING_COMMIT:-unknown}"
  date -u +%Y-%m-%dT%H:%M:%SZ
} 2>&1 | tee "$OUT/device.txt"
stage "a. graph copy"
timeout 60 python3 $B/exp_graph_copy.py --json "$OUT/copy.json" 2>&1 | tee "$OUT/copy.log"
stage "b. tp tail"
timeout $(( $(left) > 300 ? 240 : $(left) - 60 )) python3 $B/bench_tp_tail.py --tp 2 --budget-s 180 \
  --json "$OUT/tail.json" --md "$OUT/tail.md" 2>&1 | tee "$OUT/tail.log"
stage "c. gpu tests"
timeout $(( $(left) - 15 )) python3 -m pytest -q -n "$XDIST" $GPU_TESTS -k "$GPU_K" 2>&1 | tail -40 | tee "$OUT/tests.log"
stage "done"
tar czf "$OUT/tail.tgz" -C "$OUT" --exclude tail.tgz . 2>/dev/null

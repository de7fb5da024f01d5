#!/usr/bin/env bash
# One device call on a two-GPU machine (nvidia-h200-x2), each stage under its own limit:
#   a. exp_graph_copy.py: the same bytes copied four ways, eagerly and graph-timed;
#   b. bench_tp_tail.py --tp 2: the TP > 1 sublayer tail, norm after the all-gather (A,
#      served) against the norm on the shard with an all-reduce of the sums of squares (B);
#   c. GPU tests named in GPU_TESTS (pytest -n XDIST) with the time left;
# then $OUT is packed into $OUT/tail.tgz. Run from the repository root:
#   INKLING_COMMIT=<sha> bash packages/inkling-kernels/benchmarks/run_tp_tail_device.sh
BUDGET=${BUDGET:-560}
GPU_TESTS=${GPU_TESTS:-"packages/inkling-kernels/tests/test_gpu.py"}
GPU_K=${GPU_K:-"cuda_graph or add_same_step"}
XDIST=${XDIST:-16}
source "$(dirname "$0")/device_env.sh"
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
device_info
nvidia-smi topo -m 2>&1 | tee -a "$OUT/device.txt"
stage "a. graph copy"
timeout 60 python3 $B/exp_graph_copy.py --json "$OUT/copy.json" 2>&1 | tee "$OUT/copy.log"
stage "b. tp tail"
timeout $(( $(left) > 300 ? 240 : $(left) - 60 )) python3 $B/bench_tp_tail.py --tp 2 --budget-s 180 \
  --json "$OUT/tail.json" --md "$OUT/tail.md" 2>&1 | tee "$OUT/tail.log"
stage "c. gpu tests"
timeout $(( $(left) - 15 )) python3 -m pytest -q -n "$XDIST" $GPU_TESTS -k "$GPU_K" 2>&1 | tail -40 | tee "$OUT/tests.log"
stage "done"
tar czf "$OUT/tail.tgz" -C "$OUT" --exclude tail.tgz . 2>/dev/null

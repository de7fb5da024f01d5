#!/usr/bin/env bash
# The per-layer benchmark's device call (issue 14): one call, at most BUDGET (540) seconds,
# each stage under its own time limit so that a slow stage does not take the later ones
# with it. In order:
#   a. the GPU tests named in GPU_TESTS (pytest, no xdist);
#   b. bench_layer.py, global layer, TP 1 and TP 8 shard shapes, the peer from .peer
#      (the results file: layer_r1.json / layer_r1.md);
#   c. when time is left, a second round (noise check) that also adds the sliding layer
#      (layer_r2.*; global first, so a cut-short round still holds the repeat);
#   then everything under $OUT is packed into $OUT/layer.tgz (loose files can get lost).
# bench_layer.py writes its JSON after every case, so a stage cut by its limit keeps
# the cases it finished. Run from anywhere, with .peer carried (fetch_peer.py output);
# INKLING_COMMIT names the tree where the device copy has no .git (bench_layer.py records it):
#   INKLING_COMMIT=<sha> bash packages/inkling-kernels/benchmarks/run_layer_device.sh
source "$(dirname "$0")/device_env.sh"
GPU_TESTS=${GPU_TESTS:-"packages/inkling-kernels/tests/test_gpu.py packages/inkling-kernels/tests/test_sconv_add_rmsnorm.py"}
BUDGET=${BUDGET:-540}      # seconds for the whole call
TESTS_LIMIT=${TESTS_LIMIT:-270}  # test_gpu.py took 148 s, test_sconv_add_rmsnorm.py 38-88 s
RESERVE=20                 # kept for packing the results
REPS=${REPS:-50}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
lim() { local v=$(( $(left) - RESERVE )); [ "$v" -lt 5 ] && v=5; [ -n "$1" ] && [ "$1" -lt "$v" ] && v=$1; echo "$v"; }
BENCH=packages/inkling-kernels/benchmarks/bench_layer.py

device_info
echo "peer: $(tr '\n' ' ' < .peer/PROVENANCE.txt 2>/dev/null || echo 'missing: .peer not carried')" | tee -a "$OUT/device.txt"

stage "a. gpu tests: $GPU_TESTS"
# shellcheck disable=SC2086  # GPU_TESTS is a list of paths
timeout -k 5 "$(lim "$TESTS_LIMIT")" python3 -m pytest -q -p no:cacheprovider -p no:benchmark $GPU_TESTS \
  > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?" | tee -a "$OUT/stages.txt"; tail -3 "$OUT/gpu_tests.log"

stage "b. bench_layer round 1 (global)"
timeout -k 5 "$(lim)" python3 "$BENCH" --peer-dir .peer --layers global --reps "$REPS" \
  --json "$OUT/layer_r1.json" --md "$OUT/layer_r1.md" > "$OUT/layer_r1.log" 2>&1
echo "bench round 1 rc=$?" | tee -a "$OUT/stages.txt"; tail -4 "$OUT/layer_r1.log"

if [ "$(left)" -gt 90 ]; then
  stage "c. bench_layer round 2 (global again, then sliding)"
  timeout -k 5 "$(lim)" python3 "$BENCH" --peer-dir .peer --layers global,sliding --reps "$REPS" \
    --json "$OUT/layer_r2.json" --md "$OUT/layer_r2.md" > "$OUT/layer_r2.log" 2>&1
  echo "bench round 2 rc=$?" | tee -a "$OUT/stages.txt"; tail -2 "$OUT/layer_r2.log"
else
  echo "round 2 skipped: $(left) s left" | tee -a "$OUT/stages.txt"
fi

stage "end: packing $OUT into layer.tgz"
tar czf /tmp/layer.tgz -C "$OUT" . && mv /tmp/layer.tgz "$OUT/layer.tgz"
ls -la "$OUT"

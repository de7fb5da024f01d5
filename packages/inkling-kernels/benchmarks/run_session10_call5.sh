#!/usr/bin/env bash
# Device call 5 (nvidia-h200), session 10: programmatic dependent launch as the conv
# kernel's default for mapped decode-size launches. GPU tests of the conv kernels
# (shapes, graph replay: the map build then the conv, which must wait for it), the
# decode sweep with pdl rows (cold / hot, peer in the same run), and the layer bench
# on the decode steps with pdl off and on (INKLING_KERNELS_PDL). Needs .peer carried
# (fetch_peer.py). Outputs packed in $OUT/call.tgz.
#   INKLING_COMMIT=<sha> bash packages/inkling-kernels/benchmarks/run_session10_call5.sh
OUT=${OUT:-device-out}/r
source "$(dirname "$0")/device_env.sh"
R=$OUT
device_info
stage "a. GPU tests (conv kernels)"
timeout 150 python3 -m pytest -q -n 8 -p no:cacheprovider packages/inkling-kernels/tests/test_gpu.py \
  -k "graph or shapes" 2>&1 | tail -30 | tee "$R/tests.log"
stage "b. conv decode sweep with pdl"
timeout 150 python3 $B/bench_sconv.py --peer-dir .peer --only "decode|spec" --sweep --sweep-hot --reps 30 \
  --hazard-launches 0 --json "$R/sconv.json" --md "$R/sconv.md" 2>&1 | tee "$R/sconv.log"
for pdl in 0 1; do
  stage "c. layer, decode steps, INKLING_KERNELS_PDL=$pdl"
  INKLING_KERNELS_PDL=$pdl timeout 120 python3 $B/bench_layer.py --peer-dir .peer --layers global \
    --only "decode|spec" --reps 50 --json "$R/layer_pdl$pdl.json" --md "$R/layer_pdl$pdl.md" 2>&1 \
    | tee "$R/layer_pdl$pdl.log" | tail -20
done
stage "done"
tar czf "$OUT/../call.tgz" -C "$R" .

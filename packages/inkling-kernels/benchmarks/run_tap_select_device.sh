#!/usr/bin/env bash
# The next device calls (nvidia-h200) for the one-load tap (SconvConfig.tap_select,
# NormConfig.tap_select; INKLING_KERNELS_TAP_SELECT=1 switches on the proposed defaults:
# 16-row mapped conv tiles at T x C >= 2^20, the add and norm kernels with one load a tap).
# Two calls, each under the 600 s limit; outputs packed in $OUT/call.tgz.
#
#   INKLING_COMMIT=<sha> bash packages/inkling-kernels/benchmarks/run_tap_select_device.sh tests
#     a. the conv family's GPU tests with the switch on (every default tiling the switch
#        changes, the one-load tile tests, the add/norm kernels' tests on CUDA);
#     b. fused_sconv_add's graph-replay and many-launch hazard tests with the defaults
#        (not yet shown passing on a GPU: earlier calls ran out of device time).
#   INKLING_COMMIT=<sha> bash packages/inkling-kernels/benchmarks/run_tap_select_device.sh bench
#     (.peer carried: fetch_peer.py) c. bench_sconv --sweep, every row (the one-load rows
#     included) checked against fused_sconv_ref before it is timed, cold and hot, vLLM
#     0.33.0's kernel in the same run; d. bench_layer on global and sliding layers, ours
#     timed with the defaults and again with the switch on, the peer in the same run.
#   INKLING_COMMIT=<sha> bash packages/inkling-kernels/benchmarks/run_tap_select_device.sh prefill
#     e. exp_prefill.py: the library kernel, the store-only floor and session 11's
#        untimed prefill designs (one load a tap in the experimental kernel; speculative
#        shifted taps issued before the map is read), each checked before it is timed.
#
# Clean tests and "ok" checks everywhere, and the one-load rows faster, are what the
# switch needs before its proposal becomes the default (RESULTS_prefill_exp.md, session 10).
OUT=${OUT:-device-out}/r
source "$(dirname "$0")/device_env.sh"
device_info
T=packages/inkling-kernels/tests
case "${1:-}" in
  tests)
    stage "a. conv GPU tests, INKLING_KERNELS_TAP_SELECT=1"
    INKLING_KERNELS_TAP_SELECT=1 timeout 300 python3 -m pytest -q -n 8 -p no:cacheprovider \
      $T/test_gpu.py $T/test_sconv_add.py $T/test_sconv_add_rmsnorm.py $T/test_sconv_kv.py \
      > "$OUT/tests_tap_select.log" 2>&1
    tail -25 "$OUT/tests_tap_select.log"
    stage "b. fused_sconv_add graph replay + hazard tests, defaults"
    timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider $T/test_gpu.py \
      -k "add_cuda_graph or add_same_step" > "$OUT/tests_add.log" 2>&1
    tail -15 "$OUT/tests_add.log"
    ;;
  bench)
    stage "c. conv sweep, rows checked"
    timeout 330 python3 $B/bench_sconv.py --peer-dir .peer --sweep --sweep-hot --reps 30 --hazard-launches 0 \
      --json "$OUT/sweep.json" --md "$OUT/sweep.md" > "$OUT/sweep.log" 2>&1
    tail -5 "$OUT/sweep.log"
    stage "d. layer, defaults and one-load, peer"
    timeout 220 python3 $B/bench_layer.py --peer-dir .peer --layers global,sliding --reps 50 --tap-select \
      --json "$OUT/layer.json" --md "$OUT/layer.md" > "$OUT/layer.log" 2>&1
    tail -40 "$OUT/layer.log"
    ;;
  prefill)
    stage "e. prefill designs"
    timeout 420 python3 $B/exp_prefill.py --budget-s 360 --json "$OUT/prefill.json" \
      --variants "floor,sel 16x128/4w,sel 8x128/4w,sel 16x256/8w,spec 16x128/4w,spec 8x128/4w,spec 32x128/4w,spec 16x256/8w,spec 16x64/2w" \
      > "$OUT/prefill.log" 2>&1
    tail -40 "$OUT/prefill.log"
    ;;
  *)
    echo "usage: $0 tests|bench|prefill" >&2
    exit 2
    ;;
esac
stage "done"
tar czf "$OUT/../call.tgz" -C "$OUT" .

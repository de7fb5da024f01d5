#!/usr/bin/env bash
# Device calls (nvidia-h200) for the one-load tap (SconvConfig.tap_select: fused_sconv's
# default for mapped launches of T x C >= 2^20 since session 12; INKLING_KERNELS_TAP_SELECT=0
# turns it off). Each mode fits one call (< 600 s); outputs packed in $OUT/call.tgz.
#
#   INKLING_COMMIT=<sha> bash packages/inkling-kernels/benchmarks/run_tap_select_device.sh MODE
#   tests    the conv family's GPU tests (test_gpu, test_sconv_add, test_sconv_add_rmsnorm,
#            test_sconv_kv; 8 workers; about 12 min on the H200: two calls' worth, see check)
#   check    fused_sconv's GPU tests with the defaults (Inkling shapes, the one-load tiles,
#            CUDA-graph replay, the many-launch same-step hazard), then the sweep and the
#            prefill designs below: session 12's call
#   bench    (.peer carried: fetch_peer.py) the sweep: every row checked against
#            fused_sconv_ref before it is timed, cold and hot, vLLM 0.33.0's kernel in the
#            same run; then bench_layer on global and sliding layers, the peer in the same run
#   prefill  exp_prefill.py: the library kernel, the store-only floor and the one-load
#            designs of the experimental kernel, each checked before it is timed
#   feat     exp_prefill.py, about a minute: which of the library kernel's ways (map as a
#            2D tile, channel mask, clamped taps, 1D weights) takes away the experimental
#            kernel's int32 gain (RESULTS_prefill_exp.md, session 12)
#   rows     exp_prefill.py (session 13): the "rows" kernel (x rows as registers, every
#            load before any store) on several tiles, next to the floor, the best sel tile
#            and the feat variants; about 5 minutes
#   rowslib  (.peer carried) the library's row-register kernel (fused_sconv's default for
#            prefill-sized mapped launches since session 13): fused_sconv's GPU tests, its
#            tiles in exp_prefill.py next to the one-load tile and the floor, the sweep
#   kvrows   bench_sconv_kv.py --rows: fused_sconv_kv on the row-register kernel (one
#            launch per stream, opt-in since session 13, checked first) next to its
#            default one-launch tiles, every KV shape and step
#   s14      (session 14) the row kernel's GPU tests; exp_prefill.py: the library's row
#            kernel (weights as one tile), with its old strided weights, the experimental
#            kernel, the one-load tile, the floor; then the --threshold cases (decode-heavy
#            and mid-size launches, mixed batches with their decodes first and last)
#   s15      (next) exp_prefill.py: the experimental row kernel's load path as [8, SUB]
#            channel chunks (rows2d) against row by row and the library, prefill and
#            --threshold cases (decode-heavy, mixed with decodes first and last)
#   s15b     (session 15) the library's row kernel with its load path as [8, 64] chunks:
#            its GPU tests (rows, K+V, mapped hazard), exp_prefill.py next to the
#            experimental rows2d and the one-load tile, then the --threshold cases
#   s15c     (.peer carried) the row kernel's and K+V GPU tests, bench_sconv_kv.py --rows
#            (K and V in one row-kernel launch against two), then the sweep; `layer` after
#   s15d     (.peer carried) the sweep (with the mixed batch in vLLM's order too), then
#            bench_layer on global and sliding layers, the peer in the same run
#   s16      (written in session 16, not yet run: that session had 213 s of device time) GPU tests of the K+V launch on the row kernel (CUDA-graph replay,
#            the many-launch same-step hazard); the --threshold cases with the experimental
#            row kernel's tiles rotated (rows2d-rot: the decode tiles first in either order)
#   s17      (session 17, calls 2 and 4; mode removed with the feature) the library's row
#            kernel with a host-computed tile rotation: no gain without the modulo
#   s17b     the --threshold cases: the experimental row kernel in plain order, rotated, and
#            with its load-path tiles spread evenly over the grid (rows2d-ilv), next to the library
#   s17c     (.peer carried) s17b's cases (the experimental kernel now without a modulo
#            in its plain launches), then the sweep
#   s17d     (written in session 17, not yet run: no device time left) the mixed batch in
#            both orders next to its two parts alone (the 2048-token prompt, the 255
#            decodes): the library (default, row kernel forced), rows2d-rot
#   s18      (session 18) exp_split.py: the prompt-first mixed batch as one launch or as
#            two on row slices (decodes, then prompt), cold and hot; the same variants
#            once each under ncu (duration, DRAM throughput and bytes, L2 hit rate,
#            occupancy); then s17d
#   s18b     the row kernel's L2 prefetch of its load-path taps (INKLING_KERNELS_ROWS_PREFETCH
#            0 and 1): exp_split.py, the --threshold cases, the row kernel's GPU tests with it on
#            (run at tree 95f284e; the prefetch gained nothing and was removed after it, so on
#            later trees both settings run the same kernel)
#   s19      (session 19) exp_norm_rows.py: fused_sconv_add_rmsnorm / fused_sconv_add on the
#            row-register kernel (NormConfig.rows, several tiles, each checked against the
#            tile kernel first) next to the tile kernel; then the add/norm kernels' GPU tests
#   s19b     (.peer carried) s19's experiment with every variant checked against the fp32
#            reference, bench_layer (global and sliding, the peer in the same run), the
#            add/norm GPU tests
#   s19c     (.peer carried) the final session-19 call: the GPU tests of the row-register
#            add/norm kernel and of the add/norm files, s19b's experiment, bench_layer
#   s20      (session 20) the row kernels' GPU tests (test_gpu.py -k rows, the fixed 2 x 512
#            graph-replay test among them); the rows rule's boundary: speculative batches of
#            7 and 8 drafts (8 and 9 rows a request) and the 1024-token mix in both orders,
#            fused_sconv (--threshold, every case: default, row kernel, one-load tile; call 1
#            also the row kernel with its tiles last to first and from both ends, since
#            removed) and the add/norm kernels (exp_norm_rows.py: tile kernel, row tiles,
#            the default's choice)
#   s20b     (session 20) the row-register add/norm GPU tests (graph replay with the fixed 2 x 512
#            parameters, the hazard; fused_sconv_add's 2-row tile among them); the defaults
#            with the batches' prompt-row hint (SconvBatch.num_prefill_tokens) on the rows
#            rule's boundary cases: fused_sconv (--threshold) and the add/norm kernels
#   s20c     (.peer carried) the final session-20 call: the row kernels' GPU tests
#            (test_gpu.py -k rows), then bench_layer (global and sliding, the peer in the
#            same run)
#   s20d     (session 20) the experimental row kernel with its tiles last to first, with
#            its slot and map loads before its x rows, and both, on prefill and mixed cases
#   s21      (session 21) GPU tests of the row kernel's reversed compile (decodes_last), then the
#            library's row kernel in its plain order, reversed, and as the batch says, on prefill
#            and mixed cases of both orders
#   s21b     (.peer carried) the sweep (the standing, the peer in the same run), then the layer
#   s21c     (.peer carried) bench_sconv's two mixed cases under three seeds (placement of the
#            cache blocks), then the threshold harness on the same cases
#   s21d     (.peer carried) the prompt-first mixed case after the 16k sliding K case alone, then
#            every case without the sweep: where does the full sweep's slower figure come from?
#   s14c     (.peer carried) GPU tests of the row kernel, the K+V launch and the mapped
#            hazard paths, then the sweep
#   layer    (.peer carried) bench_layer on global and sliding layers, the peer in the same run
#   weights  exp_prefill.py, about 3 minutes: the library's row and one-load kernels with
#            the weights [W, C]-contiguous, next to the experimental row kernel with and
#            without (RESULTS_prefill_exp.md, session 13)
OUT=${OUT:-device-out}/r
source "$(dirname "$0")/device_env.sh"
device_info
T=packages/inkling-kernels/tests
PREFILL_VARIANTS="floor,sel 16x128/4w,sel-i64 16x128/4w,sel-varC 16x128/4w,sel-wCW 16x128/4w,sel lib-like 16x128/4w"
PREFILL_VARIANTS+=",sel+cs 16x128/4w,sel+cs 16x256/8w,sel+cs 8x256/4w,sel 16x128/2w,sel 16x64/2w,sel 32x128/4w"
PREFILL_VARIANTS+=",sel 32x64/4w,sel 8x256/4w,sel 16x256/4w,sel 16x256/8w"
sweep() {
  stage "sweep, rows checked"
  timeout "$1" python3 $B/bench_sconv.py --peer-dir .peer --sweep --sweep-hot --reps 30 --hazard-launches 0 \
    --json "$OUT/sweep.json" --md "$OUT/sweep.md" > "$OUT/sweep.log" 2>&1
  tail -5 "$OUT/sweep.log"
}
layer() {
  stage "layer, peer"
  timeout "$1" python3 $B/bench_layer.py --peer-dir .peer --layers global,sliding --reps 50 \
    --json "$OUT/layer.json" --md "$OUT/layer.md" > "$OUT/layer.log" 2>&1
  tail -"$2" "$OUT/layer.log"
}
threshold() {  # limit (s), variants, lines of the table to print[, more exp_prefill.py arguments]
  stage "threshold cases"
  timeout "$1" python3 $B/exp_prefill.py --threshold --budget-s $(( $1 - 20 )) --json "$OUT/threshold.json" \
    --variants "$2" "${@:4}" > "$OUT/threshold.log" 2>&1
  grep -E "^\| " "$OUT/threshold.log" | cut -c1-150 | tail -"$3"
}
gputests() {  # limit (s), pytest -k expression, lines of the log to print
  timeout "$1" python3 -m pytest -q -n 8 -p no:cacheprovider $T/test_gpu.py -k "$2" > "$OUT/tests.log" 2>&1
  tail -"$3" "$OUT/tests.log"
}
prefill() {
  stage "prefill designs"
  timeout "$1" python3 $B/exp_prefill.py --budget-s $(( $1 - 40 )) --json "$OUT/prefill.json" \
    --variants "$PREFILL_VARIANTS" > "$OUT/prefill.log" 2>&1
  grep -E "case |lib|floor|sel" "$OUT/prefill.log" | grep -v '^- ' | cut -c1-160 | tail -90
}
case "${1:-}" in
  tests)
    stage "conv GPU tests"
    timeout 560 python3 -m pytest -q -n 8 -p no:cacheprovider \
      $T/test_gpu.py $T/test_sconv_add.py $T/test_sconv_add_rmsnorm.py $T/test_sconv_kv.py \
      > "$OUT/tests.log" 2>&1
    tail -25 "$OUT/tests.log"
    ;;
  check)
    stage "fused_sconv GPU tests, defaults"
    gputests 260 "not kv_ and not add_" 15
    sweep 150
    prefill 110
    ;;
  bench)
    sweep 330
    layer 220 40
    ;;
  prefill)
    prefill 420
    ;;
  feat)
    PREFILL_VARIANTS="sel 16x128/4w,sel lib-like 16x128/4w,sel-i32 16x128/4w,sel+map2d 16x128/4w"
    PREFILL_VARIANTS+=",sel+cmask 16x128/4w,sel+clamp 16x128/4w,sel+w1d 16x128/4w,sel+all4 16x128/4w"
    PREFILL_VARIANTS+=",sel+all4 i64 16x128/4w"
    prefill 150
    ;;
  rows)
    PREFILL_VARIANTS="floor,sel+cs 8x256/4w,rows 8x512/4w/g1,rows 8x256/2w/g1,rows 16x512/4w/g1,rows 8x1024/4w/g1"
    PREFILL_VARIANTS+=",rows 16x256/2w/g1,rows 8x512/2w/g1,rows 8x256/1w/g1,rows 16x256/1w/g1,rows 8x512/4w/g4"
    PREFILL_VARIANTS+=",rows 16x1024/4w/g1,sel 16x128/4w,sel lib-like 16x128/4w,sel-i32 16x128/4w"
    PREFILL_VARIANTS+=",sel+map2d 16x128/4w,sel+cmask 16x128/4w,sel+clamp 16x128/4w,sel+w1d 16x128/4w"
    PREFILL_VARIANTS+=",sel+all4 16x128/4w"
    prefill 560
    ;;
  rowslib)
    stage "fused_sconv GPU tests, defaults (the row-register kernel included)"
    gputests 250 "not kv_ and not add_" 15
    PREFILL_VARIANTS="floor,lib-one-load 16x128/4w,rows 8x256/2w/g1,lib-rows 16x256/1w,lib-rows 16x1024/4w"
    prefill 135
    sweep 165
    ;;
  weights)
    # session 13's open question, about 3 minutes: is the library row kernel's gap to the
    # experimental one its [C, W] weight view (114 registers against 96 with [W, C])?
    PREFILL_VARIANTS="lib-rows-wt 8x256/2w,rows 8x256/2w/g1,rows-wCW 8x256/2w/g1,rows-wtile 8x256/2w/g1"
    PREFILL_VARIANTS+=",lib-one-load 16x128/4w"
    PREFILL_VARIANTS+=",lib-one-load-wt 16x128/4w,floor"
    prefill 240
    ;;
  kvrows)
    stage "fused_sconv_kv, the row kernel"
    timeout 500 python3 $B/bench_sconv_kv.py --rows --json "$OUT/kv.json" --md "$OUT/kv.md" > "$OUT/kv.log" 2>&1
    tail -30 "$OUT/kv.md"
    ;;
  s14)
    stage "row kernel GPU tests"
    gputests 170 "rows" 8
    PREFILL_VARIANTS="floor,lib-one-load 16x128/4w,lib-rows 8x256/2w,lib-rows-strided-w 8x256/2w"
    PREFILL_VARIANTS+=",rows 8x256/2w/g1,lib-rows-wt 8x256/2w"
    prefill 200
    threshold 200 "lib-one-load 16x128/4w,lib-rows 8x256/2w" 45
    ;;
  s15)
    # session 14's open question, about 5 minutes: the experimental row kernel with its
    # load path as [8, SUB] channel chunks (rows2d: 72 registers for sm_90 at SUB 64,
    # against 92 row by row and the library's 87) on the prefill and the threshold cases
    PREFILL_VARIANTS="floor,lib-rows 8x256/2w,rows-wtile 8x256/2w/g1,rows2d 8x256/2w/s64,rows2d 8x256/2w/s32"
    PREFILL_VARIANTS+=",rows2d 8x256/2w/s128,rows2d-all 8x256/2w/s64"
    prefill 200
    threshold 200 "lib-one-load 16x128/4w,lib-rows 8x256/2w,rows-wtile 8x256/2w/g1,rows2d 8x256/2w/s64,rows2d 8x256/2w/s32" 50
    ;;
  s15b)
    stage "GPU tests: the row kernel, the K+V launch, the hazard on the mapped paths"
    gputests 170 "rows or kv_ or (hazard and map)" 8
    PREFILL_VARIANTS="floor,lib-one-load 16x128/4w,rows-wtile 8x256/2w/g1,rows2d 8x256/2w/s64"
    prefill 130
    threshold 170 "lib-one-load 16x128/4w,lib-rows 8x256/2w,rows2d 8x256/2w/s64" 40
    ;;
  s15c)
    stage "GPU tests: the row kernel (int64 offsets too), the K+V launches"
    gputests 150 "rows or kv_" 4
    stage "fused_sconv_kv, the row kernel"
    timeout 130 python3 $B/bench_sconv_kv.py --rows --json "$OUT/kv.json" --md "$OUT/kv.md" > "$OUT/kv.log" 2>&1
    tail -32 "$OUT/kv.md"
    sweep 230
    ;;
  s15d)
    sweep 150
    layer 330 30
    ;;
  s16)
    stage "GPU tests: the K+V launch (row kernel included), graph replay and hazard"
    gputests 230 "kv_cuda_graph or kv_same_step" 6
    threshold 230 "lib-rows 8x256/2w,rows2d 8x256/2w/s64,rows2d-rot 8x256/2w/s64" 40
    grep "rotated" "$OUT/threshold.log" | head -12
    ;;
  s17b)
    threshold 200 "lib-rows 8x256/2w,rows2d 8x256/2w/s64,rows2d-rot 8x256/2w/s64,rows2d-ilv 8x256/2w/s64" 50
    grep "spread" "$OUT/threshold.log" | sort -u | head -12
    ;;
  s17c)
    threshold 120 "lib-rows 8x256/2w,rows2d 8x256/2w/s64,rows2d-rot 8x256/2w/s64,rows2d-ilv 8x256/2w/s64" 50
    sweep 200
    ;;
  s17d)
    threshold 150 "lib-rows 8x256/2w,rows2d-rot 8x256/2w/s64" 30 --only "2048|255 decodes"
    ;;
  s18)
    stage "split: the prompt-first mixed batch as one launch or two"
    timeout 150 python3 $B/exp_split.py --json "$OUT/split.json" > "$OUT/split.log" 2>&1
    tail -22 "$OUT/split.log"
    stage "ncu: each variant once (caches flushed per kernel)"
    M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,dram__bytes_write.sum
    M+=,lts__t_sector_hit_rate.pct,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread
    M+=,launch__grid_size,sm__throughput.avg.pct_of_peak_sustained_elapsed
    timeout 200 ncu --clock-control none --profile-from-start off --nvtx --print-summary none --metrics "$M" \
      --csv python3 $B/exp_split.py --ncu > "$OUT/ncu.csv" 2> "$OUT/ncu.err"
    echo "ncu rc $?"; grep -c '"' "$OUT/ncu.csv"; tail -3 "$OUT/ncu.err"
    python3 - "$OUT/ncu.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
head, body = rows[0], rows[1:]
ix = {h: i for i, h in enumerate(head)}
per = collections.OrderedDict()
for r in body:
    key = (r[ix["ID"]], r[ix.get("Kernel Name", 0)][:28])
    per.setdefault(key, {})[r[ix["Metric Name"]]] = r[ix["Metric Value"]]
for (kid, kname), m in per.items():
    print(kid, kname, " ".join(f"{k.split('__')[1][:22]}={v}" for k, v in m.items()))
PY
    threshold 150 "lib-rows 8x256/2w,rows2d-rot 8x256/2w/s64" 30 --only "2048|255 decodes"
    ;;
  s19)
    stage "norm rows: the row-register fused conv + add (+ RMSNorm) against the tile kernel"
    timeout 330 python3 $B/exp_norm_rows.py --json "$OUT/norm_rows.json" > "$OUT/norm_rows.log" 2>&1
    echo "rc $?"; grep -vE "^\s*$" "$OUT/norm_rows.log" | cut -c1-150 | tail -190
    stage "GPU tests of the add/norm kernels (rows configs among them)"
    timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider $T/test_sconv_add_rmsnorm.py $T/test_sconv_add.py \
      > "$OUT/tests.log" 2>&1
    tail -8 "$OUT/tests.log"
    ;;
  s19b)
    stage "norm rows, checked against the reference"
    timeout 240 python3 $B/exp_norm_rows.py --json "$OUT/norm_rows.json" > "$OUT/norm_rows.log" 2>&1
    echo "rc $?"; tail -2 "$OUT/norm_rows.log"
    layer 170 8
    stage "GPU tests of the add/norm kernels"
    timeout 120 python3 -m pytest -q -n 8 -p no:cacheprovider $T/test_sconv_add_rmsnorm.py $T/test_sconv_add.py \
      $T/test_gpu.py -k "add or norm" > "$OUT/tests.log" 2>&1
    tail -6 "$OUT/tests.log"
    ;;
  s20)
    stage "GPU tests of the row kernels (fused_sconv, fused_sconv_kv, add/norm)"
    gputests 180 "rows" 6
    # (call 1 ran lib-rows-rev and lib-rows-zz too: variants removed after it)
    threshold 200 "lib-rows 8x256/2w,lib-one-load 16x128/4w" 100
    stage "add/norm row tiles at the rows rule's boundary"
    timeout 130 python3 $B/exp_norm_rows.py --json "$OUT/norm_rows.json" \
      --cases "spec verify,mixed 255 + 1024,mixed 1024" > "$OUT/norm_rows.log" 2>&1
    echo "rc $?"; grep -vE "^\s*$" "$OUT/norm_rows.log" | cut -c1-150 | tail -80
    ;;
  s20b)
    stage "GPU tests of the row-register add/norm kernel"
    gputests 200 "norm_rows" 6
    threshold 150 "lib-rows 8x256/2w,lib-one-load 16x128/4w" 60 \
      --only "spec verify|1024|mixed 2048|decodes + 2048"
    stage "add/norm defaults with the hint at the rows rule's boundary"
    timeout 130 python3 $B/exp_norm_rows.py --json "$OUT/norm_rows.json" \
      --cases "spec verify 1,spec verify 2,mixed 255 + 1024,mixed 1024,mixed 2048,mixed 255 + 2048" \
      > "$OUT/norm_rows.log" 2>&1
    echo "rc $?"; tail -2 "$OUT/norm_rows.log"
    ;;
  s20c)
    stage "GPU tests of the row kernels"
    gputests 240 "rows" 6
    layer 200 8
    ;;
  s21)
    stage "GPU tests: the row kernel's reversed compile"
    gputests 200 "decodes_last or rows-rev" 6
    threshold 330 "lib,lib-rows-inorder 8x256/2w,lib-rows-rev 8x256/2w,rows2d-mf-rev 8x256/2w/s64" 80 \
      --only "prefill 1024|tp8|part of the mix: prompt|2048 + 255|decodes + 2048|prefill 2048|1024 + 255|decodes + 1024"
    ;;
  s21b)
    sweep 200
    layer 330 30
    ;;
  s21c)
    for seed in 0 1 2; do
      stage "bench_sconv mixed, seed $seed"
      timeout 70 python3 $B/bench_sconv.py --peer-dir .peer --only "mixed" --reps 30 --hazard-launches 0 \
        --seed $seed --json "$OUT/mixed_seed$seed.json" --md "$OUT/mixed_seed$seed.md" > "$OUT/mixed_seed$seed.log" 2>&1
      grep "^| mixed" "$OUT/mixed_seed$seed.log" | cut -c1-200
    done
    threshold 120 "lib,lib-rows-inorder 8x256/2w" 20 --only "2048 + 255|decodes + 2048"
    ;;
  s21d)
    for sel in "16384|mixed" "all"; do
      only=(--only "$sel"); [ "$sel" = all ] && only=()
      tag=${sel//|/_}
      stage "bench_sconv ${sel}"
      timeout 150 python3 $B/bench_sconv.py --peer-dir .peer "${only[@]}" --reps 30 --hazard-launches 0 \
        --json "$OUT/b_$tag.json" --md "$OUT/b_$tag.md" > "$OUT/b_$tag.log" 2>&1
      grep -E "^\| (mixed|prefill 16384)" "$OUT/b_$tag.log" | cut -c1-120
    done
    ;;
  s20d)
    threshold 200 "rows2d 8x256/2w/s64,rows2d-rev 8x256/2w/s64,rows2d-mf 8x256/2w/s64,rows2d-mf-rev 8x256/2w/s64" 60 \
      --only "prefill 1024|tp8|part of the mix: prompt|2048 + 255|decodes + 2048|prefill 2048"
    ;;
  s19c)
    stage "GPU tests: the row-register add/norm kernel (graph replay, hazard), the add/norm files"
    timeout 230 python3 -m pytest -q -n 8 -p no:cacheprovider $T/test_gpu.py -k "norm_rows or add_" \
      $T/test_sconv_add_rmsnorm.py $T/test_sconv_add.py > "$OUT/tests.log" 2>&1
    tail -6 "$OUT/tests.log"
    stage "norm rows, checked against the reference"
    timeout 120 python3 $B/exp_norm_rows.py --json "$OUT/norm_rows.json" > "$OUT/norm_rows.log" 2>&1
    echo "rc $?"; tail -2 "$OUT/norm_rows.log"
    layer 170 8
    ;;
  s18b)
    for pf in 0 1; do
      stage "split, INKLING_KERNELS_ROWS_PREFETCH=$pf"
      INKLING_KERNELS_ROWS_PREFETCH=$pf timeout 100 python3 $B/exp_split.py --json "$OUT/split_pf$pf.json" \
        > "$OUT/split_pf$pf.log" 2>&1
      grep -E "single|copy" "$OUT/split_pf$pf.log"
    done
    for pf in 0 1; do
      INKLING_KERNELS_ROWS_PREFETCH=$pf threshold 110 "lib-rows 8x256/2w" 30
      mv "$OUT/threshold.log" "$OUT/threshold_pf$pf.log"; mv "$OUT/threshold.json" "$OUT/threshold_pf$pf.json"
    done
    stage "GPU tests of the row kernel, prefetch on"
    INKLING_KERNELS_ROWS_PREFETCH=1 gputests 200 "rows" 6
    ;;
  s14c)
    stage "GPU tests: the row kernel, the K+V launch, the hazard on the mapped paths"
    gputests 230 "rows or kv_ or (hazard and map)" 8
    sweep 200
    ;;
  layer)
    layer 300 40
    ;;
  *)
    echo "usage: $0 tests|check|bench|prefill|feat|rows|rowslib|weights|kvrows|s14|s14c|s15|s15b|s15c|s15d|s16|s17b|s17c|s17d|s18|s18b|layer" >&2
    exit 2
    ;;
esac
stage "done"
tar czf "$OUT/../call.tgz" -C "$OUT" .

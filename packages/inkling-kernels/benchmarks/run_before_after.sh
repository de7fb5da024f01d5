#!/usr/bin/env bash
# The kernel benchmark before and after a change, on one device, back to back (issue 9).
#
#   1. here (a git checkout), once:   bash packages/inkling-kernels/benchmarks/run_before_after.sh --prepare [BASE]
#      extracts packages/inkling-kernels of BASE (default: the commit before the reshape)
#      into the ignored .scratch/before/;
#   2. on the device (repository root; carry .scratch and .peer):
#          bash packages/inkling-kernels/benchmarks/run_before_after.sh [bench_sconv.py args]
#      runs bench_sconv.py of the old tree, then of this tree (ROUNDS times, alternating;
#      default 1), each in its own process, and prints compare_runs.py's table of the
#      last round (earlier rounds stay in $OUT for the noise). Exit status 1: a case slower.
set -o pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$ROOT"
if [ "$1" = "--prepare" ]; then
  BASE=${2:-d6e556c}
  rm -rf .scratch/before && mkdir -p .scratch/before
  git archive "$BASE" packages/inkling-kernels | tar -x -C .scratch/before
  echo "old tree $(git rev-parse --short "$BASE") in .scratch/before"
  exit 0
fi
[ -d .scratch/before/packages/inkling-kernels/src ] || { echo "run with --prepare first (and carry .scratch)"; exit 2; }
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PEER=(); [ -d .peer ] && PEER=(--peer-dir "$ROOT/.peer")
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/device.txt"
for round in $(seq 1 "${ROUNDS:-1}"); do
  PYTHONPATH=$ROOT/.scratch/before/packages/inkling-kernels/src \
    python3 .scratch/before/packages/inkling-kernels/benchmarks/bench_sconv.py "${PEER[@]}" \
      --json "$OUT/before_$round.json" "$@" > "$OUT/before_$round.log" 2>&1 || { tail -20 "$OUT/before_$round.log"; exit 3; }
  PYTHONPATH=$ROOT/packages/inkling-kernels/src \
    python3 packages/inkling-kernels/benchmarks/bench_sconv.py "${PEER[@]}" \
      --json "$OUT/after_$round.json" --md "$OUT/after_$round.md" "$@" > "$OUT/after_$round.log" 2>&1 || { tail -20 "$OUT/after_$round.log"; exit 3; }
  echo "round $round done"
done
python3 packages/inkling-kernels/benchmarks/compare_runs.py "$OUT/before_${ROUNDS:-1}.json" "$OUT/after_${ROUNDS:-1}.json" \
  --md "$OUT/before_after.md"

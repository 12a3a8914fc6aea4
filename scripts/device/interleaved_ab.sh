#!/usr/bin/env bash
# Batch-1 (or BATCH) graph-mode p50 of two or more flag sets, interleaved over ROUNDS rounds (default
# 3): the machine drifts for minutes at a time, so an A/B is only evidence across rounds. Prints each
# run's p50 and each flag set's median over the rounds; JSON per run under $OUT/ab.
#   PROTOSPEC_GIT_COMMIT=<sha> ROUNDS=3 BATCH=1 bash scripts/device/interleaved_ab.sh "--spec-step-graph off" "--spec-step-graph auto"
set -uo pipefail
source "$(dirname "$0")/env.sh"
mkdir -p "$OUT/ab"
rounds=${ROUNDS:-3}
batch=${BATCH:-1}
for ((r = 1; r <= rounds; r++)); do
  for ((i = 1; i <= $#; i++)); do
    flags=${!i}
    timeout 120 python3 -m protospec.bench --load-format dummy --draft-loop graph --batch-size "$batch" \
      --num-iters-warmup 3 --num-iters 20 $flags --output-json "$OUT/ab/set${i}_round${r}.json" > /dev/null 2>&1
    echo "round $r [$flags] p50 $(python3 -c "import json; print(json.load(open('$OUT/ab/set${i}_round${r}.json'))['percentiles']['50'])" 2>&1 | tail -1)"
  done
done
for ((i = 1; i <= $#; i++)); do
  python3 -c "
import glob, json, statistics
p50 = [json.load(open(f))['percentiles']['50'] for f in sorted(glob.glob('$OUT/ab/set${i}_round*.json'))]
print('[${!i}] median p50 over rounds', round(statistics.median(p50), 4), [round(x, 4) for x in p50])"
done

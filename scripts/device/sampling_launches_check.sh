#!/usr/bin/env bash
# The sampling kernels as two launches or as one cooperative launch: their GPU tests (the one launch
# bit for bit against the two, both against torch's sampler, the engine's greedy tokens), the census
# (GPU busy per spec step) with each, twice in turn, then graph-mode p50 with each, interleaved over
# 3 rounds at batch 1. Results under $OUT/res (census) and printed (p50).
#   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/sampling_launches_check.sh
set -uo pipefail
source "$(dirname "$0")/env.sh"
mkdir -p "$OUT/res"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_sampling_kernel.py 2>&1 \
  | grep -E "^(FAILED|ERROR)|passed|failed|Error" | tail -6
for round in 1 2; do
  for launches in two one; do
    echo "round $round, $launches: $(timeout 90 python3 -m protospec.bench.kernel_census --modes graph \
      --sampling-launches $launches --output-json "$OUT/res/kernel_census_sampling_${launches}_$round.json" 2>&1 \
      | quiet | grep -E "busy per spec step")"
  done
done
ROUNDS=3 BATCH=1 OUT=/tmp/sampling_ab bash "$(dirname "$0")/interleaved_ab.sh" "--sampling-launches two" \
  "--sampling-launches one"

#!/usr/bin/env bash
# The defaults against three switches: repeated prefills eager (--prefill-graphs off), draft step 1
# prepared on the CPU where no step was launched ahead (--first-step-at-begin off) and the sampling
# kernels as one cooperative launch (--sampling-launches one). Their GPU tests, the census (GPU busy
# per spec step) with each sampling form, then batch-1 graph-mode p50 of the four flag sets
# interleaved over 3 rounds. Census JSON under $OUT/res; p50 printed. About nine minutes.
#   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/levers_check.sh
set -uo pipefail
source "$(dirname "$0")/env.sh"
mkdir -p "$OUT/res"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_sampling_kernel.py tests/test_overlap_commit.py \
  tests/test_draft_loop.py tests/test_step_graph.py tests/test_prefill_graphs.py 2>&1 \
  | grep -E "^(FAILED|ERROR)|passed|failed|Error" | tail -8
for launches in two one; do
  echo "sampling launches $launches: $(timeout 90 python3 -m protospec.bench.kernel_census --modes graph \
    --sampling-launches $launches --output-json "$OUT/res/kernel_census_sampling_${launches}.json" 2>&1 \
    | quiet | grep -E "busy per spec step")"
done
ROUNDS=3 BATCH=1 OUT=/tmp/levers_ab bash "$(dirname "$0")/interleaved_ab.sh" "" "--sampling-launches one" \
  "--first-step-at-begin off" "--prefill-graphs off"

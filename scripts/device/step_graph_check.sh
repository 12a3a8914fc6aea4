#!/usr/bin/env bash
# A launched spec step whole as one CUDA graph: its GPU tests (verify inputs kernel against its twin,
# tokens equal to the stage-by-stage step while batches change, the debugger over it, the first step
# launched from the prefill), then graph-mode p50 with the step
# graph off and on, interleaved over 3 rounds, at batch 1 and batch 64; then the census with it on.
#   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/step_graph_check.sh
set -uo pipefail
source "$(dirname "$0")/env.sh"
mkdir -p "$OUT/res"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_step_graph.py tests/test_draft_loop.py \
  tests/test_overlap_commit.py tests/test_debug.py -k "graph or verify or overlap or prefill" 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed|Error" | tail -12
for batch in 1 64; do
  echo "batch $batch"
  ROUNDS=3 BATCH=$batch OUT="$OUT/b$batch" bash "$(dirname "$0")/interleaved_ab.sh" "--spec-step-graph off" "--spec-step-graph auto"
done
timeout 90 python3 -m protospec.bench.kernel_census --modes graph --spec-step-graph auto \
  --output-json "$OUT/res/kernel_census_step_graph.json" 2>&1 | quiet | grep -E "busy per spec step|graph:"

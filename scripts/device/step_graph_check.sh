#!/usr/bin/env bash
# A launched spec step whole as one CUDA graph: its GPU tests (tokens equal to the stage-by-stage
# step while batches change), then batch-1 p50 with the step graph off and on (and with the
# tensor-core GEMVs as programmatic dependents), and the census with it on. Results under $OUT/res.
#   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/step_graph_check.sh
set -uo pipefail
source "$(dirname "$0")/env.sh"
mkdir -p "$OUT/res"
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_step_graph.py tests/test_draft_loop.py \
  tests/test_overlap_commit.py tests/test_fused_linears_tokens.py 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed|Error" | tail -12
bench="python3 -m protospec.bench --load-format dummy --draft-loop graph --num-iters-warmup 3 --num-iters 30"
for flags in "--spec-step-graph off --dependent-launch off" "--spec-step-graph auto --dependent-launch off" \
             "--spec-step-graph auto --dependent-launch on" "--spec-step-graph off --dependent-launch on"; do
  name=$(echo "$flags" | tr -d '-' | tr ' ' '_')
  echo "[$flags] $(timeout 90 $bench $flags --output-json "$OUT/res/latency_$name.json" 2>&1 | quiet | grep -E "^50% percentile")"
done
timeout 90 python3 -m protospec.bench.kernel_census --modes graph --dependent-launch on --spec-step-graph auto \
  --output-json "$OUT/res/kernel_census_step_graph.json" 2>&1 | quiet | grep -E "busy per spec step|graph:"

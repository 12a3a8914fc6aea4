#!/usr/bin/env bash
# A lean run of record for the fastest mode at its defaults: the GPU tests of what the defaults reach
# (step graph, sampling kernels, draft loops, fused linears), the census (GPU busy per spec step) and
# the ablation with every peer (unfused and hf_compiled included), 3 interleaved rounds. Extra flags
# go to the census and the ablation alike. Results under $OUT/res; about six minutes.
#   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/fastest_mode_record.sh [--fused-sampling off ...]
set -uo pipefail
source "$(dirname "$0")/env.sh"
mkdir -p "$OUT/res"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_step_graph.py tests/test_sampling_kernel.py \
  tests/test_draft_loop.py tests/test_fused_linears_tokens.py -k "graph or engine or tokens" 2>&1 \
  | grep -E "^(FAILED|ERROR)|passed|failed|Error" | tail -8
timeout 90 python3 -m protospec.bench.kernel_census --modes graph "$@" \
  --output-json "$OUT/res/kernel_census.json" 2>&1 | quiet | grep -E "busy per spec step|graph:"
timeout 300 python3 -m protospec.bench --ablation --repeats 3 "$@" --output-dir "$OUT/res" 2>&1 | quiet \
  | grep -v -e "mode .* (round" -e "^$" -e "peer " -e "generation_config" -e "TensorFloat32"

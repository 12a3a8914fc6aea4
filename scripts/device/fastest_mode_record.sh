#!/usr/bin/env bash
# A lean run of record for the fastest mode at its defaults: the tests of the files the defaults reach
# (the overlapped commit, the step graph), the census (GPU busy per spec step) and the ablation with
# every peer (unfused and hf_compiled included), 3 interleaved rounds. Extra flags go to the census and
# the ablation alike. Results under $OUT/res; about seven minutes. The GPU-only tests (three minutes
# and more, compiles included) are a call of their own: python3 -m pytest -q -m gpu tests.
#   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/fastest_mode_record.sh [--fused-sampling off ...]
set -uo pipefail
source "$(dirname "$0")/env.sh"
mkdir -p "$OUT/res"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_overlap_commit.py tests/test_step_graph.py 2>&1 \
  | grep -E "^(FAILED|ERROR)|passed|failed|Error" | tail -6
((PIPESTATUS[0] == 124)) && echo "tests: timed out after 240 s"
timeout 90 python3 -m protospec.bench.kernel_census --modes graph "$@" \
  --output-json "$OUT/res/kernel_census.json" 2>&1 | quiet | grep -E "busy per spec step|graph:"
timeout 300 python3 -m protospec.bench --ablation --repeats 3 "$@" --output-dir "$OUT/res" 2>&1 | quiet \
  | grep -v -e "mode .* (round" -e "^$" -e "peer " -e "generation_config" -e "TensorFloat32"

#!/usr/bin/env bash
# Flag sets against each other (default: the defaults alone, e.g. "" "--attention-early-loads off"):
# the GPU tests of the kernels the step's forms touch (sampling, overlap, draft loop, step graph,
# prefill graphs, GEMV and the layer forwards, attention, advance_step, rejection, reductions, the LM head's tile statistics),
# then the census (GPU busy per spec step, per kernel name) of each flag set; JSON under $OUT/res
# (kernel_census_set<i>.json). TESTS overrides the test files. About
# three minutes plus ~40 s a flag set; their p50 is a second call of its own (ten minutes a call),
# which the last line prints:
#   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/levers_check.sh ["<flags A>" "<flags B>" ...]
set -uo pipefail
source "$(dirname "$0")/env.sh"
mkdir -p "$OUT/res"
if (($# == 0)); then set -- ""; fi
tests=${TESTS:-"tests/test_layer_kernels.py tests/test_sampling_kernel.py tests/test_overlap_commit.py
  tests/test_draft_loop.py tests/test_step_graph.py tests/test_prefill_graphs.py tests/test_gemv_mma.py
  tests/test_attention_mma.py tests/test_advance_step.py tests/test_rejection_kernel.py tests/test_reductions.py
  tests/test_logit_stats_engine.py tests/test_gemv_forms_engine.py"}
timeout 300 python3 -m pytest -q -p no:cacheprovider $tests 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed|Error" | tail -8
for ((i = 1; i <= $#; i++)); do
  echo "census [${!i}]: $(timeout 90 python3 -m protospec.bench.kernel_census --modes graph ${!i} \
    --output-json "$OUT/res/kernel_census_set${i}.json" 2>&1 | quiet | grep -E "busy per spec step")"
done
printf 'p50 next: PROTOSPEC_GIT_COMMIT=<sha> ROUNDS=2 bash scripts/device/interleaved_ab.sh'
printf ' "%s"' "$@"
echo

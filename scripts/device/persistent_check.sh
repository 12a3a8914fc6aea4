#!/usr/bin/env bash
# The persistent decode forward on a GPU, in one command that fits one device call: its GPU tests,
# where its time goes phase by phase (llama-68m and llama-160m, one token; beside it the same phases
# as one kernel each), then the graph mode's p50 without either, with the persistent kernel and with
# the per-phase kernels. Results under $OUT/res.
#   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/persistent_check.sh
set -uo pipefail
source "$(dirname "$0")/env.sh"
mkdir -p "$OUT/res"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_word_loads.py tests/test_cooperative_launch.py \
  tests/test_persistent_decode.py tests/test_gemv.py tests/test_sampling_kernel.py tests/test_rejection_kernel.py 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed|Error" | tail -8
for model in ${PERSISTENT_MODELS:-llama-68m llama-160m}; do
  timeout 200 python3 -m protospec.bench.persistent_phases --model JackFram/$model --threads ${PERSISTENT_THREADS:-256 512} \
    --output-json "$OUT/res/persistent_phases_$model.json" 2>&1 | quiet | grep -v "^layer[1-9]"
done
for flag in "" "--persistent-decode" "--persistent-decode per_phase"; do
  timeout 150 python3 -m protospec.bench --ablation --repeats 1 --modes graph --peers $flag \
    --output-dir "$OUT/res" 2>&1 | quiet | grep -E "^\| graph|wrote"
done

#!/usr/bin/env bash
# The down projection's split K: the GEMV's tests on the GPU, its forms alone (split_k_profile.py),
# and the census of each --down-k-splits. Results under $OUT/res; about five minutes. Their p50 is a
# call of its own, which the last line prints.
#   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/split_k_check.sh
set -uo pipefail
source "$(dirname "$0")/env.sh"
mkdir -p "$OUT/res"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gemv_mma.py tests/test_layer_kernels.py tests/test_gemv_forms_engine.py 2>&1 \
  | grep -E "^(FAILED|ERROR)|passed|failed|Error" | tail -6
timeout 120 python3 scripts/device/split_k_profile.py 2>&1 | quiet | tee "$OUT/res/split_k_forms.txt"
for splits in 1 2 4; do
  echo "census [--down-k-splits $splits]: $(timeout 90 python3 -m protospec.bench.kernel_census --modes graph \
    --down-k-splits $splits --output-json "$OUT/res/kernel_census_down_split$splits.json" 2>&1 | quiet \
    | grep -E "busy per spec step")"
done
echo 'p50 next: PROTOSPEC_GIT_COMMIT=<sha> ROUNDS=3 bash scripts/device/interleaved_ab.sh "--down-k-splits 1" "--down-k-splits 2" "--down-k-splits 4"'

#!/usr/bin/env bash
# The o and down projections' split K: the GEMV's tests and the same-bits forms' engine test on the
# GPU, the forms alone (split_k_profile.py), then the census of each flag set (default: unsplit, down
# split 2 and 4 ways, o split 2 ways). Results under $OUT/res; about five minutes. Their p50 is a call
# of its own, which the last line prints.
#   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/split_k_check.sh ["<flags A>" "<flags B>" ...]
set -uo pipefail
source "$(dirname "$0")/env.sh"
mkdir -p "$OUT/res"
if (($# == 0)); then set -- "" "--down-k-splits 2" "--down-k-splits 4" "--o-k-splits 2"; fi
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gemv_mma.py tests/test_layer_kernels.py \
  tests/test_gemv_forms_engine.py 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed|Error" | tail -6
timeout 120 python3 scripts/device/split_k_profile.py 2>&1 | quiet | tee "$OUT/res/split_k_forms.txt"
for ((i = 1; i <= $#; i++)); do
  echo "census [${!i}]: $(timeout 90 python3 -m protospec.bench.kernel_census --modes graph ${!i} \
    --output-json "$OUT/res/kernel_census_split_set${i}.json" 2>&1 | quiet | grep -E "busy per spec step")"
done
printf 'p50 next: PROTOSPEC_GIT_COMMIT=<sha> ROUNDS=3 bash scripts/device/interleaved_ab.sh'
printf ' "%s"' "$@"
echo

#!/usr/bin/env bash
# The tensor-core GEMV's same-bits forms against the defaults: the GEMV's tests and the forms' engine
# test on the GPU, the split-K forms alone (split_k_profile.py), then the census of each flag set
# (default: the defaults, the weight loads pinned above the wait, that with the early allows, and
# with the down projection split 4 ways). Results under $OUT/res; about eight minutes. Their p50
# is a call of its own, which the last line prints.
#   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/gemv_forms_check.sh ["<flags A>" "<flags B>" ...]
set -uo pipefail
source "$(dirname "$0")/env.sh"
mkdir -p "$OUT/res"
if (($# == 0)); then
  set -- "" "--pin-weight-loads on" "--pin-weight-loads on --gemv-early-allow o,gate_up,down" \
    "--pin-weight-loads on --down-k-splits 4"
fi
timeout 170 python3 -m pytest -q -p no:cacheprovider tests/test_gemv_mma.py tests/test_layer_kernels.py \
  tests/test_gemv_forms_engine.py 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed|Error" | tail -6
timeout 150 python3 scripts/device/split_k_profile.py 2>&1 | quiet | tee "$OUT/res/split_k_forms.txt"
for ((i = 1; i <= $#; i++)); do
  echo "census [${!i}]: $(timeout 80 python3 -m protospec.bench.kernel_census --modes graph ${!i} \
    --output-json "$OUT/res/kernel_census_forms_set${i}.json" 2>&1 | quiet | grep -E "busy per spec step")"
done
printf 'p50 next: PROTOSPEC_GIT_COMMIT=<sha> ROUNDS=3 bash scripts/device/interleaved_ab.sh'
printf ' "%s"' "$@"
echo

#!/usr/bin/env bash
# The tensor-core GEMV's same-bits forms against the defaults: the split-K forms alone, pinned and
# not (split_k_profile.py), then levers_check.sh with the GEMV's tests and the forms' engine test on
# the GPU and the census of each flag set (default: the defaults, the weight loads pinned above the
# wait, that with the early allows, and with the down projection split 4 ways). Results under
# $OUT/res; about eight minutes. Their p50 is a call of its own, which the last line prints.
#   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/gemv_forms_check.sh ["<flags A>" "<flags B>" ...]
set -uo pipefail
source "$(dirname "$0")/env.sh"
mkdir -p "$OUT/res"
if (($# == 0)); then
  set -- "" "--pin-weight-loads on" "--pin-weight-loads on --gemv-early-allow o,gate_up,down" \
    "--pin-weight-loads on --down-k-splits 4"
fi
timeout 150 python3 scripts/device/split_k_profile.py 2>&1 | quiet | tee "$OUT/res/split_k_forms.txt"
TESTS="tests/test_gemv_mma.py tests/test_layer_kernels.py tests/test_gemv_forms_engine.py" \
  bash "$(dirname "$0")/levers_check.sh" "$@"

#!/usr/bin/env bash
# The tensor-core GEMVs as programmatic dependents: their GPU tests (results and tokens equal to the
# ordinary launches, in and out of CUDA graphs), then the census (GPU busy per spec step) and batch-1
# p50 with and without --dependent-launch, and a host profile with the sampling kernels on (their p50
# rose with busy time falling). Results under $OUT/res; about five minutes.
#   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/dependent_launch_check.sh
set -uo pipefail
source "$(dirname "$0")/env.sh"
mkdir -p "$OUT/res"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_gemv_mma.py tests/test_layer_kernels.py \
  tests/test_attention_mma.py tests/test_fused_linears_tokens.py 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed|Error" | tail -8
for flag in "--dependent-launch off" "--dependent-launch on"; do
  name=${flag##* }
  timeout 90 python3 -m protospec.bench.kernel_census --modes graph $flag \
    --output-json "$OUT/res/kernel_census_$name.json" 2>&1 | quiet | grep -E "busy per spec step|graph:"
  timeout 90 python3 -m protospec.bench --load-format dummy --draft-loop graph --num-iters-warmup 3 --num-iters 30 \
    $flag --output-json "$OUT/res/latency_$name.json" 2>&1 | quiet | grep -E "^50% percentile"
done
timeout 120 python3 scripts/device/host_profile.py --batch-size 1 --top 30 --fused-sampling 2>&1 | quiet \
  > "$OUT/res/host_profile_fused_sampling.txt"; head -3 "$OUT/res/host_profile_fused_sampling.txt"

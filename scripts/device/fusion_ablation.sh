#!/usr/bin/env bash
# The fused kernels in one device call: GPU tests of the sampling kernels and the fused linears, the
# census (GPU busy per spec step) and batch-1 p50 with torch's sampling and with the sampling kernels,
# then the ablation of record with every peer (unfused and hf_compiled included), the sampling
# kernels on. Results under $OUT/res; about eight minutes.
#   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/fusion_ablation.sh
set -uo pipefail
source "$(dirname "$0")/env.sh"
mkdir -p "$OUT/res"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_sampling_kernel.py tests/test_gemv_mma.py \
  2>&1 | grep -E "^(FAILED|ERROR)|passed|failed|Error" | tail -8
for sampling in "" --fused-sampling; do
  name=${sampling:-torch-sampling}; name=${name#--}
  timeout 90 python3 -m protospec.bench.kernel_census --modes graph $sampling \
    --output-json "$OUT/res/kernel_census_$name.json" 2>&1 | quiet | grep -E "busy per spec step|graph:"
  timeout 90 python3 -m protospec.bench --load-format dummy --draft-loop graph --num-iters-warmup 3 --num-iters 30 \
    $sampling --output-json "$OUT/res/latency_$name.json" 2>&1 | quiet | grep -E "^50% percentile"
done
timeout 330 python3 -m protospec.bench --ablation --repeats 3 --fused-sampling --output-dir "$OUT/res" 2>&1 | quiet \
  | grep -v -e "mode .* (round" -e "^$"

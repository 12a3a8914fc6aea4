#!/usr/bin/env bash
# The fused kernels in one device call: GPU tests of the kernels whose launches or outputs changed, the
# census (GPU busy per spec step) and batch-1 p50 with torch's sampling and with the sampling kernels,
# then the ablation of record with every peer (unfused and hf_compiled included), with the sampling
# kernels where their p50 was the lower. Results under $OUT/res; about seven minutes.
#   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/fusion_ablation.sh
set -uo pipefail
source "$(dirname "$0")/env.sh"
mkdir -p "$OUT/res"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_sampling_kernel.py tests/test_gemv_mma.py \
  tests/test_rejection_kernel.py tests/test_layer_kernels.py tests/test_fused_linears_tokens.py \
  tests/test_cooperative_launch.py 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed|Error" | tail -8
p50() { python3 -c "import json; print(json.load(open('$1'))['percentiles']['50'])"; }
for sampling in "" --fused-sampling; do
  name=${sampling:-torch-sampling}; name=${name#--}
  [ -n "$sampling" ] || timeout 90 python3 -m protospec.bench.kernel_census --modes graph \
    --output-json "$OUT/res/kernel_census_$name.json" 2>&1 | quiet | grep -E "busy per spec step|graph:"
  timeout 90 python3 -m protospec.bench --load-format dummy --draft-loop graph --num-iters-warmup 3 --num-iters 30 \
    $sampling --output-json "$OUT/res/latency_$name.json" 2>&1 | quiet | grep -E "^50% percentile"
done
faster=$(python3 -c "print('--fused-sampling' if $(p50 $OUT/res/latency_fused-sampling.json) < $(p50 $OUT/res/latency_torch-sampling.json) else '')")
echo "ablation with: ${faster:-torch sampling}"
timeout 300 python3 -m protospec.bench --ablation --repeats 3 $faster --output-dir "$OUT/res" 2>&1 | quiet \
  | grep -v -e "mode .* (round" -e "^$" -e "peer " -e "generation_config" -e "TensorFloat32"

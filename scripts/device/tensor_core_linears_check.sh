#!/usr/bin/env bash
# The tensor-core linear layers in one device call: their GPU tests, the GEMVs against cuBLAS by shape,
# whole forwards (plain and with the norms and SiLU folded in), the census per spec step and batch-1
# p50 with each --linear-kernel (cublas, mma, mma_fused), modes round-robin in one process per kernel.
# Results under $OUT/res; about five minutes. LINEARS picks the kernels timed end to end, GEMV=0 skips
# the GEMVs by shape.
#   PROTOSPEC_GIT_COMMIT=<sha> [LINEARS="cublas mma_fused"] [GEMV=0] bash scripts/device/tensor_core_linears_check.sh
set -uo pipefail
source "$(dirname "$0")/env.sh"
mkdir -p "$OUT/res"
timeout 180 python3 -m pytest -q -p no:cacheprovider tests/test_gemv_mma.py tests/test_layer_kernels.py \
  tests/test_fused_linears_tokens.py 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed|Error" | tail -8
[ "${GEMV:-1}" = 0 ] || timeout 60 python3 -m protospec.bench.gemv_cost \
  --output-json "$OUT/res/gemv_cost.json" 2>&1 | quiet | tail -11
for model in llama-160m llama-68m; do
  timeout 60 python3 -m protospec.bench.layer_kernel_cost --model JackFram/$model \
    --output-json "$OUT/res/layer_kernel_cost_$model.json" 2>&1 | quiet | grep forward
done
for linear in ${LINEARS:-cublas mma mma_fused}; do
  timeout 90 python3 -m protospec.bench.kernel_census --modes graph --linear-kernel $linear \
    --output-json "$OUT/res/kernel_census_$linear.json" 2>&1 | quiet | grep -E "busy per spec step|graph:"
  timeout 90 python3 -m protospec.bench --load-format dummy --draft-loop graph --num-iters-warmup 3 --num-iters 30 \
    --linear-kernel $linear --output-json "$OUT/res/latency_$linear.json" 2>&1 | quiet | grep -E "^(Avg latency|50% percentile)"
done

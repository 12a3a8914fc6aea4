#!/usr/bin/env bash
# The kernels whose index arithmetic was cut without a GPU at hand, timed in one device call: their GPU
# tests, attention per call (every path the shapes allow, mma forced beside by_kv_head at one query),
# the layer ops, GEMVs and decode phases against torch and cuBLAS, the persistent and per-phase forwards, then the
# census (GPU busy per spec step). Results under $OUT/res; about five minutes.
#   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/instruction_cuts_check.sh
set -uo pipefail
source "$(dirname "$0")/env.sh"
mkdir -p "$OUT/res"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_word_loads.py tests/test_attention_mma.py \
  tests/test_paged_attention.py tests/test_layer_kernels.py tests/test_persistent_decode.py tests/test_gemv.py \
  tests/test_gpu_typecheck.py \
  2>&1 | grep -E "^(FAILED|ERROR)|passed|failed|Error" | tail -8
timeout 120 python3 -m protospec.bench.attention_cost --contexts 320 --paths mma by_kv_head \
  --output-json "$OUT/res/attention_cost.json" 2>&1 | quiet | tail -30
for shape in "mma --batch 16 --queries 6" "by_kv_head --batch 1 --queries 1"; do  # machine code to count
  timeout 60 python3 scripts/device/attention_profile.py --path $shape --sass "$OUT/res/k" 2>&1 | quiet | tail -1
done
for model in llama-68m llama-160m; do
  timeout 100 python3 -m protospec.bench.layer_kernel_cost --model JackFram/$model \
    --output-json "$OUT/res/layer_kernel_cost_$model.json" 2>&1 | quiet | tail -20
done
timeout 120 python3 -m protospec.bench.gemv_cost --output-json "$OUT/res/gemv_cost.json" 2>&1 | quiet | tail -12
timeout 150 python3 -m protospec.bench.persistent_phases --model JackFram/llama-68m --threads 256 \
  --output-json "$OUT/res/persistent_phases.json" 2>&1 | quiet | grep -v "^layer[1-9]" | tail -12
timeout 120 python3 -m protospec.bench.kernel_census --modes graph --output-json "$OUT/res/kernel_census.json" \
  2>&1 | quiet | tail -12

#!/usr/bin/env bash
# Attention at batch: the kernel's tests on the GPU, its device time against the bytes floor (with a
# split-K sweep and the torch path beside it), the kernel census and p50 of the graph mode at batch 1
# and 64. Results: $OUT/results.tgz.
#   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/batch_scaling.sh
set -uo pipefail
source "$(dirname "$0")/env.sh"
rm -rf res; mkdir -p res
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_paged_attention.py tests/test_layer_kernels.py 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed" | tail -12
timeout 120 python3 -m protospec.bench.attention_cost --contexts 320 --splits 1 2 4 8 16 --torch --output-json res/attention_cost_splits.json 2>&1 | quiet
timeout 90 python3 -m protospec.bench.attention_cost --contexts 256 1024 2048 --output-json res/attention_cost_contexts.json 2>&1 | quiet
[ -f .old/attention_old.py ] && timeout 60 python3 .old/attention_old.py --contexts 320 --output-json res/attention_cost_previous_kernel.json 2>&1 | quiet
for b in 64 1; do
  timeout 120 python3 -m protospec.bench.kernel_census --batch-size $b --modes graph --output-json res/kernel_census_b$b.json 2>&1 | quiet | tail -9
done
timeout 200 python3 -m protospec.bench --sweep --sweep-batch-sizes 1 64 --sweep-ks 5 --modes graph --peers \
  --num-iters-warmup 2 --num-iters 5 --output-dir res 2>&1 | quiet | tail -8
tar czf "$OUT/results.tgz" res

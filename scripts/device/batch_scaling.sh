#!/usr/bin/env bash
# Attention at batch: the whole suite on the GPU, attention's device time against the bytes floor
# (both paths forced and the shape's own choice, the torch path beside them), the kernel census and
# p50 of the graph mode at batch 1, 16 and 64 (three rounds in turn, medians), and the cost of a spec step's random numbers. Results: $OUT/results.tgz.
#   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/batch_scaling.sh
set -uo pipefail
source "$(dirname "$0")/env.sh"
rm -rf res; mkdir -p res
timeout 420 python3 -m pytest -q -p no:cacheprovider tests 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed" | tail -12
timeout 120 python3 -m tools.attention_cost --contexts 320 --paths by_kv_head mma --torch --output-json res/attention_cost.json 2>&1 | quiet
timeout 90 python3 -m tools.attention_cost --contexts 256 1024 2048 --output-json res/attention_cost_contexts.json 2>&1 | quiet
timeout 300 python3 -m protospec.bench --sweep --sweep-batch-sizes 1 16 64 --sweep-ks 5 --modes graph --peers \
  --num-iters-warmup 3 --num-iters 20 --sweep-rounds 3 --output-dir res 2>&1 | quiet | grep wrote
{ echo "# $(nvidia-smi --query-gpu=name --format=csv,noheader), $(date -u +%FT%TZ), commit ${PROTOSPEC_GIT_COMMIT:-unknown}"
  echo "# python3 scripts/device/randoms_cost.py"; timeout 60 python3 scripts/device/randoms_cost.py 2>&1 | quiet; } > res/randoms_cost.txt
cat res/randoms_cost.txt
tar czf "$OUT/results.tgz" res

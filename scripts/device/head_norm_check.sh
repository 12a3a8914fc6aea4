#!/usr/bin/env bash
# The fused forward's final norm inside the LM head GEMV or as a kernel of its own: the layer-kernel
# GPU test (logits against the torch path either way), then the census (GPU busy per spec step) with
# each, twice in turn (busy is steadier than p50, but not noise-free). Results under $OUT/res.
#   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/head_norm_check.sh
set -uo pipefail
source "$(dirname "$0")/env.sh"
mkdir -p "$OUT/res"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_layer_kernels.py -k tensor_core 2>&1 | tail -1
for round in 1 2; do
  for head in fused separate; do
    echo "round $round, head norm $head: $(timeout 90 python3 -m protospec.bench.kernel_census --modes graph \
      --head-norm $head --output-json "$OUT/res/kernel_census_head_norm_${head}_$round.json" 2>&1 | quiet \
      | grep -E "busy per spec step")"
  done
done

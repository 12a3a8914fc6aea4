#!/usr/bin/env bash
# The persistent decode forward on a GPU, in one command that fits one device call: the tests that
# need a GPU for it (cooperative launches bound and in a graph, the kernel at float16 over many blocks,
# mma at head_dim 96 / 128), a grid sync's cost, the persistent forward beside the layer kernels'
# (llama-68m, T = 1), then the graph mode's p50 with and without it. Results under $OUT/res.
#   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/persistent_check.sh
set -uo pipefail
source "$(dirname "$0")/env.sh"
mkdir -p "$OUT/res"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_cooperative_launch.py tests/test_persistent_decode.py \
  tests/test_attention_mma.py 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed" | tail -8
timeout 60 python3 -m protospec.bench.grid_sync_cost --output-json "$OUT/res/grid_sync_cost.json" 2>&1 | quiet | tail -8
timeout 90 python3 -m protospec.bench.layer_kernel_cost --model JackFram/llama-68m --tokens 1 \
  --output-json "$OUT/res/layer_kernel_cost_68m.json" 2>&1 | quiet | grep -E "forward"
for flag in "" "--persistent-decode"; do
  timeout 150 python3 -m protospec.bench --ablation --repeats 1 --modes graph --peers $flag \
    --output-dir "$OUT/res" 2>&1 | quiet | grep -E "^\| graph|wrote"
done

#!/usr/bin/env bash
# A lean run of record for the fastest mode's defaults: the GPU tests of what changed, batch-1 p50
# with torch's sampling and with the sampling kernels, the census (GPU busy per spec step) and the
# ablation with every peer, both with the sampling that had the lower p50. Results under $OUT/res;
# about six minutes.
#   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/fastest_mode_record.sh
set -uo pipefail
source "$(dirname "$0")/env.sh"
mkdir -p "$OUT/res"
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_step_graph.py tests/test_draft_loop.py \
  tests/test_layer_kernels.py -k "graph or dependent" 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed|Error" | tail -8
p50() { python3 -c "import json; print(json.load(open('$1'))['percentiles']['50'])"; }
for sampling in "" --fused-sampling; do
  name=${sampling:-torch-sampling}; name=${name#--}
  timeout 60 python3 -m protospec.bench --load-format dummy --draft-loop graph --num-iters-warmup 3 --num-iters 20 \
    $sampling --output-json "$OUT/res/latency_$name.json" 2>&1 | quiet | grep -E "^50% percentile"
done
faster=$(python3 -c "print('--fused-sampling' if $(p50 $OUT/res/latency_fused-sampling.json) < $(p50 $OUT/res/latency_torch-sampling.json) else '')")
echo "census and ablation with: ${faster:-torch sampling}"
timeout 60 python3 -m protospec.bench.kernel_census --modes graph $faster \
  --output-json "$OUT/res/kernel_census.json" 2>&1 | quiet | grep -E "busy per spec step|graph:"
timeout 280 python3 -m protospec.bench --ablation --repeats 3 $faster --output-dir "$OUT/res" 2>&1 | quiet \
  | grep -v -e "mode .* (round" -e "^$" -e "peer " -e "generation_config" -e "TensorFloat32"

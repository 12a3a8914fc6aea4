#!/usr/bin/env bash
# One device call for the GPU advance_step work: GPU tests, launch cost, the three draft-loop modes.
# Run by the device tool from the repo root with .whl carried (numpy 2.4 for numba-cuda), e.g.
#   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/draft_loop_modes.sh
set -uo pipefail
source "$(dirname "$0")/env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "import numpy, numba, torch, transformers; print('numpy', numpy.__version__, 'numba', numba.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
python3 -m pytest -q -x -p no:cacheprovider tests 2>&1 | tee "$OUT/pytest.log" | tail -25
python3 -m protospec.bench.launch_cost --output-json "$OUT/launch_cost.json" 2>&1 | tee "$OUT/launch_cost.log"
for mode in main sampler gpu; do
  python3 -m protospec.bench --draft-loop $mode --output-json "$OUT/bench_$mode.json" 2>&1 | grep -v "it/s" | tee "$OUT/bench_$mode.log"
done

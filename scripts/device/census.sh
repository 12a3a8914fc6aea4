#!/usr/bin/env bash
# Where gpu mode's time goes: kernel census (eager and compiled), then the ablation with
# torch.compile in 3 interleaved rounds. Results land in $OUT/results.tgz.
#   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/census.sh
set -uo pipefail
source "$(dirname "$0")/env.sh"
mkdir -p res
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests 2>&1 | tail -2
timeout 90 python3 -m protospec.bench.kernel_census --output-json res/kernel_census_eager.json 2>&1 | quiet | tail -4
timeout 150 python3 -m protospec.bench.kernel_census --compile --output-json res/kernel_census_compile.json 2>&1 | quiet | tail -4
timeout 240 python3 -m protospec.bench --ablation --compile --repeats 3 --modes main sampler gpu graph --peers target_only \
  --output-dir res 2>&1 | quiet | tail -16
tar czf "$OUT/results.tgz" res

#!/usr/bin/env bash
# A probe between engine changes: the whole test suite on the GPU, the kernel census with GPU idle
# time charged to host phases, the trained pair's acceptance and speedup, and a quick ablation
# (2 interleaved rounds, protospec peers only). Results land in $OUT/results.tgz.
#   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/probe.sh [--no-tests] [--launch-cost]
set -uo pipefail
source "$(dirname "$0")/env.sh"
rm -rf res; mkdir -p res
case " $* " in *" --no-tests "*) ;; *) timeout 240 python3 -m pytest -q -p no:cacheprovider tests 2>&1 | grep -E "^(FAILED|ERROR|E  )|passed|failed" | tail -30 ;; esac
case " $* " in *" --launch-cost "*) timeout 60 python3 -m tools.launch_cost --output-json res/launch_cost.json 2>&1 | quiet | tail -3 ;; esac
timeout 100 python3 -m protospec.bench.kernel_census --modes main gpu --output-json res/kernel_census.json 2>&1 | quiet | tail -4
timeout 70 python3 -m protospec.train.evaluate --models data/models --prompts-json data/models/heldout_prompts.json \
  --timing --output-json res/trained_pair_evaluate.json 2>&1 | quiet | tail -3
timeout 170 python3 -m protospec.bench --ablation --repeats 2 --peers target_only --output-dir res 2>&1 | quiet \
  | grep -v -e "^$" -e "mode .* (round" | tail -12
tar czf "$OUT/results.tgz" res

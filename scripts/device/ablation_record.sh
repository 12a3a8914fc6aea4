#!/usr/bin/env bash
# Device run of record: GPU tests, the trained pair's acceptance and batch-1 speedup on the fixed
# held-out prompts, the ablation with the per-phase breakdown (3 interleaved rounds), and draft ==
# target. Results land in $OUT/results.tgz.
#   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/ablation_record.sh [--full-tests]
# (The sweep: bench 300 --sweep --num-iters-warmup 1 --num-iters 3, in a call of its own.)
set -uo pipefail
source "$(dirname "$0")/env.sh"
rm -rf res; mkdir -p res
bench() { timeout "$1" python3 -m protospec.bench "${@:2}" --output-dir res 2>&1 | quiet | grep -v -e "^|" -e "^$" -e "mode .* (round"; }
if [ "${1:-}" = "--full-tests" ]; then  # the whole suite on the GPU (kernel tests included), ~2-3 min
  timeout 240 python3 -m pytest -q -p no:cacheprovider tests 2>&1 | tail -3
else
  timeout 80 python3 -m pytest -q -p no:cacheprovider -m gpu tests 2>&1 | tail -2
fi
timeout 70 python3 -m protospec.train.evaluate --models data/models --prompts-json data/models/heldout_prompts.json \
  --timing --output-json res/trained_pair_evaluate.json 2>&1 | quiet | tail -3
bench 200 --ablation --breakdown --repeats 3
bench 90 --ablation --draft-equals-target --repeats 2 --peers target_only hf_assisted
tar czf "$OUT/results.tgz" res

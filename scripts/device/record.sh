#!/usr/bin/env bash
# Runs of record for issue 4 (session 3): GPU-marked tests, the trained pair's acceptance and
# speedup, the ablation with breakdown (3 interleaved rounds, every peer), draft == target, and the
# ablation with the torch layer path (what the Numba layer kernels changed). $OUT/results.tgz.
#   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/record.sh
# The sweep runs in a call of its own: python -m protospec.bench --sweep --num-iters-warmup 1 --num-iters 3
set -uo pipefail
source "$(dirname "$0")/env.sh"
rm -rf res; mkdir -p res
bench() { timeout "$1" python3 -m protospec.bench "${@:2}" --output-dir res 2>&1 | quiet | grep -E "^\| (main|sampler|gpu|graph|target|hf)|each round|^breakdown|^wrote"; }
timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests 2>&1 | tail -1
timeout 70 python3 -m protospec.train.evaluate --models data/models --prompts-json data/models/heldout_prompts.json \
  --timing --output-json res/trained_pair_evaluate.json 2>&1 | quiet | tail -4
bench 220 --ablation --breakdown --repeats 3
bench 100 --ablation --draft-equals-target --repeats 2 --peers target_only hf_assisted
bench 100 --ablation --layer-kernels off --repeats 2 --peers target_only
tar czf "$OUT/results.tgz" res

#!/usr/bin/env bash
# Runs of record for the seed ablation: the whole test suite on the GPU, the post-sync gap per mode
# (diag_commit_gap.py), the ablation with breakdown (3 interleaved rounds, every peer), draft ==
# target, and the trained pair's acceptance and speedup. Results: $OUT/results.tgz.
#   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/record.sh
# The sweep runs in a call of its own: python -m protospec.bench --sweep --num-iters-warmup 1 --num-iters 3
# The torch-layers A/B: python -m protospec.bench --ablation --layer-kernels off --repeats 2 --peers target_only
set -uo pipefail
source "$(dirname "$0")/env.sh"
rm -rf res; mkdir -p res
bench() { timeout "$1" python3 -m protospec.bench "${@:2}" --output-dir res 2>&1 | quiet | grep -E "^\| (main|sampler|gpu|graph|target|hf)|each round|^breakdown|^wrote|Error"; }
timeout 150 python3 -m pytest -q -p no:cacheprovider tests 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed" | tail -12
timeout 100 python3 scripts/device/diag_commit_gap.py 2>&1 | quiet | grep -E "wall|Error" | tee res/commit_gap.txt
bench 240 --ablation --breakdown --repeats 3
bench 100 --ablation --draft-equals-target --repeats 2 --peers target_only hf_assisted
timeout 70 python3 -m protospec.train.evaluate --models data/models --prompts-json data/models/heldout_prompts.json \
  --timing --output-json res/trained_pair_evaluate.json 2>&1 | quiet | tail -4
tar czf "$OUT/results.tgz" res

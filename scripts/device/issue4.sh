#!/usr/bin/env bash
# Device run of record, part 1: GPU tests, the trained pair's acceptance and batch-1 speedup on the
# fixed held-out prompts, the ablation with the per-phase breakdown in 3 interleaved rounds.
# Part 2 (scripts/device/issue4_more.sh): draft == target, torch.compile, kernel census.
# Results land in $OUT/results.tgz.   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/issue4.sh
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" res
quiet() { grep -v -e "it/s" -e "MinNewTokens" -e "sync_debug_mode" -e "FutureWarning" -e "return forward_call" -e "warnings.warn" -e "_warn_once"; }
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests tests/test_rejection_kernel.py 2>&1 | tail -3
timeout 90 python3 -m protospec.train.evaluate --models data/models --prompts-json data/models/heldout_prompts.json \
  --timing --output-json res/trained_pair_evaluate.json 2>&1 | quiet | tail -3
timeout 240 python3 -m protospec.bench --ablation --breakdown --repeats 3 --output-dir res 2>&1 | quiet | tail -22
tar czf "$OUT/results.tgz" res

#!/usr/bin/env bash
# Device run of record: GPU tests, the trained pair's acceptance and batch-1 speedup on the fixed
# held-out prompts, the ablation (draft != target with the per-phase breakdown, 3 interleaved rounds)
# and draft == target. Results land in $OUT/results.tgz.
#   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/issue4.sh [--sweep]
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" res
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
quiet() { grep -v -e "it/s" -e "MinNewTokens" -e "sync_debug_mode" -e "FutureWarning" -e "return forward_call"; }
bench() { timeout "$1" python3 -m protospec.bench "${@:2}" --output-dir res 2>&1 | quiet; }
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests 2>&1 | tail -4
timeout 120 python3 -m protospec.train.evaluate --models data/models --prompts-json data/models/heldout_prompts.json \
  --timing --output-json res/trained_pair_evaluate.json 2>&1 | quiet | tail -4
bench 240 --ablation --breakdown --repeats 3
bench 150 --ablation --draft-equals-target --repeats 2 --peers target_only hf_assisted
if [ "${1:-}" = "--sweep" ]; then bench 200 --sweep --num-iters-warmup 1 --num-iters 3; fi
tar czf "$OUT/results.tgz" res

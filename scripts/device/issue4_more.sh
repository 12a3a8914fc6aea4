#!/usr/bin/env bash
# Device run of record, part 2: draft == target, torch.compile (3 rounds), kernel census.
#   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/issue4_more.sh
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" res
quiet() { grep -v -e "it/s" -e "MinNewTokens" -e "sync_debug_mode" -e "FutureWarning" -e "return forward_call" -e "warnings.warn" -e "_warn_once"; }
timeout 150 python3 -m protospec.bench --ablation --draft-equals-target --repeats 2 --peers target_only hf_assisted \
  --output-dir res 2>&1 | quiet | tail -14
timeout 200 python3 -m protospec.bench --ablation --compile --repeats 3 --peers target_only --output-dir res 2>&1 | quiet | tail -14
timeout 90 python3 -m protospec.bench.kernel_census --output-json res/kernel_census.json 2>&1 | quiet | tail -4
tar czf "$OUT/results.tgz" res

#!/usr/bin/env bash
# Device run for the ablation issue: GPU tests, the ablation reports (draft != target with the
# per-phase breakdown, draft == target, and with torch.compile), then the batch x k sweep.
# Results land in $OUT/results.tgz.   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/issue4.sh
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" res
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
bench() { timeout "$1" python3 -m protospec.bench "${@:2}" --output-dir res 2>&1 | grep -v -e "it/s" -e "MinNewTokens" -e "sync_debug_mode"; }
timeout 150 python3 -m pytest -q -p no:cacheprovider tests 2>&1 | tail -4
bench 300 --ablation --breakdown --repeats 3
bench 120 --ablation --draft-equals-target
bench 100 --ablation --compile --peers target_only
bench 200 --sweep --num-iters-warmup 1 --num-iters 3
tar czf "$OUT/results.tgz" res

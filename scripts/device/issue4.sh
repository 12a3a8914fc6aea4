#!/usr/bin/env bash
# Device run for the ablation issue. PART=ablation: GPU tests + the ablation reports (with the
# per-phase breakdown); PART=sweep: the batch x k sweep. Results land in $OUT/results.tgz.
#   PROTOSPEC_GIT_COMMIT=<sha> PART=ablation bash scripts/device/issue4.sh
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" res
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
bench() { python3 -m protospec.bench "$@" --output-dir res 2>&1 | grep -v -e "it/s" -e "MinNewTokens" -e "sync_debug_mode"; }
if [ "${PART:-ablation}" = ablation ]; then
  python3 -m pytest -q -x -p no:cacheprovider tests 2>&1 | tail -4
  bench --ablation --compile --breakdown
  bench --ablation --breakdown --peers
  bench --ablation --compile --draft-equals-target
else
  bench --sweep --compile --num-iters-warmup 2 --num-iters 5
fi
tar czf "$OUT/results.tgz" res

#!/usr/bin/env bash
# Device run for the trained pair: train on the H200 (timed), measure acceptance on held-out prompts
# (greedy and T=1) and batch-1 speedup over target-only; bring the checkpoints back in $OUT/pair.tgz.
#   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/issue5.sh
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
time python3 -m protospec.train --out data/models 2>&1 | grep -v Writing
python3 -m protospec.train.evaluate --models data/models --timing --output-json data/models/evaluate.json
tar czf "$OUT/pair.tgz" data/models

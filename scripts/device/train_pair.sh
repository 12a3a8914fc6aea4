#!/usr/bin/env bash
# Device run for the trained pair: train on the H200 (timed), measure acceptance on held-out prompts
# (greedy and T=1); bring the checkpoints back in $OUT/pair.tgz. Timing runs separately (ablation_record.sh).
#   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/train_pair.sh [extra train flags]
set -uo pipefail
source "$(dirname "$0")/env.sh"
t0=$SECONDS
python3 -m protospec.train --out data/models --max-minutes 7.2 "$@" 2>&1 \
  | grep -v -e Writing -e FutureWarning -e "return forward_call"
echo "train wall $((SECONDS - t0)) s"
timeout 120 python3 -m protospec.train.evaluate --models data/models --output-json data/models/evaluate.json 2>&1 | tail -3
tar czf "$OUT/pair.tgz" data/models

#!/usr/bin/env bash
# The cost of the proposer and acceptance settings at the seed configuration (graph mode on
# a GPU, batch 1, k = 5): one bench run per setting, JSON under $OUT. Random prompts, so the n-gram
# proposer mostly finds no match: these runs time its kernel, not its acceptance.
#   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/proposers_cost.sh
set -uo pipefail
source "$(dirname "$0")/env.sh"
run() { name=$1; shift; timeout 90 python3 -m protospec.bench "$@" --output-json "$OUT/$name.json" 2>&1 \
  | quiet | grep -E "^50% percentile|acceptance rate|Error|Traceback" | sed "s/^/$name: /"; }
run fixed_k --draft-loop graph
run typical --draft-loop graph --acceptance typical
run ngram --proposer ngram --draft-loop gpu

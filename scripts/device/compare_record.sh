#!/usr/bin/env bash
# The proposers x acceptance rules comparison of record on the trained pair (its 32
# held-out prompts, batch 1, greedy and T=1), then attention against its bytes floor.
# Results under $OUT (copy the compare files into data/results/ to record them).
#   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/compare_record.sh
set -uo pipefail
source "$(dirname "$0")/env.sh"
timeout 400 python3 -m protospec.bench --compare --output-dir "$OUT" 2>&1 | quiet | grep -E "^\||^wrote|Error|Traceback"
timeout 200 python3 -m tools.attention_cost --contexts 320 2048 --paths by_kv_head \
  --output-json "$OUT/attention_paths.json" 2>&1 | quiet

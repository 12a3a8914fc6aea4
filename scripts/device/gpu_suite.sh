#!/usr/bin/env bash
# The whole test suite on the GPU in SHARDS parallel pytest processes (default 4), one GPU shared:
# the suite is bound by Numba compiling kernels on the CPU, which parallel processes spread over the
# host's cores. Test files are dealt round-robin, largest first; the shards' logs end up in $OUT/suite.tar
# (one file: a device call brings back only so many).
# Prints each shard's summary, every failure and its assertion lines.
#   PROTOSPEC_GIT_COMMIT=<sha> SHARDS=4 bash scripts/device/gpu_suite.sh [seconds per shard, default 420] [test files]
set -uo pipefail
source "$(dirname "$0")/env.sh"
shards=${SHARDS:-4}
limit=${1:-420}
suite=/tmp/gpu_suite_logs && rm -rf "$suite" && mkdir -p "$suite"
if (($# > 1)); then files=("${@:2}"); else mapfile -t files < <(ls -S tests/test_*.py); fi
pids=()
for ((i = 0; i < shards; i++)); do
  mine=()
  for ((j = i; j < ${#files[@]}; j += shards)); do mine+=("${files[j]}"); done
  timeout "$limit" python3 -m pytest -q -p no:cacheprovider "${mine[@]}" > "$suite/shard$i.log" 2>&1 &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
for ((i = 0; i < shards; i++)); do
  echo "shard $i: $(grep -E "passed|failed|error" "$suite/shard$i.log" | tail -1)"
  grep -E "^(FAILED|ERROR)" "$suite/shard$i.log"
  grep -E "^E " "$suite/shard$i.log" | head -20  # the failing assertions themselves, not just the names
done
tar -cf "$OUT/suite.tar" -C "$suite" .

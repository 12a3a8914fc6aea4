#!/usr/bin/env bash
# A code change with no switch, timed against its previous version: the census of the tree, of the tree
# with OLD copied over TARGET, and of the tree again; then the batch-1 graph p50 of the two, interleaved
# over ROUNDS rounds (default 2). OLD must travel with the tree (an ignored path: the device call's carry).
# JSON under $OUT/res and $OUT/ab.
#   git show <commit>:<file> > runs/ab/old.py
#   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/source_ab.sh runs/ab/old.py <file>
set -uo pipefail
source "$(dirname "$0")/env.sh"
old=$1 target=$2 rounds=${ROUNDS:-2}
mkdir -p "$OUT/res" "$OUT/ab"
cp "$target" /tmp/source_ab_new
use() { if [ "$1" = before ]; then cp "$old" "$target"; else cp /tmp/source_ab_new "$target"; fi; }
for name in after before after2; do
  use "$name"
  echo "census [$name]: $(timeout 80 python3 -m protospec.bench.kernel_census --modes graph \
    --output-json "$OUT/res/kernel_census_$name.json" 2>&1 | quiet | grep -E "busy per spec step")"
done
for ((r = 1; r <= rounds; r++)); do
  for name in before after; do
    use "$name"
    timeout 60 python3 -m protospec.bench --load-format dummy --draft-loop graph --batch-size 1 --num-iters-warmup 3 \
      --num-iters 20 --output-json "$OUT/ab/${name}_round$r.json" > /dev/null 2>&1
    echo "round $r [$name] p50 $(python3 -c "import json; print(json.load(open('$OUT/ab/${name}_round$r.json'))['percentiles']['50'])" 2>&1 | tail -1)"
  done
done
use after

#!/usr/bin/env bash
# One bench command in two trees, alternating over ROUNDS rounds (default 2), each run its own process:
# this tree ("tree") and OTHER ("other"), which is either a directory holding another version's protospec/
# (a `git archive <commit> protospec data/configs` copy, carried with the call) or a one-line edit of
# this tree, FILE:SED (a copy of protospec/ with that sed expression applied to that file: a constant
# changed, no switch added). Prints each run's p50 and token digest per point (--ablation's modes, or
# --sweep's points); the JSON lands under $OUT/ab/<arm>_r<round>.
#   PROTOSPEC_GIT_COMMIT=<sha> OTHER=.old7 OTHER_COMMIT=370bafe bash scripts/device/tree_ab.sh --sweep --sweep-batch-sizes 64 --sweep-ks 5 --modes graph
#   PROTOSPEC_GIT_COMMIT=<sha> OTHER='protospec/model/layer_kernels.py:s/^MLP_FUSED_MAX_ROWS = 32$/MLP_FUSED_MAX_ROWS = 64/' bash scripts/device/tree_ab.sh --ablation --repeats 1 --modes graph --peers
set -uo pipefail
source "$(dirname "$0")/env.sh"
: "${OTHER:?OTHER: a directory with protospec/ in it, or FILE:SED}"
rounds=${ROUNDS:-2}
if [ -d "$OTHER" ]; then
  other=$(cd "$OTHER" && pwd) other_commit=${OTHER_COMMIT:-unknown}
else
  file=${OTHER%%:*} expr=${OTHER#*:} other=/tmp/tree_ab_other other_commit=${PROTOSPEC_GIT_COMMIT:-unknown}
  rm -rf "$other" && mkdir -p "$other/data" && cp -r protospec "$other/" && cp -r data/configs "$other/data/"
  sed -i "$expr" "$other/$file"
  if cmp -s "$file" "$other/$file"; then echo "tree_ab: the sed expression changed nothing in $file" >&2; exit 2; fi
  diff "$file" "$other/$file"
fi
summary() {  # each point's p50 and token digest of one run's JSON
  python3 - "$1" <<'PY'
import glob, json, sys
for path in sorted(glob.glob(sys.argv[1] + "/*.json")):
    report = json.load(open(path))
    if "sweep" in report:
        for p in report["sweep"]["points"]:
            print(f"  k={p['k']} batch={p['batch_size']} {p['mode']}: p50 {p['p50_s']:.5f} s, tokens {p.get('token_digest')}")
    for mode, e in report.get("modes", {}).items():
        if "p50_s" in e:
            print(f"  {mode}: p50 {e['p50_s']:.5f} s, tokens {e.get('token_digest')}")
PY
}
for ((r = 1; r <= rounds; r++)); do
  for arm in tree other; do
    out="$OUT/ab/${arm}_r$r"
    mkdir -p "$out"
    if [ "$arm" = tree ]; then
      timeout 300 python3 -m protospec.bench "$@" --output-dir "$out" > "$out/log.txt" 2>&1
    else
      (cd "$other" && PYTHONPATH=/tmp/site:$other PROTOSPEC_GIT_COMMIT=$other_commit \
        timeout 300 python3 -m protospec.bench "$@" --output-dir "$out" > "$out/log.txt" 2>&1)
    fi
    echo "round $r [$arm] rc $?"
    summary "$out"
  done
done

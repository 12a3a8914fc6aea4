#!/usr/bin/env bash
# One bench command in several trees, alternating over ROUNDS rounds (default 2), each run its own process:
# this tree ("tree") and each of OTHER's arms, where an arm is either a directory holding another
# version's protospec/ (a `git archive <commit>` copy, carried with the call) or a one-line edit of this
# tree, FILE:SED (a copy of protospec/ with that sed expression applied to that file: a constant changed,
# no switch added). OTHER may list several directories (space-separated; OTHER_COMMIT their commits in
# the same order): every round runs this tree once and each arm once, so N candidates share the baseline's
# runs. Prints each run's p50 and token digest per point (--ablation's modes, or --sweep's points); each
# run's JSON and log are appended to $OUT/ab.tar as <arm>_r<round>_<name> right after the run (one file,
# since a device call brings back only so many, and a call cut short keeps the runs it finished; AB_TAR
# names another, for a second call in the same job).
#   PROTOSPEC_GIT_COMMIT=<sha> OTHER=.old7 OTHER_COMMIT=370bafe bash scripts/device/tree_ab.sh --sweep --sweep-batch-sizes 64 --sweep-ks 5 --modes graph
#   PROTOSPEC_GIT_COMMIT=<sha> OTHER=".a .b" OTHER_COMMIT="1111111 2222222" bash scripts/device/tree_ab.sh --ablation --repeats 1 --modes graph --batch-size 64
#   PROTOSPEC_GIT_COMMIT=<sha> OTHER='protospec/model/layer_kernels.py:s/^MLP_FUSED_MAX_ROWS = 32$/MLP_FUSED_MAX_ROWS = 64/' bash scripts/device/tree_ab.sh --ablation --repeats 1 --modes graph --peers
# Bound a call's time with RUN_LIMIT (seconds a run, default 300), not by wrapping this script in `timeout`:
# that stops the script but not the run in flight, which then times itself beside the next command's.
set -uo pipefail
source "$(dirname "$0")/env.sh"
run_limit=${RUN_LIMIT:-300}
: "${OTHER:?OTHER: directories with protospec/ in them, or FILE:SED}"
rounds=${ROUNDS:-2}
arms=() dirs=() commits=()
if [ -d "${OTHER%% *}" ]; then
  read -ra given <<< "$OTHER"
  read -ra given_commits <<< "${OTHER_COMMIT:-}"
  for i in "${!given[@]}"; do
    arms+=("$(basename "${given[i]}" | tr -d .)") dirs+=("$(cd "${given[i]}" && pwd)") commits+=("${given_commits[i]:-unknown}")
  done
else
  other=/tmp/tree_ab_other
  sed_arm "$other" "${OTHER%%:*}" "${OTHER#*:}" || exit 2
  arms+=(other) dirs+=("$other") commits+=("${PROTOSPEC_GIT_COMMIT:-unknown}")
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
  for ((i = -1; i < ${#arms[@]}; i++)); do
    arm=tree
    ((i >= 0)) && arm=${arms[i]}
    out=/tmp/tree_ab_run && rm -rf "$out" && mkdir -p "$out"
    if ((i < 0)); then
      timeout "$run_limit" python3 -m protospec.bench "$@" --output-dir "$out" > "$out/log.txt" 2>&1
    else
      (cd "${dirs[i]}" && PYTHONPATH=/tmp/site:${dirs[i]} PROTOSPEC_GIT_COMMIT=${commits[i]} \
        timeout "$run_limit" python3 -m protospec.bench "$@" --output-dir "$out" > "$out/log.txt" 2>&1)
    fi
    echo "round $r [$arm] rc $?"
    summary "$out"
    staged=/tmp/tree_ab_staged && rm -rf "$staged" && mkdir -p "$staged"
    for f in "$out"/*.json "$out/log.txt"; do [ -f "$f" ] && cp "$f" "$staged/${arm}_r${r}_$(basename "$f")"; done
    tar -rf "$OUT/${AB_TAR:-ab.tar}" -C "$staged" .
  done
done

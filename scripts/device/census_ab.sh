#!/usr/bin/env bash
# The kernel census of this tree and of each arm, alternating over ROUNDS rounds (default 1), each run its
# own process, then one table: every kernel's microseconds a call and a spec step in each run, largest
# first, and the busy time a spec step. Kernel forms are decided here, one kernel at a time, where an
# end-to-end p50 moves less than the spread between processes. An arm is FILE:SED (a copy of protospec/
# with that sed expression applied to that file: a constant changed) or a directory holding another
# version's protospec/ (a `git archive` copy carried with the call); ARMS lists them separated by `;;`.
# Census arguments follow (the default: the spec graph at batch 64). JSONs go to $OUT/census_ab.tar.
# A directory arm's records name the commit given for it in ARM_COMMITS (space-separated, in the
# directory arms' order), or none (provenance then hashes its protospec/); sed arms name this tree's.
#   PROTOSPEC_GIT_COMMIT=<sha> ARMS='protospec/kernels/sampling/slices.py:s/^MAX_SPAN = 8 /MAX_SPAN = 4 /' \
#     bash scripts/device/census_ab.sh --modes graph --batch-size 64
set -uo pipefail
source "$(dirname "$0")/env.sh"
: "${ARMS:?ARMS: FILE:SED expressions or directories, separated by ;;}"
rounds=${ROUNDS:-1}
run_limit=${RUN_LIMIT:-150}
(($# > 0)) || set -- --modes graph --batch-size 64
runs=/tmp/census_ab && rm -rf "$runs" && mkdir -p "$runs"
names=(tree) dirs=("$PWD") commits=("${PROTOSPEC_GIT_COMMIT:-}")
read -ra arm_commits <<< "${ARM_COMMITS:-}"
i=0 d=0
while IFS= read -r arm; do
  [ -z "$arm" ] && continue
  i=$((i + 1))
  if [ -d "$arm" ]; then
    names+=("$(basename "$arm" | tr -d .)") dirs+=("$(cd "$arm" && pwd)") commits+=("${arm_commits[d]:-}")
    d=$((d + 1))
    continue
  fi
  dir=/tmp/census_ab_arm$i
  echo "arm$i:"
  sed_arm "$dir" "${arm%%:*}" "${arm#*:}" || exit 2
  names+=("arm$i") dirs+=("$dir") commits+=("${PROTOSPEC_GIT_COMMIT:-}")
done < <(printf '%s\n' "${ARMS//;;/$'\n'}")
for ((r = 1; r <= rounds; r++)); do
  for j in "${!names[@]}"; do
    (cd "${dirs[j]}" && PYTHONPATH=/tmp/site:${dirs[j]} PROTOSPEC_GIT_COMMIT=${commits[j]} timeout "$run_limit" python3 -m protospec.bench.kernel_census "$@" \
      --output-json "$runs/${names[j]}_r$r.json" > "$runs/${names[j]}_r$r.log" 2>&1)
    echo "round $r [${names[j]}] rc $?"
  done
done
tar -cf "$OUT/census_ab.tar" -C "$runs" .
python3 - "$runs" <<'PY'
import glob, json, os, re, sys
runs = sorted(glob.glob(sys.argv[1] + "/*.json"), key=lambda p: (os.path.basename(p).rsplit("_r", 1)[1], p))
tables = {}
for path in runs:
    modes = json.load(open(path))["modes"]
    for mode, m in modes.items():
        steps = m.get("spec_steps") or 1
        per = {}
        for name, k in m.get("top_kernels_by_time", {}).items():
            label = re.sub(r"\[abi:v\d+\]", "", name)[-70:]  # the version tag differs between trees
            old = per.get(label, (0.0, 0.0))
            per[label] = (old[0] + k["ms"] * 1000 / steps, old[1] + k["calls"] / steps)
        tables.setdefault(mode, {})[os.path.basename(path)[:-5]] = (m.get("busy_ms_per_spec_step"), per)
for mode, table in tables.items():
    cols = list(table)
    print(f"\n{mode}: us a spec step (us a call) per run")
    print(f"{'busy ms a spec step':72s}" + "".join(f"{c:>20s}" for c in cols))
    print(f"{'':72s}" + "".join(f"{table[c][0] or 0:20.3f}" for c in cols))
    labels = sorted({l for c in cols for l in table[c][1]}, key=lambda l: -max(table[c][1].get(l, (0, 0))[0] for c in cols))
    for label in labels[:30]:
        cells = []
        for c in cols:
            us, calls = table[c][1].get(label, (0.0, 0.0))
            cells.append(f"{us:9.1f} ({us / calls if calls else 0:6.2f})")
        print(f"{label:72s}" + "".join(f"{x:>20s}" for x in cells))
PY

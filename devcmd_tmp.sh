source scripts/device/env.sh
mkdir -p $OUT/dbg
for v in base after teager deager; do for p in 0 1 2 3 4; do PROTOSPEC_DBG=$v PRE=0 TAG=${v}_$p timeout 300 python3 dbg_tmp.py > $OUT/dbg/${v}_$p.log 2>&1 & done; done
wait
python3 - <<'PY'
import json, glob, os
out = {os.path.basename(f)[:-5]: json.load(open(f)) for f in glob.glob(os.environ["OUT"] + "/dbg/*.json")}
json.dump(out, open(os.environ["OUT"] + "/all.json", "w"))
for tag, res in sorted(out.items()):
    for key, gens in res.items():
        ref = res[key.split("_")[0] + "_pg0_side0"][0]
        print(tag, key, "".join("." if g == ref else "X" for g in gens))
PY
for f in $OUT/dbg/*.log; do echo "$f: $(tail -1 $f)"; done | grep -v sync_debug
rm -f $OUT/dbg/*.json $OUT/dbg/*.log

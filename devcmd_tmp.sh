source scripts/device/env.sh
mkdir -p $OUT/dbg
for p in 0 1 2 3; do PRE=1 TAG=pre$p timeout 300 python3 dbg_tmp.py > $OUT/dbg/pre$p.log 2>&1 & done
for p in 0 1 2 3; do PRE=0 TAG=alone$p timeout 300 python3 dbg_tmp.py > $OUT/dbg/alone$p.log 2>&1 & done
wait
python3 - <<'PY'
import json, glob, os
out = {os.path.basename(f)[:-5]: json.load(open(f)) for f in glob.glob(os.environ["OUT"] + "/dbg/*.json")}
json.dump(out, open(os.environ["OUT"] + "/all.json", "w"))
for tag, res in sorted(out.items()):
    for key, gens in res.items():
        ref = res[key.split("_")[0] + "_pg0_side0"][0]
        print(tag, key, ["ok" if g == ref else "DIFF" for g in gens])
PY
for f in $OUT/dbg/*.log; do echo "$f: $(tail -1 $f)"; done
rm -f $OUT/dbg/*.json

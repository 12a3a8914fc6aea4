source scripts/device/env.sh
mkdir -p $OUT/rep
run_variant() {  # name fused exp
  for p in 0 1 2; do
    PROTOSPEC_VR_FUSED=$2 PROTOSPEC_VR_EXP=$3 timeout 400 python3 -m pytest -vv -q -p no:cacheprovider -m gpu \
      tests/test_step_graph.py tests/test_prefill_graphs.py > $OUT/rep/$1_$p.log 2>&1 &
  done
}
run_variant off 0 ""
run_variant base 1 ""
run_variant F 1 F
run_variant T 1 T
run_variant G 1 G
wait
for f in $OUT/rep/*.log; do echo "$f: $(tail -1 $f)"; done
grep -h "^FAILED" $OUT/rep/*.log | sort | uniq -c

import json, os, pathlib, sys, tempfile
sys.path.insert(0, "tests")
import pytest
if os.environ.get("PRE", "1") == "1":
    pytest.main(["-q", "-p", "no:cacheprovider", "-m", "gpu", "tests/test_step_graph.py"])
from tiny import DRAFT_CFG, TARGET_CFG, random_prompts, tiny_llm, write_config
from protospec import SamplingParams
d = pathlib.Path(tempfile.mkdtemp())
tgt, drf = write_config(d / "t", TARGET_CFG), write_config(d / "d", DRAFT_CFG)
res = {}
for temp in (0.0, 1.0):
    prompts = random_prompts(2, lengths=(24,), seed=3)
    params = SamplingParams(temperature=temp, max_tokens=20, ignore_eos=True, seed=4)
    for pg, side in ((False, False), (True, True)) if os.environ.get('PROTOSPEC_DBG') else ((False, False), (True, True), (True, False)):
        if True:
            llm = tiny_llm(tgt, drf, k=3, device="cuda", draft_loop="graph", prefill_graphs=pg, draft_prefill_side=side)
            res[f"T{temp}_pg{int(pg)}_side{int(side)}"] = [[o.token_ids for o in llm.generate(prompts, params)] for _ in range(6)]
            del llm
json.dump(res, open(os.environ["OUT"] + f"/dbg/{os.environ['TAG']}.json", "w"))

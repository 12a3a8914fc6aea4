"""One engine on the offline batch that once hung the GPU: a warm-up generate() of 256 prompts, then one
generate() of N, every engine step logged (batch, waiting, free blocks) and every thread's stack printed if
the call has not returned after --hang-s. Run beside others by hang_probe_driver.py.

    python3 scripts/device/hang_probe.py --mode graph --n 3000 --log /tmp/steps.log [--set EngineConfig field=value ...]
"""
import argparse, faulthandler, json, os, sys, tempfile, time, ast
p = argparse.ArgumentParser()
p.add_argument("--mode", default="graph")
p.add_argument("--n", type=int, default=3000)
p.add_argument("--set", nargs="*", default=[])
p.add_argument("--log", required=True)
p.add_argument("--hang-s", type=float, default=60)
p.add_argument("--dtype", default="float32")
a = p.parse_args()
faulthandler.dump_traceback_later(a.hang_s, exit=False)
import torch
from protospec import LLM, SamplingParams
d = tempfile.mkdtemp()
def cfg(path, layers):
    os.makedirs(path)
    json.dump(dict(model_type="llama", bos_token_id=0, eos_token_id=2, hidden_size=96, intermediate_size=256,
                   initializer_range=0.1, max_position_embeddings=512, num_attention_heads=6, num_key_value_heads=2,
                   num_hidden_layers=layers, rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
                   vocab_size=301), open(path + "/config.json", "w"))
cfg(d + "/t", 3); cfg(d + "/d", 1)
kw = {}
for s in a.set:
    k, v = s.split("=", 1); kw[k] = ast.literal_eval(v)
draft = None if a.mode == "target_only" else d + "/d"
llm = LLM(d + "/t", speculative_model=draft, num_speculative_tokens=3, max_num_seqs=256, load_format="dummy",
          dtype=a.dtype, **({"draft_loop": a.mode} if draft else {}), **kw)
eng = llm.engine
log = open(a.log, "w")
orig = eng.step
count = [0]
t0 = [time.perf_counter()]
def step():
    count[0] += 1
    log.write(f"{count[0]} {time.perf_counter()-t0[0]:.3f} run={len(eng.running)} wait={len(eng.waiting)} "
              f"free={eng.block_manager.num_free_blocks} sg={len(getattr(eng.spec_step, '_step_graphs', {}) or {})}\n")
    log.flush()
    orig()
eng.step = step
def params(n):
    return [SamplingParams(temperature=0.8, top_k=6, top_p=0.9, max_tokens=7, ignore_eos=True, seed=1000 + i) for i in range(n)]
prompts = lambda n: [[5, 6, 7, 8]] * n
t = time.perf_counter(); llm.generate(prompts(256), params(256)); (torch.cuda.synchronize() if torch.cuda.is_available() else None)
print("warm", time.perf_counter() - t, flush=True)
log.write("=== main call\n"); count[0] = 0; t0[0] = time.perf_counter()
t = time.perf_counter(); outs = llm.generate(prompts(a.n), params(a.n)); (torch.cuda.synchronize() if torch.cuda.is_available() else None)
print("RESULT", a.mode, a.n, a.set, "seconds", round(time.perf_counter() - t, 3), "steps", count[0],
      "counters", llm.counters.get("draft", {}), flush=True)
faulthandler.cancel_dump_traceback_later()

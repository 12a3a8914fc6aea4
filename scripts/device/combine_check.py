"""Folded vs separate split-K attention combine on a GPU: the seed configuration's tokens (greedy and
seeded T=1, graph mode) must be identical either way. Prints one line per setting and OK / DIFFER."""
import torch

from protospec import LLM, SamplingParams
from protospec.kernels import paged_attention as attention_kernels

tokens = {}
for fused in (True, False):
    attention_kernels.FUSED_COMBINE = fused  # before the engine captures its graphs
    llm = LLM("JackFram/llama-160m", speculative_model="JackFram/llama-68m", num_speculative_tokens=5,
              load_format="dummy", draft_loop="graph", seed=0)
    prompts = [[(7 * i + 3) % 32000 for i in range(256)], [(11 * i + 5) % 32000 for i in range(300)]]
    out = [o.token_ids for t in (0.0, 1.0) for o in llm.generate(prompts, SamplingParams(temperature=t, max_tokens=64, seed=1, ignore_eos=True))]
    tokens[fused] = out
    print(f"fused_combine={fused}: {[len(o) for o in out]} tokens, first {out[0][:8]}", flush=True)
    del llm
    torch.cuda.empty_cache()
print("OK: identical tokens" if tokens[True] == tokens[False] else "DIFFER")

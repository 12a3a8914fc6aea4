"""Is the greedy parting between cuBLAS and the fused linears a near tie? Decodes the seed
configuration's pair (dummy float16) greedily in the captured draft loop with both linear kernels,
finds the first token where they part, then runs the target once over the cuBLAS sequence (the torch
prefill path, no graphs) and prints, for every output position, the gap between the target's two
largest logits computed in float32 from the float16 hidden state: where the parting token's gap sits
among all positions' gaps says whether it is a tie that summation order decides.
    python3 scripts/device/greedy_tie.py
"""
import torch
import torch.nn.functional as F

from protospec.bench.ablation import BenchSetup
from protospec.config import SamplingParams
from protospec.model.llama import rms_norm


def setup(linear: str, **kw) -> BenchSetup:
    return BenchSetup("JackFram/llama-160m", "JackFram/llama-68m", 5, 256, 128, 1, 0, 1, load_format="dummy",
                      temperature=0.0, linear_kernel=linear, dependent_launch=linear == "mma_fused", **kw)


tokens = {}
for linear in ("cublas", "mma_fused"):
    s = setup(linear)
    llm = s.llm(draft_loop="graph")
    prompt = s.prompts(llm.engine.vocab_size)[0]
    tokens[linear] = llm.generate([prompt], s.params())[0].token_ids
    del llm
a, b = tokens["cublas"], tokens["mma_fused"]
d = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
print(f"first parting at output {d}: cublas {a[d] if d is not None else '-'}, fused {b[d] if d is not None else '-'}")

s = setup("cublas", prefill_kernels=False)  # the torch prefill (a layout seen once runs eager) calls the hooked head
llm = s.llm(speculative=False)
model = llm.engine.target.model
captured = {}


def head(x, residual, logits_indices, norm_w, eps, lm_w):
    captured["h"] = rms_norm(x + residual, norm_w, eps)  # [T, hidden] float16, every position
    captured["w"] = lm_w
    return F.linear(captured["h"][logits_indices], lm_w).float()


model.head = head
llm.generate([prompt + a], SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
h, w = captured["h"], captured["w"].detach()
torch.set_grad_enabled(False)
rows = h[len(prompt) - 1: len(prompt) - 1 + len(a)]                  # row j predicts output token j
logits32 = rows.float() @ w.float().t()                              # [128, vocab] float32
logits16 = F.linear(rows, w).float()                                 # as cuBLAS's LM head writes them
top32, idx32 = logits32.topk(2, dim=-1)
gaps = (top32[:, 0] - top32[:, 1]).cpu()
agree = (idx32[:, 0].cpu() == torch.tensor(a)).float().mean().item()
print(f"the prefill's float32 argmax matches cuBLAS's tokens at {agree:.3f} of positions")
order = gaps.argsort()
print("smallest top-two gaps (position, gap, float32 top two, float16 logits of those two):")
for j in order[:8].tolist():
    i0, i1 = idx32[j].tolist()
    print(f"  {j:4d} {gaps[j].item():.6f} tokens {i0},{i1} float16 {logits16[j, i0].item():.5f},{logits16[j, i1].item():.5f}")
if d is not None:
    rank = (gaps < gaps[d]).sum().item()
    print(f"parting position {d}: gap {gaps[d].item():.6f}, rank {rank} of {len(a)} (0 = smallest); "
          f"median gap {gaps.median().item():.6f}; tokens at it: float32 top two {idx32[d].tolist()}")

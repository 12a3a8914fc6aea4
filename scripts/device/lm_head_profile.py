"""The tensor-core LM head alone (llama-160m's head, 768 x 32000, 49 MB), out of the forward's chain:
us per call and x its bytes floor for the plain product, the fused head form the forward launches
(final norm after the residual add, wanted rows gathered, float32 logits), that form as a chain of
programmatic dependents, the same with the register cap, and the norm as a one-block kernel of its
own before the plain product (layer_kernels.HEAD_NORM = "separate"); each case 20 calls cycling through
weight copies that exceed L2 (as in the forward, the head's weight is not in L2 when its turn comes).
    python3 scripts/device/lm_head_profile.py [--tokens 1 6]
For ncu, --once launches each form a few times without graphs:
    ncu --clock-control none --kernel-name regex:gemv_mma_k768_norm_residual_gather --launch-skip 3 \
        --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
        --section WarpStateStats --section LaunchStats python3 scripts/device/lm_head_profile.py --once
"""
import argparse

import torch

from protospec.bench.attention_cost import cuda_and_copy_bandwidth, time_calls
from protospec.bench.gemv_cost import weight_copies
from protospec.kernels import gemv_mma

p = argparse.ArgumentParser()
p.add_argument("--tokens", type=int, nargs="+", default=[1, 6])
p.add_argument("--once", action="store_true", help="no timing: each form launched 5 times (for ncu)")
args = p.parse_args()
dev, bandwidth = cuda_and_copy_bandwidth("lm_head_profile")
k, n = 768, 32000
weights = weight_copies(k, n, dev)
g = (1 + 0.1 * torch.randn(k, device=dev)).half()
for tokens in args.tokens:
    hidden, residual = (torch.randn(8, k, device=dev).half() for _ in range(2))  # the last layer's rows
    wanted = torch.arange(8 - tokens, 8, device=dev)                             # the rows whose logits are wanted
    floor_us = (k * n * 2 + tokens * n * 4) / bandwidth / 1e3
    forms = {
        "plain (x already normalised)": lambda w: gemv_mma.gemv_mma(hidden[:tokens], w, out_dtype=torch.float32),
        "head form": lambda w: gemv_mma.gemv_mma(hidden, w, g, residual, 1e-6, x_rows=wanted, out_dtype=torch.float32),
        "head form, dependents": lambda w: gemv_mma.gemv_mma(hidden, w, g, residual, 1e-6, x_rows=wanted,
                                                              out_dtype=torch.float32, dependent_launch=True),
        "head form, dependents, 128 registers, no prefetch": lambda w: gemv_mma.gemv_mma(
            hidden, w, g, residual, 1e-6, x_rows=wanted, out_dtype=torch.float32, dependent_launch=True,
            max_registers=128, prefetch_norm=False),
        "norm kernel, then plain (dependents)": lambda w: gemv_mma.gemv_mma(
            gemv_mma.head_norm(hidden, residual, g, 1e-6, wanted, dependent_launch=True), w,
            out_dtype=torch.float32, dependent_launch=True),
        "plain, dependents": lambda w: gemv_mma.gemv_mma(hidden[:tokens], w, out_dtype=torch.float32,
                                                         dependent_launch=True),
    }
    for name, form in forms.items():
        if args.once:
            for w in (weights * 5)[:5]:
                form(w)
            torch.cuda.synchronize()
            continue
        us = time_calls([lambda w=w, form=form: form(w) for w in weights])
        print(f"tokens {tokens}  {name:>52}: {us:6.2f} us  ({us / floor_us:.2f}x the {floor_us:.2f} us floor)", flush=True)

"""The tensor-core GEMV's split-K form alone (gemv_mma k_splits): the down projection's shape (K 3072,
N 768: 48 tiles of 16 rows, so one block a tile leaves most SMs idle) and the o projection's (768 x
768), us per call against the bytes floor, unsplit and split 2 and 4 ways, each with its weight loads
where ptxas puts them and pinned above the wait (--pin-weight-loads), as a chain of programmatic
dependents (as in the forward), 20 calls cycling through weight copies that exceed L2. Also checks
that every split gives the unsplit bits on the GPU.
    python3 scripts/device/split_k_profile.py [--tokens 1 6]
"""
import argparse

import torch

from protospec.bench.attention_cost import cuda_and_copy_bandwidth, time_calls
from protospec.bench.gemv_cost import weight_copies
from protospec.kernels import gemv_mma

p = argparse.ArgumentParser()
p.add_argument("--tokens", type=int, nargs="+", default=[1, 6])
args = p.parse_args()
dev, bandwidth = cuda_and_copy_bandwidth("split_k_profile")
for k, n in ((3072, 768), (768, 768)):
    weights = weight_copies(k, n, dev)
    for tokens in args.tokens:
        x = torch.randn(tokens, k, device=dev).half()
        floor_us = (k * n * 2 + tokens * (k + n) * 2) / bandwidth / 1e3
        whole = gemv_mma.gemv_mma(x, weights[0], dependent_launch=True)
        for pin in (False, True):
            gemv_mma.PIN_WEIGHT_LOADS = pin
            for splits in (1, 2, 4):
                same = torch.equal(gemv_mma.gemv_mma(x, weights[0], dependent_launch=True, k_splits=splits), whole)
                us = time_calls([lambda w=w, s=splits: gemv_mma.gemv_mma(x, w, dependent_launch=True, k_splits=s)
                                 for w in weights])
                print(f"{k}x{n}  tokens {tokens}  splits {splits}  {'pinned' if pin else 'default'}: {us:6.2f} us  "
                      f"({us / floor_us:.2f}x the {floor_us:.2f} us floor)  same bits as unsplit: {same}", flush=True)
        gemv_mma.PIN_WEIGHT_LOADS = False

"""A spec step's random numbers, per-request draws against one batched fill, at the seed shapes
(k = 5, vocab 32000): wall us per draw (host + device, synchronised every 20 draws) and kernels per draw.
python3 scripts/device/randoms_cost.py [--batch-sizes 1 16 64]"""
import argparse
import time

import torch

from protospec import SamplingParams
from protospec.speculation.randoms import SpecStepRandoms
from protospec.speculation.sampler import SamplingTensors

p = argparse.ArgumentParser()
p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16, 64])
p.add_argument("--k", type=int, default=5)
p.add_argument("--vocab", type=int, default=32000)
args = p.parse_args()
dev = torch.device("cuda")
print(f"{'batch':>5} {'per-request us':>15} {'batched us':>11} {'floor us':>9}")
for batch in args.batch_sizes:
    gens = [torch.Generator(device=dev).manual_seed(i) for i in range(batch)]
    st = SamplingTensors.build([SamplingParams(temperature=1.0)] * batch, gens, args.vocab, dev)
    row = []
    for batched in (False, True):
        for _ in range(5):
            SpecStepRandoms.draw(st, args.k, args.vocab, dev, batched=batched)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(20):
            SpecStepRandoms.draw(st, args.k, args.vocab, dev, batched=batched)
        torch.cuda.synchronize()
        row.append((time.perf_counter() - start) / 20 * 1e6)
    floor = batch * (2 * args.k + 2) * args.vocab * 4 / 4.26e12 * 1e6
    print(f"{batch:>5} {row[0]:>15.1f} {row[1]:>11.1f} {floor:>9.1f}", flush=True)

"""Device time of the rejection sampler kernel against the torch reference, us per call replayed from a
CUDA graph (20 calls per graph), at the seed shape (k = 5, a 32000-entry vocabulary):
python3 scripts/device/rejection_cost.py [--batch-sizes 1 16 64]"""
import argparse

import torch

from protospec.bench.layer_kernel_cost import graph_us
from protospec.kernels.sampling.rejection import rejection_sample_fused
from protospec.speculation.rejection import rejection_sample

p = argparse.ArgumentParser()
p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64])
p.add_argument("--k", type=int, default=5)
p.add_argument("--vocab", type=int, default=32000)
args = p.parse_args()
dev, k, vocab = torch.device("cuda"), args.k, args.vocab
for batch in args.batch_sizes:
    gen = torch.Generator(device=dev).manual_seed(batch)
    q = torch.softmax(torch.randn(batch, k, vocab, device=dev, generator=gen), -1)
    p_ = torch.softmax(torch.randn(batch, k + 1, vocab, device=dev, generator=gen), -1)
    ids = torch.multinomial(q.view(-1, vocab), 1, generator=gen).view(batch, k)
    noise = torch.empty(batch, 2 * k + 1, vocab, device=dev).exponential_(generator=gen)
    u = torch.rand(batch, k, device=dev, generator=gen)
    call = (ids, q, p_, u, noise[:, k:2 * k], noise[:, 2 * k])
    same = rejection_sample_fused(*call).output_token_ids.equal(rejection_sample(*call).output_token_ids)
    print(f"batch {batch:3d}: kernel {graph_us(lambda: rejection_sample_fused(*call)):7.1f} us, "
          f"torch {graph_us(lambda: rejection_sample(*call)):7.1f} us, same tokens {same}")

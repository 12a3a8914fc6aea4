"""The tensor-core attention path's variants timed at the seed shapes (320 keys), us per call:
python3 scripts/device/attention_mma_variants.py [--warps 2 4 8] [--blocks-per-sm 2 4]
  --warps          attention_mma.WARPS: warps per block (each walks its own 16-key tiles; 0: by shape)
  --blocks-per-sm  attention_mma.BLOCKS_PER_SM: how far split-K spreads a small grid
  --min-blocks     attention_mma.MIN_BLOCKS_PER_SM: launch bounds ("none": the compiler's registers)
  --splits         split-K factors forced (default: chosen by shape)
  --context        keys per sequence
by_kv_head is timed first at the same shapes, for reference."""
import argparse
import itertools

import torch

from protospec.bench.attention_cost import make_calls, time_calls
from protospec.kernels import attention_mma as by_mma, interop
from protospec.model.loader import resolve_checkpoint

p = argparse.ArgumentParser()
p.add_argument("--warps", type=int, nargs="+", default=[0], help="0: by shape")
p.add_argument("--blocks-per-sm", type=int, nargs="+", default=[by_mma.BLOCKS_PER_SM])
p.add_argument("--min-blocks", nargs="+", default=[str(by_mma.MIN_BLOCKS_PER_SM).lower()])
p.add_argument("--splits", type=int, nargs="+", default=[0])
p.add_argument("--context", type=int, default=320)
p.add_argument("--shapes", nargs="+", default=["1x1", "1x6", "16x1", "16x6", "64x1", "64x6"], help="BATCHxQUERIES")
args = p.parse_args()
cfg, _ = resolve_checkpoint("JackFram/llama-160m", "dummy")
dev = torch.device("cuda")
shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes]


def timed(path, splits=None):
    out = []
    for batch, queries in shapes:
        calls, _ = make_calls(cfg, batch, queries, args.context, 16, dev, path, splits)
        out.append(time_calls(calls))
        del calls
    return out


print(f"context {args.context}; warps blocks/SM min_blocks splits | " + " ".join(f"b{b}q{q:<2}" for b, q in shapes) + " | (warps, regs, spill bytes)")
print("by_kv_head              | " + " ".join(f"{t:6.1f}" for t in timed("by_kv_head")), flush=True)
for warps, per_sm, min_blocks, splits in itertools.product(args.warps, args.blocks_per_sm, args.min_blocks, args.splits):
    by_mma.WARPS, by_mma.BLOCKS_PER_SM = warps or None, per_sm
    by_mma.MIN_BLOCKS_PER_SM = None if min_blocks == "none" else int(min_blocks)
    times = timed("mma", splits or None)
    regs = sorted({(w, info["regs_per_thread"], info["local_mem_per_thread"]) for w in (2, 4, 8, warps) if w
                   for info in interop.compiled_resources(by_mma.attention_kernel(6, cfg.head_dim, w, 1), 32 * w)})
    print(f"mma {warps:>5} {per_sm:>9} {min_blocks:>10} {splits:>6} | " + " ".join(f"{t:6.1f}" for t in times) + f" | {regs}", flush=True)

"""by_kv_head's variants timed at the seed shapes (320 keys), us per call and registers per thread:
python3 scripts/device/attention_variants.py [--rows 6 3] [--budget 7 8] [--min-blocks 3] [--blocks-per-sm 2]
  --rows           MAX_ROWS, query rows per block
  --budget         ROW_KEY_BUDGET: rows + keys per lane group per step (7 with 6 rows = one key per step)
  --min-blocks     launch bounds' blocks per SM ("none": the compiler's registers)
  --blocks-per-sm  paged_attention.BLOCKS_PER_SM: how far split-K spreads a small grid
  --fill           FILL_BLOCKS_PER_SM
Fast-math stays on."""
import argparse
import itertools

import torch

from protospec.bench.attention_cost import make_calls, time_calls
from protospec.kernels import attention_by_kv_head as by_kv_head, interop, paged_attention
from protospec.model.loader import resolve_checkpoint

p = argparse.ArgumentParser()
p.add_argument("--rows", type=int, nargs="+", default=[by_kv_head.MAX_ROWS])
p.add_argument("--budget", type=int, nargs="+", default=[by_kv_head.ROW_KEY_BUDGET])
p.add_argument("--min-blocks", nargs="+", default=[str(by_kv_head.MIN_BLOCKS_PER_SM)])
p.add_argument("--blocks-per-sm", type=int, nargs="+", default=[paged_attention.BLOCKS_PER_SM])
p.add_argument("--fill", type=int, nargs="+", default=[by_kv_head.FILL_BLOCKS_PER_SM],
               help="FILL_BLOCKS_PER_SM: rows per block are halved below this many blocks per SM (0: never)")
p.add_argument("--shapes", nargs="+", default=["1x6", "16x1", "16x6", "64x1", "64x6"], help="BATCHxQUERIES")
args = p.parse_args()
cfg, _ = resolve_checkpoint("JackFram/llama-160m", "dummy")
dev = torch.device("cuda")
shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes]
print("rows budget min_blocks blocks/SM fill | " + " ".join(f"b{b}q{q:<2}" for b, q in shapes) + " | regs", flush=True)
for rows, budget, min_blocks, per_sm, fill in itertools.product(args.rows, args.budget, args.min_blocks,
                                                                args.blocks_per_sm, args.fill):
    by_kv_head.MAX_ROWS, by_kv_head.ROW_KEY_BUDGET, by_kv_head.FILL_BLOCKS_PER_SM = rows, budget, fill
    by_kv_head.MIN_BLOCKS_PER_SM = None if min_blocks == "none" else int(min_blocks)
    paged_attention.BLOCKS_PER_SM = per_sm
    times = []
    for batch, queries in shapes:
        calls, _ = make_calls(cfg, batch, queries, 320, 16, dev, "by_kv_head")
        times.append(time_calls(calls))
        del calls
    regs = {}
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    for r in sorted({by_kv_head.rows_per_block(q, b * cfg.num_key_value_heads, sms) for b, q in shapes}):
        resources = interop.compiled_resources(by_kv_head.attention_kernel(r, cfg.head_dim, 16, 1), by_kv_head.THREADS)
        if resources:
            regs[r] = [info["regs_per_thread"] for info in resources]
    print(f"{rows:>4} {budget:>6} {min_blocks:>10} {per_sm:>9} {fill:>4} | " + " ".join(f"{t:6.1f}" for t in times)
          + f" | {regs}", flush=True)

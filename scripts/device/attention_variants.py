"""by_kv_head's compile options and rows per block, timed at the seed shapes (320 keys):
python3 scripts/device/attention_variants.py [ROWS,...] [MIN_BLOCKS,...] (fast-math on). Prints us per call and registers per thread."""
import itertools
import sys

import torch

from protospec.bench.attention_cost import make_calls, time_calls
from protospec.kernels import attention_by_kv_head as by_kv_head, interop
from protospec.loader import resolve_checkpoint

cfg, _ = resolve_checkpoint("JackFram/llama-160m", "dummy")
dev = torch.device("cuda")
# argv: rows per block, then min blocks per SM ("none" for the compiler's choice), e.g. 6,3 none,3,4
ROWS = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "6,3").split(",")]
MIN_BLOCKS = [None if x == "none" else int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "none,3").split(",")]
shapes = [(1, 6), (16, 1), (16, 6), (64, 1), (64, 6)]
print("rows min_blocks fastmath | " + " ".join(f"b{b}q{q:<2}" for b, q in shapes) + " | regs")
for rows, min_blocks, fast in itertools.product(ROWS, MIN_BLOCKS, [True]):
    by_kv_head.MAX_ROWS, by_kv_head.MIN_BLOCKS_PER_SM, by_kv_head.FASTMATH = rows, min_blocks, fast
    times = []
    for batch, queries in shapes:
        calls, _ = make_calls(cfg, batch, queries, 320, 16, dev, "by_kv_head")
        times.append(time_calls(calls))
        del calls
    launcher = interop._tensor_launchers.get(by_kv_head.attention_kernel(by_kv_head.rows_per_block(6), cfg.head_dim))
    regs = [getattr(c, "regs_per_thread", None) for c in launcher.compiled_kernels.values()] if launcher else []
    print(f"{rows:>4} {str(min_blocks):>10} {fast!s:>8} | " + " ".join(f"{t:6.1f}" for t in times) + f" | {regs}", flush=True)

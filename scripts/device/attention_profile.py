"""The attention kernel's compiled resources (registers, local memory, shared memory, blocks per SM)
and a few launches to profile: python3 scripts/device/attention_profile.py [--batch 64] [--queries 1 6]
Run under `ncu --clock-control none --kernel-name regex:attention ...` for the hardware counters."""
import argparse

import torch

from protospec.bench.attention_cost import make_calls
from protospec.kernels import attention_by_kv_head as by_kv_head, interop
from protospec.model.loader import resolve_checkpoint

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=64)
p.add_argument("--queries", type=int, nargs="+", default=[1, 6])
p.add_argument("--context", type=int, default=320)
args = p.parse_args()
cfg, _ = resolve_checkpoint("JackFram/llama-160m", "dummy")
dev = torch.device("cuda")
for queries in args.queries:
    calls, _ = make_calls(cfg, args.batch, queries, args.context, 16, dev, "by_kv_head")
    for call in calls[:2]:
        call()
    torch.cuda.synchronize()
    rows = by_kv_head.rows_per_block(queries * cfg.num_attention_heads // cfg.num_key_value_heads)
    dispatcher = by_kv_head.attention_kernel(rows, cfg.head_dim, 16)
    for info in interop.compiled_resources(dispatcher, by_kv_head.THREADS):
        print(f"queries {queries} rows {rows}: {info}", flush=True)

"""An attention path's compiled resources (registers, local memory, shared memory, blocks per SM)
and a few launches to profile:
  python3 scripts/device/attention_profile.py [--path mma] [--batch 16] [--queries 6] [--context 320]
Run under `ncu --clock-control none --kernel-name regex:attention ...` for the hardware counters."""
import argparse

import torch

from tools.attention_cost import make_calls
from protospec.kernels.attention import by_kv_head, mma as by_mma
from protospec.kernels.launch import interop
from protospec.kernels.launch.interop import sm_count as _sm_count
from protospec.model.loader import resolve_checkpoint

p = argparse.ArgumentParser()
p.add_argument("--path", default="mma", choices=["mma", "by_kv_head"])
p.add_argument("--batch", type=int, default=16)
p.add_argument("--queries", type=int, nargs="+", default=[6])
p.add_argument("--context", type=int, default=320)
p.add_argument("--sass", default="", help="write each compiled signature's SASS and PTX to this prefix")
args = p.parse_args()
cfg, _ = resolve_checkpoint("JackFram/llama-160m", "dummy")
dev = torch.device("cuda")
for queries in args.queries:
    calls, _ = make_calls(cfg, args.batch, queries, args.context, 16, dev, args.path)
    for call in calls[:3]:
        call()
    torch.cuda.synchronize()
    group_rows = queries * cfg.num_attention_heads // cfg.num_key_value_heads
    groups = args.batch * cfg.num_key_value_heads
    if args.path == "mma":
        warps = by_mma.warps_per_block(groups, _sm_count(dev), group_rows, cfg.head_dim)
        dispatcher, threads = by_mma.attention_kernel(group_rows, cfg.head_dim, warps, group_rows // queries), 32 * warps
    else:
        rows = by_kv_head.rows_per_block(group_rows, groups, _sm_count(dev))
        dispatcher, threads = by_kv_head.attention_kernel(rows, cfg.head_dim, 16, group_rows // queries), by_kv_head.threads_per_block(cfg.head_dim)
    for info in interop.compiled_resources(dispatcher, threads):
        print(f"{args.path} batch {args.batch} queries {queries} threads {threads}: {info}", flush=True)
    if args.sass:  # the machine code of each compiled signature (needs nvdisasm), for counting instructions
        for n, compiled in enumerate(interop._tensor_launchers[dispatcher].compiled_kernels.values()):
            with open(f"{args.sass}_{args.path}_b{args.batch}q{queries}_{n}.sass", "w") as f:
                f.write(compiled.inspect_sass())
            with open(f"{args.sass}_{args.path}_b{args.batch}q{queries}_{n}.ptx", "w") as f:
                f.write(compiled.inspect_asm(torch.cuda.get_device_capability(dev)))

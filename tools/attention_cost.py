"""Device time of one paged-attention call against its bytes floor, by batch, queries and context.

    python -m tools.attention_cost [--batch-sizes 1 16 64] [--queries 1 6] [--contexts 320 1024 2048]
                                             [--splits 1 2 4 8] [--torch] [--output-json PATH]

Shapes: the model's attention (llama-160m: 12 heads of 64, MHA), float16 K/V in a paged cache with
the blocks of each sequence scattered over the pool, a block table as wide as the engine's CUDA
graphs make it. `context` = keys per sequence (its last query's position + 1).

Floor = (K/V bytes read + Q bytes read + output bytes written) / the copy bandwidth measured in the
same run (a 1 GiB device-to-device copy, bytes read + written over its time). Each case is captured
20 times in one CUDA graph and replayed (CUDA events); the 20 calls cycle through enough distinct
caches that their K/V exceed the L2 cache several times over, so a call reads from memory as a
layer does in a forward, not from the previous call's L2 lines.
"""
from __future__ import annotations

import argparse
import itertools

import torch

from protospec.bench.kernel_census import copy_bandwidth_gbs, graph_replay_us
from protospec.bench.provenance import check_writable, provenance, write_report
from protospec.model.inputs import prepare_inputs
from protospec.kernels.attention import paged_attention as kernel
from protospec.model.loader import resolve_checkpoint
from protospec.model.config import LlamaArchConfig
from protospec.command_line import CommandParser, run_command

L2_BYTES = 60 * 2**20  # the H200's L2; the rotation covers 4x this
CALLS_PER_GRAPH = 20


def cuda_and_copy_bandwidth(prog: str) -> tuple[torch.device, float]:
    """The CUDA device a micro-benchmark times on (SystemExit without one) and its copy rate, printed."""
    if not torch.cuda.is_available():
        raise SystemExit(f"{prog} needs a CUDA device")
    dev = torch.device("cuda")
    bandwidth = copy_bandwidth_gbs(dev)
    print(f"copy bandwidth {bandwidth:.0f} GB/s (read + written)")
    return dev, bandwidth


def make_calls(cfg: LlamaArchConfig, batch: int, queries: int, context: int, block_size: int, dev, path=None,
               splits=None, use_torch: bool = False) -> tuple[list, int]:
    """Closures, one per distinct cache set, each one attention call; and the bytes one call must move."""
    heads, kv_heads, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    blocks_per_seq = -(-context // block_size)
    width = 1 << (blocks_per_seq - 1).bit_length()
    kv_bytes = batch * context * kv_heads * d * 2 * 2  # K and V, float16
    sets = max(2, min(CALLS_PER_GRAPH, -(-4 * L2_BYTES // kv_bytes)))
    gen = torch.Generator().manual_seed(0)
    pool = sets * batch * blocks_per_seq + 1  # block 0: the null block
    cache = torch.empty(2, pool, block_size, kv_heads, d, dtype=torch.float16, device=dev).normal_()
    order = (torch.randperm(pool - 1, generator=gen) + 1).view(sets, batch, blocks_per_seq).tolist()
    calls = []
    for tables in order:
        inputs = prepare_inputs([[1] * queries] * batch, [context - queries] * batch, tables, block_size, queries, dev, width)
        q = torch.randn(batch * queries, heads, d, generator=gen).half().to(dev)
        meta, pos = inputs.meta, inputs.positions
        if use_torch:
            calls.append(_torch_call(q, cache, inputs, kv_heads, d))
        else:
            calls.append(lambda q=q, meta=meta, pos=pos: kernel.paged_attention(
                q, cache, meta.block_tables, pos, queries, d ** -0.5, path=path, splits=splits))
    qo_bytes = 2 * batch * queries * heads * d * 2
    return calls, kv_bytes + qo_bytes


def _torch_call(q, cache, inputs, kv_heads, d):
    from protospec.model.attention import paged_attention as torch_attention, plan_attention

    meta = inputs.meta
    k = cache[0].view(-1, kv_heads, d)[meta.slot_mapping]
    v = cache[1].view(-1, kv_heads, d)[meta.slot_mapping]
    plan = plan_attention(inputs.positions, meta, q.dtype)
    return lambda: torch_attention(q, k, v, cache, meta, plan, d ** -0.5)  # its K/V write included


def time_calls(calls: list) -> float:
    """Device us per call, the calls cycled through in one captured graph."""
    cycle = itertools.cycle(calls)
    return graph_replay_us(lambda: next(cycle)(), CALLS_PER_GRAPH, 20) / CALLS_PER_GRAPH


def main(argv=None) -> dict:
    p = CommandParser(prog="python -m tools.attention_cost", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="JackFram/llama-160m", help="whose attention shape (default: %(default)s)")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--queries", type=int, nargs="+", default=[1, 6], help="query tokens per sequence (1 = decode, k + 1 = verify)")
    p.add_argument("--contexts", type=int, nargs="+", default=[320, 1024, 2048], help="keys per sequence")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--paths", nargs="*", default=[], choices=list(kernel.PATHS), help="also time these paths, forced")
    p.add_argument("--splits", type=int, nargs="*", default=[],
                   help="also time the path chosen by shape with these split-K factors, forced")
    p.add_argument("--torch", action="store_true", help="also time the torch path (K/V write + gather + SDPA)")
    p.add_argument("--output-json", default=None)
    args = p.parse_args(argv)
    check_writable(args.output_json)
    dev, bandwidth = cuda_and_copy_bandwidth("attention_cost")
    cfg, _ = resolve_checkpoint(args.model, "dummy")
    report = provenance(dev, argv, "tools.attention_cost") | {
        "config": vars(args), "copy_bandwidth_gbs": bandwidth, "cases": []}
    print(f"{'batch':>5} {'queries':>7} {'context':>7} {'path':>16} {'splits':>6} {'MB':>7} {'floor us':>8} {'us':>8} {'x floor':>7}"
          + (f" {'torch us':>8}" if args.torch else ""))
    for batch, queries, context in itertools.product(args.batch_sizes, args.queries, args.contexts):
        variants = [(None, None), *[(p, None) for p in args.paths], *[(None, s) for s in args.splits]]
        for path, splits in variants:
            calls, nbytes = make_calls(cfg, batch, queries, context, args.block_size, dev, path, splits)
            us = time_calls(calls)
            floor_us = nbytes / bandwidth / 1e3
            chosen = kernel.choose_path(cfg.head_dim, torch.float16, args.block_size, dev)
            row = {"batch": batch, "queries": queries, "context": context, "path": path or f"auto:{chosen}",
                   "splits": splits or "auto",
                   "bytes": nbytes, "floor_us": floor_us, "us": us, "x_floor": us / floor_us}
            if args.torch and path is None and splits is None:  # once a shape, beside the chosen path
                row["torch_us"] = time_calls(make_calls(cfg, batch, queries, context, args.block_size, dev, use_torch=True)[0])
            report["cases"].append(row)
            print(f"{batch:>5} {queries:>7} {context:>7} {row['path']:>16} {str(row['splits']):>6} {nbytes / 1e6:>7.2f} {floor_us:>8.2f} "
                  f"{us:>8.2f} {us / floor_us:>7.2f}" + (f" {row['torch_us']:>8.2f}" if "torch_us" in row else ""), flush=True)
            del calls
    write_report(args.output_json, report)
    return report


if __name__ == "__main__":
    run_command(main)

"""What a persistent kernel pays to sync its grid, launched the way protospec launches kernels.

    python -m protospec.bench.grid_sync_cost [--threads 128 256] [--blocks-per-sm 1 2 4] [--syncs 1000]
                                             [--output-json PATH]

A fused forward in one persistent kernel separates its phases (norm + GEMV, attention, ...) with
grid-wide syncs, so its cost is the weights it reads plus one sync per phase. This times, through
interop's cooperative cuLaunchCooperativeKernel and inside a CUDA graph (as a spec step would
replay it), per grid size (blocks per SM x SMs, at most what can be resident):
  - launch: device time of a cooperative kernel that syncs once, against an ordinary empty kernel
    (both 20 per graph, back to back: what each launch adds in a captured spec step);
  - per sync: (time with --syncs syncs - time with 1) / (--syncs - 1).
"""
from __future__ import annotations

import argparse
import itertools

import torch

from protospec.bench.launch_cost import graph_replay_us
from protospec.bench.provenance import check_writable, provenance, write_report
from protospec.kernels import interop
from protospec.kernels.interop import cuda

CALLS_PER_GRAPH = 20


@cuda.jit
def _grid_syncs(flags, count):
    """`count` grid syncs in a row; block 0's thread 0 counts them (a store the syncs order)."""
    grid = cuda.cg.this_grid()
    for i in range(count):
        grid.sync()
        if cuda.blockIdx.x == 0 and cuda.threadIdx.x == 0:
            flags[0] = i + 1


@cuda.jit
def _empty(flags, count):
    if cuda.blockIdx.x == 0 and cuda.threadIdx.x == 0 and count < 0:
        flags[0] = count


def time_launches(kernel, blocks: int, threads: int, count: int, flags: torch.Tensor) -> float:
    """Device us per launch, CALLS_PER_GRAPH launches captured in one CUDA graph."""
    return graph_replay_us(lambda: interop.launch_tensors(kernel, blocks, threads, [flags, count]), CALLS_PER_GRAPH,
                           20) / CALLS_PER_GRAPH


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m protospec.bench.grid_sync_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, nargs="+", default=[128, 256], help="threads per block")
    p.add_argument("--blocks-per-sm", type=int, nargs="+", default=[1, 2, 4], help="grid = this x SMs (if resident)")
    p.add_argument("--syncs", type=int, default=1000, help="syncs per kernel for the per-sync figure")
    p.add_argument("--output-json", default=None)
    args = p.parse_args(argv)
    check_writable(args.output_json)
    if not torch.cuda.is_available():
        raise SystemExit("grid_sync_cost needs a CUDA device")
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    flags = torch.zeros(1, dtype=torch.int64, device=dev)
    report = provenance(dev, argv, "protospec.bench.grid_sync_cost") | {"config": vars(args), "sm_count": sms, "cases": []}
    print(f"{'threads':>7} {'blocks':>6} {'empty kernel us':>15} {'1-sync kernel us':>16} {'us per sync':>11}")
    for threads, per_sm in itertools.product(args.threads, args.blocks_per_sm):
        resident = interop.max_cooperative_blocks(_grid_syncs, threads, [flags, 1])
        blocks = min(per_sm * sms, resident)
        empty_us = time_launches(_empty, blocks, threads, 1, flags)
        one_us = time_launches(_grid_syncs, blocks, threads, 1, flags)
        many_us = time_launches(_grid_syncs, blocks, threads, args.syncs, flags)
        assert int(flags.item()) == args.syncs, "the syncs did not all run"
        per_sync = (many_us - one_us) / (args.syncs - 1)
        report["cases"].append({"threads": threads, "blocks": blocks, "resident_blocks": resident, "empty_us": empty_us,
                                "one_sync_us": one_us, "many_syncs_us": many_us, "us_per_sync": per_sync})
        print(f"{threads:>7} {blocks:>6} {empty_us:>15.2f} {one_us:>16.2f} {per_sync:>11.3f}", flush=True)
    write_report(args.output_json, report)
    return report


if __name__ == "__main__":
    from protospec.command_line import run_command

    run_command(main)

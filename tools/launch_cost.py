"""Host cost of one advance_step launch, by launch path, against the CPU prepare it replaces.

    python -m tools.launch_cost --output-json data/results/advance_step_launch_cost.json

Host cost = wall time of N back-to-back calls / N, with no sync inside the loop (the GPU queue
absorbs the kernels; this is what the draft loop pays on the CPU per step). Median of R repeats.
"""
from __future__ import annotations

import statistics
import sys
import time

import torch

from protospec.bench.kernel_census import graph_replay_us
from protospec.bench.provenance import check_writable, provenance, write_report
from protospec.speculation.decode_state import DraftDecodeState
from protospec.model.inputs import prepare_inputs
from protospec.kernels.launch import interop
from protospec.kernels.inputs.advance_step import advance_step, advance_step_kernel
from protospec.command_line import CommandParser, run_command


def host_us(fn, calls: int, repeats: int) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def measure(batch: int, block_size: int, calls: int, repeats: int) -> dict:
    device = torch.device("cuda")
    max_blocks = 129  # llama-160m: 2048 positions + lookahead, 16-token blocks
    state = DraftDecodeState("launch_cost", batch, max_blocks, block_size, device,
                             torch.zeros(1, dtype=torch.int32, device=device))
    buf = state.buffers
    gen = torch.Generator().manual_seed(batch)
    lens = torch.randint(256, 300, (batch,), generator=gen, dtype=torch.int32)
    tables = torch.randint(1, 5000, (batch, max_blocks), generator=gen, dtype=torch.int32)
    buf.seq_lens.copy_(lens.to(device))
    buf.block_tables.copy_(tables.to(device))
    state.num_queries.fill_(batch)
    args = [state.num_queries, block_size, state.sampled_ids, buf.input_ids, buf.positions, buf.seq_lens,
            buf.slot_mapping, buf.block_tables, state.error_row]
    cached = [interop.as_numba(a) if isinstance(a, torch.Tensor) else a for a in args]
    grid, block = interop.launch_config(batch)
    stream = interop.torch_stream_for_numba(device)

    def numba_default_cached():
        advance_step_kernel[grid, block, stream](*cached)

    def numba_default_torch():
        advance_step(*args)

    def reset():
        state.seq_lens.copy_(lens.to(device))

    host_tables = [t[: 20].tolist() for t in tables]
    host_lens = lens.tolist()

    def cpu_prepare():
        prepare_inputs([[1]] * batch, host_lens, host_tables, block_size, 1, device, max_blocks=20)

    scratch = torch.zeros(batch, dtype=torch.int64, device=device)
    result = {
        "batch_size": batch,
        "bound_launch_available": state.advance.bound is not None,
        "bind_error": state.advance.bind_error,
        "host_us": {
            "numba_dispatch_torch_tensors": host_us(numba_default_torch, calls, repeats),
            "numba_dispatch_cached_device_arrays": host_us(numba_default_cached, calls, repeats),
            "bound_launch": host_us(state.advance, calls, repeats) if state.advance.bound else None,
            "cpu_prepare_inputs_decode": host_us(cpu_prepare, calls // 4, repeats),
            "torch_elementwise_add_": host_us(lambda: scratch.add_(1), calls, repeats),
        },
    }
    reset()
    if state.advance.bound:
        result["graph_replay_us_5_advances"] = graph_replay_us(state.advance, 5, 1000)
    return result


def main(argv=None) -> dict:
    p = CommandParser(prog="python -m tools.launch_cost", description=__doc__)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64])
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--output-json", default=None)
    args = p.parse_args(argv)
    check_writable(args.output_json)
    if not torch.cuda.is_available():
        sys.exit("launch_cost measures a real GPU launch; no CUDA device here")
    report = provenance(torch.device("cuda"), argv, "tools.launch_cost")
    report["results"] = [measure(b, args.block_size, args.calls, args.repeats) for b in args.batch_sizes]
    for r in report["results"]:
        cells = "  ".join(f"{k}={v:.1f}" for k, v in r["host_us"].items() if v is not None)
        print(f"batch {r['batch_size']:>3}: host us/launch  {cells}  graph(5 adv)={r.get('graph_replay_us_5_advances')}")
    write_report(args.output_json, report)
    return report


if __name__ == "__main__":
    run_command(main)

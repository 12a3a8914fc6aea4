"""python -m protospec.bench: latency of speculative decoding. Flags follow vLLM's
benchmarks/benchmark_latency.py (mid-2024), so its command runs as written (add --load-format dummy
offline):

  python -m protospec.bench --model JackFram/llama-160m --input-len 256 --output-len 128 \\
      --batch-size 1 --use-v2-block-manager --speculative-model JackFram/llama-68m \\
      --num-speculative-tokens 5 --num-iters-warmup 5 --num-iters 10

--ablation runs the draft-loop modes (main, sampler, gpu_sync_commit, gpu, graph) and the peers (target_only, hf_assisted,
hf_target_only) in one process and writes JSON, markdown and PNG under --output-dir.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from protospec.bench.ablation import MODE_SETTINGS, MODES, PEERS, BenchSetup, run_ablation, run_mode, run_sweep
from protospec.bench.latency import PERCENTILES
from protospec.bench.provenance import provenance
from protospec.bench.report import markdown_table, write_report

# With no arguments: the seed study's configuration on a GPU; on a CPU, a small one (~10 s on 2 cores).
GPU_DEFAULTS = dict(model="JackFram/llama-160m", speculative_model="JackFram/llama-68m", num_speculative_tokens=5,
                    input_len=256, output_len=128, batch_size=1, num_iters_warmup=5, num_iters=10, load_format="dummy")
CPU_DEFAULTS = dict(GPU_DEFAULTS, input_len=32, output_len=32, num_iters_warmup=1, num_iters=3)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m protospec.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--speculative-model", default=None)
    p.add_argument("--num-speculative-tokens", type=int, default=None)
    p.add_argument("--input-len", type=int, default=None)
    p.add_argument("--output-len", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--num-iters-warmup", type=int, default=None)
    p.add_argument("--num-iters", type=int, default=None)
    p.add_argument("--dtype", default="auto", choices=["auto", "float16", "bfloat16", "float32", "float64"])
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--load-format", default=None, choices=["auto", "dummy"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=1.0, help="1.0, as the original script sampled")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--draft-loop", default="auto", choices=["auto", *MODES],
                   help="draft input path: main (CPU prepare + sync per step), sampler (CPU prepare, no sync), "
                        "gpu_sync_commit (advance_step kernel for steps 2..k, no sync: vLLM's change), gpu (as "
                        "gpu_sync_commit, and draft step 1 built on the device, launched before the commit's sync), "
                        "graph (gpu with steps 2..k as one CUDA graph); auto = gpu on CUDA, main on CPU")
    p.add_argument("--compile", action="store_true", help="torch.compile the per-layer op chains (fused kernels)")
    p.add_argument("--layer-kernels", default="auto", choices=["auto", "on", "off"],
                   help="decode-shaped forwards on the Numba layer kernels (9 kernels per layer instead of ~20); "
                        "auto = on CUDA for float16/float32 unless --compile")
    p.add_argument("--output-json", default=None, help="write this run's numbers here (plain latency run)")
    p.add_argument("--use-v2-block-manager", action="store_true", help="accepted for compatibility; a no-op here")
    g = p.add_argument_group("ablation report")
    g.add_argument("--ablation", action="store_true", help="run every mode and peer; write JSON, markdown, PNG")
    g.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    g.add_argument("--peers", nargs="*", default=list(PEERS), choices=list(PEERS))
    g.add_argument("--repeats", type=int, default=1,
                   help="run the modes round-robin this many times and pool them (steadier ratios on a drifting host)")
    g.add_argument("--draft-equals-target", action="store_true", help="use the target as its own draft (acceptance 1.0)")
    g.add_argument("--breakdown", action="store_true", help="per-phase CPU/GPU time (extra iterations with CUDA events)")
    g.add_argument("--sweep", action="store_true", help="p50 per mode over batch sizes 1,4,16,64 and k 1,3,5,7")
    g.add_argument("--sweep-batch-sizes", type=int, nargs="+", default=[1, 4, 16, 64])
    g.add_argument("--sweep-ks", type=int, nargs="+", default=[1, 3, 5, 7])
    g.add_argument("--output-dir", default="data/results")
    return p


def resolve_args(args: argparse.Namespace) -> argparse.Namespace:
    """Fill unset flags from this machine's defaults; a bare command runs the whole default."""
    on_gpu = torch.cuda.is_available() if args.device is None else args.device.startswith("cuda")
    defaults = GPU_DEFAULTS if on_gpu else CPU_DEFAULTS
    bare = args.model is None
    for key, value in defaults.items():
        if getattr(args, key) is None and (bare or key not in ("speculative_model", "model")):
            setattr(args, key, value)
    if args.load_format is None:
        args.load_format = "auto"
    if args.draft_equals_target:
        args.speculative_model = args.model
    return args


def setup_from(args) -> BenchSetup:
    return BenchSetup(args.model, args.speculative_model, args.num_speculative_tokens, args.input_len, args.output_len,
                      args.batch_size, args.num_iters_warmup, args.num_iters, args.dtype, args.block_size,
                      args.load_format, args.seed, args.temperature, args.device, args.compile,
                      {"auto": None, "on": True, "off": False}[args.layer_kernels])


def print_latency(entry: dict) -> None:
    print(f"Avg latency: {entry['avg_s']} seconds")
    for p in PERCENTILES:
        print(f"{p}% percentile latency: {entry[f'p{p}_s']} seconds")
    if entry.get("acceptance_rate") is not None:
        print(f"acceptance rate: {entry['acceptance_rate']:.4f} (accepted prefix: {entry['prefix_acceptance_rate']:.4f})  "
              f"system efficiency: {entry['system_efficiency']:.4f}  mean accepted length: {entry['mean_accepted_len']:.3f}")
    if "counters" in entry:
        print(f"path counters: {json.dumps(entry['counters'])}")


def main(argv: list[str] | None = None) -> dict:
    args = resolve_args(build_parser().parse_args(argv))
    setup = setup_from(args)
    print(f"protospec.bench: model={setup.model} speculative_model={setup.speculative_model} "
          f"k={setup.num_speculative_tokens if setup.speculative_model else 0} input_len={setup.input_len} "
          f"output_len={setup.output_len} batch_size={setup.batch_size} load_format={setup.load_format} "
          f"dtype={setup.dtype} temperature={setup.temperature} compile={setup.compile} "
          f"iters={setup.num_iters_warmup}+{setup.num_iters}", flush=True)
    if args.ablation or args.sweep:
        return run_report(args, setup, argv)
    loop = MODE_SETTINGS.get(args.draft_loop, (args.draft_loop, None))[0]
    llm = setup.llm(speculative=setup.speculative_model is not None, draft_loop=loop)
    print(f"device={llm.engine.device} dtype={llm.engine.dtype} kv_blocks={llm.engine.num_blocks} "
          f"draft_loop={llm.engine.draft_loop} cuda_graphs={llm.engine.use_cuda_graphs} "
          f"layer_kernels={llm.engine.use_layer_kernels}", flush=True)
    if setup.speculative_model:
        entry = run_mode(llm, setup, args.draft_loop, args.breakdown, _progress)
    else:
        from protospec.bench.latency import time_generate

        entry = time_generate(llm, setup.prompts(llm.engine.vocab_size), setup.params(), setup.num_iters_warmup, setup.num_iters, _progress).summary()
        entry["counters"] = llm.counters
    print_latency(entry)
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(provenance(llm.engine.device, argv) | {"config": vars(args), "result": entry}, f, indent=2)
    return entry


def run_report(args, setup: BenchSetup, argv) -> dict:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    report = provenance(device, argv)
    if args.ablation:
        if setup.speculative_model is None:
            sys.exit("--ablation needs a speculative model")
        report.update(run_ablation(setup, args.modes, args.peers, args.breakdown, _progress, repeats=args.repeats))
        print(markdown_table(report))
        for name, entry in report["modes"].items():
            if "breakdown_ms_per_call" in entry:
                cells = "  ".join(f"{ph}={v['gpu_ms'] if v['gpu_ms'] is not None else v['cpu_ms']:.2f}"
                                  for ph, v in entry["breakdown_ms_per_call"].items())
                print(f"breakdown ms/call {name}: {cells}")
    if args.sweep:
        report["sweep"] = run_sweep(setup, args.sweep_batch_sizes, args.sweep_ks, args.modes)
    tag = ("ablation" if args.ablation else "sweep") + ("_draft-equals-target" if args.draft_equals_target else "")
    tag += "_compile" if args.compile else ""
    tag += "_torch-layers" if args.layer_kernels == "off" else ""
    paths = write_report(report, args.output_dir, tag)
    print("wrote " + ", ".join(paths.values()))
    return report


def _progress(iterable):
    try:
        from tqdm import tqdm

        return tqdm(iterable, file=sys.stderr, leave=False)
    except ImportError:
        return iterable

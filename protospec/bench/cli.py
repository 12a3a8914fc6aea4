"""Command line. Flags follow vLLM's benchmarks/benchmark_latency.py (mid-2024), so its command runs
as written (add --load-format dummy offline):

  python -m protospec.bench --model JackFram/llama-160m --input-len 256 --output-len 128 \\
      --batch-size 1 --use-v2-block-manager --speculative-model JackFram/llama-68m \\
      --num-speculative-tokens 5 --num-iters-warmup 5 --num-iters 10
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from protospec.bench.latency import PERCENTILES, random_prompts, time_generate
from protospec.config import SamplingParams
from protospec.llm import LLM

# With no arguments: the seed study's configuration on a GPU; on a CPU, a small one (~1 min on 2 cores).
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
    p.add_argument("--draft-loop", default="auto", choices=["auto", "main", "sampler", "gpu"],
                   help="draft input path: main (CPU prepare + sync per step), sampler (CPU prepare, no sync), "
                        "gpu (advance_step kernel, no sync); auto = gpu on CUDA, main on CPU")
    p.add_argument("--output-json", default=None)
    p.add_argument("--use-v2-block-manager", action="store_true", help="accepted for compatibility; a no-op here")
    return p


def resolve_args(args: argparse.Namespace) -> argparse.Namespace:
    """Fill unset flags from the defaults of this machine; a bare command runs the whole default."""
    on_gpu = torch.cuda.is_available() if args.device is None else args.device.startswith("cuda")
    defaults = GPU_DEFAULTS if on_gpu else CPU_DEFAULTS
    bare = args.model is None
    for key, value in defaults.items():
        if getattr(args, key) is None and (bare or key not in ("speculative_model", "model")):
            setattr(args, key, value)
    if args.load_format is None:
        args.load_format = "auto"
    return args


def main(argv: list[str] | None = None) -> dict:
    args = resolve_args(build_parser().parse_args(argv))
    k = args.num_speculative_tokens if args.speculative_model else 0
    print(f"protospec.bench: model={args.model} speculative_model={args.speculative_model} k={k} "
          f"input_len={args.input_len} output_len={args.output_len} batch_size={args.batch_size} "
          f"load_format={args.load_format} dtype={args.dtype} iters={args.num_iters_warmup}+{args.num_iters}", flush=True)
    llm = LLM(args.model, speculative_model=args.speculative_model, num_speculative_tokens=k or 1,
              load_format=args.load_format, dtype=args.dtype, device=args.device, block_size=args.block_size,
              seed=args.seed, max_num_seqs=max(args.batch_size, 1), draft_loop=args.draft_loop)
    print(f"device={llm.engine.device} dtype={llm.engine.dtype} kv_blocks={llm.engine.num_blocks} "
          f"draft_loop={llm.engine.draft_loop}", flush=True)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.output_len, ignore_eos=True, seed=args.seed)
    prompts = random_prompts(args.batch_size, args.input_len, args.seed)
    result = time_generate(llm, prompts, params, args.num_iters_warmup, args.num_iters, progress=_progress)
    summary = result.summary()
    print(f"Avg latency: {summary['avg_s']} seconds")
    for p in PERCENTILES:
        print(f"{p}% percentile latency: {summary[f'p{p}_s']} seconds")
    if k:
        print(f"acceptance rate: {summary['acceptance_rate']:.4f}  system efficiency: {summary['system_efficiency']:.4f}  "
              f"mean accepted length: {summary['mean_accepted_len']:.3f}")
    print(f"path counters: {json.dumps(llm.counters)}")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({"config": vars(args), "result": summary, "counters": llm.counters}, f, indent=2)
    return summary


def _progress(iterable):
    try:
        from tqdm import tqdm

        return tqdm(iterable, file=sys.stderr, leave=False)
    except ImportError:
        return iterable

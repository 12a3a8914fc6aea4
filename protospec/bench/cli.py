"""python -m protospec.bench: latency of speculative decoding. Flags follow vLLM's
benchmarks/benchmark_latency.py (mid-2024), so its command runs as written (add --load-format dummy
offline):

  python -m protospec.bench --model JackFram/llama-160m --input-len 256 --output-len 128 \\
      --batch-size 1 --use-v2-block-manager --speculative-model JackFram/llama-68m \\
      --num-speculative-tokens 5 --num-iters-warmup 5 --num-iters 10

--ablation times the draft-loop modes and the peers in one process; it writes JSON, markdown and PNG
under runs/ (git-ignored), or with --record into data/results/, never over a file.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from protospec.bench.ablation import BenchSetup, run_ablation, run_mode, run_sweep
from protospec.bench.args import (RUNS_DIR, TRAINED_PAIR, build_parser, check_args, draft_loop_of, resolve_args,
                                  setup_from)
from protospec.bench.compare import CompareSetup, compare_table, plot_compare, run_compare
from protospec.bench.latency import PERCENTILES, time_generate
from protospec.bench.provenance import check_writable, provenance
from protospec.bench.report import markdown_table, write_report
from protospec.engine.progress import progress_bar

def print_latency(entry: dict) -> None:
    print(f"Avg latency: {entry['avg_s']} seconds")
    for p in PERCENTILES:
        print(f"{p}% percentile latency: {entry[f'p{p}_s']} seconds")
    if entry.get("acceptance_rate") is not None:
        print(f"acceptance rate: {entry['acceptance_rate']:.4f} (accepted prefix: {entry['prefix_acceptance_rate']:.4f})  "
              f"system efficiency: {entry['system_efficiency']:.4f}  mean accepted length: {entry['mean_accepted_len']:.3f}")
    if "counters" in entry:
        print(f"path counters: {json.dumps(entry['counters'])}")


def vllm_result(latencies_s: list[float]) -> dict:
    """The keys vLLM's benchmark_latency.py writes to --output-json, so tools written for it read ours."""
    return {"avg_latency": float(np.mean(latencies_s)), "latencies": list(latencies_s),
            "percentiles": {str(p): float(np.percentile(latencies_s, p)) for p in PERCENTILES}}


def cpu_caveat(device: torch.device) -> str | None:
    if device.type == "cuda":
        return None
    return ("note: a CPU run. The draft-loop modes differ only in where inputs are built and when the host "
            "waits for a GPU; there is none here (Numba kernels run in the CUDA simulator or are replaced by "
            "torch ops), so these times and ratios say nothing about a GPU.")


def main(argv: list[str] | None = None) -> dict:
    args = build_parser(__doc__).parse_args(argv)
    if args.compare and args.model is None:  # the trained pair: the drafts there mean something
        args.model, args.speculative_model = f"{TRAINED_PAIR}/protospec-target", f"{TRAINED_PAIR}/protospec-draft"
    args = resolve_args(args)
    check_args(args)
    check_writable(args.output_json)
    if args.ablation or args.sweep or args.compare:
        check_writable(args.output_dir, directory=True)
    if args.compare:
        return run_compare_report(args, argv)
    setup = setup_from(args)
    print(f"protospec.bench: model={setup.model} speculative_model={setup.speculative_model} "
          f"k={setup.num_speculative_tokens if setup.speculative_model else 0} input_len={setup.input_len} "
          f"output_len={setup.output_len} batch_size={setup.batch_size} load_format={setup.load_format} "
          f"dtype={setup.dtype} temperature={setup.temperature} "
          f"iters={setup.num_iters_warmup}+{setup.num_iters} torch_threads={args.threads}", flush=True)
    if args.ablation or args.sweep:
        return run_report(args, setup, argv)
    llm = setup.llm(speculative=setup.speculative_model is not None, draft_loop=draft_loop_of(args.draft_loop))
    print(f"device={llm.engine.device} dtype={llm.engine.dtype} kv_blocks={llm.engine.num_blocks} "
          f"draft_loop={llm.engine.draft_loop} cuda_graphs={llm.engine.use_cuda_graphs} "
          f"layer_kernels={llm.engine.use_layer_kernels}", flush=True)
    if setup.speculative_model:
        entry = run_mode(llm, setup, args.draft_loop, args.breakdown, _progress)
    else:
        entry = time_generate(llm, setup.prompts(llm.engine.vocab_size), setup.params(), setup.num_iters_warmup, setup.num_iters, _progress).summary()
        entry["counters"] = llm.counters
    print_latency(entry)
    caveat = cpu_caveat(llm.engine.device)
    if caveat:
        print(caveat)
    if args.profile:
        print("wrote profiler trace " + profile_one_call(llm, setup, args.profile_result_dir or f"{RUNS_DIR}/profile"))
    if args.output_json:
        out = vllm_result(entry["latencies_s"]) | provenance(llm.engine.device, argv) | {
            "torch_threads": args.threads, "config": vars(args), "kernel_plan": llm.engine.plan.as_record(),
            "result": entry}
        with open(args.output_json, "w") as f:
            json.dump(out, f, indent=2)
    return entry


def profile_one_call(llm, setup: BenchSetup, out_dir: str) -> str:
    """One generate() call under the torch profiler; a Chrome/Perfetto trace under out_dir."""
    from pathlib import Path

    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if llm.engine.device.type == "cuda" else [])
    prompts, params = setup.prompts(llm.engine.vocab_size), setup.params()
    with profile(activities=activities) as prof:
        llm.generate(prompts, params)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    path = str(Path(out_dir) / f"trace_{llm.engine.draft_loop}_{time.strftime('%Y%m%d-%H%M%S')}.json")
    prof.export_chrome_trace(path)
    return path


def run_report(args, setup: BenchSetup, argv) -> dict:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    report = provenance(device, argv) | {"torch_threads": args.threads}
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
        report["sweep"] = run_sweep(setup, args.sweep_batch_sizes, args.sweep_ks, args.modes,
                                    progress=progress_bar("sweep points (round x k x batch)"), rounds=args.sweep_rounds)
        report.setdefault("config", asdict(setup))  # a sweep alone: its plot's title names the models
    tag = ("ablation" if args.ablation else "sweep") + ("_draft-equals-target" if args.draft_equals_target else "")
    tag += "_torch-layers" if args.layer_kernels == "off" else ""
    caveat = cpu_caveat(device)
    if caveat:
        report["note"] = caveat
        print(caveat)
    return _write(write_report, report, args.output_dir, tag, record=args.record, force=args.force)


def run_compare_report(args, argv) -> dict:
    prompts = json.loads(Path(args.compare_prompts_json).read_text())["prompts"][: args.compare_prompts]
    prompts = [[int(t) for t in p] for p in prompts]
    engine = dict(device=args.device, dtype=args.dtype, load_format=args.load_format, seed=args.seed,
                  draft_loop=draft_loop_of(args.draft_loop), prompt_lookup_min=args.prompt_lookup_min,
                  prompt_lookup_max=args.prompt_lookup_max, posterior_threshold=args.posterior_threshold,
                  posterior_alpha=args.posterior_alpha, max_num_seqs=1)
    setup = CompareSetup(args.model, args.speculative_model, prompts, args.num_speculative_tokens or 5,
                         args.compare_max_tokens, tuple(args.compare_proposers), tuple(args.compare_acceptance),
                         seed=args.seed, repeats=args.compare_repeats, engine=engine)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    print(f"protospec.bench --compare: {args.model} + {args.speculative_model}, {len(prompts)} prompts, "
          f"{len(setup.arms())} arms x {len(setup.temperatures)} temperatures, device {device}", flush=True)
    report = provenance(device, argv) | {"torch_threads": args.threads}
    report.update(run_compare(setup, progress_bar("prompts")))
    print(compare_table(report))
    return _write(write_report, report, args.output_dir, "compare", record=args.record, force=args.force,
                  render=(compare_table, plot_compare))


def _write(writer, report: dict, *args, **kwargs) -> dict:
    try:
        paths = writer(report, *args, **kwargs)
    except FileExistsError as e:  # the numbers are not lost: print them whole before refusing
        print(json.dumps(report, indent=2))
        raise SystemExit(f"{e}; the report is printed above")
    print("wrote " + ", ".join(paths.values()))
    return report


_progress = progress_bar("generate() calls")

"""The workloads users run, not only small batches: one generate() of thousands of mixed requests, and
a batch that turns over every few steps.

    python -m protospec.bench.load                                  # 2,000 and 20,000 requests, every mode
    python -m protospec.bench.load --requests 200 --modes main --device cpu --max-num-seqs 16   # a CPU check

One call of N requests is how vLLM's `LLM.generate` is used offline: the running batch (up to
max_num_seqs) turns over many times inside the call, every batch size and mix of sampling settings
comes and goes, and CUDA graphs are captured mid-call. Per mode (the draft loop's ways, and target-only
decoding on the same weights) it times one call of each size after a warm-up call, and checks that the
greedy and seeded requests of the largest call give the same tokens when a sample of them runs
again 8 at a time. A request mix:

    prompts    1 .. max_prompt_len random tokens (ragged)
    max_tokens 1 .. max_tokens, ignore_eos half of the time (some end at EOS)
    sampling   a third greedy, a third seeded top-k / top-p at T in [0.3, 1.2], a third unseeded

The dtype defaults to float32: the check compares tokens across batch compositions, and float16's
rounding differs with the batch's GEMM shapes enough to part greedy near-ties.
"""
from __future__ import annotations

import argparse
import random
import time

import torch

from protospec import LLM, SamplingParams, registry
from protospec.bench.provenance import check_writable, provenance, write_report
from protospec.command_line import CommandParser, run_command

TARGET_ONLY = "target_only"
MODES = (registry.MAIN, registry.GPU, registry.GRAPH, TARGET_ONLY)


def mixed_requests(n: int, vocab_size: int, seed: int, max_prompt_len: int = 300,
                   max_tokens: int = 64) -> tuple[list[list[int]], list[SamplingParams]]:
    """n requests of the module docstring's mix (token ids from 3 up: 0-2 are the tiny configs' specials)."""
    rng = random.Random(seed)
    prompts, params = [], []
    for _ in range(n):
        prompts.append([rng.randrange(3, vocab_size) for _ in range(rng.randint(1, max_prompt_len))])
        common = dict(max_tokens=rng.randint(1, max_tokens), ignore_eos=rng.random() < 0.5)
        kind = rng.randrange(3)
        if kind == 0:
            params.append(SamplingParams(temperature=0.0, **common))
        elif kind == 1:
            params.append(SamplingParams(temperature=rng.uniform(0.3, 1.2), top_k=rng.choice([0, 5, 50]),
                                         top_p=rng.choice([1.0, 0.9]), seed=rng.randrange(2**31), **common))
        else:
            params.append(SamplingParams(temperature=rng.uniform(0.3, 1.2), **common))
    return prompts, params


def timed_call(llm: LLM, prompts, params) -> tuple[float, list[list[int]]]:
    """One generate() (it waits for the device before returning): seconds and each request's tokens."""
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    return time.perf_counter() - start, [o.token_ids for o in outputs]


def check_against_small_calls(llm: LLM, prompts, params, tokens: list[list[int]], sample: int,
                              seed: int) -> dict:
    """Rerun a random sample of the deterministic requests (greedy or seeded: their tokens must not depend
    on what else runs in their batch) 8 at a time; the indices whose tokens differ."""
    candidates = [i for i, p in enumerate(params) if p.greedy or p.seed is not None]
    chosen = sorted(random.Random(seed).sample(candidates, min(sample, len(candidates))))
    differ = []
    for start in range(0, len(chosen), 8):
        chunk = chosen[start : start + 8]
        outs = llm.generate([prompts[i] for i in chunk], [params[i] for i in chunk])
        differ += [i for i, out in zip(chunk, outs) if out.token_ids != tokens[i]]
    return {"checked": len(chosen), "deterministic": len(candidates), "differ": differ}


def run_mode(llm: LLM, sizes: list[int], vocab: int, seed: int, warmup: int, sample: int, max_prompt_len: int,
             max_tokens: int) -> dict:
    """A warm-up call, then one timed call per size; the largest call's deterministic tokens checked."""
    engine = llm.engine
    result = {"calls": []}
    if warmup:
        timed_call(llm, *mixed_requests(warmup, vocab, seed + 1, max_prompt_len, max_tokens))
    for n in sizes:
        prompts, params = mixed_requests(n, vocab, seed, max_prompt_len, max_tokens)
        seconds, tokens = timed_call(llm, prompts, params)
        free, usable = engine.block_manager.num_free_blocks, engine.block_manager.num_usable_blocks
        call = {"requests": n, "seconds": round(seconds, 4), "ms_per_request": round(seconds / n * 1e3, 4),
                "output_tokens": sum(map(len, tokens)), "free_blocks_after": free, "usable_blocks": usable}
        if n == max(sizes) and sample:
            call["small_calls_check"] = check_against_small_calls(llm, prompts, params, tokens, sample, seed)
        result["calls"].append(call)
    return result


def add_engine_args(p: argparse.ArgumentParser, max_num_seqs: int) -> None:
    """The engine settings the load tools share (the bundled tiny pair, float32: see the docstring)."""
    p.add_argument("--model", default="protospec/tiny-target")
    p.add_argument("--speculative-model", default="protospec/tiny-draft")
    p.add_argument("--num-speculative-tokens", type=int, default=3)
    p.add_argument("--load-format", default="dummy", choices=["auto", "dummy"])
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default=None)
    p.add_argument("--max-num-seqs", type=int, default=max_num_seqs)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-json", default=None)


def engine_kwargs(args: argparse.Namespace, **more) -> dict:
    """LLM keyword arguments from add_engine_args' flags (the models aside)."""
    return dict(num_speculative_tokens=args.num_speculative_tokens, load_format=args.load_format, dtype=args.dtype,
                device=args.device, max_num_seqs=args.max_num_seqs, seed=args.seed, **more)


def build_parser() -> argparse.ArgumentParser:
    p = CommandParser(prog="python -m protospec.bench.load", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(p, max_num_seqs=256)
    p.add_argument("--requests", type=int, nargs="+", default=[2000, 20000], help="one generate() call of each size")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--warmup", type=int, default=512, help="requests in the untimed first call of each mode")
    p.add_argument("--check", type=int, default=256,
                   help="deterministic requests of the largest call rerun 8 at a time and compared (0: none)")
    p.add_argument("--max-prompt-len", type=int, default=300)
    p.add_argument("--max-tokens", type=int, default=64)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    check_writable(args.output_json)
    if any(n < 1 for n in args.requests) or args.max_num_seqs < 1:
        raise SystemExit("--requests and --max-num-seqs must be >= 1")
    common = engine_kwargs(args)
    spec = LLM(args.model, speculative_model=args.speculative_model, **common) \
        if any(m != TARGET_ONLY for m in args.modes) else None
    plain = LLM(args.model, **common) if TARGET_ONLY in args.modes else None
    device = (spec or plain).engine.device
    vocab = (spec or plain).engine.vocab_size
    report = provenance(device, argv, "protospec.bench.load") | {"config": vars(args), "modes": {}}
    for mode in args.modes:
        llm = plain if mode == TARGET_ONLY else spec
        if mode != TARGET_ONLY:
            llm.engine.set_draft_loop(mode)
        report["modes"][mode] = run_mode(llm, args.requests, vocab, args.seed, args.warmup, args.check,
                                         args.max_prompt_len, args.max_tokens)
        report["modes"][mode]["kernel_plan"] = llm.engine.plan.as_record()
        if device.type == "cuda":
            report["modes"][mode]["max_memory_allocated_mib"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
        for call in report["modes"][mode]["calls"]:
            check = call.get("small_calls_check")
            print(f"{mode:12s} {call['requests']:6d} requests {call['seconds']:8.3f} s {call['ms_per_request']:8.4f} "
                  f"ms/request  free {call['free_blocks_after']}/{call['usable_blocks']}"
                  + (f"  8-at-a-time: {len(check['differ'])} of {check['checked']} differ" if check else ""), flush=True)
    sizes = sorted(args.requests)
    if len(sizes) > 1:
        for mode, result in report["modes"].items():
            per = {c["requests"]: c["ms_per_request"] for c in result["calls"]}
            result["per_request_ratio"] = round(per[sizes[-1]] / per[sizes[0]], 3)
            print(f"{mode:12s} ms/request at {sizes[-1]} / at {sizes[0]}: {result['per_request_ratio']:.3f}")
    write_report(args.output_json, report)
    return 0


if __name__ == "__main__":
    run_command(main)

"""A batch that turns over every few steps: requests arrive between spec steps and finish at random.

    python -m protospec.bench.turnover --steps 10000                # graph mode on a GPU, both proposers
    python -m protospec.bench.turnover --steps 200 --device cpu --draft-loop main   # a CPU check

Each step adds a few requests with probability 1/3 (short prompts and outputs, so requests finish
within a few steps) and runs one engine step, so the running batch, its sampling mix and its block
tables change all the time: launched steps are discarded, graphs of every batch bucket replay with
other rows in them, blocks go back to the pool and come out for others. The run is split over the
setups a researcher switches between: the draft model and the n-gram proposer.
At the end every KV block must be free, and every greedy request's tokens must equal what target-only
decoding gives it (lossless speculation). The host's waits are bounded (device_wait_timeout_s), so
a stuck device ends the run with DeviceWaitError instead of a hang.
"""
from __future__ import annotations

import argparse
import random
import time

from protospec import LLM, SamplingParams, registry
from protospec.bench.load import add_engine_args, engine_kwargs
from protospec.bench.provenance import check_writable, provenance, write_report
from protospec.requests.sequence import Sequence
from protospec.command_line import CommandParser, run_command

SETUPS = ("draft", registry.NGRAM_MODEL)  # the proposers


def arrivals(rng: random.Random, vocab_size: int, max_prompt_len: int, max_tokens: int) -> tuple[list, list]:
    """0 requests two steps in three, else 1-6: mostly greedy, some sampled (other graphs' keys)."""
    if rng.random() < 2 / 3:
        return [], []
    prompts, params = [], []
    for _ in range(rng.randint(1, 6)):
        # Some prompts repeat a phrase, so the n-gram proposer finds matches and proposes.
        phrase = [rng.randrange(3, vocab_size) for _ in range(rng.randint(1, 8))]
        prompt = (phrase * max_prompt_len)[: rng.randint(1, max_prompt_len)] if rng.random() < 0.5 else \
            [rng.randrange(3, vocab_size) for _ in range(rng.randint(1, max_prompt_len))]
        prompts.append(prompt)
        greedy = rng.random() < 0.75
        params.append(SamplingParams(temperature=0.0 if greedy else 0.8, top_k=0 if greedy else 20,
                                     max_tokens=rng.randint(1, max_tokens), ignore_eos=True, seed=rng.randrange(2**31)))
    return prompts, params


def turn_over(llm: LLM, steps: int, seed: int, max_prompt_len: int = 48, max_tokens: int = 24) -> dict:
    """`steps` engine steps with arrivals before each, then steps until the batch drains. Returns the
    requests (Sequence objects), the steps run and the largest batch seen."""
    engine, rng = llm.engine, random.Random(seed)
    seqs: list[Sequence] = []
    ran, widest = 0, 0
    try:
        while ran < steps:
            prompts, params = arrivals(rng, engine.vocab_size, max_prompt_len, max_tokens)
            if prompts:
                new = llm.make_sequences(prompts, params)
                engine.waiting.extend(new)
                seqs.extend(new)
            if engine.waiting or engine.running:
                engine.step()
                ran += 1
                widest = max(widest, len(engine.running))
        while engine.waiting or engine.running:  # the drain
            engine.step()
            ran += 1
    except BaseException:
        engine.abort_all()
        raise
    return {"seqs": seqs, "steps": ran, "widest_batch": widest}


def check_run(run: dict, llm: LLM, plain: LLM) -> dict:
    """What the run must leave: every block free, each request finished with max_tokens tokens, and
    the greedy requests' tokens those of target-only decoding (one call for all of them)."""
    seqs = run["seqs"]
    bm = llm.engine.block_manager
    greedy = [s for s in seqs if s.params.greedy]
    expected = [o.token_ids for o in plain.generate([s.prompt_token_ids for s in greedy], [s.params for s in greedy])] \
        if greedy else []
    differ = [s.seq_id for s, want in zip(greedy, expected) if s.output_token_ids != want]
    unfinished = [s.seq_id for s in seqs if not s.finished or len(s.output_token_ids) != s.params.max_tokens]
    return {"requests": len(seqs), "greedy": len(greedy), "greedy_differ": differ, "unfinished": unfinished,
            "free_blocks": bm.num_free_blocks, "usable_blocks": bm.num_usable_blocks,
            "reserved_blocks": llm.engine.reserved_blocks}


def build_parser() -> argparse.ArgumentParser:
    p = CommandParser(prog="python -m protospec.bench.turnover", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(p, max_num_seqs=32)
    p.add_argument("--draft-loop", default=registry.GRAPH, choices=registry.DRAFT_LOOP_NAMES)
    p.add_argument("--steps", type=int, default=10000, help="engine steps with arrivals, split over the setups")
    p.add_argument("--device-wait-timeout-s", type=float, default=60.0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    check_writable(args.output_json)
    common = engine_kwargs(args, device_wait_timeout_s=args.device_wait_timeout_s)
    plain = LLM(args.model, **common)
    report = provenance(plain.engine.device, argv, "protospec.bench.turnover") | {"config": vars(args), "setups": []}
    ok = True
    for i, proposer in enumerate(SETUPS):
        draft = args.speculative_model if proposer == "draft" else proposer
        llm = LLM(args.model, speculative_model=draft, draft_loop=args.draft_loop, **common)
        start = time.perf_counter()
        run = turn_over(llm, args.steps // len(SETUPS), args.seed + i)
        seconds = time.perf_counter() - start
        result = {"proposer": proposer, "steps": run["steps"], "widest_batch": run["widest_batch"],
                  "seconds": round(seconds, 2), "counters": llm.counters, "kernel_plan": llm.engine.plan.as_record(),
                  **check_run(run, llm, plain)}
        ok &= not result["greedy_differ"] and not result["unfinished"] and result["free_blocks"] == result["usable_blocks"]
        report["setups"].append(result)
        print(f"{proposer:8s} {run['steps']:6d} steps {seconds:7.1f} s, {result['requests']} "
              f"requests (widest batch {run['widest_batch']}), greedy differ {len(result['greedy_differ'])} of "
              f"{result['greedy']}, unfinished {len(result['unfinished'])}, free blocks "
              f"{result['free_blocks']}/{result['usable_blocks']}", flush=True)
        del llm
    report["clean"] = ok
    write_report(args.output_json, report)
    return 0 if ok else 1


if __name__ == "__main__":
    run_command(main)

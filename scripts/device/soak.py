"""A soak: mixed requests for a while on one engine, switching draft-loop modes, and the drift of
memory and latency over the run. A fixed greedy probe runs every few calls: its tokens must never
change and its latency should not creep.

    python3 scripts/device/soak.py --minutes 10 --modes gpu graph --output-json runs/soak.json
    python3 scripts/device/soak.py --minutes 0.2 --device cpu --modes main --model protospec/tiny-target \\
        --speculative-model protospec/tiny-draft                     # a quick check on a CPU
    python3 scripts/device/soak.py --minutes 10 --requests-per-call 1000 4000 --max-batch 256 --modes graph gpu \\
        --model protospec/tiny-target --speculative-model protospec/tiny-draft --dtype float32   # offline batches

With --requests-per-call LO HI each call is one offline batch of LO..HI requests of protospec.bench.load's
mix (ragged prompts 1-300 tokens, max_tokens 1-64, greedy / seeded top-k-top-p / unseeded), the running
batch (--max-batch) turning over many times inside the call; the calls alternate modes as before.

Writes a JSON with provenance, per-window memory (allocated / reserved on a GPU, the process's RSS
on a CPU) and probe latency, the probe's token check and any errors."""
import argparse
import random
import resource
import statistics
import time

import torch

from protospec import LLM, SamplingParams
from protospec.bench.load import mixed_requests
from protospec.bench.provenance import check_writable, provenance, write_report

p = argparse.ArgumentParser()
p.add_argument("--model", default="JackFram/llama-160m")
p.add_argument("--speculative-model", default="JackFram/llama-68m")
p.add_argument("--minutes", type=float, default=10.0)
p.add_argument("--modes", nargs="+", default=["gpu", "graph"])
p.add_argument("--device", default=None)
p.add_argument("--max-batch", type=int, default=16)
p.add_argument("--probe-every", type=int, default=10, help="calls between probes")
p.add_argument("--windows", type=int, default=10, help="summaries over the run")
p.add_argument("--output-json", default=None)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--requests-per-call", type=int, nargs=2, default=None, metavar=("LO", "HI"),
               help="offline batches: each call LO..HI requests of protospec.bench.load's mix (default: 1..--max-batch "
                    "small requests)")
p.add_argument("--dtype", default="auto")
p.add_argument("--warm-batches", action="store_true",
               help="run every batch size once before the clock starts, so CUDA graph captures do not read as drift")
args = p.parse_args()
check_writable(args.output_json)
llm = LLM(args.model, speculative_model=args.speculative_model, num_speculative_tokens=5, load_format="dummy",
          device=args.device, max_num_seqs=args.max_batch, seed=args.seed, dtype=args.dtype)
dev = llm.engine.device
vocab = llm.engine.vocab_size
rng = random.Random(args.seed)
probe_prompt = [rng.randrange(3, vocab) for _ in range(64)]
probe_params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)


def memory() -> dict:
    if dev.type == "cuda":
        return {"allocated_mib": torch.cuda.memory_allocated(dev) / 2**20, "reserved_mib": torch.cuda.memory_reserved(dev) / 2**20}
    return {"max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def timed(prompts, params) -> tuple[float, list]:
    start = time.perf_counter()
    outs = llm.generate(prompts, params)  # returns once the device is done (a bounded wait)
    return time.perf_counter() - start, outs


expected_probe = {}
for mode in args.modes:  # warm-up and the probe's reference tokens, per mode
    llm.engine.set_draft_loop(mode)
    expected_probe[mode] = timed([probe_prompt], probe_params)[1][0].token_ids
    if args.warm_batches:  # every batch size once: graphs captured before the first memory reading
        for batch in range(1, args.max_batch + 1):
            llm.generate([probe_prompt] * batch, SamplingParams(temperature=1.0, max_tokens=8, seed=batch))
tokens_agree_across_modes = len({tuple(t) for t in expected_probe.values()}) == 1
start, calls, errors, mismatches = time.perf_counter(), 0, [], 0
window_s = args.minutes * 60 / args.windows
windows, current = [], {"probe_s": [], "calls": 0, "tokens": 0}
while time.perf_counter() - start < args.minutes * 60:
    mode = args.modes[calls % len(args.modes)]
    llm.engine.set_draft_loop(mode)
    if args.requests_per_call:
        prompts, params = mixed_requests(rng.randint(*args.requests_per_call), vocab, rng.randrange(2**31))
    else:
        batch = rng.randint(1, args.max_batch)
        prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(8, 300))] for _ in range(batch)]
        params = [SamplingParams(temperature=rng.choice([0.0, 0.7, 1.0]), top_k=rng.choice([0, 50]),
                                 max_tokens=rng.randint(1, 96), ignore_eos=rng.random() < 0.8, seed=rng.randrange(2**31))
                  for _ in range(batch)]
    try:
        _, outs = timed(prompts, params)
        current["tokens"] += sum(len(o.token_ids) for o in outs)
    except Exception as e:  # recorded, and the soak goes on: the engine must still serve
        errors.append(f"{type(e).__name__}: {e}"[:300])
    calls += 1
    current["calls"] += 1
    if calls % args.probe_every == 0:
        seconds, outs = timed([probe_prompt], probe_params)
        current["probe_s"].append(seconds)
        mismatches += outs[0].token_ids != expected_probe[mode]
    if time.perf_counter() - start >= window_s * (len(windows) + 1):
        windows.append({"end_s": time.perf_counter() - start, "calls": current["calls"], "tokens": current["tokens"],
                        "probe_p50_s": statistics.median(current["probe_s"]) if current["probe_s"] else None,
                        **memory()})
        current = {"probe_s": [], "calls": 0, "tokens": 0}
bm = llm.engine.block_manager
first, last = windows[0], windows[-1]
key = "allocated_mib" if dev.type == "cuda" else "max_rss_mib"
report = provenance(dev, None, "scripts/device/soak.py") | {
    "config": vars(args), "calls": calls, "errors": errors, "probe_mismatches": mismatches,
    "probe_tokens_agree_across_modes": tokens_agree_across_modes,
    "free_blocks_at_end": bm.num_free_blocks, "usable_blocks": bm.num_usable_blocks,
    "memory_drift_mib": last[key] - first[key],
    "probe_latency_drift": (last["probe_p50_s"] / first["probe_p50_s"]) if first["probe_p50_s"] and last["probe_p50_s"] else None,
    "windows": windows}
report["command"] = "python3 scripts/device/soak.py " + " ".join(__import__("shlex").quote(a) for a in __import__("sys").argv[1:])
for w in windows:
    print(f"{w['end_s']:7.0f}s calls {w['calls']:4d} tokens {w['tokens']:6d} probe p50 "
          f"{(w['probe_p50_s'] or 0) * 1e3:7.1f} ms  {key} {w[key]:9.1f}")
print(f"calls {calls}, errors {len(errors)}, probe mismatches {mismatches}, modes agree {tokens_agree_across_modes}, "
      f"free blocks {bm.num_free_blocks}/{bm.num_usable_blocks}, memory drift {report['memory_drift_mib']:.1f} MiB, "
      f"probe latency drift {report['probe_latency_drift']}")
write_report(args.output_json, report)

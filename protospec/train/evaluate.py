"""Acceptance of a trained draft/target pair on held-out stdlib files, greedy and sampled.

    python -m protospec.train.evaluate --models data/models --output-json data/results/<...>.json

Prompts are windows of held-out files (never trained on), tokenized by the pair's tokenizer.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from protospec.bench.provenance import check_writable, provenance
from protospec.config import SamplingParams
from protospec.engine.llm import LLM
from protospec.requests.metrics import RATE_KEYS
from protospec.engine.progress import progress_bar
from protospec.train.corpus import Corpus
from protospec.command_line import CommandParser, run_command


def heldout_prompts(tokenizer, num_prompts: int, prompt_len: int, seed: int = 0) -> list[list[int]]:
    """num_prompts windows of prompt_len tokens from held-out files, at seeded offsets."""
    corpus = Corpus.from_stdlib()
    # int64 throughout: an empty file's np.asarray([]) is float64 and would make every id a float.
    ids = np.concatenate([np.asarray(tokenizer(text)["input_ids"], dtype=np.int64) for text in corpus.read(corpus.heldout_files)])
    starts = np.random.default_rng(seed).integers(0, len(ids) - prompt_len, num_prompts)
    return [ids[s : s + prompt_len].tolist() for s in starts]


def fixed_prompts(path: Path, tokenizer, num_prompts: int, prompt_len: int) -> list[list[int]]:
    """The prompt set stored at `path` (drawn from held-out files and written there on first use), so
    every machine measures the same prompts whatever its standard library holds."""
    if path.exists():
        prompts = json.loads(path.read_text())["prompts"]
        if len(prompts) < num_prompts or any(len(p) != prompt_len for p in prompts):
            raise ValueError(f"{path}: holds {len(prompts)} prompts of length {len(prompts[0])}, "
                             f"asked for {num_prompts} of length {prompt_len}")
        # Ids written as whole floats (the committed set was, before the int64 fix above) read back as
        # ints; anything else is not a token id.
        if any(not float(t).is_integer() for p in prompts for t in p):
            raise ValueError(f"{path}: holds token ids that are not whole numbers")
        return [[int(t) for t in p] for p in prompts[:num_prompts]]
    prompts = heldout_prompts(tokenizer, num_prompts, prompt_len)
    corpus = Corpus.from_stdlib()
    path.write_text(json.dumps({"source": f"seeded windows of the held-out files of {corpus.root}",
                                "heldout_files": [p.relative_to(corpus.root).as_posix() for p in corpus.heldout_files],
                                "prompts": prompts}))
    return prompts


def measure(target: str, draft: str, k: int, prompts, max_tokens: int, temperature: float, seed: int = 0, **engine) -> dict:
    llm = LLM(target, speculative_model=draft, num_speculative_tokens=k, **engine)
    llm.generate(prompts, SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=True, seed=seed))
    summary = llm.metrics.summary()
    return {key: summary[key] for key in RATE_KEYS + ("num_spec_steps", "num_draft_tokens")}


def speedup(target: str, draft: str, k: int, prompts, max_tokens: int, repeats: int = 3, **engine) -> dict:
    """Batch-1 latency per held-out prompt, greedy: target-only vs speculative, same engine settings."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    result = {}
    for name, spec in (("target_only", None), ("speculative", draft)):
        llm = LLM(target, speculative_model=spec, num_speculative_tokens=k, **engine)
        llm.generate(prompts[:2], params)  # warm-up: graphs, kernels
        times = []
        for prompt in progress_bar(f"timing {name}, prompts")(prompts):
            for _ in range(repeats):
                llm.generate([prompt], params)
                times.append(llm.metrics.elapsed_s)
        result[name] = {"p50_s": float(np.median(times)), "mean_s": float(np.mean(times)), "calls": len(times)}
    result["speedup_p50"] = result["target_only"]["p50_s"] / result["speculative"]["p50_s"]
    return result


def fresh_process_load_s(target: str, draft: str, k: int) -> float:
    """Seconds a new Python process takes to import protospec and load the pair on the CPU, offline:
    what a newcomer waits for (interpreter start-up excluded)."""
    code = ("import time; t = time.perf_counter(); from protospec import LLM; "
            f"LLM({target!r}, speculative_model={draft!r}, num_speculative_tokens={k}, device='cpu'); "
            "print(time.perf_counter() - t)")
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if out.returncode != 0:  # the child's own error, not a bare CalledProcessError
        raise SystemExit(f"loading the pair ({target}, {draft}) failed:\n{out.stderr.strip()[-2000:]}")
    return float(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    p = CommandParser(prog="python -m protospec.train.evaluate", description=__doc__)
    p.add_argument("--models", default="data/models")
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--device", default=None)
    p.add_argument("--prompts-json", default=None,
                   help="a fixed prompt set: read it if the file exists, else draw one from held-out files and write it")
    p.add_argument("--timing", action="store_true", help="also time batch-1 speculative vs target-only decoding")
    p.add_argument("--output-json", default=None)
    args = p.parse_args(argv)
    check_writable(args.output_json)
    if args.prompts_json and not Path(args.prompts_json).exists():
        check_writable(args.prompts_json)  # it will be drawn and written: its folder must take it
    for name in ("protospec-target", "protospec-draft"):
        if not (Path(args.models) / name / "config.json").is_file():
            raise SystemExit(f"--models {args.models}: no {name}/config.json there (python -m protospec.train writes both)")
    target, draft = str(Path(args.models) / "protospec-target"), str(Path(args.models) / "protospec-draft")
    load_fresh_s = fresh_process_load_s(target, draft, args.k)
    LLM(target, device="cpu")  # imports and first-use costs out of the way
    start = time.perf_counter()
    LLM(target, speculative_model=draft, num_speculative_tokens=args.k, device="cpu")
    load_s = time.perf_counter() - start
    llm = LLM(target, device=args.device)
    if args.prompts_json:
        prompts = fixed_prompts(Path(args.prompts_json), llm.tokenizer, args.num_prompts, args.prompt_len)
    else:
        prompts = heldout_prompts(llm.tokenizer, args.num_prompts, args.prompt_len)
    engine = dict(device=args.device, max_num_seqs=args.num_prompts)
    report = provenance(llm.engine.device, argv, "protospec.train.evaluate") | {
        "target": target, "draft": draft, "prompts_json": args.prompts_json, "k": args.k, "num_prompts": args.num_prompts, "prompt_len": args.prompt_len,
        "max_tokens": args.max_tokens, "pair_load_s_cpu": load_s, "pair_load_s_fresh_process": load_fresh_s,
    }
    for key, temperature in progress_bar("acceptance (greedy, T=1)")((("greedy", 0.0), ("temperature_1", 1.0))):
        report[key] = measure(target, draft, args.k, prompts, args.max_tokens, temperature, **engine)
    if args.timing:
        report["timing_batch1_greedy"] = speedup(target, draft, args.k, prompts[:8], args.max_tokens, device=args.device)
        t = report["timing_batch1_greedy"]
        print(f"batch 1 greedy p50: target-only {t['target_only']['p50_s']:.4f}s, speculative "
              f"{t['speculative']['p50_s']:.4f}s, speedup {t['speedup_p50']:.2f}x")
    print(f"pair load: {load_fresh_s:.2f}s in a fresh process (imports included), {load_s:.2f}s after a warm-up load")
    for mode in ("greedy", "temperature_1"):
        r = report[mode]
        print(f"{mode}: acceptance {r['acceptance_rate']:.3f} (accepted prefix {r['prefix_acceptance_rate']:.3f}), "
              f"mean accepted length {r['mean_accepted_len']:.2f}, "
              f"per position {[round(x, 3) for x in r['per_position_acceptance']]}")
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    run_command(main)

"""Do engines give the same tokens whatever their prefill runs as (eager or graphs) and on (one stream,
or the draft's beside the target's)? A race between the two models' prefills shows only now and then
and only once both prefill graphs replay (the third generate() on), so this runs several processes
at once (a loaded GPU shifts the timing) and many generate() calls per engine.

Each process builds the tests' tiny models (dummy weights, graph draft loop, k = 3), runs every
configuration at T = 0 and 1 for --generates calls of the same seeded request, and writes its tokens;
the parent prints, per process and configuration, one character per call: '.' the same tokens as the
eager one-stream engine's first call, 'X' others.
    python scripts/device/prefill_streams_check.py [--processes 5] [--generates 6] [--configs all|side]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = {"all": [(False, False), (False, True), (True, False), (True, True)], "side": [(False, False), (True, True)]}


def run_one(out: Path, generates: int, configs: str) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny import DRAFT_CFG, TARGET_CFG, random_prompts, tiny_llm, write_config

    from protospec import SamplingParams

    models = Path(tempfile.mkdtemp())
    target, draft = write_config(models / "target", TARGET_CFG), write_config(models / "draft", DRAFT_CFG)
    tokens = {}
    for temperature in (0.0, 1.0):
        prompts = random_prompts(2, lengths=(24,), seed=3)  # one length: a uniform prefill layout
        params = SamplingParams(temperature=temperature, max_tokens=20, ignore_eos=True, seed=4)
        for graphs, side in CONFIGS[configs]:
            llm = tiny_llm(target, draft, k=3, device="cuda", draft_loop="graph", prefill_graphs=graphs,
                           draft_prefill_side=side)
            name = f"T={temperature} prefill_graphs={int(graphs)} side={int(side)}"
            tokens[name] = [[o.token_ids for o in llm.generate(prompts, params)] for _ in range(generates)]
            del llm
    out.write_text(json.dumps(tokens))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--processes", type=int, default=5)
    p.add_argument("--generates", type=int, default=6)
    p.add_argument("--configs", choices=sorted(CONFIGS), default="all")
    p.add_argument("--child", help=argparse.SUPPRESS)  # a process's output file
    args = p.parse_args()
    if args.child:
        run_one(Path(args.child), args.generates, args.configs)
        return
    work = Path(tempfile.mkdtemp())
    outs = [work / f"process{i}.json" for i in range(args.processes)]
    children = [subprocess.Popen([sys.executable, __file__, "--child", str(out), "--generates", str(args.generates),
                                  "--configs", args.configs], cwd=ROOT, env=dict(os.environ)) for out in outs]
    codes = [child.wait() for child in children]
    for i, (out, code) in enumerate(zip(outs, codes)):
        if code != 0 or not out.exists():
            print(f"process {i}: exit code {code}, no tokens")
            continue
        tokens = json.loads(out.read_text())
        for name, calls in tokens.items():
            reference = tokens[name.split(" ")[0] + " prefill_graphs=0 side=0"][0]
            print(f"process {i}  {name:<34} " + "".join("." if call == reference else "X" for call in calls))


if __name__ == "__main__":
    main()

"""When speculation pays: the speed-up of the fastest spec mode over target-only decoding, measured
over acceptance rate alpha and k, against what theory predicts from measured step costs.

    python -m protospec.bench.surface [--pairs seed llama-1b-shaped head-dim-128] [--alphas ...] [--ks ...]

Acceptance is set, not hoped for: lab.forced_acceptance keeps each draft token with probability alpha
on the real step (same kernels and graphs), at temperature 1 with dummy weights. For each pair: one
target-only engine, then per k one speculative engine (the graph draft loop on a GPU, the fastest
mode; auto elsewhere), timed at every alpha.

Predicted (Leviathan et al., 2023): a spec step makes E(alpha, k) = (1 - alpha^(k+1)) / (1 - alpha)
tokens a request on average, so speed-up = E(alpha, k) x (time of a target step) / (time of a spec
step). The time of a target step is p50(target_only) / output_len; the time of a spec step at k is
p50 / spec steps of the run at CALIBRATION_ALPHA (both with their prefill spread over the steps).
Measured = p50(target_only) / p50(spec at alpha, k). At the calibration alpha the two differ only by
how far the measured tokens a step stray from E; elsewhere they test that a spec step's cost does not
depend on alpha.
"""
from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import torch

from protospec.bench.ablation import BenchSetup, _release_memory
from protospec.bench.latency import time_generate
from protospec.bench.provenance import check_writable, provenance, write_report
from protospec.lab.forced_acceptance import force_acceptance
from protospec.command_line import CommandParser, run_command

PAIRS = {
    "seed": ("JackFram/llama-160m", "JackFram/llama-68m"),
    "llama-1b-shaped": ("protospec/llama-1b-shaped", "protospec/llama-1b-shaped-draft"),
    "head-dim-128": ("protospec/llama-head-dim-128", "protospec/llama-head-dim-128-draft"),
}
ALPHAS, KS = (0.3, 0.5, 0.7, 0.9), (1, 3, 5, 7)
CALIBRATION_ALPHA = 0.5


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens a spec step makes on average when each draft token is kept with probability alpha."""
    return float(k + 1) if alpha >= 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def _timed(llm, setup: BenchSetup) -> tuple[float, float]:
    """(p50 seconds a generate() call, spec steps a call)."""
    result = time_generate(llm, setup.prompts(llm.engine.vocab_size), setup.params(), setup.num_iters_warmup,
                           setup.num_iters)
    steps = llm.metrics.num_spec_steps / max(1, setup.batch_size)  # the last call's, per request
    return result.summary()["p50_s"], steps


def run_pair(name: str, setup: BenchSetup, alphas=ALPHAS, ks=KS, log=print) -> dict:
    """One pair's surface (module docstring): target-only once, then every (k, alpha)."""
    target_only = setup.llm(speculative=False)
    target_p50, _ = _timed(target_only, setup)
    del target_only
    _release_memory()
    target_step_s = target_p50 / setup.output_len
    log(f"  {name}: target-only p50 {target_p50 * 1e3:.2f} ms ({target_step_s * 1e6:.1f} us a token)")
    points, spec_step_s = [], {}
    for k in ks:  # draft loop auto (BenchSetup.llm's): the fastest way the device allows
        llm = replace(setup, num_speculative_tokens=k).llm()
        timed = {}
        for alpha in dict.fromkeys([CALIBRATION_ALPHA, *alphas]):  # the calibration first, each alpha once
            force_acceptance(llm, alpha)
            p50, steps = _timed(llm, setup)
            timed[alpha] = (p50, steps, llm.metrics.acceptance_rate)
        mode, plan = llm.engine.draft_loop, llm.engine.plan.as_record()
        del llm
        _release_memory()
        p50_cal, steps_cal, _ = timed[CALIBRATION_ALPHA]
        spec_step_s[k] = p50_cal / steps_cal
        for alpha in alphas:
            p50, steps, rate = timed[alpha]
            measured = target_p50 / p50
            predicted = expected_tokens(alpha, k) * target_step_s / spec_step_s[k]
            points.append({"k": k, "alpha": alpha, "mode": mode, "p50_s": p50, "spec_steps": steps,
                           "measured_acceptance": rate, "tokens_per_step": (setup.output_len - 1) / steps,
                           "expected_tokens_per_step": expected_tokens(alpha, k), "measured_speedup": measured,
                           "predicted_speedup": predicted, "relative_difference": measured / predicted - 1})
            log(f"  {name} k={k} alpha={alpha}: p50 {p50 * 1e3:.2f} ms, speed-up {measured:.2f} (predicted "
                f"{predicted:.2f}), acceptance {rate:.3f}")
    return {"target": setup.model, "draft": setup.speculative_model, "target_only_p50_s": target_p50,
            "target_step_ms": target_step_s * 1e3,
            "spec_step_ms_by_k": {str(k): s * 1e3 for k, s in spec_step_s.items()},
            "spec_step_over_target_step_by_k": {str(k): s / target_step_s for k, s in spec_step_s.items()},
            "kernel_plan": plan, "points": points}


def plot_surface(report: dict):
    """Measured (solid) and predicted (dashed) speed-up against alpha, one line per k, one panel a pair."""
    from matplotlib.figure import Figure

    pairs = report["pairs"]
    fig = Figure(figsize=(5 * len(pairs), 4.2))
    axes = fig.subplots(1, len(pairs), squeeze=False)[0]
    for ax, (name, pair) in zip(axes, pairs.items()):
        for i, k in enumerate(sorted({p["k"] for p in pair["points"]})):
            pts = sorted((p for p in pair["points"] if p["k"] == k), key=lambda p: p["alpha"])
            color = f"C{i}"
            ax.plot([p["alpha"] for p in pts], [p["measured_speedup"] for p in pts], "o-", color=color, label=f"k={k}")
            ax.plot([p["alpha"] for p in pts], [p["predicted_speedup"] for p in pts], "--", color=color, alpha=0.7)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_title(f"{name}: {pair['target'].split('/')[-1]} + {pair['draft'].split('/')[-1]}", fontsize=9)
        ax.set_xlabel("acceptance rate alpha (set)")
        ax.set_ylabel("p50(target_only) / p50(spec)")
        ax.legend(fontsize=8, title="solid: measured, dashed: predicted", title_fontsize=7)
    fig.suptitle(f"{report['device']} · {report['date'][:10]} · {report['git_commit'][:8]}", fontsize=9)
    fig.tight_layout()
    return fig


def forced_acceptance_command(name: str, doc: str, default_pairs: list[str], warmup: int, iters: int,
                              add_flags) -> CommandParser:
    """The parser of a command that times pairs at set acceptance rates (this one, bench.throughput):
    the shared flags and add_flags(parser)'s own."""
    p = CommandParser(prog=f"python -m protospec.bench.{name}", description=doc,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", nargs="+", default=default_pairs, choices=list(PAIRS), help="target + draft pairs")
    p.add_argument("--alphas", nargs="+", type=float, default=list(ALPHAS), help="acceptance rates to set")
    add_flags(p)
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--num-iters-warmup", type=int, default=warmup)
    p.add_argument("--num-iters", type=int, default=iters)
    p.add_argument("--device", default=None)
    p.add_argument("--output-dir", default=f"runs/{name}", help="JSON and PNG go here (default: %(default)s)")
    return p


def start_report(name: str, args, argv, positive: dict) -> tuple[dict, Path]:
    """Checked arguments (alphas in [0, 1], every `positive` value >= 1, a writable output directory):
    (the report with its provenance, the path stem its JSON and PNG take)."""
    if any(not 0.0 <= a <= 1.0 for a in args.alphas):
        raise SystemExit(f"--alphas must lie in [0, 1], got {args.alphas}")
    if min(positive.values()) < 1:
        raise SystemExit(f"{', '.join(positive)} must be >= 1")
    check_writable(args.output_dir, directory=True)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    report = provenance(device, argv, f"protospec.bench.{name}") | {"config": vars(args), "pairs": {}}
    return report, Path(args.output_dir) / f"{name}_{time.strftime('%Y%m%d-%H%M%S')}"


def main(argv: list[str] | None = None) -> dict:
    def flags(p):
        p.add_argument("--ks", nargs="+", type=int, default=list(KS), help="draft tokens a step")
        p.add_argument("--batch-size", type=int, default=1)

    args = forced_acceptance_command("surface", __doc__, list(PAIRS), 2, 5, flags).parse_args(argv)
    report, stem = start_report("surface", args, argv, {"--ks": min(args.ks), "--input-len": args.input_len,
                                "--output-len": args.output_len, "--batch-size": args.batch_size,
                                "--num-iters": args.num_iters})
    for name in args.pairs:
        target, draft = PAIRS[name]
        setup = BenchSetup(target, draft, args.ks[0], args.input_len, args.output_len, args.batch_size,
                           args.num_iters_warmup, args.num_iters, load_format="dummy", temperature=1.0,
                           device=args.device)
        report["pairs"][name] = run_pair(name, setup, args.alphas, args.ks)
        write_report(f"{stem}.json", report)  # after each pair: a long run cut short keeps what it measured
    plot_surface(report).savefig(f"{stem}.png", dpi=120)
    print(f"wrote {stem}.json, {stem}.png")
    return report


if __name__ == "__main__":
    run_command(main)

"""--compare: proposers x acceptance rules, side by side on one pair and one prompt set.

    python -m protospec.bench --compare                    # the trained pair, its fixed held-out prompts
    python -m protospec.bench --compare --compare-proposers draft ngram --compare-acceptance rejection typical \\
        --compare-prompts 32 --compare-max-tokens 64

Each arm is one engine (a proposer and an acceptance rule), run over every prompt at
batch 1, greedy and at temperature 1 (seeded). Per arm and temperature: acceptance rate, accepted
prefix, mean accepted length, per-position acceptance (metrics.py defines them) over all prompts,
and the p50 over prompts of each prompt's median latency over --compare-repeats passes; target-only decoding is timed beside them as the baseline.
Writes JSON, a markdown table and a plot.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from protospec.bench.report import _fmt
from protospec.config import SamplingParams
from protospec.engine.llm import LLM
from protospec.requests.metrics import RATE_KEYS, RequestMetrics
from protospec import registry

TRAINED_PAIR = "data/models"
TEMPERATURES = (0.0, 1.0)


@dataclass
class CompareSetup:
    target: str
    draft: str
    prompts: list[list[int]]
    k: int = 5
    max_tokens: int = 64
    proposers: tuple = (registry.DRAFT, registry.NGRAM)
    acceptances: tuple = (registry.REJECTION, registry.TYPICAL)
    temperatures: tuple = TEMPERATURES
    seed: int = 0
    repeats: int = 3
    engine: dict = field(default_factory=dict)  # device, dtype, draft_loop, ...

    def arms(self) -> list[dict]:
        return [dict(proposer=p, acceptance=a) for p, a in itertools.product(self.proposers, self.acceptances)]


def arm_name(arm: dict) -> str:
    return f"{arm['proposer']}/{arm['acceptance']}"


def _time_prompts(llm: LLM, prompts, params: SamplingParams, repeats: int, progress=None) -> tuple[RequestMetrics, list[float]]:
    """Each prompt alone (batch 1), `repeats` passes over the prompts: the metrics summed over prompts (of
    the first pass: a seeded call repeats its tokens), and each prompt's median wall time over the passes.
    Passes rather than back-to-back repeats so that a slow stretch of the host spreads over all prompts."""
    llm.generate(prompts[:1], params)  # warm-up: kernels, graphs
    total, times = RequestMetrics(), [[] for _ in prompts]
    for rep in range(repeats):
        for i, prompt in enumerate(progress(prompts) if progress and rep == 0 else prompts):
            llm.generate([prompt], params)
            if rep == 0:
                total.merge(llm.metrics)
            times[i].append(llm.metrics.elapsed_s)
    return total, [float(np.median(t)) for t in times]


def _entry(metrics: RequestMetrics, times: list[float]) -> dict:
    summary = metrics.summary()
    return {key: summary[key] for key in RATE_KEYS + ("num_spec_steps", "num_draft_tokens")} | {
        "p50_s": float(np.median(times)), "mean_s": float(np.mean(times)), "calls": len(times)}


def run_compare(setup: CompareSetup, progress=None, log=print) -> dict:
    results: dict[str, dict] = {}
    baseline = LLM(setup.target, **setup.engine)
    results["target_only"] = {}
    for t in setup.temperatures:
        params = SamplingParams(temperature=t, max_tokens=setup.max_tokens, ignore_eos=True, seed=setup.seed)
        results["target_only"][f"T={t:g}"] = _entry(*_time_prompts(baseline, setup.prompts, params, setup.repeats, progress))
    del baseline
    for arm in setup.arms():
        draft = registry.NGRAM_MODEL if arm["proposer"] == registry.NGRAM else setup.draft
        llm = LLM(setup.target, speculative_model=draft, num_speculative_tokens=setup.k, acceptance=arm["acceptance"],
                  **setup.engine)
        name = arm_name(arm)
        results[name] = {"arm": arm, "kernel_plan": llm.engine.plan.as_record()}
        for t in setup.temperatures:
            params = SamplingParams(temperature=t, max_tokens=setup.max_tokens, ignore_eos=True, seed=setup.seed)
            results[name][f"T={t:g}"] = _entry(*_time_prompts(llm, setup.prompts, params, setup.repeats, progress))
            e = results[name][f"T={t:g}"]
            log(f"{name} T={t:g}: acceptance {_fmt(e['acceptance_rate'])}, mean accepted length "
                f"{_fmt(e['mean_accepted_len'], '.2f')}, p50 {e['p50_s'] * 1e3:.1f} ms")
        del llm
    return {"compare": results, "compare_config": {
        "target": setup.target, "draft": setup.draft, "k": setup.k, "max_tokens": setup.max_tokens,
        "num_prompts": len(setup.prompts), "temperatures": list(setup.temperatures), "seed": setup.seed,
        "repeats": setup.repeats,
        "engine": setup.engine}}


def compare_table(report: dict) -> str:
    cfg, rows = report["compare_config"], report["compare"]
    lines = [f"Device: {report['device']} · date {report['date']} · commit `{report['git_commit'][:10]}`",
             f"Command: `{report['command']}`",
             f"Pair: {cfg['target']} + {cfg['draft']}, k={cfg['k']}, {cfg['num_prompts']} prompts at batch 1, "
             f"{cfg['max_tokens']} new tokens, seed {cfg['seed']}", ""]
    for temp in (f"T={t:g}" for t in cfg["temperatures"]):
        base = rows["target_only"][temp]["p50_s"]
        lines += [f"### {temp}", "",
                  "| arm | acceptance | accepted prefix | mean acc. len | per position | p50 (ms) | target-only / arm |",
                  "|---|---:|---:|---:|---|---:|---:|"]
        for name, entry in rows.items():
            e = entry[temp]
            per = ", ".join(f"{x:.2f}" for x in e["per_position_acceptance"]) if e["per_position_acceptance"] else "—"
            lines.append(f"| {name} | {_fmt(e['acceptance_rate'])} | {_fmt(e['prefix_acceptance_rate'])} | "
                         f"{_fmt(e['mean_accepted_len'], '.2f')} | {per} | {e['p50_s'] * 1e3:.1f} | {base / e['p50_s']:.2f} |")
        lines.append("")
    return "\n".join(lines)


def plot_compare(report: dict):
    """Mean accepted length and speed-up over target-only per arm, one panel pair per temperature."""
    from matplotlib.figure import Figure

    from protospec.bench.report import config_title

    cfg, rows = report["compare_config"], report["compare"]
    temps = [f"T={t:g}" for t in cfg["temperatures"]]
    names = [n for n in rows if n != "target_only"]
    fig = Figure(figsize=(12, 3.2 * len(temps) + 1), layout="constrained")
    axes = fig.subplots(len(temps), 2, squeeze=False)
    for row, temp in enumerate(temps):
        base = rows["target_only"][temp]["p50_s"]
        lengths = [rows[n][temp]["mean_accepted_len"] or 1.0 for n in names]
        speedups = [base / rows[n][temp]["p50_s"] for n in names]
        axes[row][0].barh(names, lengths, color="#1f77b4")
        axes[row][0].set_xlabel(f"mean accepted length, {temp}")
        axes[row][1].barh(names, speedups, color="#2ca02c")
        axes[row][1].axvline(1.0, color="#7f7f7f", lw=1)
        axes[row][1].set_xlabel(f"p50 target-only / p50 arm, {temp}")
        axes[row][1].set_yticklabels([])
    fig.suptitle(f"{cfg['target']} + {cfg['draft']}, k={cfg['k']}, {cfg['num_prompts']} prompts\n"
                 + config_title(report | {"config": {}}).strip(), fontsize=9)
    return fig


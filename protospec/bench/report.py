"""Write an ablation report: JSON (everything), a markdown table, and PNG plots (matplotlib, Agg)."""
from __future__ import annotations

import json
import re
from pathlib import Path

from matplotlib.figure import Figure

from protospec import registry

# In the order they run: the compiled ones last, as torch.compile's CUDA graphs break later captures in the process.
PEER_NAMES = ("target_only", "unfused", "hf_assisted", "hf_target_only", "hf_static_loop", "hf_compiled")
PLOT_ORDER = (*registry.ARMS, *PEER_NAMES)
BASELINE = registry.MAIN
# One colour per mode in every plot: the baseline red, the device paths blues/greens (in the arms'
# order), peers greys.
MODE_COLORS = {**dict(zip(registry.ARMS, ("#d62728", "#ff7f0e", "#9ecae1", "#1f77b4", "#2ca02c"))),
               **dict(zip(PEER_NAMES, ("#7f7f7f", "#74c476", "#b0b0b0", "#d9d9d9", "#969696", "#525252")))}


def mode_color(name: str) -> str:
    return MODE_COLORS.get(name, "#8c564b")


def config_title(report: dict, sweep: bool = False) -> str:
    """Configuration, device, date and commit: the first line of every plot's title (a sweep's leaves
    out k and batch, its plot's axes)."""
    cfg = report.get("config", {})
    shape = "" if sweep else f", k={cfg.get('num_speculative_tokens')}, batch {cfg.get('batch_size')}"
    what = f"{cfg['model']} + {cfg['speculative_model']}{shape}, in {cfg['input_len']} / out {cfg['output_len']}" \
        if "model" in cfg else ""
    return f"{what}\n{report['device']} · {report['date'][:10]} · {report['git_commit'][:8]}"


def timed_entries(modes: dict) -> list[tuple[str, dict]]:
    ordered = [m for m in PLOT_ORDER if m in modes] + [m for m in modes if m not in PLOT_ORDER]
    return [(m, modes[m]) for m in ordered if "p50_s" in modes[m]]


def ratio_to_main(modes: dict, name: str) -> float | None:
    if BASELINE not in modes or "p50_s" not in modes.get(name, {}):
        return None
    return modes[BASELINE]["p50_s"] / modes[name]["p50_s"]


def _fmt(value, spec=".3f") -> str:
    return "—" if value is None else format(value, spec)


def markdown_table(report: dict) -> str:
    modes = report["modes"]
    cfg = report["config"]
    lines = [
        f"Device: {report['device']} · date {report['date']} · commit `{report['git_commit'][:10]}`",
        f"Command: `{report['command']}`",
        f"Config: {cfg['model']} + {cfg['speculative_model']}, k={cfg['num_speculative_tokens']}, input {cfg['input_len']}, "
        f"output {cfg['output_len']}, batch {cfg['batch_size']}, {cfg['resolved_dtype']}, temperature {cfg['temperature']}, "
        f"{cfg['num_iters_warmup']}+{cfg['num_iters']} iterations, CUDA graphs {cfg['cuda_graphs']}, "
        f"layer kernels {cfg.get('resolved_layer_kernels', False)}, "
        f"{cfg.get('repeats', 1)} round(s) of the modes, torch threads {report.get('torch_threads', '?')}",
        "",
        *([f"**{report['note']}**", ""] if report.get("note") else []),
        "| mode | p50 (s) | p10 (s) | p90 (s) | avg (s) | p50 main / mode (rounds' range) | acceptance | accepted prefix | system eff. | mean acc. len |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, e in timed_entries(modes):
        ratio = _fmt(ratio_to_main(modes, name), '.2f')
        rounds = e.get("ratio_to_main_per_round")
        if rounds and name != BASELINE and len(rounds) > 1:  # the spread across rounds beside the pooled ratio
            ratio += f" ({min(rounds):.2f}-{max(rounds):.2f})"
        lines.append(f"| {name} | {e['p50_s']:.4f} | {e['p10_s']:.4f} | {e['p90_s']:.4f} | {e['avg_s']:.4f} | "
                     f"{ratio} | {_fmt(e.get('acceptance_rate'))} | {_fmt(e.get('prefix_acceptance_rate'))} | "
                     f"{_fmt(e.get('system_efficiency'))} | {_fmt(e.get('mean_accepted_len'), '.2f')} |")
    for name, e in modes.items():
        if "skipped" in e:
            lines.append(f"| {name} | skipped: {e['skipped']} | | | | | | | | |")
    per_round = {n: e["ratio_to_main_per_round"] for n, e in modes.items() if "ratio_to_main_per_round" in e and n != BASELINE}
    if per_round:
        lines.append("")
        lines.append("p50(main) / p50(mode) in each round: " + "; ".join(
            f"{n} " + ", ".join(f"{r:.2f}" for r in ratios) for n, ratios in per_round.items()))
    target_only = modes.get("target_only", {})
    if target_only.get("ratio_to_fastest_per_round"):
        lines.append(f"p50(target_only) / p50({target_only['fastest_mode']}) in each round: "
                     + ", ".join(f"{r:.2f}" for r in target_only["ratio_to_fastest_per_round"]))
    unfused = modes.get("unfused", {})
    if unfused.get("ratio_to_mode_per_round"):
        lines.append(f"p50(unfused) / p50({unfused['mode']}) in each round: "
                     + ", ".join(f"{r:.2f}" for r in unfused["ratio_to_mode_per_round"]))
    fastest = fastest_mode(modes)
    if fastest is not None:
        def against(n: str) -> str:  # unfused times one mode: the first round's fastest where rounds ran
            mode = modes[n].get("mode") if n == "unfused" else None
            mode = mode if "p50_s" in modes.get(mode, {}) else fastest
            return f"p50({n}) / p50({mode}) = {modes[n]['p50_s'] / modes[mode]['p50_s']:.2f}"
        lines += ["", f"Fastest mode: {fastest}. " + "; ".join(
            against(n) for n in (BASELINE, *PEER_NAMES) if n != fastest and "p50_s" in modes.get(n, {}))]
        same = [n for n, e in modes.items() if n != fastest and e.get("token_digest") is not None
                 and e.get("token_digest") == modes[fastest].get("token_digest")]
        other = [n for n, e in modes.items() if n != fastest and e.get("token_digest") is not None and n not in same]
        if same or other:
            lines.append(f"Output tokens (sha256 of every timed call's ids): the same as {fastest}'s in "
                         f"{', '.join(same) or 'no other run'}; other tokens in {', '.join(other) or 'none'}")
        for peer in ("hf_static_loop", "hf_compiled"):
            compiled = modes.get(peer, {}).get("torch_compiled_graphs")
            if compiled is not None:
                lines.append(f"{peer}: {compiled} graph(s) compiled by torch.compile"
                             + ("" if compiled else " (none: a static cache only, as on a CPU)"))
    return "\n".join(lines) + "\n"


def fastest_mode(modes: dict) -> str | None:
    """The draft-loop mode with the lowest p50 (the peers are what it is compared with)."""
    timed = [(e["p50_s"], n) for n, e in modes.items() if n in registry.ARMS and "p50_s" in e]
    return min(timed)[1] if timed else None


def plot_latency(report: dict):
    """p50 per mode with p10-p90 whiskers and p50(main)/p50(mode) labels. Returns a Figure
    (matplotlib.figure.Figure: no pyplot, so it works headless and displays inline in Jupyter)."""
    entries = timed_entries(report["modes"])
    names = [n for n, _ in entries]
    p50 = [e["p50_s"] * 1e3 for _, e in entries]
    low = [(e["p50_s"] - e["p10_s"]) * 1e3 for _, e in entries]
    high = [(e["p90_s"] - e["p50_s"]) * 1e3 for _, e in entries]
    colors = [mode_color(n) for n in names]
    fig = Figure(figsize=(9, 4.8))
    ax = fig.subplots()
    bars = ax.bar(names, p50, yerr=[low, high], capsize=4, color=colors,
                  hatch=["//" if n in PEER_NAMES else "" for n in names], edgecolor="white")
    for bar, name in zip(bars, names):
        ratio = ratio_to_main(report["modes"], name)
        if ratio is not None:
            ax.annotate(f"{ratio:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        xytext=(0, 14), textcoords="offset points", ha="center", fontsize=9)
    # Log scale: the HF peers take 10-30x longer than the modes, which a linear axis would flatten.
    ax.set_yscale("log")
    ax.set_ylabel("latency per generate() call, p50 (ms, log scale)")
    ax.set_xlabel("mode (hatched: peers; bars: p50; whiskers: p10-p90; label: p50(main) / p50(mode))")
    ax.tick_params(axis="x", labelrotation=20)
    ax.set_title(config_title(report), fontsize=10)
    ax.margins(y=0.2)
    fig.tight_layout()
    return fig


def plot_breakdown(report: dict):
    """Stacked per-phase time per mode (CPU wall time, and GPU time from CUDA events on a GPU);
    None when the report has no breakdown."""
    from protospec.speculation.phase_timer import PHASES

    rows = [(n, e["breakdown_ms_per_call"]) for n, e in report["modes"].items() if "breakdown_ms_per_call" in e]
    if not rows:
        return None
    key = "gpu_ms" if report.get("device_type") == "cuda" else "cpu_ms"
    fig = Figure(figsize=(12, 4.8))
    axes = fig.subplots(1, 2 if key == "gpu_ms" else 1, squeeze=False)
    for ax, which in zip(axes[0], ["cpu_ms", "gpu_ms"][: axes.shape[1]]):
        bottom = [0.0] * len(rows)
        for phase in PHASES:
            values = [(b.get(phase, {}).get(which) or 0.0) for _, b in rows]
            ax.bar([n for n, _ in rows], values, bottom=bottom, label=phase)
            bottom = [a + v for a, v in zip(bottom, values)]
        ax.set_ylabel(f"{'CPU wall' if which == 'cpu_ms' else 'GPU (CUDA events)'} time per generate() (ms)")
        ax.set_xlabel("mode")
        ax.tick_params(axis="x", labelrotation=25)
        ax.set_title(f"per-phase {'CPU' if which == 'cpu_ms' else 'GPU'} time", fontsize=10)
    # The legend beside the panels, never over a bar.
    axes[0][-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle("spec-step breakdown · " + config_title(report).replace("\n", " · "), fontsize=10)
    fig.tight_layout()
    return fig


def plot_sweep(sweep: dict, title: str):
    """p50 per mode against batch size, one panel per k, all panels on one y scale."""
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    ks = sweep["ks"]
    fig = Figure(figsize=(max(6.5, 4 * len(ks)), 4.2))  # one panel still leaves room for the title
    axes = fig.subplots(1, len(ks), squeeze=False, sharey=True)
    batches = sorted({p["batch_size"] for p in sweep["points"]})
    for ax, k in zip(axes[0], ks):
        for mode in sorted({p["mode"] for p in sweep["points"]}, key=lambda m: PLOT_ORDER.index(m) if m in PLOT_ORDER else 99):
            pts = sorted((p["batch_size"], p["p50_s"] * 1e3) for p in sweep["points"] if p["k"] == k and p["mode"] == mode)
            ax.plot([b for b, _ in pts], [t for _, t in pts], marker="o", label=mode, color=mode_color(mode))
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(batches))  # the batch sizes themselves: 1, 4, 16, 64
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel("batch size")
        ax.set_title(f"k = {k}", fontsize=10)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("p50 latency per generate() (ms)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def report_stem(report: dict, tag: str, record: bool = False) -> str:
    """date_device_tag_commit; a run that is not a record adds its time of day (HHMMSS), so two runs
    never share a name."""
    device = re.sub(r"[^A-Za-z0-9]+", "-", report["device"]).strip("-").lower()
    stem = f"{report['date'][:10]}_{device}_{tag}_{report['git_commit'][:7]}"
    return stem if record else f"{stem}_{report['date'][11:19].replace(':', '')}"


def write_report(report: dict, out_dir: str | Path, tag: str = "ablation", record: bool = False,
                 force: bool = False, render: tuple | None = None) -> dict[str, str]:
    """JSON, markdown and PNGs under out_dir (an ablation's, a sweep's, or with render, the (markdown
    table, figure) functions of another report: a --compare's). Refuses (FileExistsError, before
    writing anything) to replace an existing file unless force: a run of record is never overwritten
    by accident."""
    out = Path(out_dir)
    stem = out / report_stem(report, tag, record)
    paths = {"json": f"{stem}.json"}
    render = render or ((markdown_table, plot_latency) if report.get("modes") else None)
    if render is not None:
        paths.update(md=f"{stem}.md", png=f"{stem}.png")
    breakdown = plot_breakdown(report) if report.get("modes") else None
    if breakdown is not None:
        paths["breakdown_png"] = f"{stem}_breakdown.png"
    if report.get("sweep"):
        paths["sweep_png"] = f"{stem}_sweep.png" if report.get("modes") else f"{stem}.png"
    existing = [p for p in paths.values() if Path(p).exists()]
    if existing and not force:
        raise FileExistsError(f"refusing to overwrite {', '.join(existing)} (pass --force to replace it)")
    out.mkdir(parents=True, exist_ok=True)
    with open(paths["json"], "w") as f:
        json.dump(report, f, indent=2)
    if render is not None:
        table, figure = render
        Path(paths["md"]).write_text(table(report))
        figure(report).savefig(paths["png"], dpi=110)
    if breakdown is not None:
        breakdown.savefig(paths["breakdown_png"], dpi=110)
    if report.get("sweep"):
        title = "p50 per mode · " + config_title(report, sweep=True)
        plot_sweep(report["sweep"], title).savefig(paths["sweep_png"], dpi=110)
    return paths

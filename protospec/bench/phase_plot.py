"""GPU busy time per spec step by phase, for one or more kernel censuses, against the bytes floor.

    python -m protospec.bench.phase_plot CENSUS.json[:LABEL] [CENSUS.json[:LABEL] ...] [--mode graph]
                                         --output-png PATH

Each census (python -m protospec.bench.kernel_census) splits busy time by the phase that launched each
kernel; phases group here into the draft's forwards (draft_forward and the captured draft_loop_graph,
which also samples), the verify, sampling, rejection, and the rest (prepare, commit, begin, outside a
spec step); a spec step replayed whole (step_graph) is its own group, its floor both forwards'. The floor of the draft group is k draft forwards' weights, of the verify one target
forward's, at the census's copy bandwidth; the other groups move kilobytes. Two censuses side by side
(before and after a change) show which phase moved.
"""
from __future__ import annotations

import argparse
import json

from matplotlib.figure import Figure

from protospec import registry
from protospec.command_line import CommandParser, run_command

GROUPS = {"draft forwards": ("draft_forward", "draft_loop_graph"), "verify": ("verify",), "sampling": ("sampling",),
          "rejection": ("rejection",), "whole step graph": ("step_graph",), "rest": ("prepare", "commit", "begin", "outside_spec_step")}


def phase_rows(census: dict, mode: str = registry.GRAPH) -> dict[str, dict]:
    """{group: {"busy_ms": per spec step, "floor_ms": the weights it must read or None}} for one census."""
    run = census["modes"][mode]
    if "busy_ms_per_spec_step_by_phase" not in run:
        raise ValueError(f"the census at {census.get('git_commit', '?')} has no busy time by phase (it predates the "
                         "split): re-run python -m protospec.bench.kernel_census")
    by_phase = run["busy_ms_per_spec_step_by_phase"]
    floor, k = census["floor"], census["config"]["num_speculative_tokens"]
    bandwidth = floor["copy_bandwidth_gbs"]
    floors = {"draft forwards": k * floor["draft_weight_mb"] / bandwidth, "verify": floor["target_weight_mb"] / bandwidth}
    floors["whole step graph"] = floors["draft forwards"] + floors["verify"]
    grouped = {g: sum(by_phase.get(p, 0.0) for p in phases) for g, phases in GROUPS.items()}
    grouped["rest"] += sum(v for p, v in by_phase.items() if not any(p in ps for ps in GROUPS.values()))
    return {g: {"busy_ms": busy, "floor_ms": floors.get(g)} for g, busy in grouped.items()}


def plot_phases(censuses: dict[str, dict], mode: str = registry.GRAPH) -> Figure:
    """Grouped bars: busy ms per spec step by phase group for each labelled census, floors as ticks."""
    fig = Figure(figsize=(8, 4.5))
    ax = fig.subplots()
    width = 0.8 / max(1, len(censuses))
    for i, (label, census) in enumerate(censuses.items()):
        rows = phase_rows(census, mode)
        xs = [j + i * width for j in range(len(rows))]
        ax.bar(xs, [r["busy_ms"] for r in rows.values()], width, label=f"{label} ({census.get('git_commit', '?')[:7]})")
        for x, r in zip(xs, rows.values()):
            if r["floor_ms"] is not None:
                ax.hlines(r["floor_ms"], x - width / 2, x + width / 2, colors="black")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(GROUPS))], list(GROUPS))
    ax.set_ylabel("GPU busy per spec step (ms); black: bytes floor")
    first = next(iter(censuses.values()))
    ax.set_title(f"{first.get('device', '?')}, {mode} mode, k = {first['config']['num_speculative_tokens']}, "
                 f"batch {first['config'].get('batch_size', 1)}", fontsize=9)
    ax.set_ylim(top=ax.get_ylim()[1] * (1.0 + 0.08 * len(censuses)))  # headroom: the legend over no bar
    ax.legend(fontsize=8, loc="upper center")
    fig.tight_layout()
    return fig


def main(argv=None) -> None:
    p = CommandParser(prog="python -m protospec.bench.phase_plot", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("censuses", nargs="+", help="census JSON files, each optionally :LABEL")
    p.add_argument("--mode", default=registry.GRAPH, help="the draft-loop mode to plot (default: %(default)s)")
    p.add_argument("--output-png", required=True)
    args = p.parse_args(argv)
    censuses = {}
    for item in args.censuses:
        path, _, label = item.partition(":")
        with open(path) as f:
            censuses[label or path] = json.load(f)
    plot_phases(censuses, args.mode).savefig(args.output_png, dpi=120)
    print(f"wrote {args.output_png}")


if __name__ == "__main__":
    run_command(main)

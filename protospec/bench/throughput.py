"""Throughput by batch size: output tokens a second of the fastest spec mode and of the optimized
target-only decoder, and the crossover batch from which speculation stops paying.

    python -m protospec.bench.throughput [--pairs seed llama-1b-shaped] [--batch-sizes 1 4 16 64 128 256]
                                         [--k 5] [--alphas 0.5 0.7 0.9]

Why a batch changes the answer: at batch 1 a forward reads every weight for one token and the GPU idles
on latency, so verifying k + 1 positions costs about one target step; as the batch grows the forwards
turn from reading weights to computing and to reading K/V, a verify of (k + 1) x batch rows costs more
than a decode of batch rows, and the draft's k forwards stop being nearly free.

Acceptance is set, not hoped for (lab.forced_acceptance, as in bench.surface): dummy weights' acceptance
says nothing about a real pair. For each pair and batch size: one target-only engine and one speculative
engine (draft loop auto: graph where CUDA graphs run), each with max_num_seqs = batch, max_model_len =
input + output and a KV pool that holds the whole batch (no request waits for blocks). Throughput =
batch x output_len / p50 of one generate() of the whole batch (prefill included, as an offline batch
runs it). The crossover at an alpha: the smallest batch size timed at which target-only's throughput is
at least the spec engine's (None: speculation paid at every batch size timed).
"""
from __future__ import annotations

from dataclasses import replace


from protospec.bench.ablation import BenchSetup, _release_memory
from protospec.bench.provenance import write_report
from protospec.bench.surface import PAIRS, _timed, forced_acceptance_command, start_report
from protospec.command_line import run_command
from protospec.lab.forced_acceptance import force_acceptance

BATCH_SIZES = (1, 4, 16, 64, 128, 256)
ALPHAS = (0.5, 0.7, 0.9)
KV_CACHE_GIB = 64.0  # a cap: the pool takes only what max_num_seqs x max_model_len can use


def tokens_per_s(setup: BenchSetup, p50_s: float) -> float:
    return setup.batch_size * setup.output_len / p50_s


def crossover(batch_sizes: list[int], target_only: dict[int, float], spec: dict[int, float]) -> int | None:
    """The smallest batch size at which target-only's throughput is at least the spec engine's."""
    return next((b for b in sorted(batch_sizes) if target_only[b] >= spec[b]), None)


def run_batch(setup: BenchSetup, alphas, log=print) -> dict:
    """One batch size of one pair: target-only, then the spec engine at each alpha."""
    target_only = setup.llm(speculative=False)
    p50, _ = _timed(target_only, setup)
    del target_only
    _release_memory()
    point = {"batch_size": setup.batch_size, "target_only_p50_s": p50, "target_only_tokens_per_s": tokens_per_s(setup, p50),
             "spec": {}}
    llm = setup.llm()
    for alpha in alphas:
        force_acceptance(llm, alpha)
        p50, steps = _timed(llm, setup)
        point["spec"][str(alpha)] = {"p50_s": p50, "tokens_per_s": tokens_per_s(setup, p50),
                                     "measured_acceptance": llm.metrics.acceptance_rate, "spec_steps_per_request": steps}
    point["mode"], point["kernel_plan"] = llm.engine.draft_loop, llm.engine.plan.as_record()
    del llm
    _release_memory()
    log(f"  batch {setup.batch_size}: target-only {point['target_only_tokens_per_s']:.0f} tokens/s, spec "
        + ", ".join(f"{a}: {s['tokens_per_s']:.0f}" for a, s in point["spec"].items()))
    return point


def run_pair(name: str, setup: BenchSetup, batch_sizes=BATCH_SIZES, alphas=ALPHAS, log=print,
             checkpoint=lambda pair: None) -> dict:
    """The pair's points in batch order; checkpoint(pair so far) after each one, so a run cut short keeps
    what it measured (the crossover then over the batch sizes timed)."""
    pair = {"target": setup.model, "draft": setup.speculative_model, "k": setup.num_speculative_tokens, "points": []}
    for b in batch_sizes:
        pair["points"].append(run_batch(replace(setup, batch_size=b), alphas, log))
        timed = [p["batch_size"] for p in pair["points"]]
        target = {p["batch_size"]: p["target_only_tokens_per_s"] for p in pair["points"]}
        pair["crossover_batch_by_alpha"] = {
            str(a): crossover(timed, target, {p["batch_size"]: p["spec"][str(a)]["tokens_per_s"] for p in pair["points"]})
            for a in alphas}
        checkpoint(pair)
    log(f"  {name}: speculation stops paying from batch "
        + ", ".join(f"{b} at alpha {a}" for a, b in pair["crossover_batch_by_alpha"].items()))
    return pair


def plot_throughput(report: dict):
    """Output tokens/s against batch size (log-log), one panel a pair: target-only (black) and the spec
    engine at each alpha; a dotted line marks each crossover."""
    from matplotlib.figure import Figure

    pairs = report["pairs"]
    fig = Figure(figsize=(5.5 * len(pairs), 4.2))
    axes = fig.subplots(1, len(pairs), squeeze=False)[0]
    for ax, (name, pair) in zip(axes, pairs.items()):
        batches = [p["batch_size"] for p in pair["points"]]
        ax.plot(batches, [p["target_only_tokens_per_s"] for p in pair["points"]], "ks-", label="target-only")
        for i, alpha in enumerate(pair["crossover_batch_by_alpha"]):
            ax.plot(batches, [p["spec"][alpha]["tokens_per_s"] for p in pair["points"]], "o-", color=f"C{i}",
                    label=f"spec, alpha {alpha}")
            if pair["crossover_batch_by_alpha"][alpha] is not None:
                ax.axvline(pair["crossover_batch_by_alpha"][alpha], color=f"C{i}", ls=":", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size")
        ax.set_ylabel("output tokens / s")
        ax.set_title(f"{name}: {pair['target'].split('/')[-1]} + {pair['draft'].split('/')[-1]}, k={pair['k']}",
                     fontsize=9)
        ax.legend(fontsize=8, title="dotted: crossover", title_fontsize=7)
    fig.suptitle(f"{report['device']} · {report['date'][:10]} · {report['git_commit'][:8]}", fontsize=9)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> dict:
    def flags(p):
        p.add_argument("--batch-sizes", nargs="+", type=int, default=list(BATCH_SIZES))
        p.add_argument("--k", type=int, default=5, help="draft tokens a step")

    args = forced_acceptance_command("throughput", __doc__, ["seed", "llama-1b-shaped"], 1, 3, flags).parse_args(argv)
    report, stem = start_report("throughput", args, argv, {"--k": args.k, "--batch-sizes": min(args.batch_sizes),
                                "--input-len": args.input_len, "--output-len": args.output_len,
                                "--num-iters": args.num_iters})
    for name in args.pairs:
        target, draft = PAIRS[name]
        setup = BenchSetup(target, draft, args.k, args.input_len, args.output_len, 1, args.num_iters_warmup,
                           args.num_iters, load_format="dummy", temperature=1.0, device=args.device,
                           max_model_len=args.input_len + args.output_len, kv_cache_gib=KV_CACHE_GIB)
        def checkpoint(pair, name=name):  # after each batch size: a long run cut short keeps what it measured
            report["pairs"][name] = pair
            write_report(f"{stem}.json", report)

        run_pair(name, setup, args.batch_sizes, args.alphas, checkpoint=checkpoint)
    plot_throughput(report).savefig(f"{stem}.png", dpi=120)
    print(f"wrote {stem}.json, {stem}.png")
    return report


if __name__ == "__main__":
    run_command(main)

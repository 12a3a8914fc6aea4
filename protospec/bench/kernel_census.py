"""Where a generate() call's wall time goes on the GPU: kernels launched, GPU busy time, GPU idle.

    python -m protospec.bench.kernel_census [--batch-size 64] [--modes graph] [--output-json PATH]

For each draft-loop mode, one generate() of the seed configuration (dummy weights; batch size, k,
lengths and temperature take the bench's flags) under the torch profiler: the number of GPU
kernels, their summed duration (busy), the kernels that take the most time, and wall - busy (the
GPU waiting for the host: CPU prepares, host syncs, Python between launches). Against the floor:
a spec step must read the draft's weights k times and the target's once (the bytes one forward
reads: every parameter, the embedding table only where the LM head shares it), over the copy
bandwidth measured in the same run; busy time per spec step (the prefill included, spread over
the steps) over that floor says how far the device work is from memory speed; busy time per step is
also split by the phase that launched each kernel (bench/phase_plot.py draws it against the floors). The ratio main/gpu can only exceed
1 + (main's extra host time) / (gpu's wall), so this says which side to shrink.
"""
from __future__ import annotations

import argparse
import re
import time
from collections import Counter

import torch

from protospec import registry
from protospec.bench.ablation import MODES, BenchSetup, apply_mode
from protospec.bench.engine_flags import add_engine_flags, engine_switches
from protospec.bench.provenance import check_writable, provenance, write_report
from protospec.speculation.phase_timer import NULL_TIMER, ProfilerPhases
from protospec.command_line import CommandParser, run_command


def graph_replay_us(fn, steps: int, replays: int) -> float:
    """Capture `steps` launches in one CUDA graph; device time of one replay (CUDA events)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(steps):
            fn()
    for _ in range(10):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / replays


def copy_bandwidth_gbs(dev: torch.device, nbytes: int = 2**30) -> float:
    """Device-to-device copy rate by a kernel (dst = src * 1 over float32), (read + written) bytes per
    second / 1e9. A captured copy_ becomes a copy-engine memcpy node, which copies slower than a kernel
    reads: the kernel's rate is the one an attention kernel competes with (and gives the lower floor)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=dev).normal_()
    dst = torch.empty_like(src)
    us = graph_replay_us(lambda: torch.mul(src, 1.0, out=dst), 5, 5) / 5
    return 2 * nbytes / us / 1e3


def kernel_label(name: str) -> str:
    """A profiler kernel name, short but still one label per compiled kernel: the package's namespace,
    Numba's `<locals>` and its closure tags and the argument list dropped, the specialization's
    version tag (`[abi:vN]`) kept. Two specializations of one kernel (attention's prefill and decode
    row groups) share a 90-character prefix, so a truncated name would merge or hide one of them."""
    head = name.split("(", 1)[0] if not name.startswith("void ") else name
    head = re.sub(r"\[abi:cw[^\]]*\]", "", head.removeprefix("protospec::kernels::")).replace("::_3clocals_3e::", ".")
    return head[:160]


def engine_spec_steps(phases: list[tuple[float, float, str]], request_steps: int) -> int:
    """The engine's spec steps: one verify phase each, or one step_graph phase (a whole step replayed).
    Not the requests' summed steps (request_steps, the fallback where no phase was recorded): a step at
    batch 64 serves 64 requests and reads the weights once, so per-step figures divide by this."""
    return sum(1 for *_, name in phases if name in ("verify", "step_graph")) or request_steps


def innermost(ranges: list[tuple[float, float, str]]) -> str:
    """The name of the innermost of nested (start, end, name) ranges: the latest start, and of ranges
    starting together the earliest end (on the device a phase's first kernel may open its parent's
    range too); "outside_spec_step" when there are none."""
    return min(ranges, key=lambda r: (-r[0], r[1]))[2] if ranges else "outside_spec_step"


def idle_by_phase(kernels: list[tuple[float, float]], phases: list[tuple[float, float, str]],
                  launch_lead_us: float = 4.0) -> dict[str, float]:
    """Charge each GPU idle gap (us) to the host phase that ended it: the phase range running on the
    CPU just before the next kernel started (its launch), the innermost where ranges nest.
    kernels: device (start, end); phases: host (start, end, name). Gaps before the first kernel are
    not counted; a gap no phase covers is "outside_spec_step" (engine bookkeeping between steps)."""
    gaps: dict[str, float] = {}
    end_so_far = None
    for start, end in sorted(kernels):
        if end_so_far is not None and start > end_so_far:
            launch = start - launch_lead_us
            covering = [p for p in phases if p[0] <= launch <= p[1]]
            name = innermost(covering)
            gaps[name] = gaps.get(name, 0.0) + (start - end_so_far)
        end_so_far = end if end_so_far is None else max(end_so_far, end)
    return gaps


def uncovered_us(kernels: list[tuple[float, float, str]], annotations=None) -> dict:
    """Device time (us) of each kernel charged only the time no earlier kernel covers, so the parts add
    up to the merged busy time (a programmatic dependent starts, and waits, while the kernel before it
    runs: that overlap counts once): what removing the kernel could save. Keyed by its name, or with
    annotations (the phases' (start, end, name) ranges projected onto the device) by (phase, name), the
    phase the innermost range holding the kernel's start (latest start where they nest;
    "outside_spec_step" in none)."""
    out: dict = {}
    end_so_far = float("-inf")
    for start, end, name in sorted(kernels):
        if end > end_so_far:
            if annotations is not None:
                name = (innermost([a for a in annotations if a[0] <= start < a[1]]), name)
            out[name] = out.get(name, 0.0) + (end - max(start, end_so_far))
            end_so_far = end
    return out


def top_by_phase(uncovered: dict[tuple[str, str], float], steps: int, per_phase: int = 8) -> dict[str, dict[str, float]]:
    """Per phase its `per_phase` kernel labels (kernel_label) of most uncovered time (uncovered_us), in us per spec step."""
    labelled: Counter = Counter()
    for (phase, name), us in uncovered.items():
        labelled[phase, kernel_label(name)] += us
    phases: dict[str, dict[str, float]] = {}
    for (phase, name), us in labelled.most_common():
        names = phases.setdefault(phase, {})
        if len(names) < per_phase:
            names[name] = round(us / max(1, steps), 2)
    return phases


def weight_bytes_per_forward(model: torch.nn.Module) -> int:
    """Bytes of weights one forward reads: every parameter once (a tied LM head is the embedding
    table, read in full by the head), an untied embedding table not at all (it gathers a few rows)."""
    embed = model.model.embed_tokens.weight
    tied = model.lm_head.weight is embed  # the same Parameter where the checkpoint ties them
    return sum(p.numel() * p.element_size() for p in model.parameters() if tied or p is not embed)


def spec_step_floor(llm, k: int, bandwidth_gbs: float) -> dict:
    """The weights a spec step reads (k draft forwards, one verify) and their time at the copy rate
    (bytes read + written per second: the rate a kernel that only reads can reach)."""
    target = weight_bytes_per_forward(llm.engine.target.model)
    draft = weight_bytes_per_forward(llm.engine.draft.model) if llm.engine.draft is not None else 0
    total = k * draft + target
    return {"target_weight_mb": target / 1e6, "draft_weight_mb": draft / 1e6, "spec_step_weight_mb": total / 1e6,
            "copy_bandwidth_gbs": bandwidth_gbs, "floor_ms_per_spec_step": total / bandwidth_gbs / 1e6}


def census(llm, setup: BenchSetup, mode: str | None) -> dict:
    """mode None: an engine without a proposer (target-only decoding; no spec-step phases)."""
    from torch.profiler import ProfilerActivity, profile

    if mode is not None:
        apply_mode(llm.engine, mode)
    prompts, params = setup.prompts(llm.engine.vocab_size), setup.params()
    for _ in range(3):  # warm-up: graphs captured, kernels loaded
        llm.generate(prompts, params)
    torch.cuda.synchronize()
    if mode is not None:
        llm.engine.spec_step.timer = ProfilerPhases()
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            start = time.perf_counter()
            llm.generate(prompts, params)
            torch.cuda.synchronize()
            wall_us = (time.perf_counter() - start) * 1e6
    finally:
        if mode is not None:
            llm.engine.spec_step.timer = NULL_TIMER
    events = prof.events()
    # Device work: kernels, copies, memsets; a record_function range also shows up on the device
    # side under its own name, and is not work.
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith("phase:")]
    phases = [(e.time_range.start, e.time_range.end, e.name.removeprefix("phase:")) for e in events
              if e.device_type == torch.autograd.DeviceType.CPU and e.name.startswith("phase:")]
    on_device = [(e.time_range.start, e.time_range.end, e.name.removeprefix("phase:")) for e in events
                 if e.device_type == torch.autograd.DeviceType.CUDA and e.name.startswith("phase:")]
    spans = [(e.time_range.start, e.time_range.end) for e in kernels]
    named = [(e.time_range.start, e.time_range.end, e.name) for e in kernels]
    by_both = uncovered_us(named, on_device)
    busy_us = sum(by_both.values())
    steps = engine_spec_steps(phases, llm.metrics.num_spec_steps)
    idle = idle_by_phase(spans, phases)
    by_phase: Counter = Counter()
    for (phase, _), us in by_both.items():
        by_phase[phase] += us
    names, durations, uncovered = Counter(), Counter(), Counter()  # by kernel_label
    for e in kernels:
        label = kernel_label(e.name)
        names[label] += 1
        durations[label] += e.time_range.end - e.time_range.start
    for name, us in uncovered_us(named).items():
        uncovered[kernel_label(name)] += us
    top = {name: round(count / max(1, steps), 1) for name, count in names.most_common(20)}
    top_time = {name: {"ms": round(us / 1e3, 2), "calls": names[name], "us_per_call": round(us / names[name], 2),
                            "uncovered_us_per_call": round(uncovered.get(name, 0.0) / names[name], 2)}
                for name, us in durations.most_common(40)}
    return {"wall_ms": wall_us / 1e3, "gpu_busy_ms": busy_us / 1e3, "gpu_idle_ms": (wall_us - busy_us) / 1e3,
            "gpu_kernels": len(kernels), "spec_steps": steps, "kernels_per_spec_step": len(kernels) / max(1, steps),
            "mean_kernel_us": busy_us / max(1, len(kernels)),
            "gpu_idle_ms_by_host_phase": {k: round(v / 1e3, 2) for k, v in sorted(idle.items(), key=lambda kv: -kv[1])},
            "busy_ms_per_spec_step_by_phase": {k: round(v / 1e3 / max(1, steps), 4)
                                               for k, v in sorted(by_phase.items(), key=lambda kv: -kv[1])},
            "top_kernels_per_spec_step": top, "top_kernels_by_time": top_time,
            "uncovered_us_per_spec_step_by_phase": top_by_phase(by_both, steps)}


def main(argv=None) -> dict:
    p = CommandParser(prog="python -m protospec.bench.kernel_census", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="JackFram/llama-160m", help="target (default: %(default)s)")
    p.add_argument("--speculative-model", default="JackFram/llama-68m", help="draft (default: %(default)s)")
    p.add_argument("--num-speculative-tokens", type=int, default=5, help="k (default: %(default)s)")
    p.add_argument("--input-len", type=int, default=256, help="prompt tokens (default: %(default)s)")
    p.add_argument("--output-len", type=int, default=128, help="generated tokens (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=1, help="requests per generate() (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (default: %(default)s)")
    p.add_argument("--modes", nargs="+", default=[m for m in MODES if m != registry.SAMPLER], choices=MODES,
                   help="draft-loop modes (default: %(default)s)")
    p.add_argument("--target-only", action="store_true",
                   help="also target-only decoding (the engine without a draft): GPU busy and wall per token "
                        "against the target's weights floor")
    add_engine_flags(p)
    p.add_argument("--output-json", default=None, help="write the census here as JSON")
    args = p.parse_args(argv)
    check_writable(args.output_json)
    if not torch.cuda.is_available():
        raise SystemExit("kernel_census needs a CUDA device (it counts GPU kernels)")
    setup = BenchSetup(args.model, args.speculative_model, args.num_speculative_tokens, args.input_len, args.output_len,
                       args.batch_size, 3, 1, load_format="dummy", temperature=args.temperature, **engine_switches(args))
    llm = setup.llm()
    floor = spec_step_floor(llm, args.num_speculative_tokens, copy_bandwidth_gbs(llm.engine.device))
    print(f"weights per spec step: {floor['spec_step_weight_mb']:.0f} MB ({args.num_speculative_tokens} x draft "
          f"{floor['draft_weight_mb']:.0f} + target {floor['target_weight_mb']:.0f}), floor "
          f"{floor['floor_ms_per_spec_step']:.3f} ms at {floor['copy_bandwidth_gbs']:.0f} GB/s")
    report = provenance(llm.engine.device, argv, "protospec.bench.kernel_census") | {
        "config": vars(args), "kernel_plan": llm.engine.plan.as_record(), "floor": floor, "modes": {}}
    for mode in args.modes:
        r = census(llm, setup, mode)
        r["busy_ms_per_spec_step"] = r["gpu_busy_ms"] / max(1, r["spec_steps"])
        r["busy_over_floor"] = r["busy_ms_per_spec_step"] / floor["floor_ms_per_spec_step"]
        report["modes"][mode] = r
        print(f"{mode:>7}: wall {r['wall_ms']:.1f} ms, GPU busy {r['gpu_busy_ms']:.1f} ms, idle {r['gpu_idle_ms']:.1f} ms, "
              f"{r['gpu_kernels']} kernels ({r['kernels_per_spec_step']:.0f} per spec step, {r['mean_kernel_us']:.1f} us mean)")
        print(f"         GPU busy per spec step {r['busy_ms_per_spec_step']:.3f} ms = {r['busy_over_floor']:.1f}x its "
              f"weights floor ({r['spec_steps']} spec steps)")
        print(f"         idle ms by the host phase that ended it: {r['gpu_idle_ms_by_host_phase']}")
        print(f"         busy ms per spec step by the phase that launched it: {r['busy_ms_per_spec_step_by_phase']}")
        for name, t in list(r["top_kernels_by_time"].items())[:6]:
            print(f"         {t['ms']:8.2f} ms  {t['calls']:6d} x {t['us_per_call']:7.2f} us "
                  f"({t['uncovered_us_per_call']:6.2f} us not overlapped)  {name[:100]}")
    if args.target_only:
        del llm
        report["target_only"] = target_only_census(setup, floor)
    write_report(args.output_json, report)
    return report


def target_only_census(setup: BenchSetup, floor: dict) -> dict:
    """Target-only decoding's kernels, per output token (the prefill's included): GPU busy against
    the target's weights at the copy rate (each decode step reads them once), and wall against busy."""
    llm = setup.llm(speculative=False)
    r = census(llm, setup, None)
    tokens = setup.output_len  # a batch's decode step reads the weights once for all its requests
    floor_ms = floor["target_weight_mb"] / floor["copy_bandwidth_gbs"]  # MB / (GB/s) = ms
    r.update(tokens_per_request=tokens, floor_ms_per_token=floor_ms, busy_ms_per_token=r["gpu_busy_ms"] / tokens,
             wall_ms_per_token=r["wall_ms"] / tokens, counters=llm.counters)
    r["busy_over_floor"] = r["busy_ms_per_token"] / floor_ms
    r["wall_over_busy"] = r["wall_ms"] / r["gpu_busy_ms"]
    print(f"target_only: wall {r['wall_ms']:.2f} ms, GPU busy {r['gpu_busy_ms']:.2f} ms for {tokens} tokens a request: "
          f"busy {r['busy_ms_per_token'] * 1e3:.1f} us a token = {r['busy_over_floor']:.2f}x its weights floor "
          f"({floor_ms * 1e3:.1f} us), wall / busy {r['wall_over_busy']:.2f}")
    for name, t in list(r["top_kernels_by_time"].items())[:8]:
        print(f"         {t['ms']:8.2f} ms  {t['calls']:6d} x {t['us_per_call']:7.2f} us  {name[:100]}")
    return r


if __name__ == "__main__":
    run_command(main)

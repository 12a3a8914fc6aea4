"""Smoke tests of python -m protospec.bench on a tiny dummy config (CPU; the gpu mode in the simulator)."""
import json
import re

import numpy as np
import pytest
import torch

from protospec.bench import report as report_mod
from protospec.bench.cli import main

TINY = ["--num-speculative-tokens", "3", "--input-len", "8", "--output-len", "10", "--batch-size", "1",
        "--num-iters-warmup", "1", "--num-iters", "2", "--load-format", "dummy", "--use-v2-block-manager"]


def test_latency_run_prints_the_benchmark_latency_lines(tiny_target, tiny_draft, capsys, tmp_path):
    out_json = tmp_path / "run.json"
    main(["--model", tiny_target, "--speculative-model", tiny_draft, *TINY, "--output-json", str(out_json)])
    out = capsys.readouterr().out
    assert re.search(r"^Avg latency: [0-9.e-]+ seconds$", out, re.M)
    for p in (10, 25, 50, 75, 90, 99):
        assert re.search(rf"^{p}% percentile latency: [0-9.e-]+ seconds$", out, re.M), p
    assert "acceptance rate:" in out and "path counters:" in out
    saved = json.loads(out_json.read_text())
    assert {"device", "date", "git_commit", "command", "config", "result"} <= saved.keys()
    assert len(saved["result"]["latencies_s"]) == 2
    # vLLM's benchmark_latency keys, so a reader written for vLLM's JSON reads ours
    assert saved["latencies"] == saved["result"]["latencies_s"] and saved["avg_latency"] == saved["result"]["avg_s"]
    assert saved["percentiles"]["50"] == saved["result"]["p50_s"] and saved["torch_threads"] >= 1


# On CUDA hf_compiled compiles with CUDA graphs, after which this process's own graph captures fail
# (hf_peer.HFGenerate says why): there it runs in a process of its own (the test below).
IN_PROCESS_PEERS = ["target_only", "hf_assisted", "hf_target_only", "unfused"] + (
    [] if torch.cuda.is_available() else ["hf_static_loop", "hf_compiled"])


def test_ablation_writes_json_markdown_and_plots(tiny_target, tiny_draft, tmp_path, capsys):
    main(["--model", tiny_target, "--speculative-model", tiny_draft, *TINY, "--ablation", "--breakdown",
          "--repeats", "1", "--peers", *IN_PROCESS_PEERS, "--output-dir", str(tmp_path)])
    files = {p.suffix: p for p in tmp_path.iterdir() if "breakdown" not in p.name}
    report = json.loads(files[".json"].read_text())
    assert {"device", "date", "git_commit", "command", "config", "modes"} <= report.keys()
    assert set(report["modes"]) == {"main", "sampler", "gpu_sync_commit", "gpu", "graph", *IN_PROCESS_PEERS}
    if not torch.cuda.is_available():
        assert "CUDA" in report["modes"]["graph"]["skipped"]  # CPU: the graph mode says why it did not run
    # the tiny pair is float32 (and on a CPU has no layer kernels): no linear is fused, so nothing to switch off
    assert "nothing to switch off" in report["modes"]["unfused"]["skipped"]
    for name, entry in report["modes"].items():
        if "skipped" in entry:
            continue
        assert len(entry["latencies_s"]) == 2
        for key in ("p10_s", "p25_s", "p50_s", "p75_s", "p90_s", "p99_s", "avg_s"):
            assert entry[key] > 0, (name, key)
    for mode in ("main", "sampler", "gpu_sync_commit", "gpu"):
        entry = report["modes"][mode]
        assert 0 <= entry["acceptance_rate"] <= 1 and entry["system_efficiency"] > 0 and entry["mean_accepted_len"] >= 1
        assert "draft" in entry["counters"] and "breakdown_ms_per_call" in entry
    # gpu_sync_commit is vLLM's change: every draft step 1 CPU-prepared; gpu builds most on the device
    assert "gpu_first_step" not in report["modes"]["gpu_sync_commit"]["counters"]["draft"]
    assert report["modes"]["gpu"]["counters"]["draft"]["gpu_first_step"] > 0
    assert report["modes"]["gpu"]["counters"]["draft"]["gpu_advance"] > 0
    assert "gpu_advance" not in report["modes"]["main"]["counters"]["draft"]
    assert files[".png"].stat().st_size > 10_000
    assert any("breakdown" in p.name for p in tmp_path.iterdir())
    table = files[".md"].read_text()
    assert "| main |" in table and "| hf_assisted |" in table
    fastest = min((e["p50_s"], n) for n, e in report["modes"].items() if n in ("main", "sampler", "gpu_sync_commit", "gpu", "graph")
                  and "p50_s" in e)[1]
    assert f"Fastest mode: {fastest}." in table and f"p50(hf_target_only) / p50({fastest}) = " in table
    # The modes differ in where inputs are built, not in what they emit: one token digest for all
    digests = {report["modes"][m]["token_digest"] for m in ("main", "sampler", "gpu_sync_commit", "gpu")}
    assert len(digests) == 1 and len(digests.pop()) == 16
    line = next(t for t in table.splitlines() if t.startswith("Output tokens"))
    same = line.split(f"the same as {fastest}'s in ")[1].split(";")[0].split(", ")
    assert {"main", "sampler", "gpu_sync_commit", "gpu"} - {fastest} <= set(same)
    if not torch.cuda.is_available():  # generate() compiles only on CUDA: the report says so
        assert report["modes"]["hf_compiled"]["torch_compiled_graphs"] == 0 and "none: a static cache only" in table
    # the honest baseline against the fastest mode, round by round
    target_only = report["modes"]["target_only"]
    assert target_only["fastest_mode"] == fastest and len(target_only["ratio_to_fastest_per_round"]) == 1
    assert target_only["ratio_to_fastest_per_round"][0] == pytest.approx(target_only["p50_s"] / report["modes"][fastest]["p50_s"])
    assert f"p50(target_only) / p50({fastest}) in each round: " in table
    if not torch.cuda.is_available():  # a CPU run says what its numbers are not
        assert "say nothing about a GPU" in table and "say nothing about a GPU" in capsys.readouterr().out


def test_sweep_writes_a_plot(tiny_target, tiny_draft, tmp_path):
    main(["--model", tiny_target, "--speculative-model", tiny_draft, *TINY, "--sweep", "--sweep-batch-sizes", "1", "2",
          "--sweep-ks", "1", "2", "--modes", "main", "gpu", "--output-dir", str(tmp_path)])
    report = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert len(report["sweep"]["points"]) == 2 * 2 * 2
    # tokens a spec step: at least the one the verify always makes, at most k + 1
    assert all(1.0 <= p["mean_accepted_len"] <= p["k"] + 1 for p in report["sweep"]["points"])
    digests = {(p["k"], p["batch_size"]): set() for p in report["sweep"]["points"]}
    for p in report["sweep"]["points"]:  # the modes sample with the same numbers: the same tokens at a point
        digests[p["k"], p["batch_size"]].add(p["token_digest"])
    assert all(len(d) == 1 and len(next(iter(d))) == 16 for d in digests.values())
    assert next(tmp_path.glob("*_sweep_*.png")).stat().st_size > 10_000  # sweep-only: date_device_sweep_commit_time.png
    # A sweep alone still records its configuration, so the plot's title names the pair, not "None".
    assert (report["config"]["model"], report["config"]["speculative_model"]) == (tiny_target, tiny_draft)
    title = report_mod.config_title(report, sweep=True)
    assert tiny_target in title and "None" not in title


def test_sweep_rounds_interleave_the_grid_and_report_medians(monkeypatch):
    # Scripted timings: the grid must run round by round (every point once, then again), and a point's
    # figures are the medians of its rounds', whatever order its slow and fast rounds came in.
    from protospec.bench import ablation

    calls, script = [], iter([0.3, 9.0, 0.1, 0.2, 0.2, 0.4])  # (batch 1, batch 4) x 3 rounds, in call order
    from types import SimpleNamespace

    plan = SimpleNamespace(as_record=lambda: {"layer_kernels": True})
    monkeypatch.setattr(ablation.BenchSetup, "llm",
                        lambda self: SimpleNamespace(batch=self.batch_size, engine=SimpleNamespace(plan=plan)))
    monkeypatch.setattr(ablation, "_release_memory", lambda: None)

    def fake_run_mode(llm, setup, mode, breakdown):
        calls.append(llm.batch)
        p50 = next(script)
        digest = "d1" if llm.batch == 1 else f"d4-{len(calls) // 2}"  # batch 4 makes other tokens each round
        return {"p50_s": p50, "p10_s": p50 / 2, "p90_s": p50 * 2, "acceptance_rate": 0.5, "mean_accepted_len": 2.0,
                "token_digest": digest}

    monkeypatch.setattr(ablation, "run_mode", fake_run_mode)
    setup = ablation.BenchSetup(model="m", speculative_model="d", num_speculative_tokens=5, input_len=8, output_len=8,
                                batch_size=1, num_iters_warmup=0, num_iters=1)
    sweep = ablation.run_sweep(setup, batch_sizes=(1, 4), ks=(5,), modes=["graph"], log=lambda *_: None, rounds=3)
    assert calls == [1, 4, 1, 4, 1, 4]
    by_batch = {p["batch_size"]: p for p in sweep["points"]}
    assert by_batch[1]["p50_rounds_s"] == [0.3, 0.1, 0.2] and by_batch[1]["p50_s"] == 0.2
    assert by_batch[4]["p50_rounds_s"] == [9.0, 0.2, 0.4] and by_batch[4]["p50_s"] == 0.4 and by_batch[4]["p90_s"] == 0.8
    assert sweep["rounds"] == 3
    assert by_batch[1]["kernel_plan"] == by_batch[4]["kernel_plan"] == {"layer_kernels": True}  # each point says its kernels
    assert by_batch[1]["token_digest"] == "d1"
    assert by_batch[4]["token_digest"] == "differs between rounds: d4-1, d4-2, d4-3"


def test_cpu_default_is_small(monkeypatch):
    from protospec.bench.args import build_parser, resolve_args

    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    args = resolve_args(build_parser().parse_args([]))
    assert (args.model, args.speculative_model, args.input_len, args.output_len) == (
        "JackFram/llama-160m", "JackFram/llama-68m", 32, 32)
    assert args.load_format == "dummy"


@pytest.mark.parametrize("flipped", [False, True], ids=["defaults", "flipped"])
def test_the_engine_flags_reach_the_engine_and_its_kernel_plan(tiny_target, tiny_draft, flipped):
    """--prefill-kernels reaches the engine (the plan it resolves: prefill kernels on by default on a GPU,
    off in the simulator; flipped asks for the other)."""
    from protospec.bench.args import build_parser, resolve_args, setup_from

    default = torch.cuda.is_available()
    flags = ["--prefill-kernels", "off" if default else "on"] if flipped else []
    args = resolve_args(build_parser().parse_args(["--model", tiny_target, "--speculative-model", tiny_draft, *TINY,
                                                   "--layer-kernels", "on", *flags]))
    engine = setup_from(args).llm(draft_loop="gpu").engine
    expected = default != flipped
    assert engine.plan.prefill_kernels is expected
    assert engine.target.model.layer_kernels.long_chunks is engine.draft.model.layer_kernels.long_chunks is expected
    assert engine.plan.as_record()["prefill_kernels"] is expected


@pytest.mark.parametrize("flag", ["--draft-equals-target"])
def test_draft_equals_target_flag(flag):
    from protospec.bench.args import build_parser, resolve_args

    args = resolve_args(build_parser().parse_args(["--model", "x", "--speculative-model", "y", flag]))
    assert args.speculative_model == "x"


def test_plain_cpu_run_names_why_the_gpu_path_did_not_run(tiny_target, tiny_draft, capsys):
    main(["--model", tiny_target, "--speculative-model", tiny_draft, *TINY, "--device", "cpu"])
    out = capsys.readouterr().out
    assert "draft_loop=main" in out and "fallback:no_cuda_device" in out


def test_repeated_rounds_are_pooled(tiny_target, tiny_draft, tmp_path):
    main(["--model", tiny_target, "--speculative-model", tiny_draft, *TINY, "--ablation", "--repeats", "2",
          "--modes", "main", "gpu", "--peers", "--output-dir", str(tmp_path)])
    report = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert report["config"]["repeats"] == 2
    gpu = report["modes"]["gpu"]
    assert len(gpu["latencies_s"]) == 4 and len(gpu["ratio_to_main_per_round"]) == 2
    assert report["modes"]["main"]["ratio_to_main_per_round"] == [1.0, 1.0]
    assert gpu["token_digest"] == report["modes"]["main"]["token_digest"] and len(gpu["token_digest"]) == 16
    assert "in each round" in next(tmp_path.glob("*.md")).read_text()


def test_kernel_census_merges_overlapping_intervals():
    from protospec.bench.kernel_census import uncovered_us

    spans = [(0, 10, "a"), (5, 12, "b"), (20, 25, "a"), (21, 22, "c")]
    assert sum(uncovered_us(spans).values()) == 17  # [0,12) + [20,25)
    assert uncovered_us([]) == {}


def test_kernel_census_counts_engine_steps_not_the_requests_steps():
    from protospec.bench.kernel_census import engine_spec_steps
    # Two engine steps of a batch of 3: six request steps, two verifies.
    phases = [(0, 5, "draft_loop_graph"), (5, 9, "verify"), (9, 10, "commit"), (10, 15, "draft_loop_graph"),
              (15, 19, "verify")]
    assert engine_spec_steps(phases, request_steps=6) == 2
    assert engine_spec_steps([], request_steps=6) == 6   # nothing recorded: the requests' count
    # a step replayed whole as one graph has no verify phase of its own
    assert engine_spec_steps(phases + [(20, 30, "step_graph"), (30, 35, "commit")], request_steps=9) == 3


def test_kernel_census_charges_each_idle_gap_to_the_phase_that_ended_it():
    from protospec.bench.kernel_census import idle_by_phase

    kernels = [(0, 10), (30, 40), (38, 45), (100, 110), (200, 205)]  # gaps: 20, 55, 90 us
    phases = [(20, 60, "commit"), (80, 120, "begin"), (85, 99, "prepare")]  # prepare nests in begin
    gaps = idle_by_phase(kernels, phases, launch_lead_us=4)
    # 30 - 4 = 26 in commit; 96 in begin and prepare -> the inner one; 196 in no phase
    assert gaps == {"commit": 20, "prepare": 55, "outside_spec_step": 90}
    assert idle_by_phase([], phases) == {}


def test_kernel_census_charges_each_kernel_to_the_innermost_phase_that_launched_it():
    from protospec.bench.kernel_census import uncovered_us

    # (12, 20) starts while (10, 13) runs (a dependent launch): the overlap is charged once, to the first
    kernels = [(0, 4, "k"), (10, 13, "k"), (12, 20, "k"), (50, 51, "k"), (90, 95, "k"), (91, 93, "k")]
    ranges = [(0, 21, "draft_loop_graph"), (11, 21, "sampling"), (40, 60, "verify")]  # sampling nests in the graph
    assert uncovered_us(kernels, ranges) == {("draft_loop_graph", "k"): 4 + 3, ("sampling", "k"): 7,
                                             ("verify", "k"): 1, ("outside_spec_step", "k"): 5}
    # a phase whose first kernel also opens its parent's device range: the inner one (the shorter) wins
    assert uncovered_us([(0, 2, "k"), (5, 9, "k")], [(0, 10, "draft_loop_graph"), (0, 4, "sampling")]) == {
        ("sampling", "k"): 2, ("draft_loop_graph", "k"): 4}


def test_kernel_census_charges_each_kernel_name_only_its_uncovered_time():
    from protospec.bench.kernel_census import uncovered_us

    # a dependent (qkv) starts while attention runs; a copy hides inside a GEMV's span entirely
    kernels = [(0, 5, "attention"), (3, 9, "qkv"), (9, 12, "attention"), (20, 30, "gemv"), (22, 24, "copy")]
    assert uncovered_us(kernels) == {"attention": 5 + 3, "qkv": 4, "gemv": 10}


def test_kernel_census_splits_each_phases_uncovered_time_by_kernel_name():
    from protospec.bench.kernel_census import top_by_phase, uncovered_us

    kernels = [(0, 5, "gemm"), (3, 9, "norm"), (9, 12, "gemm"), (20, 30, "gemv"), (22, 24, "copy"), (40, 41, "gemv")]
    ranges = [(0, 13, "prefill"), (20, 31, "step_graph")]  # (40, 41) runs in no phase
    by_both = uncovered_us(kernels, ranges)
    assert by_both == {("prefill", "gemm"): 8, ("prefill", "norm"): 4, ("step_graph", "gemv"): 10,
                       ("outside_spec_step", "gemv"): 1}
    # per spec step (2 here), the largest first, at most per_phase names a phase
    assert top_by_phase(by_both, steps=2, per_phase=1) == {"prefill": {"gemm": 4.0}, "step_graph": {"gemv": 5.0},
                                                          "outside_spec_step": {"gemv": 0.5}}


def test_kernel_census_labels_keep_two_specializations_of_one_kernel_apart():
    from protospec.bench.kernel_census import kernel_label, top_by_phase

    # Numba's names for two compiled forms of one kernel differ only past their first 90 characters
    stem = "protospec::kernels::attention::mma_kernel::make_mma_kernel::_3clocals_3e::attention_mma_kernel"
    decode, prefill = (f"{stem}[abi:v{v}][abi:cw51cXTLSUwv1sDUaKtLoBzEW4A_2fADJdlUE+kjgA](Array<long long, 3>, int)"
                       for v in (12, 13))
    assert kernel_label(decode) == "attention::mma_kernel::make_mma_kernel.attention_mma_kernel[abi:v12]"
    assert kernel_label(decode) != kernel_label(prefill)
    torch_name = "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::fill>(int, float)"
    assert "(anonymous namespace)" in kernel_label(torch_name)  # not cut at the template's first parenthesis
    # both forms keep their own time in a phase; labels that do collide add up rather than overwrite
    uncovered = {("verify", decode): 30.0, ("verify", prefill): 2.0, ("verify", decode + " "): 4.0}
    assert top_by_phase(uncovered, steps=2) == {"verify": {kernel_label(decode): 17.0, kernel_label(prefill): 1.0}}


def _census(commit: str, by_phase: dict) -> dict:
    return {"git_commit": commit, "device": "NVIDIA H200",
            "config": {"num_speculative_tokens": 5, "batch_size": 1},
            "floor": {"copy_bandwidth_gbs": 4000.0, "draft_weight_mb": 80.0, "target_weight_mb": 200.0},
            "modes": {"graph": {"busy_ms_per_spec_step_by_phase": by_phase}}}


def test_the_phase_plot_groups_phases_and_puts_the_floors_where_weights_are_read():
    from protospec.bench.phase_plot import GROUPS, phase_rows, plot_phases

    before = _census("aaa", {"draft_forward": 0.1, "draft_loop_graph": 0.4, "verify": 0.5, "sampling": 0.2,
                             "rejection": 0.04, "prepare": 0.01, "commit": 0.02, "somewhere_new": 0.03})
    rows = phase_rows(before)
    assert rows["draft forwards"]["busy_ms"] == pytest.approx(0.5) and rows["verify"]["busy_ms"] == 0.5
    assert rows["rest"]["busy_ms"] == pytest.approx(0.06)  # prepare + commit + a phase no group names
    assert rows["draft forwards"]["floor_ms"] == pytest.approx(5 * 80 / 4000) and rows["verify"]["floor_ms"] == 0.05
    assert rows["sampling"]["floor_ms"] is None
    assert sum(r["busy_ms"] for r in rows.values()) == pytest.approx(sum(before["modes"]["graph"]["busy_ms_per_spec_step_by_phase"].values()))
    fig = plot_phases({"before": before, "after": _census("bbb", {"verify": 0.3})})
    ax = fig.axes[0]
    assert len(ax.patches) == 2 * len(GROUPS)  # a bar per group per census
    assert len(ax.collections) == 2 * 3  # floor ticks: draft forwards, verify and the whole step, per census
    whole = phase_rows(_census("ddd", {"step_graph": 0.7, "commit": 0.01}))["whole step graph"]
    assert whole["busy_ms"] == 0.7 and whole["floor_ms"] == pytest.approx(5 * 80 / 4000 + 0.05)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["before (aaa)", "after (bbb)"]
    old = _census("ccc", {})
    del old["modes"]["graph"]["busy_ms_per_spec_step_by_phase"]
    with pytest.raises(ValueError, match="ccc has no busy time by phase"):
        phase_rows(old)


def test_the_bench_runs_the_trained_pair(tmp_path, capsys):
    """The trained pair through the bench: `--model data/models/protospec-target --speculative-model data/models/protospec-draft`."""
    from pathlib import Path

    models = Path(__file__).resolve().parents[1] / "data" / "models"
    out_json = tmp_path / "pair.json"
    main(["--model", str(models / "protospec-target"), "--speculative-model", str(models / "protospec-draft"),
          "--num-speculative-tokens", "5", "--input-len", "16", "--output-len", "12", "--num-iters-warmup", "1",
          "--num-iters", "1", "--temperature", "0", "--output-json", str(out_json)])
    saved = json.loads(out_json.read_text())
    result = saved["result"]
    assert result["acceptance_rate"] is not None and 0 <= result["prefix_acceptance_rate"] <= result["acceptance_rate"] <= 1
    assert len(result["per_position_acceptance"]) == 5
    # A named checkpoint loads its weights (dummy is the bare command's default only): with them the
    # trained draft agrees with its target on some greedy tokens; two random models would not.
    assert saved["config"]["load_format"] == "auto" and result["acceptance_rate"] > 0.1


def test_profile_writes_a_trace(tiny_target, tiny_draft, tmp_path, capsys):
    main(["--model", tiny_target, "--speculative-model", tiny_draft, *TINY, "--profile",
          "--profile-result-dir", str(tmp_path)])
    trace = next(tmp_path.glob("trace_*.json"))
    assert "traceEvents" in json.loads(trace.read_text())
    assert str(trace) in capsys.readouterr().out


@pytest.mark.parametrize("flags", [["--proposer", "ngram"], ["--speculative-model", "[ngram]", "--ngram-prompt-lookup-max", "2"]])
def test_the_ngram_proposer_and_typical_acceptance_through_the_bench(tiny_target, tmp_path, capsys, flags):
    out_json = tmp_path / "ngram.json"
    main(["--model", tiny_target, *flags, *TINY, "--spec-decoding-acceptance-method", "typical_acceptance_sampler",
          "--typical-acceptance-sampler-posterior-threshold", "0.2",
          "--speculative-disable-by-batch-size", "4", "--output-json", str(out_json)])
    saved = json.loads(out_json.read_text())
    cfg = saved["config"]
    assert cfg["speculative_model"] == "[ngram]" and cfg["acceptance"] == "typical" and cfg["posterior_threshold"] == 0.2
    assert cfg["prompt_lookup_max"] == (2 if "2" in flags else 4)
    assert cfg["speculative_disable_by_batch_size"] == 4
    # auto: on a GPU the match runs as a kernel; on a CPU, where auto is the main way, on the host
    where = "kernel" if torch.cuda.is_available() else "cpu"
    assert f"ngram_match:{where}" in saved["result"]["counters"]["proposer"]


def test_compare_runs_every_arm_and_writes_its_report(tmp_path, capsys):
    """--compare on the trained pair (two prompts, a few tokens): every arm at both temperatures, JSON,
    markdown and a plot; greedy arms under lossless rejection emit the target-only tokens' rates."""
    from pathlib import Path

    report = main(["--compare", "--compare-prompts", "2", "--compare-max-tokens", "8", "--compare-repeats", "1",
                   "--output-dir", str(tmp_path)])
    rows = report["compare"]
    assert set(rows) == {"target_only"} | {f"{p}/{a}" for p in ("draft", "ngram") for a in ("rejection", "typical")}
    for name, entry in rows.items():
        for temp in ("T=0", "T=1"):
            assert entry[temp]["calls"] == 2 and entry[temp]["p50_s"] > 0
    assert rows["draft/rejection"]["T=0"]["acceptance_rate"] > 0.1  # the trained draft drafts
    written = sorted(p.suffix for p in Path(tmp_path).iterdir())
    assert written == [".json", ".md", ".png"]
    assert "target-only / arm" in capsys.readouterr().out


def test_compare_timing_takes_each_prompts_median_and_counts_tokens_once():
    """Repeated passes: a prompt's latency is the median of its passes, its metrics are merged once."""
    from protospec.bench.compare import _time_prompts
    from protospec.requests.metrics import RequestMetrics

    class FakeLLM:
        def __init__(self):
            self.calls = 0

        def generate(self, prompts, params):
            self.calls += 1
            self.metrics = RequestMetrics()
            self.metrics.num_spec_steps = 1
            # warm-up call, then pass 1 (prompts a, b), pass 2, pass 3
            self.metrics.elapsed_s = {2: 5.0, 3: 1.0, 4: 2.0, 5: 30.0, 6: 3.0, 7: 4.0}.get(self.calls, 0.0)

    total, times = _time_prompts(FakeLLM(), [[1], [2]], None, repeats=3)
    assert times == [3.0, 4.0]  # median(5, 2, 3) and median(1, 30, 4)
    assert total.num_spec_steps == 2


def test_the_static_cache_peer_decodes_what_transformers_and_protospec_decode(tiny_target):
    """hf_compiled's generate() (static KV cache) gives the greedy tokens of transformers' default cache
    and of protospec's target-only decoding, on the same weights: the peer times the same work."""
    from protospec import LLM, SamplingParams
    from protospec.bench.hf_peer import HFGenerate, to_hf

    llm = LLM(tiny_target, load_format="dummy", dtype="float32", seed=0)
    prompts = [[3, 9, 4, 11, 7, 2], [5, 5, 8, 1, 6, 10]]
    hf = to_hf(llm.engine.target.model)
    static = HFGenerate(hf, prompts, 12, 0.0, static_cache=True, compile=False)()[:, len(prompts[0]):]
    dynamic = HFGenerate(hf, prompts, 12, 0.0)()[:, len(prompts[0]):]
    ours = [out.token_ids for out in llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))]
    assert static.tolist() == dynamic.tolist()
    eos = hf.config.eos_token_id
    for row, theirs in zip(ours, static.tolist()):
        # transformers bans EOS until min_new_tokens; protospec's ignore_eos may emit it and go on
        upto = row.index(eos) if eos in row else len(row)
        assert row[:upto] == theirs[:upto] and upto >= 4
    assert HFGenerate(hf, prompts, 12, 0.0, static_cache=True).kwargs["cache_implementation"] == "static"


def test_the_static_loop_peer_decodes_what_generate_decodes(tiny_target):
    """hf_static_loop's hand-written loop over a StaticCache gives generate()'s greedy tokens, and its
    seeded sampling repeats: the peer times the same work as the target-only decoders."""
    from protospec import LLM
    from protospec.bench.hf_peer import HFGenerate, HFStaticLoop, to_hf

    llm = LLM(tiny_target, load_format="dummy", dtype="float32", seed=0)
    prompts = [[3, 9, 4, 11, 7, 2], [5, 5, 8, 1, 6, 10]]
    hf = to_hf(llm.engine.target.model)
    loop = HFStaticLoop(hf, prompts, 12, 0.0, compile=False)()
    assert loop.shape == (2, 6 + 12)
    theirs = HFGenerate(hf, prompts, 12, 0.0, static_cache=True, compile=False)()
    eos = hf.config.eos_token_id
    for mine, row in zip(loop[:, 6:].tolist(), theirs[:, 6:].tolist()):
        # generate() bans EOS until min_new_tokens; the loop, like ignore_eos, may emit it and go on
        upto = mine.index(eos) if eos in mine else len(mine)
        assert mine[:upto] == row[:upto] and upto >= 4
    sampled = HFStaticLoop(hf, prompts, 12, 1.0, seed=3, compile=False)
    first = sampled()
    assert sampled().tolist() == first.tolist() and first.tolist() != loop.tolist()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="generate() compiles only on CUDA")
def test_the_compiled_peer_compiles_on_cuda(tiny_target, tiny_draft, tmp_path):
    """hf_compiled in a process of its own: torch.compile runs (graphs > 0) and the table reports the ratio."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "protospec.bench", "--model", tiny_target, "--speculative-model", tiny_draft,
                          *TINY, "--ablation", "--modes", "graph", "--peers", "hf_static_loop", "hf_compiled",
                          "--output-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert report["modes"]["hf_compiled"]["torch_compiled_graphs"] > 0
    assert report["modes"]["hf_static_loop"]["torch_compiled_graphs"] > 0
    table = next(tmp_path.glob("*.md")).read_text()
    assert "p50(hf_compiled) / p50(graph) = " in table and "p50(hf_static_loop) / p50(graph) = " in table


def test_a_forward_reads_the_weights_the_design_notes_count():
    """llama-160m reads 276 MB per fp16 forward and llama-68m 87 MB (untied heads: the embedding table
    is gathered, not read); a k = 5 spec step 710 MB. A tied head is counted once, in full."""
    from protospec.bench.kernel_census import weight_bytes_per_forward
    from protospec.model.llama import LlamaForCausalLM
    from protospec.model.loader import resolve_checkpoint

    def forward_mb(name, **changes):
        cfg, _ = resolve_checkpoint(name, "dummy")
        with torch.device("meta"):
            model = LlamaForCausalLM(cfg.__class__(**{**cfg.__dict__, **changes})).half()
        return weight_bytes_per_forward(model) / 1e6

    target, draft = forward_mb("JackFram/llama-160m"), forward_mb("JackFram/llama-68m")
    assert abs(target - 276) < 1.5 and abs(draft - 87) < 1.5 and abs(5 * draft + target - 710) < 5
    assert abs(forward_mb("JackFram/llama-68m", tie_word_embeddings=True) - draft) < 0.01  # the head was the table


def test_the_unfused_peer_times_the_fastest_mode_with_the_fusion_off(tiny_target, tiny_draft, monkeypatch):
    """The unfused peer builds an engine of its own with linear_kernel="cublas" and times the mode it is
    given (the fastest) on it; it runs only where some model runs fused linears (faked here: the tiny
    pair is float32 on a CPU)."""
    from types import SimpleNamespace

    from protospec.bench.ablation import BenchSetup, run_peer

    setup = BenchSetup(tiny_target, tiny_draft, 2, 8, 6, 1, 0, 2, load_format="dummy")
    llm = setup.llm()
    assert "skipped" in run_peer("unfused", setup, llm, fastest="gpu")
    llm.engine.target.model.layer_kernels = SimpleNamespace(fuses=True)  # as a float16 engine's forward
    built, real = [], BenchSetup.llm
    monkeypatch.setattr(BenchSetup, "llm", lambda self, *a, **kw: built.append(self.linear_kernel) or real(self, *a, **kw))
    entry = run_peer("unfused", setup, llm, fastest="gpu")
    assert built == ["cublas"] and entry["mode"] == "gpu" and len(entry["latencies_s"]) == 2 and entry["p50_s"] > 0


def test_with_rounds_the_unfused_peer_runs_in_each_round_on_one_engine(tiny_target, tiny_draft, monkeypatch):
    """repeats > 1: the unfused engine is built once (after the first round, for that round's fastest
    mode) and timed at the end of every round, so its p50 pools as many rounds as the modes'; the
    report divides it by the mode it timed, and prints that ratio per round."""
    from protospec.bench import ablation
    from protospec.bench.ablation import BenchSetup, run_ablation

    setup = BenchSetup(tiny_target, tiny_draft, 2, 8, 6, 1, 0, 2, load_format="dummy")
    built, real = [], BenchSetup.llm
    monkeypatch.setattr(BenchSetup, "llm", lambda self, *a, **kw: built.append(self.linear_kernel) or real(self, *a, **kw))
    monkeypatch.setattr(ablation, "runs_fused_linears", lambda engine: True)  # as a float16 engine on a GPU
    logged = []
    report = run_ablation(setup, modes=("main", "gpu"), peers=("unfused",), repeats=2, log=logged.append)
    unfused, modes = report["modes"]["unfused"], report["modes"]
    assert built == [None, "cublas"]
    first_round_p50 = {m: float(np.percentile(modes[m]["latencies_s"][:2], 50)) for m in ("main", "gpu")}
    assert unfused["mode"] == min(first_round_p50, key=first_round_p50.get)
    assert len(unfused["latencies_s"]) == 4 == len(modes["main"]["latencies_s"])
    assert sum("peer unfused" in line for line in logged) == 2 and "round 2/2" in logged[-1]
    assert len(unfused["ratio_to_mode_per_round"]) == 2 and all(r > 0 for r in unfused["ratio_to_mode_per_round"])
    text = report_mod.markdown_table(report | {"device": "cpu", "date": "d", "git_commit": "c", "command": "x"})
    assert f"p50(unfused) / p50({unfused['mode']}) in each round: " in text
    assert f"p50(unfused) / p50({unfused['mode']}) = {unfused['p50_s'] / modes[unfused['mode']]['p50_s']:.2f}" in text


def test_a_record_names_protospecs_own_commit_or_none(tmp_path):
    """Run from a copy of the package inside another repository, a record must not take that
    repository's commit: it says "unknown" and gives the package's source hash instead, the same hash
    as the original's for the same files."""
    import shutil
    import subprocess
    import sys

    from protospec.bench import provenance

    other = tmp_path / "other_repo"
    other.mkdir()
    git = ["git", "-C", str(other), "-c", "user.email=a@b", "-c", "user.name=n"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    (other / "file.txt").write_text("x")
    subprocess.run(git + ["add", "file.txt"], check=True)
    subprocess.run(git + ["commit", "-qm", "other"], check=True)
    copy = other / "vendored"
    shutil.copytree(provenance.CHECKOUT / "protospec", copy / "protospec",
                    ignore=shutil.ignore_patterns("__pycache__"))
    code = "import json; from protospec.bench.provenance import source_identity; print(json.dumps(source_identity()))"
    out = subprocess.run([sys.executable, "-c", code], cwd=copy, capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(copy)})
    seen = json.loads(out.stdout)
    assert seen["git_commit"] == "unknown" and seen["source_sha256"] == provenance.source_hash()
    here = provenance.source_identity()  # the original: its own repository's top level (or the env's commit)
    assert here["git_commit"] != "unknown" or "source_sha256" in here


def test_the_bench_command_ends_with_status_0_after_writing_its_report(tiny_target, tiny_draft, tmp_path):
    """The README's first command as a process: a finished run exits 0 (main() returns the report to
    Python callers; the command must not hand it to sys.exit, which would print it and exit 1)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "protospec.bench", "--model", tiny_target, "--speculative-model", tiny_draft,
                          *TINY, "--ablation", "--modes", "main", "--repeats", "1", "--output-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "'modes'" not in out.stderr  # the report is in its files, not dumped on stderr
    assert json.loads(next(tmp_path.glob("*.json")).read_text())["modes"]["main"]["p50_s"] > 0

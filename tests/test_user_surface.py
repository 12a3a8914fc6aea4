"""What a user meets first: runs that never overwrite a record, vLLM's benchmark flags and JSON keys,
clear refusals, plots rendered from a small report (no model needed)."""
import json
from pathlib import Path

import pytest

from protospec.bench import report as report_mod
from protospec.bench.args import IGNORED_VLLM_FLAGS, build_parser, check_args, resolve_args
from protospec.bench.cli import vllm_result

MODES = {
    "main": {"p50_s": 0.17, "p10_s": 0.16, "p90_s": 0.19, "avg_s": 0.175, "latencies_s": [0.16, 0.17, 0.19],
             "ratio_to_main_per_round": [1.0, 1.0], "acceptance_rate": 0.7,
             "breakdown_ms_per_call": {"prepare": {"cpu_ms": 20.0, "gpu_ms": 5.0}, "verify": {"cpu_ms": 30.0, "gpu_ms": 60.0}}},
    "gpu": {"p50_s": 0.12, "p10_s": 0.11, "p90_s": 0.13, "avg_s": 0.12, "latencies_s": [0.11, 0.12, 0.13],
            "ratio_to_main_per_round": [1.40, 1.45], "acceptance_rate": 0.7,
            "breakdown_ms_per_call": {"prepare": {"cpu_ms": 4.0, "gpu_ms": 1.0}, "verify": {"cpu_ms": 28.0, "gpu_ms": 60.0}}},
    "gpu_sync_commit": {"p50_s": 0.13, "p10_s": 0.12, "p90_s": 0.14, "avg_s": 0.13, "latencies_s": [0.13]},
    "target_only": {"p50_s": 0.14, "p10_s": 0.14, "p90_s": 0.15, "avg_s": 0.14, "latencies_s": [0.14]},
    "hf_assisted": {"p50_s": 2.6, "p10_s": 2.5, "p90_s": 2.8, "avg_s": 2.6, "latencies_s": [2.6]},
}
CONFIG = {"model": "JackFram/llama-160m", "speculative_model": "JackFram/llama-68m", "num_speculative_tokens": 5,
          "input_len": 256, "output_len": 128, "batch_size": 1, "resolved_dtype": "torch.float16", "temperature": 1.0,
          "num_iters_warmup": 5, "num_iters": 10, "cuda_graphs": True, "repeats": 2}


def _report(**extra):
    return {"device": "NVIDIA H200", "date": "2026-12-01T03:04:05+00:00", "git_commit": "8f11270d75c8",
            "command": "python -m protospec.bench --ablation", "config": CONFIG, "modes": MODES,
            "device_type": "cuda", "torch_threads": 1} | extra


def test_a_second_run_of_record_leaves_the_first_byte_identical(tmp_path):
    first = report_mod.write_report(_report(), tmp_path, "ablation", record=True)
    before = {p: open(p, "rb").read() for p in first.values()}
    changed = _report(modes=dict(MODES, main=dict(MODES["main"], p50_s=0.18)))
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        report_mod.write_report(changed, tmp_path, "ablation", record=True)
    assert {p: open(p, "rb").read() for p in first.values()} == before
    report_mod.write_report(changed, tmp_path, "ablation", record=True, force=True)  # on purpose: replaced
    assert json.loads(open(first["json"]).read())["modes"]["main"]["p50_s"] == 0.18


def test_runs_that_are_not_records_carry_their_time_and_commit(tmp_path):
    stems = {report_mod.report_stem(_report(date=f"2026-12-01T03:04:0{s}+00:00"), "ablation") for s in (5, 6)}
    assert len(stems) == 2 and all("8f11270" in s for s in stems)
    assert report_mod.report_stem(_report(), "ablation", record=True) == "2026-12-01_nvidia-h200_ablation_8f11270"


def test_the_bench_writes_under_runs_unless_recording():
    assert resolve_args(build_parser().parse_args(["--model", "m"])).output_dir == "runs"
    assert resolve_args(build_parser().parse_args(["--model", "m", "--record"])).output_dir == "data/results"


def test_a_cpu_run_sets_one_thread_and_rounds_are_round_robin_by_default(monkeypatch):
    import torch

    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    threads = torch.get_num_threads()
    try:
        args = resolve_args(build_parser().parse_args(["--model", "m"]))
        assert args.threads == 1 == torch.get_num_threads()  # set, and what is reported is what runs
        assert args.repeats == 3
    finally:
        torch.set_num_threads(threads)


def test_vllms_output_keys():
    out = vllm_result([0.1, 0.2, 0.3, 0.4])
    assert out["avg_latency"] == pytest.approx(0.25) and out["latencies"] == [0.1, 0.2, 0.3, 0.4]
    assert set(out["percentiles"]) == {"10", "25", "50", "75", "90", "99"}
    assert out["percentiles"]["50"] == pytest.approx(0.25)


def test_vllms_flags_are_accepted_and_the_inapplicable_ones_named():
    argv = ["--model", "m", "--tensor-parallel-size", "2", "--trust-remote-code", "--tokenizer", "t",
            "--enforce-eager", "--max-model-len", "512", "--dtype", "half", "--n", "1"]
    args = resolve_args(build_parser().parse_args(argv))
    warnings = []
    check_args(args, warn=warnings.append)
    assert args.dtype == "float16" and args.enforce_eager and args.max_model_len == 512
    named = " ".join(warnings)
    assert "--tensor-parallel-size" in named and "--trust-remote-code" in named and "--tokenizer" in named
    assert "--enforce-eager" not in named and len(warnings) == 3
    assert len(IGNORED_VLLM_FLAGS) >= 10


@pytest.mark.parametrize("argv,message", [
    (["--n", "2"], "--n 2"),
    (["--use-beam-search"], "beam search"),
    (["--num-iters", "0"], "--num-iters must be >= 1"),
    (["--enforce-eager", "--draft-loop", "graph"], "enforce-eager"),
])
def test_what_cannot_be_honoured_is_refused_by_name(argv, message):
    args = resolve_args(build_parser().parse_args(["--model", "m", *argv]))
    with pytest.raises(SystemExit, match=message):
        check_args(args, warn=lambda _: None)


def test_abbreviated_flags_are_refused(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--num-iter", "3"])  # argparse would have taken it for --num-iters
    assert "unrecognized arguments: --num-iter" in capsys.readouterr().err


def test_every_option_has_help():
    missing = [a.option_strings for a in build_parser()._actions if not a.help]
    assert missing == []


def test_train_refuses_a_non_empty_out_before_any_work(tmp_path):
    from protospec.train.__main__ import main as train

    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SystemExit, match="exists and is not empty"):
        train(["--out", str(tmp_path), "--max-files", "1", "--steps", "1"])
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]


def test_the_plots_render_from_a_small_report(tmp_path):
    report = _report()
    figures = {"latency": report_mod.plot_latency(report), "breakdown": report_mod.plot_breakdown(report),
               "sweep": report_mod.plot_sweep({"ks": [1, 5], "batch_sizes": [1, 16], "points": [
                   {"k": k, "batch_size": b, "mode": m, "p50_s": 0.1 * b ** 0.5 * (2 if m == "main" else 1)}
                   for k in (1, 5) for b in (1, 16) for m in ("main", "gpu")]}, "p50 per mode")}
    for name, fig in figures.items():
        path = tmp_path / f"{name}.png"
        fig.savefig(path, dpi=60)
        assert path.stat().st_size > 5_000, name
    # hf_assisted (2.6 s) must not flatten the modes (0.1 s): the latency axis is logarithmic
    assert figures["latency"].axes[0].get_yscale() == "log"
    # one colour per mode, the same in every plot; peers apart from modes
    assert report_mod.MODE_COLORS["gpu"] != report_mod.MODE_COLORS["gpu_sync_commit"]
    sweep_lines = {line.get_label(): line.get_color() for line in figures["sweep"].axes[0].get_lines()}
    assert sweep_lines["gpu"] == report_mod.MODE_COLORS["gpu"]
    # panels share their y scale, and the title names configuration, device, date and commit
    assert figures["sweep"].axes[0].get_ylim() == figures["sweep"].axes[1].get_ylim()
    title = figures["latency"].axes[0].get_title()
    assert "llama-160m" in title and "H200" in title and "2026-12-01" in title and "8f11270" in title


def test_progress_bars_are_labelled_and_silent_in_a_redirected_log(monkeypatch):
    import sys

    from protospec.engine.progress import progress_bar

    items = [1, 2, 3]
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    assert progress_bar("sweep")(items) is items  # no bar, no carriage returns in a log file
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    bar = progress_bar("sweep points")(items)
    assert bar.desc.startswith("sweep points") and bar.leave is True and list(bar) == items


def test_the_readmes_first_example_runs_and_drafts_something(capsys, monkeypatch):
    """The first Python block of the README, as written, on the trained pair: text out and a real
    acceptance rate (two unrelated random models would give 0)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)  # the README's paths are relative to the repository root
    readme = (root / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    rate = float(re.search(r"^acceptance ([0-9.]+)", out, re.M).group(1))
    assert rate > 0.3 and "num_spec_steps" in out


@pytest.mark.parametrize("fail, status, line", [
    (lambda: (_ for _ in ()).throw(__import__("protospec").ConfigError("k must be >= 1")), 2,
     "error: ConfigError: k must be >= 1"),
    (lambda: (_ for _ in ()).throw(SystemExit("--batch-size must be >= 1, got 0")), 2,
     "error: --batch-size must be >= 1, got 0"),
    (lambda: 0, 0, None),
    (lambda: {"modes": {}}, 0, None),
], ids=["named_error", "own_check", "success", "returns_a_report"])
def test_a_command_ends_with_one_line_and_status_2_on_bad_input(capsys, fail, status, line):
    from protospec.command_line import run_command

    with pytest.raises(SystemExit) as info:
        run_command(fail)
    assert info.value.code == status
    err = capsys.readouterr().err.strip()
    assert (err == line) if line else err == ""


def test_the_bench_refuses_a_bad_argument_without_a_traceback():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "protospec.bench", "--model", "/nonexistent/model"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("error: ModelLoadError: no such directory: /nonexistent/model")


def test_every_command_answers_a_bad_argument_in_one_line(capsys):
    """The commands build their parsers from CommandParser: a bad argument is one line and status 2
    (argparse alone prints its usage block first); no command's parser is a plain ArgumentParser."""
    from protospec.command_line import BAD_INPUT, CommandParser

    parser = CommandParser(prog="python -m protospec.x")
    parser.add_argument("--k", type=int)
    with pytest.raises(SystemExit) as info:
        parser.parse_args(["--k", "five"])
    assert info.value.code == BAD_INPUT
    assert capsys.readouterr().err == "python -m protospec.x: error: argument --k: invalid int value: 'five'\n"
    root = Path(__file__).resolve().parents[1]
    plain = [str(path.relative_to(root)) for folder in ("protospec", "tools") for path in (root / folder).rglob("*.py")
             if "argparse.ArgumentParser(" in path.read_text()]
    assert plain == []


def test_the_bench_help_is_short_and_grouped():
    """--help fits 150 lines in groups (vLLM's flags, the study's, the rest); vLLM's inapplicable flags
    are named in one place and still parse."""
    from protospec.bench.args import IGNORED_VLLM_FLAGS, build_parser

    parser = build_parser("description")
    text = parser.format_help()
    assert len(text.splitlines()) <= 150
    for heading in ("vLLM's benchmark_latency flags:", "the study: draft loops, proposers, acceptance:",
                    "kernels and graphs:", "ablation and sweep reports:", "where reports go:"):
        assert heading in text
    assert "--prefill-kernels" in text
    epilog = " ".join(text.split("accepted and ignored here")[1].split())
    assert all(flag in epilog for flag in IGNORED_VLLM_FLAGS)
    assert parser.parse_args(["--tensor-parallel-size", "1"]).tensor_parallel_size == 1

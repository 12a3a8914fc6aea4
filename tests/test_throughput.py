"""bench.throughput: the crossover's rule and one small run on the tiny pair."""
import pytest

from protospec.bench.ablation import BenchSetup
from protospec.bench.throughput import crossover, main, plot_throughput, run_pair


def test_the_crossover_is_the_first_batch_where_target_only_keeps_up():
    batches = [1, 4, 16, 64]
    target = {1: 100.0, 4: 380.0, 16: 1500.0, 64: 5000.0}
    assert crossover(batches, target, {1: 250.0, 4: 600.0, 16: 1400.0, 64: 4000.0}) == 16
    assert crossover(batches, target, {1: 250.0, 4: 380.0, 16: 2000.0, 64: 9000.0}) == 4   # a tie counts
    assert crossover(batches, target, {b: 2 * t for b, t in target.items()}) is None        # always pays
    assert crossover([64, 1, 16, 4], target, {1: 50.0, 4: 9e9, 16: 9e9, 64: 9e9}) == 1       # in batch order


def test_a_small_run_on_the_tiny_pair(tiny_target, tiny_draft):
    setup = BenchSetup(tiny_target, tiny_draft, 3, 8, 16, 1, 0, 2, load_format="dummy", temperature=1.0,
                       dtype="float32", device="cpu", max_model_len=24, kv_cache_gib=0.01)
    saved = []  # what a run cut short would have kept: the points so far, after each batch size
    pair = run_pair("tiny", setup, batch_sizes=(1, 3), alphas=(0.0, 1.0), log=lambda *_: None,
                    checkpoint=lambda p: saved.append([q["batch_size"] for q in p["points"]]))
    assert saved == [[1], [1, 3]]
    assert [p["batch_size"] for p in pair["points"]] == [1, 3] and set(pair["crossover_batch_by_alpha"]) == {"0.0", "1.0"}
    for p in pair["points"]:
        b = p["batch_size"]
        assert p["target_only_tokens_per_s"] == pytest.approx(b * 16 / p["target_only_p50_s"])
        assert p["spec"]["0.0"]["measured_acceptance"] == 0.0 and p["spec"]["1.0"]["measured_acceptance"] == 1.0
        # every draft token kept: k + 1 tokens a step; none kept: one
        assert p["spec"]["1.0"]["spec_steps_per_request"] < p["spec"]["0.0"]["spec_steps_per_request"]
        assert p["spec"]["1.0"]["tokens_per_s"] == pytest.approx(b * 16 / p["spec"]["1.0"]["p50_s"])
    fig = plot_throughput({"pairs": {"tiny": pair}, "device": "cpu", "date": "2026-12-05", "git_commit": "0" * 8})
    assert len(fig.axes) == 1 and len(fig.axes[0].get_lines()) >= 3  # target-only and one line an alpha


def test_bad_batch_sizes_are_refused(capsys):
    from protospec.command_line import run_command

    with pytest.raises(SystemExit) as info:
        run_command(lambda: main(["--batch-sizes", "0", "4"]))
    assert info.value.code == 2 and "--batch-sizes" in capsys.readouterr().err

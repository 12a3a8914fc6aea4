"""bench.surface: the speed-up surface's arithmetic and one small run on the tiny pair."""
import pytest

from protospec.bench.ablation import BenchSetup
from protospec.bench.surface import CALIBRATION_ALPHA, expected_tokens, main, plot_surface, run_pair


def test_expected_tokens_a_step():
    assert expected_tokens(0.0, 5) == 1.0          # only the recovered token
    assert expected_tokens(1.0, 5) == 6.0          # every draft token and the bonus
    assert expected_tokens(0.5, 1) == pytest.approx(1.5)
    assert expected_tokens(0.8, 3) == pytest.approx(1 + 0.8 + 0.64 + 0.512)


def test_a_small_surface_on_the_tiny_pair(tiny_target, tiny_draft):
    setup = BenchSetup(tiny_target, tiny_draft, 1, 8, 24, 1, 0, 2, load_format="dummy", temperature=1.0,
                       dtype="float32", device="cpu")
    pair = run_pair("tiny", setup, alphas=(0.0, 0.5, 1.0), ks=(1, 3), log=lambda *_: None)
    assert [(p["k"], p["alpha"]) for p in pair["points"]] == [(k, a) for k in (1, 3) for a in (0.0, 0.5, 1.0)]
    for p in pair["points"]:
        if p["alpha"] in (0.0, 1.0):  # set exactly: no draft token kept, or every one
            assert p["measured_acceptance"] == p["alpha"]
            assert p["tokens_per_step"] == pytest.approx(p["expected_tokens_per_step"], rel=0.15)
        assert p["measured_speedup"] == pytest.approx(pair["target_only_p50_s"] / p["p50_s"])
        assert p["predicted_speedup"] > 0 and p["spec_steps"] > 0
    # at alpha = 1 a step makes k + 1 tokens: fewer steps than at alpha = 0
    by = {(p["k"], p["alpha"]): p for p in pair["points"]}
    assert by[3, 1.0]["spec_steps"] < by[3, 0.0]["spec_steps"]
    assert set(pair["spec_step_ms_by_k"]) == {"1", "3"} and CALIBRATION_ALPHA == 0.5
    fig = plot_surface({"pairs": {"tiny": pair}, "device": "cpu", "date": "2026-12-04", "git_commit": "0" * 8})
    assert len(fig.axes) == 1 and len(fig.axes[0].lines) == 2 * 2 + 1  # measured + predicted per k, the 1x line


def test_bad_alphas_are_refused(capsys):
    from protospec.command_line import run_command

    with pytest.raises(SystemExit) as info:
        run_command(lambda: main(["--alphas", "1.5"]))
    assert info.value.code == 2 and "--alphas must lie in [0, 1]" in capsys.readouterr().err

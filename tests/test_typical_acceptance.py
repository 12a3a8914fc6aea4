"""Typical acceptance: its rule pinned position by position against the formula written out in plain
Python, and the engine with it (greedy output equal to the target's; lossy at temperature 1)."""
import math

import pytest
import torch
from tiny import random_prompts, tiny_llm

from protospec import ConfigError, SamplingParams
from protospec.speculation.acceptance import entropy, typical_acceptance
from protospec.layout import PLACEHOLDER_TOKEN_ID


def _expected(draft, p, threshold, alpha, proposed):
    """The rule in plain Python: kept prefix and per-position verdicts."""
    verdicts = []
    for i, d in enumerate(draft):
        h = -sum(x * math.log(x) for x in p[i] if x > 0)
        verdicts.append(i < proposed and p[i][d] > min(threshold, alpha * math.exp(-h)))
    kept = 0
    while kept < len(draft) and verdicts[kept]:
        kept += 1
    return verdicts, kept


@pytest.mark.parametrize("threshold,alpha", [(0.09, 0.3), (0.3, 0.9), (0.02, 0.05)])
def test_the_rule_is_exactly_the_formula(threshold, alpha):
    gen = torch.Generator().manual_seed(1)
    batch, k, vocab = 64, 4, 12
    sharpness = torch.rand(batch, k + 1, 1, generator=gen) * 4  # from flat to peaked rows: both sides of the bar
    p = torch.softmax(torch.randn(batch, k + 1, vocab, generator=gen) * sharpness, -1)
    draft = torch.randint(0, vocab, (batch, k), generator=gen)
    noise = torch.empty(batch, 2 * k + 1, vocab).exponential_(generator=gen)
    proposed = torch.randint(0, k + 1, (batch,), generator=gen)
    out = typical_acceptance(draft, p, threshold, alpha, noise[:, k : 2 * k], noise[:, 2 * k], proposed)
    kept_counts = []
    for b in range(batch):
        verdicts, kept = _expected(draft[b].tolist(), p[b].tolist(), threshold, alpha, proposed[b].item())
        assert out.passed_mask[b].tolist() == verdicts
        assert out.num_accepted[b].item() == kept
        row = out.output_token_ids[b].tolist()
        assert row[:kept] == draft[b, :kept].tolist()
        # The token after the kept prefix is the race over p at that position with its noise.
        expected_last = (p[b, kept] / noise[b, k + kept]).argmax().item()
        assert row[kept] == expected_last
        assert all(t == PLACEHOLDER_TOKEN_ID for t in row[kept + 1 :])
        kept_counts.append(kept)
    assert len(set(kept_counts)) > 2  # the cases exercise several outcomes


def test_entropy_in_nats():
    assert entropy(torch.tensor([0.5, 0.5, 0.0])).item() == pytest.approx(math.log(2))
    assert entropy(torch.tensor([1.0, 0.0])).item() == 0.0


def test_greedy_typical_acceptance_gives_the_target_only_output(tiny_target, tiny_draft):
    """On greedy rows the target's distribution is one-hot: only its argmax passes, as greedy decoding keeps."""
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    prompts = random_prompts(3)
    alone = tiny_llm(tiny_target, None).generate(prompts, params)
    typical = tiny_llm(tiny_target, tiny_draft, k=3, acceptance="typical").generate(prompts, params)
    assert [o.token_ids for o in typical] == [o.token_ids for o in alone]


def test_typical_acceptance_is_lossy_where_rejection_sampling_keeps_everything(tiny_target):
    """Draft == target at temperature 1: rejection sampling keeps every draw; typical acceptance with
    threshold = alpha = 1 (bar e^-H, about the mean probability of a flat row) rejects the draws below it."""
    params = SamplingParams(temperature=1.0, max_tokens=40, ignore_eos=True, seed=2)
    prompts = random_prompts(4, seed=6)
    rates = {}
    for rule in ("rejection", "typical"):
        llm = tiny_llm(tiny_target, tiny_target, k=3, acceptance=rule, posterior_threshold=1.0, posterior_alpha=1.0)
        llm.generate(prompts, params)
        rates[rule] = llm.metrics.acceptance_rate
    assert rates["rejection"] == 1.0  # draft == target: rejection sampling keeps everything
    assert 0.2 < rates["typical"] < 0.8


def test_the_acceptance_settings_are_checked(tiny_target, tiny_draft):
    for bad, match in ((dict(acceptance="medusa"), "acceptance"), (dict(posterior_threshold=0.0), "posterior_threshold"),
                       (dict(posterior_alpha=float("nan")), "posterior_alpha")):
        with pytest.raises(ConfigError, match=match):
            tiny_llm(tiny_target, tiny_draft, k=3, **bad)


def test_typical_acceptance_gives_the_same_seeded_tokens_in_every_draft_loop_way(tiny_target, tiny_draft):
    from protospec.kernels.launch.interop import KERNEL_DEVICE_TYPE

    ways = ["main", "sampler", "gpu"] + (["graph"] if KERNEL_DEVICE_TYPE == "cuda" else [])
    params = SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True, seed=8)
    prompts = random_prompts(3, seed=4)
    outs = {way: [o.token_ids for o in tiny_llm(tiny_target, tiny_draft, k=3, device=KERNEL_DEVICE_TYPE, draft_loop=way,
                                                 acceptance="typical").generate(prompts, params)] for way in ways}
    assert all(outs[w] == outs["main"] for w in ways)

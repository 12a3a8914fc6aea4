import pytest
import torch

from protospec import ConfigError, SamplingParams
from protospec.speculation.sampler import SamplingTensors, compute_probs, exponential_noise, sample

V = 10


def _st(params, seed=0):
    gens = [torch.Generator().manual_seed(seed + i) for i in range(len(params))]
    return SamplingTensors.build(params, gens, V, "cpu")


def test_greedy_rows_are_one_hot_at_argmax_and_sampled_rows_are_softmax():
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(0))
    st = _st([SamplingParams(temperature=0.0), SamplingParams(temperature=0.5), SamplingParams(temperature=2.0)])
    probs = compute_probs(logits, st)
    assert torch.equal(probs[0], torch.nn.functional.one_hot(logits[0].argmax(), V).float())
    assert torch.allclose(probs[1], torch.softmax(logits[1] / 0.5, -1))
    assert torch.allclose(probs[2], torch.softmax(logits[2] / 2.0, -1))


def test_top_k_then_top_p_keep_the_right_tokens():
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.05, 0.05] + [1e-9] * (V - 5)] * 2))
    st = _st([SamplingParams(top_k=2), SamplingParams(top_p=0.8)])
    probs = compute_probs(logits, st)
    assert torch.allclose(probs[0, :2], torch.tensor([0.4, 0.3]) / 0.7, atol=1e-6) and probs[0, 2:].sum() == 0
    # nucleus 0.8: 0.4 + 0.3 = 0.7 < 0.8, so 0.2 joins; the rest goes
    assert torch.allclose(probs[1, :3], torch.tensor([0.4, 0.3, 0.2]) / 0.9, atol=1e-6) and probs[1, 3:].sum() == 0


def test_exponential_race_samples_follow_probs():
    gen = torch.Generator().manual_seed(5)
    probs = torch.softmax(torch.randn(V, generator=gen), -1)
    noise = torch.empty(200_000, V).exponential_(generator=gen)
    ids = (probs / noise).argmax(-1)
    freq = torch.bincount(ids, minlength=V).float() / ids.numel()
    assert (freq - probs).abs().max() < 0.006


def test_seeded_sampling_repeats_and_differs_by_seed():
    logits = torch.zeros(2, V)  # uniform: every draw depends on the noise alone
    params = [SamplingParams(temperature=1.0)] * 2

    def draws(seed):
        st = _st(params, seed)
        return [sample(logits, st)[0].tolist() for _ in range(20)]

    assert draws(3) == draws(3)
    assert draws(3) != draws(4)


def test_noise_is_strictly_positive():
    gens = [torch.Generator().manual_seed(0)]
    assert bool((exponential_noise((1000,), gens, "cpu") > 0).all())


@pytest.mark.parametrize("kwargs", [dict(temperature=-1), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5), dict(max_tokens=0)])
def test_bad_sampling_params_are_named(kwargs):
    with pytest.raises(ConfigError, match=next(iter(kwargs))):
        SamplingParams(**kwargs)

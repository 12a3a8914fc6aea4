"""lab.forced_acceptance: the acceptance rate is what was set, on the real step, and nothing else changes."""
import pytest
import torch

from protospec import ConfigError, SamplingParams
from protospec.kernels.launch.interop import KERNEL_DEVICE_TYPE
from protospec.lab.forced_acceptance import force_acceptance
from protospec.speculation.randoms import force_acceptance as force_uniforms
from tiny import random_prompts, tiny_llm

PARAMS = SamplingParams(temperature=1.0, max_tokens=40, ignore_eos=True, seed=4)


def test_the_uniforms_become_pass_or_fail_with_probability_alpha():
    u = torch.rand(200_000, generator=torch.Generator().manual_seed(0))
    forced = force_uniforms(u.clone(), 0.3)
    assert set(forced.unique().tolist()) == {0.0, float("inf")}
    assert (forced == 0).float().mean().item() == pytest.approx(0.3, abs=0.005)
    assert torch.equal(forced == 0, u < 0.3)
    assert torch.equal(force_uniforms(forced.clone(), 0.3), forced)  # a kept, forced draw stays as it was


@pytest.mark.parametrize("mode", ["main", "gpu", pytest.param("graph", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the graph mode replays CUDA graphs: its uniforms are forced inside the replay"))])
def test_the_measured_acceptance_follows_alpha(tiny_target, tiny_draft, mode):
    llm = tiny_llm(tiny_target, tiny_draft, k=3, device=KERNEL_DEVICE_TYPE, draft_loop=mode)
    prompts = random_prompts(4)
    llm.generate(prompts, PARAMS)
    natural = llm.metrics.acceptance_rate
    rates = {}
    for alpha in (0.0, 0.5, 1.0):
        force_acceptance(llm, alpha)
        llm.generate(prompts * 2, PARAMS)
        rates[alpha] = llm.metrics.acceptance_rate
    assert rates[0.0] == 0.0 and rates[1.0] == 1.0
    assert rates[0.5] == pytest.approx(0.5, abs=0.12)
    force_acceptance(llm, None)  # the real sampler again: the first call's rate and tokens
    again = llm.generate(prompts, PARAMS)
    assert llm.metrics.acceptance_rate == natural and all(len(o.token_ids) == 40 for o in again)


def test_forced_acceptance_is_refused_where_it_cannot_mean_anything(tiny_target, tiny_draft):
    target_only = tiny_llm(tiny_target, None)
    with pytest.raises(ConfigError, match="speculative engine"):
        force_acceptance(target_only, 0.5)
    llm = tiny_llm(tiny_target, tiny_draft, k=3)
    for bad in (-0.1, 1.5, "0.5"):
        with pytest.raises(ConfigError, match="alpha"):
            force_acceptance(llm, bad)
    typical = tiny_llm(tiny_target, tiny_draft, k=3, acceptance="typical")
    with pytest.raises(ConfigError, match="acceptance='typical'"):
        force_acceptance(typical, 0.5)
    force_acceptance(llm, 0.5)
    with pytest.raises(ConfigError, match="temperature > 0"):
        llm.generate(random_prompts(1), SamplingParams(temperature=0.0, max_tokens=8))
    # refused before any step ran: the engine serves at temperature > 0
    assert len(llm.generate(random_prompts(1), PARAMS)[0].token_ids) == 40

"""Speculation off above a batch size (speculative_disable_by_batch_size, vLLM's name): while more
requests run than the cap, steps decode with the target alone; when speculation resumes the draft's
cache is caught up, and greedy outputs stay the target's."""
import pytest
from tiny import random_prompts, tiny_llm

from protospec import ConfigError, SamplingParams


def test_speculation_off_above_a_batch_size_catches_the_draft_up_after(tiny_target, tiny_draft):
    prompts = random_prompts(4)
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (6, 9, 30, 40)]
    alone = tiny_llm(tiny_target, None).generate(prompts, params)
    llm = tiny_llm(tiny_target, tiny_draft, k=3, speculative_disable_by_batch_size=2)
    out = llm.generate(prompts, params)
    assert [o.token_ids for o in out] == [o.token_ids for o in alone]
    target, draft = llm.counters["target"], llm.counters["draft"]
    assert target["cpu_prepare:decode"] > 0 and target["cpu_prepare:verify"] > 0  # both kinds of step ran
    assert draft["cpu_prepare:catch_up"] > 0   # the draft's cache was brought up to date when speculation resumed
    assert out[3].metrics.num_spec_steps > 0 and out[0].metrics.num_spec_steps == 0


@pytest.mark.parametrize("cap", [0, -1, 2.0, True])
def test_the_cap_is_checked(tiny_target, tiny_draft, cap):
    with pytest.raises(ConfigError, match="speculative_disable_by_batch_size"):
        tiny_llm(tiny_target, tiny_draft, k=3, speculative_disable_by_batch_size=cap)

"""Dynamic k (how many draft tokens a step proposes, per request) and speculation off above a batch
size: outputs stay the target's (greedy) and the same in every draft-loop way; the schedule is pinned."""
import pytest
from tiny import random_prompts, tiny_llm

from protospec import ConfigError, SamplingParams
from protospec.kernels.launch.interop import KERNEL_DEVICE_TYPE

DEVICE_WAYS = ["gpu"] + (["graph"] if KERNEL_DEVICE_TYPE == "cuda" else [])  # graph: CUDA graphs, a GPU only
from protospec.speculation.dynamic_k import HeuristicK

GREEDY = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)


class _Seq:
    def __init__(self, seq_id):
        self.seq_id, self.finished = seq_id, False


def test_the_heuristic_schedule_is_transformers():
    schedule, seq = HeuristicK(6), _Seq(1)
    seen = []
    for proposed_accepted in [(6, 6), (6, 2), (5, 5), (6, 0), (5, 0), (4, 0), (3, 0), (2, 0), (1, 0), (1, 1), (3, 3)]:
        schedule.observe(seq, *proposed_accepted)
        seen.append(schedule.current[1])
    # full accept: +2 (capped at k = 6); otherwise -1 (at least 1)
    assert seen == [6, 5, 6, 5, 4, 3, 2, 1, 1, 3, 5]
    seq.finished = True
    schedule.observe(seq, 5, 5)
    assert 1 not in schedule.current  # a finished request's state is dropped


@pytest.mark.parametrize("dynamic_k", ["heuristic", "confidence"])
def test_greedy_output_is_the_target_only_output(tiny_target, tiny_draft, dynamic_k):
    prompts = random_prompts(3)
    alone = tiny_llm(tiny_target, None).generate(prompts, GREEDY)
    llm = tiny_llm(tiny_target, tiny_draft, k=4, dynamic_k=dynamic_k, draft_confidence_threshold=0.5)
    out = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in out] == [o.token_ids for o in alone]


def test_the_heuristic_proposes_fewer_when_drafts_are_rejected(tiny_target, tiny_draft):
    llm = tiny_llm(tiny_target, tiny_draft, k=4, dynamic_k="heuristic")
    llm.generate(random_prompts(3), SamplingParams(temperature=1.0, max_tokens=40, ignore_eos=True, seed=1))
    m = llm.metrics
    assert m.num_spec_steps <= m.num_draft_tokens < 4 * m.num_spec_steps


def test_confidence_threshold_zero_is_fixed_k_and_one_proposes_nothing(tiny_target, tiny_draft):
    params = SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True, seed=5)
    prompts = random_prompts(2)
    fixed = tiny_llm(tiny_target, tiny_draft, k=3)
    zero = tiny_llm(tiny_target, tiny_draft, k=3, dynamic_k="confidence", draft_confidence_threshold=0.0)
    assert [o.token_ids for o in zero.generate(prompts, params)] == [o.token_ids for o in fixed.generate(prompts, params)]
    assert zero.metrics.num_draft_tokens == fixed.metrics.num_draft_tokens
    one = tiny_llm(tiny_target, tiny_draft, k=3, dynamic_k="confidence", draft_confidence_threshold=1.0)
    one.generate(prompts, params)  # a sampled draft's top probability is below 1 at every step
    assert one.metrics.num_draft_tokens == 0 and one.metrics.num_spec_steps > 0


@pytest.mark.parametrize("dynamic_k", ["heuristic", "confidence"])
def test_seeded_tokens_are_the_same_on_the_host_and_the_device_path(tiny_target, tiny_draft, dynamic_k):
    params = SamplingParams(temperature=1.0, top_k=30, max_tokens=24, ignore_eos=True, seed=9)
    prompts = random_prompts(3, seed=2)
    outs, drafted = {}, {}
    for mode in ("main", *DEVICE_WAYS):
        llm = tiny_llm(tiny_target, tiny_draft, k=3, device=KERNEL_DEVICE_TYPE,  # one device: one random stream
                       draft_loop=mode, dynamic_k=dynamic_k, draft_confidence_threshold=0.02)
        outs[mode] = [o.token_ids for o in llm.generate(prompts, params)]
        drafted[mode] = llm.metrics.num_draft_tokens
    assert all(outs[m] == outs["main"] and drafted[m] == drafted["main"] for m in DEVICE_WAYS)


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


def test_the_settings_are_checked(tiny_target, tiny_draft):
    for bad, match in ((dict(dynamic_k="schedule"), "dynamic_k"), (dict(draft_confidence_threshold=1.5), "confidence"),
                       (dict(speculative_disable_by_batch_size=0), "disable_by_batch_size")):
        with pytest.raises(ConfigError, match=match):
            tiny_llm(tiny_target, tiny_draft, k=3, **bad)

"""The n-gram proposer: the match kernel against its CPU twin (property-based), the twin against the
rule written out, and the engine with it (lossless, the same tokens on the host and the device)."""
import pytest
import torch
from hypothesis import given, settings, strategies as st
from tiny import random_prompts, tiny_llm

from protospec import ConfigError, SamplingParams
from protospec.kernels.launch.interop import KERNEL_DEVICE_TYPE
from protospec.kernels.inputs.ngram_match import ngram_match, propose

DEV = KERNEL_DEVICE_TYPE


def test_the_twin_takes_the_longest_suffix_and_its_most_recent_occurrence():
    #          0  1  2  3  4  5  6  7  8  9
    tokens = [5, 6, 7, 9, 5, 6, 8, 1, 5, 6]
    assert propose(tokens, 3, 1, 4) == [8, 1, 5]     # "5 6" last occurred at 4..5 (not 0..1): then 8 1 5
    assert propose(tokens, 5, 1, 4) == [8, 1, 5, 6]  # clipped: the history ends
    assert propose([1, 2, 3, 4], 3, 1, 3) == []      # no earlier occurrence of any suffix
    assert propose([7, 7, 7], 2, 1, 2) == [7]        # "7 7" ends at 1; only position 2 follows
    assert propose([3, 4, 9, 3, 4], 2, 3, 3) == []   # n_min = 3: "9 3 4" never occurred before
    assert propose([1], 3, 1, 2) == []


@st.composite
def _batches(draw):
    rows = draw(st.integers(1, 4))
    vocab = draw(st.integers(2, 5))  # few symbols: matches of every length happen
    histories = [draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=40)) for _ in range(rows)]
    n_min = draw(st.integers(1, 3))
    n_max = draw(st.integers(n_min, 5))
    k = draw(st.integers(1, 6))
    return histories, k, n_min, n_max


@settings(max_examples=25, deadline=None)
@given(_batches())
def test_the_kernel_matches_its_twin(batch):
    histories, k, n_min, n_max = batch
    vocab = 8
    width = max(len(h) for h in histories) + 3
    history = torch.tensor([h + [0] * (width - len(h)) for h in histories], dtype=torch.int64, device=DEV)
    lengths = torch.tensor([len(h) for h in histories], dtype=torch.int64, device=DEV)
    rows = len(histories)
    draft_ids = torch.full((rows, k), -5, dtype=torch.int64, device=DEV)
    draft_probs = torch.full((rows, k, vocab), 0.5, device=DEV)
    num_proposed = torch.full((rows,), -5, dtype=torch.int64, device=DEV)
    ngram_match(history, lengths, n_min, n_max, draft_ids, draft_probs, num_proposed)
    for b, h in enumerate(histories):
        expected = propose(h, k, n_min, n_max)
        n = len(expected)
        assert num_proposed[b].item() == n
        assert draft_ids[b, :n].tolist() == expected and (draft_ids[b, n:] == 0).all()
        one_hot = torch.zeros(k, vocab, device=DEV)
        for i, t in enumerate(expected):
            one_hot[i, t] = 1.0
        assert torch.equal(draft_probs[b], one_hot)


def _ngram_llm(tiny_target, mode, **kw):
    # One device for every way (a GPU's random stream is not the CPU's): main matches on the host.
    return tiny_llm(tiny_target, "[ngram]", k=3, device=DEV, draft_loop=mode, **kw)


REPEATING = [[10, 11, 12, 13] * 5 + [10, 11], [40, 41, 42] * 6]  # prompts an n-gram lookup can continue


@pytest.mark.parametrize("mode", ["main", "gpu"])
def test_greedy_output_is_the_target_only_output(tiny_target, mode):
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    prompts = REPEATING + random_prompts(2)
    alone = tiny_llm(tiny_target, None, device="cpu").generate(prompts, params)
    llm = _ngram_llm(tiny_target, mode)
    out = llm.generate(prompts, params)
    assert [o.token_ids for o in out] == [o.token_ids for o in alone]
    counters = llm.counters["proposer"]
    assert counters.get("ngram_match:kernel" if mode == "gpu" else "ngram_match:cpu", 0) > 0
    assert llm.metrics.num_draft_tokens > 0  # something was proposed (and tested)


def test_seeded_tokens_and_counts_are_the_same_on_the_host_and_on_the_device(tiny_target):
    params = SamplingParams(temperature=1.0, top_k=20, max_tokens=25, ignore_eos=True, seed=4)
    prompts = REPEATING + random_prompts(2, seed=3)
    ways = ["main", "gpu"] + (["graph"] if DEV == "cuda" else [])  # graph: the n-gram match needs no graph
    runs = {mode: _ngram_llm(tiny_target, mode) for mode in ways}
    outs = {mode: [o.token_ids for o in llm.generate(prompts, params)] for mode, llm in runs.items()}
    assert all(outs[w] == outs["main"] for w in ways)
    assert all(runs[w].metrics.num_draft_tokens == runs["main"].metrics.num_draft_tokens for w in ways)
    assert all(runs[w].metrics.num_passed_tokens == runs["main"].metrics.num_passed_tokens for w in ways)


def test_no_match_proposes_nothing_and_the_step_is_target_only(tiny_target):
    llm = _ngram_llm(tiny_target, "main", prompt_lookup_min=3, prompt_lookup_max=3)
    prompt = list(range(20, 40))  # no repeated trigram; greedy decoding of random weights may repeat later
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))[0]
    # One spec step after the prefill's token: 21 distinct tokens, no trigram repeats, nothing proposed.
    assert out.metrics.num_spec_steps == 1 and out.metrics.num_draft_tokens == 0
    assert len(out.token_ids) == 2


def test_the_proposers_settings_are_checked(tiny_target):
    for bad in (dict(prompt_lookup_min=0), dict(prompt_lookup_min=3, prompt_lookup_max=2),
                dict(prompt_lookup_max=2.0)):
        with pytest.raises(ConfigError, match="prompt_lookup"):
            _ngram_llm(tiny_target, "main", **bad)

"""Bad input gets an error that names the problem, and the engine serves the next request correctly."""
import pytest
from tiny import TINY_VOCAB, random_prompts, tiny_llm

from protospec import ConfigError, OutOfKVBlocksError, PromptError, SamplingParams, VocabMismatchError
from protospec.errors import ModelLoadError

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_target, tiny_draft):
    # 12 usable blocks of 4 slots: a 30-token prompt + 12 new + 3 lookahead needs 12.
    return tiny_llm(tiny_target, tiny_draft, k=3, block_size=4, num_kv_blocks=13)


@pytest.fixture(scope="module")
def reference(tiny_target):
    return tiny_llm(tiny_target).generate(random_prompts(2), GREEDY)


@pytest.mark.parametrize("k", [0, -2])
def test_bad_k(tiny_target, tiny_draft, k):
    with pytest.raises(ConfigError, match="num_speculative_tokens"):
        tiny_llm(tiny_target, tiny_draft, k=k)


def test_an_on_off_setting_takes_a_bool_not_a_word():
    from protospec.config import EngineConfig

    with pytest.raises(ConfigError, match="overlap_commit must be True or False, got 'off'"):
        EngineConfig(model="m", overlap_commit="off")  # "off" is truthy: it would have switched it on
    assert EngineConfig(model="m", overlap_commit=False).overlap_commit is False


def test_vocab_mismatch(tiny_target, tiny_draft_other_vocab):
    with pytest.raises(VocabMismatchError, match="vocab_size"):
        tiny_llm(tiny_target, tiny_draft_other_vocab)


def test_unknown_model_without_network_says_what_to_do(monkeypatch):
    import huggingface_hub

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(ModelLoadError, match="load-format dummy"):
        tiny_llm("someone/llama-that-is-not-bundled", load_format="auto")


@pytest.mark.parametrize(
    "prompt, params, error, match",
    [
        ([], GREEDY, PromptError, "empty prompt"),
        ([5, TINY_VOCAB + 3], GREEDY, PromptError, "outside the vocabulary"),
        ([5, -1], GREEDY, PromptError, "outside the vocabulary"),
        ([5] * 250, GREEDY, PromptError, "exceeds the model's max length 256"),
        ([5] * 40, GREEDY, OutOfKVBlocksError, "out of KV blocks"),
        ("text with no tokenizer", GREEDY, PromptError, "tokenizer"),
    ],
    ids=["empty", "id-too-large", "negative-id", "too-long", "out-of-blocks", "text-no-tokenizer"],
)
def test_bad_request_then_engine_still_serves(llm, reference, prompt, params, error, match):
    free_before = llm.engine.block_manager.num_free_blocks
    with pytest.raises(error, match=match):
        llm.generate([random_prompts(1)[0], prompt], params)  # a good prompt beside the bad one
    assert llm.engine.block_manager.num_free_blocks == free_before
    assert not llm.engine.running and not llm.engine.waiting
    outs = llm.generate(random_prompts(2), GREEDY)
    assert [o.token_ids for o in outs] == [o.token_ids for o in reference]


def test_no_blocks_leak_over_many_requests_that_queue_for_the_pool(llm):
    """Eight requests, a pool that holds about two at a time: they wait, run, finish, free."""
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_usable_blocks
    for round_ in range(3):
        outs = llm.generate(random_prompts(8, lengths=(5, 17, 9, 30), seed=round_), SamplingParams(max_tokens=12, ignore_eos=True, seed=round_))
        assert all(len(o.token_ids) == 12 for o in outs)
        assert bm.num_free_blocks == bm.num_usable_blocks


def test_eos_stops_a_request_unless_ignored(tiny_target, tiny_draft):
    llm = tiny_llm(tiny_target, tiny_draft)
    prompt = random_prompts(1)
    first = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))[0].token_ids
    llm.engine.eos_token_id = first[3]  # make the 4th generated token the end-of-sequence token
    stopped = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=8))[0]
    assert stopped.token_ids == first[: first.index(first[3]) + 1] and stopped.finish_reason == "stop"
    ignored = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))[0]
    assert ignored.token_ids == first and ignored.finish_reason == "length"

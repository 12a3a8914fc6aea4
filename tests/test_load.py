"""The workloads users run: one generate() of thousands of requests, batches that turn over every few
steps, and the bound on every host wait. The GPU cases run the sizes of record; on a CPU the same
code runs smaller (kernels in the simulator for the device draft loops)."""
import contextlib
import faulthandler
import sys

import pytest
import torch
from tiny import TARGET_CFG, random_prompts, tiny_llm, write_config

from protospec import SamplingParams, registry
from protospec.bench import load, turnover
from protospec.errors import DeviceWaitError

GPU = torch.cuda.is_available()
needs_gpu = [pytest.mark.gpu, pytest.mark.skipif(not GPU, reason="needs a CUDA device")]


@contextlib.contextmanager
def watchdog(seconds: float):
    """A test that hangs on the device ends the process after `seconds`, with every thread's stack."""
    faulthandler.dump_traceback_later(seconds, exit=True, file=sys.stderr)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="module")
def gqa_pair(tmp_path_factory):
    """A 3-layer GQA target (6 heads over 2 KV heads, hidden 96, vocab 301) and a 1-layer draft."""
    target = dict(TARGET_CFG, hidden_size=96, intermediate_size=256, num_hidden_layers=3, num_attention_heads=6,
                  num_key_value_heads=2, vocab_size=301, max_position_embeddings=512)
    draft = dict(target, num_hidden_layers=1)
    return write_config(tmp_path_factory.mktemp("gqa_t"), target), write_config(tmp_path_factory.mktemp("gqa_d"), draft)


@pytest.mark.parametrize("mode", [registry.GRAPH, registry.GPU])
@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA device")
def test_an_offline_batch_of_thousands_of_prompts_completes(gqa_pair, mode):
    """Once a hang: from about 3,000 such prompts in one call the device never finished (two cuBLAS
    GEMMs of the two models' prefills ran at once on two streams and waited on each other forever)."""
    target, draft = gqa_pair
    llm = tiny_llm(target, draft, k=3, device="cuda", draft_loop=mode, max_num_seqs=256, device_wait_timeout_s=60)

    def params(n):
        return [SamplingParams(temperature=0.8, top_k=6, top_p=0.9, max_tokens=7, ignore_eos=True, seed=1000 + i)
                for i in range(n)]

    with watchdog(300):
        llm.generate([[5, 6, 7, 8]] * 256, params(256))
        outs = llm.generate([[5, 6, 7, 8]] * 4096, params(4096))
    assert [len(o.token_ids) for o in outs] == [7] * 4096
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_usable_blocks and llm.engine.reserved_blocks == 0


def _one_large_call(llm, n, sample, max_prompt_len, max_tokens):
    prompts, params = load.mixed_requests(n, llm.engine.vocab_size, seed=7, max_prompt_len=max_prompt_len,
                                          max_tokens=max_tokens)
    _, tokens = load.timed_call(llm, prompts, params)
    for t, p in zip(tokens, params):  # ignore_eos requests run to max_tokens; the others may stop at EOS
        assert 1 <= len(t) <= p.max_tokens and (len(t) == p.max_tokens or not p.ignore_eos and t[-1] == 2)
    check = load.check_against_small_calls(llm, prompts, params, tokens, sample, seed=7)
    assert check["checked"] == min(sample, check["deterministic"]) > 0 and check["differ"] == []
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_usable_blocks and llm.engine.reserved_blocks == 0


@pytest.mark.parametrize("mode", load.MODES)
@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA device")
def test_one_call_of_20000_mixed_requests_completes_and_matches_small_calls(gqa_pair, mode):
    target, draft = gqa_pair
    llm = tiny_llm(target, None if mode == load.TARGET_ONLY else draft, k=3, device="cuda", max_num_seqs=256,
                   device_wait_timeout_s=60, **({} if mode == load.TARGET_ONLY else {"draft_loop": mode}))
    with watchdog(600):
        _one_large_call(llm, 20000, sample=64, max_prompt_len=300, max_tokens=64)


@pytest.mark.parametrize("mode", [registry.MAIN, registry.GPU, load.TARGET_ONLY])
@pytest.mark.slow
def test_one_call_of_mixed_requests_turns_the_batch_over_on_a_cpu(tiny_target, tiny_draft, mode):
    """The CPU's counterpart: 120 requests through a batch of 8 (the device draft loop's kernels in the
    simulator), every deterministic one checked against calls of 8."""
    if GPU:
        pytest.skip("the GPU runs the sizes of record")
    llm = tiny_llm(tiny_target, None if mode == load.TARGET_ONLY else tiny_draft, k=3, max_num_seqs=8,
                   **({} if mode == load.TARGET_ONLY else {"draft_loop": mode}))
    _one_large_call(llm, 120 if mode != registry.GPU else 40, sample=120, max_prompt_len=40, max_tokens=12)


def _turn_over(target, draft, steps, **kwargs):
    plain = tiny_llm(target, **kwargs)
    for i, proposer in enumerate(turnover.SETUPS):
        llm = tiny_llm(target, draft if proposer == "draft" else proposer, k=3, **kwargs)
        run = turnover.turn_over(llm, steps // len(turnover.SETUPS), seed=i, max_prompt_len=24, max_tokens=12)
        check = turnover.check_run(run, llm, plain)
        assert run["steps"] >= steps // len(turnover.SETUPS) and run["widest_batch"] > 1
        assert check["greedy"] > 0 and check["greedy_differ"] == [] and check["unfinished"] == []
        assert check["free_blocks"] == check["usable_blocks"] and check["reserved_blocks"] == 0
        if proposer == "draft" and kwargs.get("draft_loop") == registry.GRAPH:
            assert llm.counters["draft"]["spec_step_graph"] > 0  # the replayed step ran under turnover


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA device")
def test_10000_steps_of_a_batch_that_turns_over_in_graph_mode(tiny_target, tiny_draft):
    with watchdog(900):
        _turn_over(tiny_target, tiny_draft, 10000, device="cuda", draft_loop=registry.GRAPH, max_num_seqs=32,
                   device_wait_timeout_s=60)


@pytest.mark.slow
def test_a_batch_that_turns_over_on_a_cpu(tiny_target, tiny_draft):
    if GPU:
        pytest.skip("the GPU runs the sizes of record")
    _turn_over(tiny_target, tiny_draft, 400, draft_loop=registry.MAIN, max_num_seqs=8)


def test_admission_keeps_a_running_total_of_what_it_reserved(tiny_target, tiny_draft):
    """Admission reads one number, whatever the running batch: requests are admitted while the
    blocks their whole lives need fit the pool, and a retired request gives its share back."""
    llm = tiny_llm(tiny_target, tiny_draft, k=3, num_kv_blocks=9, block_size=16, max_num_seqs=8)
    eng = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    need = eng.blocks_for_request(30, 20)  # 30 + 20 + lookahead tokens: 4 blocks of 16
    eng.waiting.extend(llm.make_sequences(random_prompts(3, lengths=(30,)), [params] * 3))
    admitted = eng._admit()
    assert len(admitted) == 2 and eng.reserved_blocks == 2 * need == 8 and len(eng.waiting) == 1
    while eng.running:
        eng.step()
        assert eng.reserved_blocks == sum(s.reserved_blocks for s in eng.running)
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_usable_blocks and eng.reserved_blocks == 0


class _NeverDone:
    def query(self):
        return False


def test_a_host_wait_that_cannot_complete_raises_and_leaves_the_engine_usable(tiny_target, tiny_draft, monkeypatch):
    """The commit's wait on an event that never completes: DeviceWaitError within the bound, every
    block back in the pool, and the next call gives the tokens a fresh engine gives."""
    from protospec import device_wait
    from protospec.speculation import step as step_module

    prompts, params = random_prompts(2), SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    llm = tiny_llm(tiny_target, tiny_draft, k=3, device_wait_timeout_s=0.2)
    expected = [o.token_ids for o in tiny_llm(tiny_target, tiny_draft, k=3).generate(prompts, params)]
    monkeypatch.setattr(step_module, "copy_to_host", lambda t: (t, _NeverDone()))
    with pytest.raises(DeviceWaitError, match="within 0.2 s"):
        llm.generate(prompts, params)
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_usable_blocks and not llm.engine.running and llm.engine.reserved_blocks == 0
    monkeypatch.setattr(step_module, "copy_to_host", device_wait.copy_to_host)
    assert [o.token_ids for o in llm.generate(prompts, params)] == expected


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA device")
def test_a_busy_device_past_the_bound_raises_and_the_engine_serves_after(tiny_target, tiny_draft):
    """A kernel that keeps the device busy for about a second (torch's spin kernel) in front of a call
    with a 0.2 s bound: the call raises; once the device is free the engine serves as before."""
    prompts, params = random_prompts(2), SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    llm = tiny_llm(tiny_target, tiny_draft, k=3, device="cuda", draft_loop=registry.GRAPH, device_wait_timeout_s=0.2)
    expected = [o.token_ids for o in llm.generate(prompts, params)]
    torch.cuda._sleep(int(3e9))  # ~1.5 s of spinning at the H200's clock
    with pytest.raises(DeviceWaitError):
        llm.generate(prompts, params)
    torch.cuda.synchronize()
    assert [o.token_ids for o in llm.generate(prompts, params)] == expected

"""Target-only decoding several steps a replay (engine/decode_graph.py), run eagerly in the simulator on a
CPU and captured on a GPU: the tokens of the one-step decoder, stop rules on the device, seeded output
independent of grouping and batch, blocks returned, and the decode_advance kernel's rules."""
import pytest
import torch

from protospec import SamplingParams
from protospec.kernels.launch.interop import KERNEL_DEVICE_TYPE
from protospec.layout import PAD_SLOT_ID, PLACEHOLDER_TOKEN_ID
from tiny import random_prompts, tiny_llm


def _multi_step(llm, steps=None, graphs=False):
    eng = llm.engine
    eng.decoder = eng.multi_step_decode(graphs=graphs)
    if steps is not None:
        eng.decoder.steps = steps
    return llm


def _run(llm, prompts, params):
    return [(o.token_ids, o.finish_reason) for o in llm.generate(prompts, params)]


def test_greedy_tokens_and_stops_equal_the_one_step_decoder(tiny_target):
    """Ragged prompts, budgets that end inside a replay, EOS on (the dummy model emits it sometimes),
    more requests than max_num_seqs so the batch turns over: every token and finish reason equal."""
    prompts = random_prompts(7, lengths=(5, 17, 9, 30, 2))
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=i % 2 == 0) for i, n in enumerate((1, 3, 8, 9, 17, 25, 40))]
    one_step = _run(tiny_llm(tiny_target, None, device=KERNEL_DEVICE_TYPE, max_num_seqs=4), prompts, params)
    llm = _multi_step(tiny_llm(tiny_target, None, device=KERNEL_DEVICE_TYPE, max_num_seqs=4), steps=4)
    assert _run(llm, prompts, params) == one_step
    counters = llm.counters["target"]
    assert counters["decode_replays"] > 0 and counters["decode_uploads"] > 0
    assert counters.get("cpu_prepare:decode", 0) == 0  # no one-step decode ran
    eng = llm.engine
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_usable_blocks and eng.reserved_blocks == 0


def test_a_stop_on_eos_freezes_the_row_on_the_device(tiny_target):
    """A request whose EOS comes early: it ends there, and a request beside it goes on to its budget."""
    llm = _multi_step(tiny_llm(tiny_target, None, device=KERNEL_DEVICE_TYPE), steps=8)
    prompt = random_prompts(1)[0]
    free = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))[0].token_ids
    eos = free[2]  # make the third greedy token the model's EOS
    llm.engine.eos_token_id = eos
    llm.engine.decoder.eos_token_id = eos
    out = llm.generate([prompt, prompt], [SamplingParams(temperature=0.0, max_tokens=12),
                                          SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)])
    stop_at = free.index(eos) + 1
    assert out[0].token_ids == free[:stop_at] and out[0].finish_reason == "stop"
    assert out[1].token_ids == free and out[1].finish_reason == "length"


def test_seeded_tokens_do_not_depend_on_grouping_or_batch(tiny_target):
    """A seeded request's tokens follow from its seed and positions: the same with 3 or 8 steps a
    replay, alone or beside others, and different for another seed."""
    prompts = random_prompts(3, lengths=(6, 11, 4))
    params = [SamplingParams(temperature=0.9, top_k=20, max_tokens=10, ignore_eos=True, seed=s) for s in (5, 6, 7)]
    grouped = {}
    for steps in (3, 8):
        llm = _multi_step(tiny_llm(tiny_target, None, device=KERNEL_DEVICE_TYPE), steps=steps)
        grouped[steps] = [o.token_ids for o in llm.generate(prompts, params)]
    assert grouped[3] == grouped[8]
    alone = _multi_step(tiny_llm(tiny_target, None, device=KERNEL_DEVICE_TYPE), steps=8)
    assert alone.generate([prompts[1]], params[1])[0].token_ids == grouped[8][1]
    other = alone.generate([prompts[1]], SamplingParams(temperature=0.9, top_k=20, max_tokens=10, ignore_eos=True, seed=99))
    assert other[0].token_ids != grouped[8][1]


def test_speculation_off_above_a_batch_size_decodes_several_steps_a_replay(tiny_target, tiny_draft):
    """speculative_disable_by_batch_size hands the big batch to the multi-step decoder and the small one
    back to speculation: greedy output equals target-only."""
    prompts = random_prompts(4)
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (6, 9, 30, 40)]
    alone = _run(tiny_llm(tiny_target, None), prompts, params)
    llm = _multi_step(tiny_llm(tiny_target, tiny_draft, k=3, device=KERNEL_DEVICE_TYPE, speculative_disable_by_batch_size=2),
                      steps=4)
    assert _run(llm, prompts, params) == alone
    assert llm.counters["target"]["decode_replays"] > 0 and llm.metrics.num_spec_steps > 0  # both decoders ran


def test_the_engine_serves_after_a_call_fails_midway(tiny_target, monkeypatch):
    from protospec.engine import decode_graph

    llm = _multi_step(tiny_llm(tiny_target, None, device=KERNEL_DEVICE_TYPE), steps=4)
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    want = llm.generate(random_prompts(2), params)
    calls = {"n": 0}
    commit = decode_graph.MultiStepDecode._commit

    def failing(self, launched):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected")
        commit(self, launched)

    monkeypatch.setattr(decode_graph.MultiStepDecode, "_commit", failing)
    with pytest.raises(RuntimeError, match="injected"):
        llm.generate(random_prompts(2), params)
    monkeypatch.setattr(decode_graph.MultiStepDecode, "_commit", commit)
    eng = llm.engine
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_usable_blocks
    assert [o.token_ids for o in llm.generate(random_prompts(2), params)] == [o.token_ids for o in want]


def _advance_buffers(rows=3, steps=2, max_blocks=4):
    dev = KERNEL_DEVICE_TYPE
    i64 = dict(dtype=torch.int64, device=dev)
    return dict(
        sampled=torch.tensor([7, 2, 9], **i64), stop_ids=torch.tensor([2, 2, -1], **i64),
        remaining=torch.tensor([5, 5, 0], **i64), base_keys=torch.tensor([[1, 2], [3, 4], [5, 6]], **i64),
        step_keys=torch.zeros(rows, 2, **i64), out_tokens=torch.full((rows, steps), 55, **i64),
        input_ids=torch.tensor([1, 1, 1], **i64), positions=torch.tensor([15, 3, 0], **i64),
        seq_lens=torch.tensor([16, 4, 1], dtype=torch.int32, device=dev), slot_mapping=torch.tensor([0, 0, 0], **i64),
        block_tables=torch.tensor([[4, 6, 0, 0], [5, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.int32, device=dev),
        error_row=torch.zeros(1, dtype=torch.int32, device=dev))


def test_decode_advance_records_advances_and_freezes():
    from protospec.kernels.inputs.decode_advance import decode_advance, position_keys

    b = _advance_buffers()
    decode_advance(1, 16, **b)
    # row 0: token 7 goes on to position 16 (block 6, slot 96); row 1 sampled its stop id; row 2 had nothing left
    assert b["out_tokens"][:, 1].tolist() == [7, 2, PLACEHOLDER_TOKEN_ID]
    assert b["out_tokens"][:, 0].tolist() == [55, 55, 55]  # other columns untouched
    assert b["remaining"].tolist() == [4, 0, 0]
    assert b["input_ids"].tolist()[0] == 7 and b["positions"].tolist()[0] == 16 and b["seq_lens"].tolist()[0] == 17
    assert b["slot_mapping"].tolist() == [6 * 16 + 0, PAD_SLOT_ID, PAD_SLOT_ID]
    assert b["positions"].tolist()[1] == 3  # a stopped row does not move
    want = position_keys(b["base_keys"].cpu(), torch.tensor([17, 0, 0]))[0]
    assert b["step_keys"][0].tolist() == want.tolist()
    assert b["error_row"].item() == 0


def test_decode_advance_flags_a_position_its_table_does_not_cover():
    from protospec.kernels.inputs.decode_advance import decode_advance

    b = _advance_buffers()
    b["positions"][0] = 31  # the next position, 32, is in block column 2: the null block
    decode_advance(0, 16, **b)
    assert b["slot_mapping"].tolist()[0] == PAD_SLOT_ID and b["error_row"].item() == 1


def test_decode_advance_refuses_wrong_dtypes():
    from protospec.errors import KernelArgumentError
    from protospec.kernels.inputs.decode_advance import decode_advance

    b = _advance_buffers()
    b["seq_lens"] = b["seq_lens"].long()
    with pytest.raises(KernelArgumentError, match="seq_lens"):
        decode_advance(0, 16, **b)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="captures CUDA graphs")
def test_captured_replays_give_the_one_step_tokens_on_cuda(tiny_target):
    """On a GPU the engine captures the replays itself (no one-step decode runs); greedy tokens equal
    the one-step decoder's, float32."""
    prompts = random_prompts(6, lengths=(5, 17, 9, 30, 2))
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=i % 2 == 0) for i, n in enumerate((1, 3, 9, 17, 25, 40))]
    llm = tiny_llm(tiny_target, None, device="cuda", max_num_seqs=4)
    assert llm.engine.decoder is not None
    got = _run(llm, prompts, params)
    llm.engine.decoder = None
    assert _run(llm, prompts, params) == got
    assert llm.counters["target"]["decode_graphs"] > 0


def test_the_sampling_kernel_draws_the_torch_samplers_tokens(tiny_target):
    """With the sampling kernels a decode step samples its token alone (a Gumbel-max over the logits and
    the request's Exp(1) noise, no probabilities): the same seeded tokens as the torch sampler's race
    (probabilities over the same noise), up to float32 ties, which this model does not reach."""
    prompts = random_prompts(3, lengths=(6, 11, 4))
    params = [SamplingParams(temperature=t, max_tokens=10, ignore_eos=True, seed=s) for s, t in ((5, 0.7), (6, 1.0), (7, 0.0))]
    tokens = {}
    for fused in (False, True):
        llm = _multi_step(tiny_llm(tiny_target, None, device=KERNEL_DEVICE_TYPE, fused_sampling=fused), steps=4)
        assert llm.engine.fused_sampling == fused
        tokens[fused] = [o.token_ids for o in llm.generate(prompts, params)]
        probs = [state.probs for state in llm.engine.decoder._rows.values()] if fused else []
        assert not fused or (probs and all(p is None for p in probs))  # the kernel path needs no probabilities
    assert tokens[True] == tokens[False]

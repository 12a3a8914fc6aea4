"""The overlapped commit: the next spec step's draft step 1, built on the device by the
first_draft_step kernel from the rejection output and launched before the commit's host sync."""
import random

import pytest
import torch
from tiny import random_prompts, tiny_llm

from protospec import SamplingParams
from protospec.layout import NULL_BLOCK, PAD_SLOT_ID
from protospec.errors import KernelArgumentError
from protospec.model.inputs import prepare_inputs
from protospec.kernels.inputs.first_draft_step import first_draft_step, first_draft_step_reference, stage
from protospec.kernels.launch.interop import KERNEL_DEVICE_TYPE
from protospec.layout import PLACEHOLDER_TOKEN_ID

DEVICE = torch.device(KERNEL_DEVICE_TYPE)
ON_GPU = KERNEL_DEVICE_TYPE == "cuda"
MODES = ["gpu"] + (["graph"] if ON_GPU else [])


def _case(batch, k, block_size, seed, short_row=None):
    """Random sequences mid-generation: tables with room for L + k + 1 tokens (one row short of it
    if short_row is set), a rejection output per row, and the host state before the step."""
    rng = random.Random(seed)
    free = list(range(1, 5000))
    rng.shuffle(free)
    lengths, tables, last_tokens, outputs, accepted = [], [], [], [], []
    for row in range(batch):
        length = rng.randint(2, 60)
        a = rng.randint(0, k)
        need = length + a + 1 if row == short_row else length + k + 1
        n_blocks = -(-need // block_size) - (1 if row == short_row else 0)
        tables.append([free.pop() for _ in range(n_blocks)])
        lengths.append(length)
        last_tokens.append(rng.randint(3, 255))
        drafts = [rng.randint(3, 255) for _ in range(k)]
        outputs.append(drafts[:a] + [rng.randint(3, 255)] + [PLACEHOLDER_TOKEN_ID] * (k - a))
        accepted.append(a)
    return tables, lengths, last_tokens, outputs, accepted


def _run_kernel(tables, lengths, last_tokens, outputs, accepted, rows, max_blocks, block_size):
    width = max(len(t) for t in tables)
    buf = dict(
        input_ids=torch.full((2 * rows,), 77, dtype=torch.int64),
        positions=torch.full((2 * rows,), 77, dtype=torch.int64),
        slot_mapping=torch.full((2 * rows,), 77, dtype=torch.int64),
        seq_lens=torch.full((rows,), 77, dtype=torch.int32),
        block_tables=torch.full((rows, max_blocks), 77, dtype=torch.int32),
        error_row=torch.zeros(1, dtype=torch.int32),
    )
    buf = {name: t.to(DEVICE) for name, t in buf.items()}
    staged = torch.tensor(stage(tables, lengths, last_tokens, width), dtype=torch.int64, device=DEVICE)
    first_draft_step(block_size, width, staged, torch.tensor(outputs, device=DEVICE), torch.tensor(accepted, device=DEVICE),
                     **buf)
    return {name: t.cpu() for name, t in buf.items()}


@pytest.mark.parametrize("batch,rows", [(1, 1), (3, 4), (7, 8), (16, 16)])
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_kernel_matches_its_twin_and_keeps_padding_rows_inert(batch, rows, block_size):
    k = 5
    case = _case(batch, k, block_size, seed=batch * 31 + block_size)
    tables = case[0]
    out = _run_kernel(*case, rows=rows, max_blocks=max(len(t) for t in tables) + 2, block_size=block_size)
    for row, (tokens, positions, slots, new_len) in enumerate(first_draft_step_reference(block_size, *case)):
        assert out["input_ids"][2 * row : 2 * row + 2].tolist() == tokens
        assert out["positions"][2 * row : 2 * row + 2].tolist() == positions
        assert out["slot_mapping"][2 * row : 2 * row + 2].tolist() == slots
        assert out["seq_lens"][row].item() == new_len
        width = out["block_tables"].shape[1]
        assert out["block_tables"][row].tolist() == tables[row] + [NULL_BLOCK] * (width - len(tables[row]))
    assert out["error_row"].item() == 0
    pad = slice(2 * batch, 2 * rows)
    assert (out["slot_mapping"][pad] == PAD_SLOT_ID).all() and (out["input_ids"][pad] == 0).all()
    assert (out["positions"][pad] == 0).all() and (out["seq_lens"][batch:] == 0).all()


@pytest.mark.parametrize("block_size", [2, 16])
def test_kernel_builds_what_the_cpu_prepare_builds(block_size):
    """The device path and the CPU path's "first_draft_step" prepare: same tokens, positions,
    slots and lengths, for every accepted count (0 uses t_{L-1}, k is a full accept)."""
    k = 4
    tables, lengths, last_tokens, outputs, accepted = _case(6, k, block_size, seed=block_size)
    out = _run_kernel(tables, lengths, last_tokens, outputs, accepted, rows=6, max_blocks=64, block_size=block_size)
    chunks, starts = [], []
    for length, prev, row, a in zip(lengths, last_tokens, outputs, accepted):
        # the host's view after the commit: ... t_{L-1}, then the emitted tokens row[: a + 1]
        tokens = [prev] + row[: a + 1]
        chunks.append(tokens[-2:])
        starts.append(length + a + 1 - 2)
    cpu = prepare_inputs(chunks, starts, tables, block_size, 1, torch.device("cpu"))
    assert out["input_ids"].tolist() == cpu.input_ids.tolist()
    assert out["positions"].tolist() == cpu.positions.tolist()
    assert out["slot_mapping"].tolist() == cpu.meta.slot_mapping.tolist()
    assert out["seq_lens"].tolist() == cpu.meta.seq_lens.tolist()


def test_kernel_flags_a_position_its_table_cannot_hold():
    tables, lengths, last_tokens, outputs, accepted = _case(3, 5, 4, seed=3, short_row=1)
    out = _run_kernel(tables, lengths, last_tokens, outputs, accepted, rows=4, max_blocks=40, block_size=4)
    assert PAD_SLOT_ID in out["slot_mapping"][2:4].tolist() and out["error_row"].item() == 2
    assert PAD_SLOT_ID not in out["slot_mapping"][:2].tolist() + out["slot_mapping"][4:6].tolist()


def test_bad_arguments_name_the_problem():
    case = _case(2, 3, 4, seed=0)
    tables, lengths, last_tokens, outputs, accepted = case
    args = dict(input_ids=torch.zeros(4, dtype=torch.int64, device=DEVICE),
                positions=torch.zeros(4, dtype=torch.int64, device=DEVICE),
                slot_mapping=torch.zeros(4, dtype=torch.int64, device=DEVICE),
                seq_lens=torch.zeros(2, dtype=torch.int32, device=DEVICE),
                block_tables=torch.zeros(2, 30, dtype=torch.int32, device=DEVICE),
                error_row=torch.zeros(1, dtype=torch.int32, device=DEVICE))
    width = max(len(t) for t in tables)
    staged = torch.tensor(stage(tables, lengths, last_tokens, width), device=DEVICE)
    ids = torch.tensor(outputs, device=DEVICE)
    with pytest.raises(KernelArgumentError, match="num_accepted: dtype torch.int32"):
        first_draft_step(4, width, staged, ids, torch.tensor(accepted, dtype=torch.int32, device=DEVICE), **args)
    with pytest.raises(KernelArgumentError, match="staged: .* entries"):
        first_draft_step(4, width, staged[:-1], ids, torch.tensor(accepted, device=DEVICE), **args)
    with pytest.raises(KernelArgumentError, match="batch 2 exceeds the buffers' 1 rows"):
        short = dict(args, input_ids=args["input_ids"][:2], positions=args["positions"][:2],
                     slot_mapping=args["slot_mapping"][:2], seq_lens=args["seq_lens"][:1], block_tables=args["block_tables"][:1])
        first_draft_step(4, width, staged, ids, torch.tensor(accepted, device=DEVICE), **short)


# ---- the engine ------------------------------------------------------------------------------------

def _outputs(llm, prompts, params):
    return [(o.token_ids, o.finish_reason) for o in llm.generate(prompts, params)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_overlap_gives_the_tokens_of_the_synced_commit_while_batches_change(tiny_target, tiny_draft, mode, temperature):
    """Requests of different lengths queue for two batch slots and one stops at an EOS token, so
    launched steps get discarded and batches change; the tokens are those of the synced commit."""
    prompts = random_prompts(5, seed=4)
    params = [SamplingParams(temperature=temperature, top_k=40, max_tokens=n, seed=10 + i)
              for i, n in enumerate((40, 60, 33, 18, 29))]
    llms = {overlap: tiny_llm(tiny_target, tiny_draft, k=4, device=KERNEL_DEVICE_TYPE, draft_loop=mode, max_num_seqs=2,
                              overlap_commit=overlap, check_no_sync=True)
            for overlap in (False, True)}
    probe = llms[False].generate(prompts, [SamplingParams(**(vars(p) | {"ignore_eos": True})) for p in params])
    eos = probe[0].token_ids[20]  # request 0 stops at (or before) its 21st token
    for llm in llms.values():
        llm.engine.eos_token_id = eos
    synced, overlapped = _outputs(llms[False], prompts, params), _outputs(llms[True], prompts, params)
    assert overlapped == synced
    assert any(reason == "stop" for _, reason in synced)
    on, off = llms[True].counters["draft"], llms[False].counters["draft"]
    assert "gpu_first_step" not in off and on["gpu_first_step"] > 0 and on["first_step_discarded"] > 0
    # Where no step was launched for the batch (it changed, or a request neared its end), draft step 1
    # is built on the device from the committed state, not on the CPU.
    assert on["first_step_at_begin"] > 0 and "cpu_prepare:first_draft_step" not in on
    bm = llms[True].engine.block_manager
    assert bm.num_free_blocks == bm.num_usable_blocks and llms[True].engine.spec_step.commit_policy.pending is None


def test_an_aborted_generate_drops_the_launched_step_and_the_engine_still_serves(tiny_target, tiny_draft):
    llm = tiny_llm(tiny_target, tiny_draft, k=3, device=KERNEL_DEVICE_TYPE, draft_loop="gpu")
    prompts, params = random_prompts(3), SamplingParams(temperature=1.0, max_tokens=30, ignore_eos=True, seed=7)
    reference = _outputs(tiny_llm(tiny_target, tiny_draft, k=3, device=KERNEL_DEVICE_TYPE, draft_loop="gpu"), prompts, params)
    spec, real_commit, calls = llm.engine.spec_step, llm.engine.spec_step.commit, []

    def failing_commit(state):
        calls.append(spec.commit_policy.pending is not None)
        if len(calls) == 3:
            raise RuntimeError("injected failure at the third commit")
        real_commit(state)
    spec.commit = failing_commit
    with pytest.raises(RuntimeError, match="injected"):
        llm.generate(prompts, params)
    assert calls[-1]  # a next step had been launched when the commit failed
    del spec.commit
    assert spec.commit_policy.pending is None and not llm.engine.running
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_usable_blocks
    assert _outputs(llm, prompts, params) == reference  # serves again, as a fresh engine would


def test_overlap_off_prepares_every_first_step_on_the_cpu(tiny_target, tiny_draft):
    llm = tiny_llm(tiny_target, tiny_draft, k=3, device=KERNEL_DEVICE_TYPE, draft_loop="gpu", overlap_commit=False)
    llm.generate(random_prompts(2), SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))
    draft, steps = llm.counters["draft"], llm.counters["target"]["cpu_prepare:verify"]
    assert "gpu_first_step" not in draft and draft["cpu_prepare:first_draft_step"] == steps
    llm.engine.set_draft_loop("gpu", overlap_commit=True)
    llm.generate(random_prompts(2), SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))
    assert llm.counters["draft"]["gpu_first_step"] > 0


def test_k_1_overlaps_its_commit_too(tiny_target, tiny_draft):
    """k = 1 has no draft step 2 to advance, but its single draft step can still be built on the
    device and launched before the commit: same tokens as main and as the synced commit."""
    prompts, params = random_prompts(3, seed=2), SamplingParams(temperature=1.0, max_tokens=25, ignore_eos=True, seed=3)
    outs, counters = {}, {}
    for name, mode, overlap in (("main", "main", True), ("synced", "gpu", False), ("overlapped", "gpu", True)):
        llm = tiny_llm(tiny_target, tiny_draft, k=1, device=KERNEL_DEVICE_TYPE, draft_loop=mode, overlap_commit=overlap)
        outs[name] = _outputs(llm, prompts, params)
        counters[name] = llm.counters["draft"]
    assert outs["overlapped"] == outs["synced"] == outs["main"]
    assert counters["overlapped"]["gpu_first_step"] > 0 and "gpu_advance" not in counters["overlapped"]
    assert "gpu_first_step" not in counters["synced"]


def test_the_first_spec_step_is_launched_from_the_prefills_tokens(tiny_target, tiny_draft):
    """After a prefill that makes the whole batch, the first spec step's draft step 1 is queued from
    the sampled tokens on the device (t_{L-1} and the new token at positions L-1, L) before the host
    reads them, and the spec step takes it; not for requests whose prefill token is their last."""
    llm = tiny_llm(tiny_target, tiny_draft, k=3, device=KERNEL_DEVICE_TYPE, draft_loop="gpu")
    eng = llm.engine
    prompts = random_prompts(2, seed=8)
    seqs = llm.make_sequences(prompts, SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True, seed=3))
    eng.waiting.extend(seqs)
    eng.admit_and_prefill()
    pending = eng.spec_step.commit_policy.pending
    assert pending is not None and pending.seqs == seqs
    first = pending.first_inputs
    assert first.input_ids.view(-1, 2)[:2].tolist() == [s.token_ids[-2:] for s in seqs]
    assert first.positions.view(-1, 2)[:2].tolist() == [[len(p) - 1, len(p)] for p in prompts]
    eng.step()
    draft = llm.counters["draft"]
    assert draft["gpu_first_step"] == 2 and "cpu_prepare:first_draft_step" not in draft  # this step's, the next's
    eng.abort_all()

    for params, launch in ((SamplingParams(max_tokens=1), True), (SamplingParams(max_tokens=20), False)):
        seqs = llm.make_sequences(prompts, params)
        eng.waiting.extend(seqs)
        eng.admit_and_prefill(launch_first_step=launch)
        assert eng.spec_step.commit_policy.pending is None
        eng.abort_all()


def test_a_prefill_launch_survives_short_requests_and_an_eos_at_the_prefill(tiny_target, tiny_draft):
    """max_tokens 2 (the launched first step is the request's last) and a request whose prefill token
    is its EOS (the launched step is left over, then dropped by the next launch): the tokens are the
    synced commit's and every block comes back."""
    prompts = random_prompts(2, seed=9)
    llms = {overlap: tiny_llm(tiny_target, tiny_draft, k=3, device=KERNEL_DEVICE_TYPE, draft_loop="gpu",
                              overlap_commit=overlap) for overlap in (False, True)}
    short = SamplingParams(temperature=1.0, max_tokens=2, seed=4)
    assert _outputs(llms[True], prompts, short) == _outputs(llms[False], prompts, short)
    first = llms[False].generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=5))[0].token_ids[0]
    for llm in llms.values():
        llm.engine.eos_token_id = first  # the first prompt's greedy prefill token ends it
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    ended = _outputs(llms[True], prompts[:1], greedy)
    assert ended == [([first], "stop")] == _outputs(llms[False], prompts[:1], greedy)
    assert llms[True].engine.spec_step.commit_policy.pending is not None  # launched, then nothing took it
    assert _outputs(llms[True], prompts[1:], greedy) == _outputs(llms[False], prompts[1:], greedy)
    assert llms[True].counters["draft"]["first_step_discarded"] >= 1
    for llm in llms.values():
        bm = llm.engine.block_manager
        assert bm.num_free_blocks == bm.num_usable_blocks


def test_a_launched_step_is_taken_past_an_ended_request_only_where_it_ran_whole():
    """The rows of a request that ended in the commit before are skipped only where the launched step
    ran whole (its result is there, nothing of it is left to prepare); a joined request, or a step left
    to finish stage by stage, discards it."""
    from collections import Counter

    from protospec.requests.sequence import FinishReason, Sequence
    from protospec.speculation.commit import OverlappedCommit
    from protospec.speculation.lookahead import Lookahead
    from protospec.speculation.step_state import StepState

    def seq(i):
        return Sequence(i, [1, 2, 3], SamplingParams(max_tokens=20), torch.Generator(), block_table=[1, 2])

    def pending(seqs, st, ran_whole):
        empty = torch.empty(0)
        state = StepState(seqs, st, 2, empty, empty)
        state.result = object() if ran_whole else None
        return state

    a, b, c, joined = (seq(i) for i in range(4))
    old_st, new_st = object(), object()
    counters = Counter()
    policy = OverlappedCommit(counters, Lookahead(3), block_size=16)
    b.finish_reason = FinishReason.LENGTH  # ended in the commit before the launched step is taken

    policy.pending = launched = pending([a, b, c], old_st, ran_whole=True)
    assert policy.take([a, c], new_st) is launched and launched.live_st is new_st
    assert counters["launched_rows_past_an_end"] == 1 and policy.pending is None
    policy.pending = pending([a, b, c], old_st, ran_whole=False)
    assert policy.take([a, c], new_st) is None and counters["first_step_discarded"] == 1
    policy.pending = pending([a, b, c], old_st, ran_whole=True)
    assert policy.take([a, c, joined], new_st) is None
    policy.pending = launched = pending([a, c], old_st, ran_whole=True)  # nothing ended: the same settings only
    assert policy.take([a, c], new_st) is None and counters["first_step_discarded"] == 3
    policy.pending = launched = pending([a, c], old_st, ran_whole=False)
    assert policy.take([a, c], old_st) is launched and counters["launched_rows_past_an_end"] == 1

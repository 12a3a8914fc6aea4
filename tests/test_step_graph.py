"""A launched spec step as one CUDA graph: the verify's inputs built on the device (held to the CPU
prepare), the commit's row, when the step graph applies, and its tokens against the stage-by-stage step."""
import random

import pytest
import torch
from tiny import random_prompts, tiny_llm

from protospec import SamplingParams, registry
from protospec.errors import ConfigError, KernelArgumentError
from protospec.layout import NULL_BLOCK, PAD_SLOT_ID, RejectionOutput
from protospec.model.inputs import prepare_inputs
from protospec.model.persistent_inputs import PersistentInputs
from protospec.speculation.step_graph import commit_row, draws_from_keys, step_graph_applies
from protospec.speculation.verify_inputs import build_verify_inputs

ON_GPU = torch.cuda.is_available()
# Where the verify-inputs kernel runs: the simulator takes host tensors, a real device wants its own.
KERNEL_DEVICE = torch.device("cuda" if ON_GPU else "cpu")


def _first_step(rows, width, block_size, lengths, last_tokens, tables):
    """Draft step 1's buffers as the first_draft_step kernel leaves them (padding rows: seq_lens 0)."""
    first = PersistentInputs("first", rows, 2, width, 1, block_size, KERNEL_DEVICE)
    first.input_ids.fill_(99)
    for r, (length, last, table) in enumerate(zip(lengths, last_tokens, tables)):
        first.seq_lens[r] = length
        first.input_ids[2 * r + 1] = last
        first.block_tables[r, : len(table)] = torch.tensor(table, dtype=torch.int32)
    return first


def _build(first, drafts, verify, rows, width, error):
    """The draft tokens as the draft steps' samples leave them in the verify's tokens, then the kernel."""
    verify.input_ids[: rows * (drafts.shape[1] + 1)].view(rows, -1)[:, 1:] = drafts
    build_verify_inputs(first, drafts, verify, rows, width, error)


@pytest.mark.parametrize("batch,rows,k,block_size", [(1, 1, 5, 16), (3, 4, 4, 4), (6, 8, 2, 8)])
def test_verify_inputs_match_the_cpu_prepare_and_keep_padding_inert(batch, rows, k, block_size):
    rng = random.Random(batch * 10 + k)
    free = list(range(1, 500))
    rng.shuffle(free)
    lengths = [rng.randint(2, 40) for _ in range(batch)]
    tables = [[free.pop() for _ in range(-(-(n + k) // block_size))] for n in lengths]
    width = max(len(t) for t in tables)
    last = [rng.randint(3, 200) for _ in range(batch)]
    drafts = torch.randint(3, 200, (rows, k), device=KERNEL_DEVICE)
    first = _first_step(rows, width, block_size, lengths, last, tables)
    verify = PersistentInputs("verify", rows, k + 1, width, k + 1, block_size, KERNEL_DEVICE)
    verify.slot_mapping.fill_(123)  # stale slots a padding row must not keep
    verify.input_ids.fill_(-5)
    error = torch.zeros(1, dtype=torch.int32, device=KERNEL_DEVICE)
    _build(first, drafts, verify, rows, width, error)

    cpu = prepare_inputs([[t] + drafts[r].tolist() for r, t in enumerate(last)], [n - 1 for n in lengths], tables,
                         block_size, k + 1, torch.device("cpu"), width)
    real = batch * (k + 1)
    assert verify.input_ids[:real].tolist() == cpu.input_ids.tolist()
    assert verify.positions[:real].tolist() == cpu.positions.tolist()
    assert verify.slot_mapping[:real].tolist() == cpu.meta.slot_mapping.tolist()
    assert verify.seq_lens[:batch].tolist() == [n + k for n in lengths]
    assert torch.equal(verify.block_tables[:batch, :width].cpu(), cpu.meta.block_tables)
    assert (verify.slot_mapping[real:] == PAD_SLOT_ID).all() and (verify.seq_lens[batch:] == 0).all()
    pad = verify.input_ids[real : rows * (k + 1)].view(rows - batch, k + 1)
    assert (pad[:, 0] == 0).all() and torch.equal(pad[:, 1:], drafts[batch:])  # padding: only the first token
    assert error.item() == 0


def test_verify_inputs_flag_a_position_past_the_table():
    block_size, k = 4, 3
    tables = [[5, 6, 7], [8, NULL_BLOCK, NULL_BLOCK]]  # row 1 holds 4 positions only
    lengths, last = [6, 3], [11, 12]
    first = _first_step(2, 3, block_size, lengths, last, tables)
    verify = PersistentInputs("verify", 2, k + 1, 3, k + 1, block_size, KERNEL_DEVICE)
    error = torch.zeros(1, dtype=torch.int32, device=KERNEL_DEVICE)
    _build(first, torch.full((2, k), 7, device=KERNEL_DEVICE), verify, 2, 3, error)
    assert error.item() == 2  # row 1, + 1
    assert verify.slot_mapping[k + 1 :].tolist() == [8 * 4 + 2, 8 * 4 + 3, PAD_SLOT_ID, PAD_SLOT_ID]
    assert verify.slot_mapping[: k + 1].tolist() == [6 * 4 + 1, 6 * 4 + 2, 6 * 4 + 3, 7 * 4 + 0]


def test_the_verify_inputs_kernel_names_a_bad_argument():
    first = _first_step(2, 3, 4, [5, 6], [9, 9], [[1, 2], [3, 4]])
    verify = PersistentInputs("verify", 2, 4, 3, 4, 4, KERNEL_DEVICE)
    error = torch.zeros(1, dtype=torch.int32, device=KERNEL_DEVICE)
    drafts = torch.zeros(2, 3, dtype=torch.int64, device=KERNEL_DEVICE)
    with pytest.raises(KernelArgumentError, match="draft_ids: dtype torch.int32, expected torch.int64"):
        build_verify_inputs(first, drafts.int(), verify, 2, 3, error)
    with pytest.raises(KernelArgumentError, match="width 4 outside 1..3"):
        build_verify_inputs(first, drafts, verify, 2, 4, error)
    with pytest.raises(ValueError, match="verify buffers hold 4 tokens a row, the step needs k \\+ 1 = 3"):
        build_verify_inputs(first, drafts[:, :2], verify, 2, 3, error)


def test_commit_row_lays_out_ids_counts_and_the_flag():
    out = torch.tensor([[4, 5, -1], [6, -1, -1]])
    result = RejectionOutput(out, torch.tensor([1, 0]), torch.tensor([[True, False], [False, False]]),
                             torch.tensor([[True, True], [False, True]]))
    row = commit_row(result, None, torch.tensor([2], dtype=torch.int32))
    assert row.tolist() == [4, 5, -1, 1, 2, 6, -1, -1, 0, 1, 2]
    assert commit_row(result, torch.tensor([2, 1]), None).tolist() == [4, 5, -1, 1, 2, 2, 6, -1, -1, 0, 1, 1]
    # Columns a rejection kernel wrote are taken as they are (here deliberately not the masks' counts),
    # except where the proposed counts must go between the rows
    written = RejectionOutput(out, result.num_accepted, result.accepted_mask, result.passed_mask,
                              commit_columns=torch.tensor([[4, 5, -1, 1, 7], [6, -1, -1, 0, 8]]))
    assert commit_row(written, None, torch.tensor([0], dtype=torch.int32)).tolist() == [4, 5, -1, 1, 7, 6, -1, -1, 0, 8, 0]
    assert commit_row(written, torch.tensor([2, 1]), None).tolist() == [4, 5, -1, 1, 2, 2, 6, -1, -1, 0, 1, 1]
    # and a row the kernel wrote with the flag is the commit's row itself, where no proposed counts go in
    flagged = torch.tensor([4, 5, -1, 1, 7, 6, -1, -1, 0, 8, 9])
    written.commit_flagged = flagged
    assert commit_row(written, None, torch.tensor([0], dtype=torch.int32)) is flagged
    assert commit_row(written, torch.tensor([2, 1]), None).tolist() == [4, 5, -1, 1, 2, 2, 6, -1, -1, 0, 1, 1]


def test_the_step_graph_applies_only_where_it_can_and_says_why_not():
    args = dict(draft_loop=registry.GRAPH, proposer=registry.DRAFT, commit=registry.OVERLAPPED)
    assert step_graph_applies(None, **args) and step_graph_applies(True, **args)
    assert not step_graph_applies(False, **args)
    with pytest.raises(ConfigError, match="the graph draft loop, .*the overlapped commit"):
        step_graph_applies(True, **(args | {"draft_loop": registry.GPU, "commit": registry.SYNCED}))
    with pytest.raises(ConfigError, match="needs a draft model$"):
        step_graph_applies(True, **(args | {"proposer": registry.NGRAM}))
    assert not step_graph_applies(None, **(args | {"proposer": registry.NGRAM}))


def test_the_verify_draws_from_keys_with_the_fused_rejection_kernel_only():
    """Only the fused rejection kernel takes noise keys; rows with top-k / top-p go to the torch
    samplers, which read filled noise."""
    from protospec.speculation.acceptance import RejectionSampling, TypicalAcceptance
    from protospec.speculation.sampler import SamplingTensors

    def settings(**given):
        return SamplingTensors.build([SamplingParams(temperature=1.0, **given)], [torch.Generator()], 50, KERNEL_DEVICE)

    assert draws_from_keys(settings(), RejectionSampling(fused=True))
    assert not draws_from_keys(settings(), RejectionSampling(fused=False))
    assert not draws_from_keys(settings(), TypicalAcceptance(0.09, 0.3))
    assert not draws_from_keys(settings(top_k=5), RejectionSampling(fused=True))


def test_asking_for_the_step_graph_on_a_cpu_engine_names_what_is_missing(tiny_target, tiny_draft):
    with pytest.raises(ConfigError, match="spec_step_graph=True needs the graph draft loop"):
        tiny_llm(tiny_target, tiny_draft, k=3, draft_loop="main", spec_step_graph=True)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device")
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("slots", [2, 8])
def test_step_graph_gives_the_stage_by_stage_tokens_while_batches_change(tiny_target, tiny_draft, temperature, k,
                                                                         slots):
    """Requests of different lengths share two batch slots, so launched steps are discarded (their keys
    kept) and graphs of several batch sizes replay; or all run in one batch of eight slots and end at
    different steps, so launched steps are taken with the rows of requests that ended in the commit
    before (skipped), and the next is built for the rest. With the step graph on or off the tokens
    are the same (its random numbers and verify inputs built on a branch beside draft step 1)."""
    prompts = random_prompts(5, seed=6)
    params = [SamplingParams(temperature=temperature, top_k=40, max_tokens=n, seed=20 + i, ignore_eos=True)
              for i, n in enumerate((40, 61, 33, 18, 29))]
    outs, counters = {}, {}
    for setting in (False, None):
        llm = tiny_llm(tiny_target, tiny_draft, k=k, device="cuda", dtype="float16", draft_loop="graph",
                       max_num_seqs=slots, spec_step_graph=setting, check_no_sync=True)
        outs[setting] = [o.token_ids for o in llm.generate(prompts, params)]
        counters[setting] = llm.counters["draft"]
        bm = llm.engine.block_manager
        assert bm.num_free_blocks == bm.num_usable_blocks
    assert outs[None] == outs[False]
    assert counters[None]["spec_step_graph"] > 0 and "spec_step_graph" not in counters[False]
    if slots == 8:  # no request joins: every ending but the last is crossed by a launched step
        assert counters[None]["launched_rows_past_an_end"] >= 3 and "launched_rows_past_an_end" not in counters[False]




@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device")
@pytest.mark.parametrize("temperatures", [(1.0, 0.0), (0.0,)], ids=["mixed", "greedy"])
def test_probabilities_formed_from_the_logits_give_the_written_ones_tokens(tiny_target, tiny_draft, temperatures,
                                                                          monkeypatch):
    """From LOGITS_MIN_ROWS rows the step graph writes no probabilities (the rejection kernel forms p
    and q from the logits and each row's statistics): the tokens of the graphs that write them, with
    keyed noise at T = 1 beside greedy rows, and in all-greedy graphs."""
    from protospec.speculation import step_graph

    prompts = random_prompts(5, seed=7)
    params = [SamplingParams(temperature=temperatures[i % len(temperatures)], max_tokens=n, seed=30 + i,
                             ignore_eos=True) for i, n in enumerate((40, 61, 33, 18, 29))]
    outs = {}
    for min_rows in (1, 1 << 20):
        monkeypatch.setattr(step_graph, "LOGITS_MIN_ROWS", min_rows)
        llm = tiny_llm(tiny_target, tiny_draft, k=4, device="cuda", dtype="float16", draft_loop="graph",
                       max_num_seqs=8, check_no_sync=True)
        outs[min_rows] = [o.token_ids for o in llm.generate(prompts, params)]
        graphs = llm.engine.spec_step._step_graphs.values()
        assert graphs and all(g.from_logits == (min_rows == 1) for g in graphs)
    assert outs[1] == outs[1 << 20]

"""The draft step's token in one Gumbel-max launch (kernels/sampling/gumbel_sample.py) against its torch twin and
against the exponential race of the two-launch sampler: the same ids on sampled and greedy rows (a tie
to the first index, a row of -inf to 0), the same decode inputs written by its advance, and bad
arguments refused. Then the captured draft loop with the probabilities on a branch of their own
(speculation/probs_branch.py): the same tokens as without it. Simulator on CPU, the GPU where there is one."""
import pytest
import torch

from protospec.errors import KernelArgumentError
from protospec.kernels.sampling import gumbel_sample, softmax_sample as sampling
from protospec.kernels.inputs.advance_step import AdvanceStepLauncher
from protospec.kernels.sampling.gumbel_sample import gumbel_reference, gumbel_sample_into
from protospec.kernels.launch.interop import KERNEL_DEVICE_TYPE
from protospec.kernels.randoms import counter_randoms
from protospec.layout import NULL_BLOCK
from protospec.speculation.sampler import exponential_noise
from test_advance_step import NAMES, make_batch
from test_sampling_kernel import _narrow_slices, _tensors

DEV = torch.device(KERNEL_DEVICE_TYPE)
BLOCK_SIZE = 4


def _narrow(monkeypatch) -> int:
    width = _narrow_slices(monkeypatch)
    from protospec.kernels.launch import interop

    if interop.SIMULATOR:
        monkeypatch.setattr(gumbel_sample, "THREADS", 8)
        monkeypatch.setattr(gumbel_sample, "VOCAB_PER_BLOCK", 16)
    return width


def _decode_buffers(rows: int):
    t = make_batch(2, rows + 2, BLOCK_SIZE, [5, 9], seed=3)
    t["block_tables"][1, 2:] = NULL_BLOCK  # row 1's position 9 needs block index 2: flagged
    return t


@pytest.mark.parametrize("dependent", [False, True], ids=["plain", "dependent"])
def test_the_one_launch_sample_is_the_races_winner_and_advances_the_same(monkeypatch, dependent):
    width = _narrow(monkeypatch)
    rows, k, step, vocab = 3, 3, 2, 3 * width + 5
    st = _tensors([0.7, 0.0, 1.3], vocab)
    logits = (torch.randn(rows, vocab, generator=torch.Generator().manual_seed(7)) * 3).to(DEV)
    noise = exponential_noise((2 * k + 1, vocab), st.generators, DEV)[:, :k].contiguous()  # [B, k, V]
    out = {}
    for form in ("race", "gumbel"):
        t = _decode_buffers(rows)
        advance = AdvanceStepLauncher(BLOCK_SIZE, *(t[n] for n in NAMES), dependent=dependent)
        ids = torch.full((rows, k), -7, dtype=torch.int64, device=DEV)
        if form == "race":
            probs = torch.zeros(rows, k, vocab, device=DEV)
            sampling.sample_into(logits, st, step, probs, ids, noise, t["sampled_ids"], dependent, advance)
        else:
            gumbel_sample_into(logits, st, step, ids, noise, t["sampled_ids"], dependent, advance)
        out[form] = (ids.cpu(), {n: t[n].cpu() for n in NAMES})
    (race_ids, race_inputs), (ids, inputs) = out["race"], out["gumbel"]
    twin = gumbel_reference(logits.cpu(), st.temperature.cpu(), st.is_greedy.cpu(), noise[:, step].cpu())
    assert ids[:, step].tolist() == twin.tolist() == race_ids[:, step].tolist()
    assert ids[1, step].item() == logits[1].argmax().item()  # the greedy row
    assert (ids[:, [0, 1]] == -7).all()  # other steps' columns untouched
    for name in ("input_ids", "positions", "seq_lens", "slot_mapping", "error_row"):
        assert torch.equal(inputs[name][:rows], race_inputs[name][:rows]), name
    assert inputs["input_ids"][:2].tolist() == ids[:2, step].tolist()


@pytest.mark.parametrize("dependent", [False, True], ids=["plain", "dependent"])
def test_noise_drawn_from_the_rows_keys_is_the_noise_the_counter_fill_writes(monkeypatch, dependent):
    """Target-only decoding hands the kernel its rows' counter keys instead of a filled noise tensor:
    the numbers it draws at [r, step] must be the fill's, so the sampled ids are the same bits. Logits
    near zero let the noise decide every sampled row; step 2 of 3 catches a draw at the wrong index."""
    width = _narrow(monkeypatch)
    rows, k, step, vocab = 3, 3, 2, 3 * width + 5
    st = _tensors([0.7, 0.0, 1.3], vocab)
    logits = (torch.randn(rows, vocab, generator=torch.Generator().manual_seed(4)) * 0.01).to(DEV)
    keys = torch.tensor([[12345, 678], [0, 0], [2**31 + 5, 2**32 - 1]], dtype=torch.int64, device=DEV)  # [B, 2]
    noise = torch.zeros(rows, k, vocab, device=DEV)
    counter_randoms.fill_kernel(keys, noise, torch.zeros(rows, 0, device=DEV))
    by_noise = torch.full((rows, k), -7, dtype=torch.int64, device=DEV)
    by_keys = by_noise.clone()
    gumbel_sample_into(logits, st, step, by_noise, noise, dependent=dependent)
    gumbel_sample_into(logits, st, step, by_keys, None, dependent=dependent, noise_keys=keys)
    twin = gumbel_reference(logits.cpu(), st.temperature.cpu(), st.is_greedy.cpu(), noise[:, step].cpu())
    assert by_keys[:, step].tolist() == by_noise[:, step].tolist() == twin.tolist()
    assert by_keys[1, step].item() == logits[1].argmax().item()  # the greedy row ignores its key
    wrong_step = gumbel_reference(logits.cpu(), st.temperature.cpu(), st.is_greedy.cpu(), noise[:, 0].cpu())
    assert wrong_step[[0, 2]].tolist() != twin[[0, 2]].tolist()  # the noise, not the logits, decides here
    with pytest.raises(KernelArgumentError, match="not both"):
        gumbel_sample_into(logits, st, step, by_keys, noise, noise_keys=keys)
    with pytest.raises(KernelArgumentError, match="key pair"):
        gumbel_sample_into(logits, st, step, by_keys, None, noise_keys=keys[:, :1].contiguous())


def test_ties_go_to_the_first_index_and_a_row_of_minus_infinity_to_zero(monkeypatch):
    width = _narrow(monkeypatch)
    rows, k, vocab = 3, 2, 2 * width + 3
    st = _tensors([0.0, 0.0, 0.0], vocab)  # all greedy: no noise at all
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(1))
    logits[0, [3, width + 2]] = 9.0       # equal maxima in two slices: the first wins
    logits[1, [width + 4, vocab - 1]] = 9.0
    logits[2] = float("-inf")
    ids = torch.full((rows, k), -7, dtype=torch.int64, device=DEV)
    mirror = torch.full((rows,), -7, dtype=torch.int64, device=DEV)
    gumbel_sample_into(logits.to(DEV), st, 1, ids, None, mirror)
    assert ids[:, 1].tolist() == [3, width + 4, 0] == mirror.tolist()
    assert ids[:, 1].tolist() == gumbel_reference(logits, st.temperature.cpu(), st.is_greedy.cpu(), None).tolist()


def test_bad_arguments_are_refused_by_name(monkeypatch):
    width = _narrow(monkeypatch)
    vocab = width + 1
    st = _tensors([1.0, 1.0], vocab)
    logits = torch.zeros(2, vocab, device=DEV)
    ids = torch.zeros(2, 2, dtype=torch.int64, device=DEV)
    with pytest.raises(KernelArgumentError, match="noise: None"):
        gumbel_sample_into(logits, st, 0, ids, None)
    with pytest.raises(KernelArgumentError, match="does not fit"):
        gumbel_sample_into(logits, st, 0, ids, torch.ones(2, 2, vocab + 1, device=DEV))
    with pytest.raises(KernelArgumentError, match="draft_ids"):
        gumbel_sample_into(logits, st, 0, ids.int(), torch.ones(2, 2, vocab, device=DEV))
    t = make_batch(1, 1, BLOCK_SIZE, [3], seed=0)
    with pytest.raises(KernelArgumentError, match="the inputs to advance hold 1"):
        gumbel_sample_into(logits, st, 0, ids, torch.ones(2, 2, vocab, device=DEV), None, False,
                           AdvanceStepLauncher(BLOCK_SIZE, *(t[n] for n in NAMES)))


@pytest.mark.parametrize("temperatures", [[0.7, 0.0, 1.0], [0.0, 0.0, 0.0]], ids=["mixed", "greedy"])
def test_draft_steps_sampled_first_then_their_probabilities_in_one_pass_write_what_the_two_launches_write(
        monkeypatch, temperatures):
    """k draft steps through sample_draft_step with sample_first (the token alone, the logits kept in
    draft_probs), then ProbsBranch.probabilities over all k rows in place: the same ids, the very same
    probabilities as sampling each step with the two launches (on a CPU the branch runs in place)."""
    from protospec.speculation.draft_sampling import sample_draft_step
    from protospec.speculation.probs_branch import ProbsBranch

    width = _narrow(monkeypatch)
    rows, k, vocab = 3, 3, 2 * width + 7
    st = _tensors(temperatures, vocab)
    gen = torch.Generator().manual_seed(2)
    logits = [(torch.randn(rows, vocab, generator=gen) * 3).to(DEV) for _ in range(k)]
    noise = None if st.all_greedy else exponential_noise((2 * k + 1, vocab), st.generators, DEV)[:, :k].contiguous()
    out = {}
    for first in (False, True):
        ids = torch.full((rows, k), -7, dtype=torch.int64, device=DEV)
        probs = torch.zeros(rows, k, vocab, device=DEV)
        tokens = torch.full((rows, k + 1), -7, dtype=torch.int64, device=DEV)
        for step in range(k):
            got = sample_draft_step(logits[step], st, step, ids, probs, noise, None, True,
                                    tokens_to=tokens[:, step + 1], sample_first=first)
            assert got.tolist() == ids[:, step].tolist()
        if first:
            assert torch.equal(probs[:, 1].cpu(), logits[1].cpu())  # the logits, kept for the pass
            branch = ProbsBranch(DEV)
            branch.probabilities(probs, st)
            branch.join()
        out[first] = (ids.cpu(), probs.cpu(), tokens.cpu())
    (ref_ids, ref_probs, ref_tokens), (ids, probs, tokens) = out[False], out[True]
    assert torch.equal(ids, ref_ids) and torch.equal(tokens, ref_tokens) and torch.equal(probs, ref_probs)
    assert tokens[:, 1:].tolist() == ids.tolist()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "seeded_t1"])
def test_the_draft_loop_with_probabilities_on_a_branch_keeps_the_tokens(tiny_target, tiny_draft, temperature,
                                                                         launched_kernels):
    """The graph draft loop (a step graph on a GPU), its tokens sampled by the one-launch kernel and its
    probabilities on a branch: the same tokens as the gpu loop's two-launch sampler, and the one-launch
    kernel launched by the graph loop only."""
    from protospec.config import SamplingParams
    from tiny import random_prompts, tiny_llm

    params = SamplingParams(temperature=temperature, max_tokens=10, ignore_eos=True, seed=4)
    prompts = random_prompts(2, seed=3)
    tokens = {}
    for mode in ("gpu", "graph"):
        launched_kernels.clear()
        llm = tiny_llm(tiny_target, tiny_draft, k=3, device="cuda", draft_loop=mode)
        tokens[mode] = [o.token_ids for o in llm.generate(prompts, params)]
        assert any(name.startswith("gumbel_sample") for name in launched_kernels) is (mode == "graph")
    assert tokens["graph"] == tokens["gpu"] and all(len(t) == params.max_tokens for t in tokens["gpu"])

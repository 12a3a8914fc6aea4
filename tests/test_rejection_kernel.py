"""The fused rejection kernel gives exactly the torch reference's tokens, masks and counts (simulator
on CPU, the GPU where there is one), including the residual's fallback and the bonus token."""
import pytest
import torch

from protospec.errors import KernelArgumentError
from protospec.kernels.launch.interop import KERNEL_DEVICE_TYPE
from protospec.kernels.sampling.rejection import rejection_sample_fused
from protospec.kernels.primitives import arrivals
from protospec.speculation.rejection import rejection_sample

DEV = KERNEL_DEVICE_TYPE


def _case(seed: int, batch: int, k: int, vocab: int, greedy: bool = False, uniforms=None):
    gen = torch.Generator().manual_seed(seed)
    if greedy:  # one-hot rows; drafts agree with the target's argmax at random positions
        target_ids = torch.randint(0, vocab, (batch, k + 1), generator=gen)
        agree = torch.rand(batch, k, generator=gen) < 0.6
        draft_ids = torch.where(agree, target_ids[:, :k], torch.randint(0, vocab, (batch, k), generator=gen))
        q = torch.nn.functional.one_hot(draft_ids, vocab).float()
        p = torch.nn.functional.one_hot(target_ids, vocab).float()
        noise = torch.ones(batch, 2 * k + 1, vocab)
    else:
        q = torch.softmax(torch.randn(batch, k, vocab, generator=gen) * 2, -1)
        p = torch.softmax(torch.cat([q.log(), torch.zeros(batch, 1, vocab)], 1) + torch.randn(batch, k + 1, vocab, generator=gen), -1)
        draft_ids = torch.multinomial(q.view(-1, vocab), 1, generator=gen).view(batch, k)
        noise = torch.empty(batch, 2 * k + 1, vocab).exponential_(generator=gen).clamp_min_(1e-30)
    u = torch.rand(batch, k, generator=gen) if uniforms is None else uniforms
    # The engine's layout: recovered and bonus noise are slices of one block (non-contiguous for B > 1).
    args = (draft_ids, q, p, u, noise[:, k : 2 * k], noise[:, 2 * k])
    return [a.to(DEV) for a in args]


def _assert_same(args):
    ref = rejection_sample(*args)
    got = rejection_sample_fused(*args)
    assert got.output_token_ids.tolist() == ref.output_token_ids.tolist()
    assert got.num_accepted.tolist() == ref.num_accepted.tolist()
    assert got.accepted_mask.tolist() == ref.accepted_mask.tolist()
    assert got.passed_mask.tolist() == ref.passed_mask.tolist()
    assert got.accepted_mask.dtype == got.passed_mask.dtype == torch.bool
    # The commit's columns: the ids, the accepted count and the passed count, as commit_row lays them out
    expected = torch.cat([ref.output_token_ids, ref.num_accepted[:, None], ref.passed_mask.sum(-1, keepdim=True)], 1)
    assert got.commit_columns.tolist() == expected.tolist() and got.commit_flagged is None
    # given the step's error flag, the kernel copies it in after the rows: the commit's whole row
    flag = torch.tensor([3], dtype=torch.int32, device=DEV)
    flagged = rejection_sample_fused(*args, error_flag=flag).commit_flagged
    assert flagged.tolist() == expected.flatten().tolist() + [3]
    return ref


@pytest.mark.parametrize("seed,batch,k,vocab", [(0, 3, 3, 50), (1, 2, 5, 300), (2, 1, 1, 7)])
def test_sampled_rows_match_the_reference(seed, batch, k, vocab):
    ref = _assert_same(_case(seed, batch, k, vocab))
    assert len(set(ref.num_accepted.tolist())) >= 1


def test_a_vocabulary_over_several_gpu_slices_matches_the_reference():
    """Sized for the GPU's 512-entry slices (the other cases fit one or two there); twice, so the
    arrival counters must be back at zero."""
    from protospec.kernels.sampling import rejection

    if 7000 > 3 * rejection.VOCAB_PER_BLOCK * 2:  # the simulator's 128-entry slices: fifty-odd blocks
        pytest.skip("sized for the GPU's slices")
    args = _case(5, 3, 4, 7000)
    for _ in range(2):
        _assert_same(args)


@pytest.mark.parametrize("span", [2, 4])
def test_blocks_of_several_slices_match_the_reference(span):
    """A block over `span` slices (what the grid picks once it fills the GPU), the last block's range
    ragged: the same tokens, masks and commit row as the reference and as a block a slice."""
    from protospec.kernels.sampling.slices import VOCAB_PER_BLOCK

    args = _case(10, 3, 4, 5 * VOCAB_PER_BLOCK + 37, uniforms=torch.tensor([[0.0] * 4, [0.9] * 4, [1.0] * 4]))
    ref = rejection_sample(*args)
    assert 4 in ref.num_accepted.tolist() and min(ref.num_accepted.tolist()) < 4  # the bonus race and a residual one
    for given in (span, 1):
        got = rejection_sample_fused(*args, span=given)
        assert got.output_token_ids.tolist() == ref.output_token_ids.tolist()
        assert got.passed_mask.tolist() == ref.passed_mask.tolist()
        assert got.commit_columns[:, -2].tolist() == ref.num_accepted.tolist()


@pytest.mark.parametrize("greedy", [False, True])
def test_more_positions_than_threads_match_the_reference(greedy):
    """k past the block's threads: a thread tests several positions and writes several outputs."""
    from protospec.kernels.sampling import rejection

    _assert_same(_case(6, 2, rejection.THREADS + 3, 20, greedy=greedy))


def test_blocks_of_several_warps_match_the_reference(monkeypatch):
    """The warps' partial results merged through shared slots (the first failure, the passed count, the
    races): the simulator reads the block width and the shuffle width at run time, so two warps of 32
    there (8 on a GPU), and k = 40 puts draft positions in the second warp."""
    from protospec.kernels.launch import interop
    from protospec.kernels.primitives import reductions
    from protospec.kernels.sampling import rejection

    if interop.SIMULATOR:
        monkeypatch.setattr(rejection, "THREADS", 64)
        monkeypatch.setattr(reductions, "SHUFFLE_LANES", 32)  # the GPU's shuffles, emulated
    uniforms = torch.zeros(1, 40)  # u = 0 passes wherever p > 0 ...
    uniforms[0, 37] = 1.0          # ... and u = 1 fails where p == q: the first failure in the second warp
    args = _case(9, 1, 40, 130, uniforms=uniforms)
    args[2][0, 37] = args[1][0, 37]
    ref = _assert_same(args)
    assert ref.num_accepted.tolist() == [37] and int(ref.passed_mask.sum()) == 39


def test_more_slices_than_threads_match_the_reference():
    """A vocabulary of more slices than the block has threads: the last block's threads combine several
    slices each (and the fallback race where p == q everywhere)."""
    from protospec.kernels.sampling import rejection

    vocab = rejection.THREADS * rejection.VOCAB_PER_BLOCK + 100
    _assert_same(_case(7, 1, 2, vocab))
    args = _case(8, 1, 2, vocab, uniforms=torch.ones(1, 2))
    args[2][:, :2] = args[1]
    assert _assert_same(args).num_accepted.tolist() == [0]


def test_greedy_rows_match_including_full_accepts():
    args = _case(3, 4, 4, 130, greedy=True)  # a vocabulary over several slices (blocks) in the simulator too
    args[0][0] = args[2][0, :4].argmax(-1)  # row 0: every draft token is the target's argmax
    args[1][0] = torch.nn.functional.one_hot(args[0][0], 130).float()
    ref = _assert_same(args)
    assert ref.num_accepted[0].item() == 4  # so the bonus path ran


def test_residual_fallback_when_p_equals_q():
    """u = 1 rejects even where p == q; the residual is then all zero (in every slice of the
    vocabulary) and the race runs over p. Twice: the slices' arrival counters are back at zero."""
    args = _case(4, 2, 3, 150, uniforms=torch.ones(2, 3))
    args[2][:, :3] = args[1]  # p == q at every draft position
    for _ in range(2):
        ref = _assert_same(args)
        assert ref.num_accepted.tolist() == [0, 0]
        assert int(arrivals._COUNTERS[(args[0].device, "rejection")][-1].abs().sum()) == 0


def test_bad_arguments_are_named():
    args = _case(5, 2, 3, 20)
    with pytest.raises(KernelArgumentError, match="draft_probs"):
        rejection_sample_fused(args[0], args[1].double(), *args[2:])
    with pytest.raises(KernelArgumentError, match="shapes"):
        rejection_sample_fused(args[0], args[1], args[2][:, :3].contiguous(), *args[3:])
    with pytest.raises(KernelArgumentError, match="recovered_noise and bonus_noise are tensors"):
        rejection_sample_fused(*args[:4], None, None)


def test_engine_with_the_fused_kernel_emits_the_same_tokens(tiny_target, tiny_draft):
    from tiny import random_prompts, tiny_llm

    from protospec import SamplingParams

    prompts = random_prompts(3)
    params = [SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, seed=7),
              SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
              SamplingParams(temperature=0.8, top_k=20, max_tokens=12, ignore_eos=True, seed=3)]
    device = "cuda" if DEV == "cuda" else "cpu"
    runs = []
    for fused in (False, True):
        llm = tiny_llm(tiny_target, tiny_draft, k=3, device=device, fused_rejection=fused)
        outs = llm.generate(prompts, params)
        runs.append(([o.token_ids for o in outs], llm.metrics.num_passed_tokens, llm.metrics.num_accepted_tokens))
    assert runs[0] == runs[1]


def test_array_fields_follow_numbas_layout_for_c_contiguous_arrays():
    """TensorLaunch hands the driver these fields per tensor; they must be what Numba's own dispatch
    marshals for the same array (meminfo, parent, nitems, itemsize, data, shape, strides in bytes)."""
    import numpy as np

    from protospec.kernels.launch.interop import array_fields

    t = torch.zeros(1, 3, 5, dtype=torch.float32)
    strided_dim0 = torch.zeros(4, 3, 5)[1:2]  # contiguous, but torch reports stride 15 for the size-1 dim
    for tensor in (t, strided_dim0, torch.zeros(7, dtype=torch.int64), torch.zeros(2, 6, dtype=torch.uint8)):
        expected_strides = list(np.empty(tuple(tensor.shape), dtype=tensor.numpy().dtype).strides)
        fields = array_fields(tensor)
        assert fields[:5] == [0, 0, tensor.numel(), tensor.element_size(), tensor.data_ptr()]
        assert fields[5:] == list(tensor.shape) + expected_strides


def test_a_launch_parameter_block_holds_every_field_and_scalar_in_its_slot():
    """TensorLaunch packs a launch's arguments into one buffer of 8-byte slots, one pointer per slot:
    the tensors' fields as array_fields gives them (rank 1, 2 and 3) and each scalar as Numba types it
    (an int32 or float32 fills the low 4 bytes of its slot). Refilled with other tensors of the same
    signature, the block holds the new ones (the pointers stay)."""
    import ctypes
    import struct

    from numba import types

    from protospec.kernels.launch.interop import _Parameters, array_fields

    sig = [types.float32[:, ::1], types.int64, types.float32, types.int64[::1], types.int32, types.float64,
           types.boolean, types.float16[:, :, ::1]]
    def args_of(n):
        return [torch.zeros(n, 3), 7 * n, 0.25, torch.zeros(5 + n, dtype=torch.int64), -3, 1.5, True,
                torch.zeros(2, n, 4, dtype=torch.float16)]
    params = _Parameters(sig, args_of(1))
    for n in (1, 4):
        args = args_of(n)
        pointers = params.fill(args)
        slots = [ctypes.string_at(p, 8) for p in pointers]
        read = []
        for a, ty in zip(args, sig):
            if isinstance(a, torch.Tensor):
                read += [struct.unpack("<q", slots.pop(0))[0] for _ in array_fields(a)]
            else:
                fmt = {"int64": "<q", "float64": "<d", "int32": "<i4x", "float32": "<f4x", "bool": "<?7x"}[str(ty)]
                read.append(struct.unpack(fmt, slots.pop(0))[0])
        assert not slots
        expected = []
        for a in args:
            expected += array_fields(a) if isinstance(a, torch.Tensor) else [a]
        assert read == expected


def _with_fewer_proposals(args, num_proposed):
    """Zero the draft_probs rows past each row's proposals, as a proposer with fewer tokens leaves them."""
    k = args[0].shape[1]
    proposed = torch.tensor(num_proposed, dtype=torch.int64, device=args[0].device)
    past = torch.arange(k, device=args[0].device)[None, :] >= proposed[:, None]
    args[1] = args[1].masked_fill(past[:, :, None], 0.0)
    return args + [proposed]


@pytest.mark.parametrize("greedy", [False, True])
def test_rows_with_fewer_proposals_match_the_reference(greedy):
    args = _with_fewer_proposals(_case(5, 4, 3, 40, greedy=greedy), [0, 1, 3, 2])
    ref = _assert_same(args)
    assert ref.num_accepted[0].item() == 0 and not ref.passed_mask[0].any()  # nothing proposed, nothing tested
    assert not ref.passed_mask[1, 1:].any() and not ref.passed_mask[3, 2:].any()
    assert (ref.output_token_ids[0, 1:] == -1).all()  # one token emitted: a target-only step for that row


def test_noise_drawn_from_the_keys_gives_the_tokens_of_the_filled_noise():
    """noise_keys: the kernel draws row n's Exp(1) numbers from each sequence's key where the filled
    form reads the spec step's noise block (counter_randoms' numbers at rows k..2k): the same tokens,
    masks and commit row, for the bonus race (u = 0), the residual race (u = 1) and the residual
    fallback (q = p on the second sequence: its race over p)."""
    from protospec.kernels.randoms import counter_randoms

    k, vocab = 2, 300
    args = _case(11, 3, k, vocab, uniforms=torch.tensor([[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]))
    args[2][1, :k] = args[1][1]  # p = q on the second sequence: its residual is zero everywhere
    keys = torch.tensor([counter_randoms.split_key(v) for v in (11, 2**63 + 5, 3)], dtype=torch.int64, device=DEV)
    noise = torch.empty(3, 2 * k + 1, vocab, device=DEV)
    counter_randoms.fill_kernel(keys, noise, torch.empty(3, k, device=DEV))
    filled = [*args[:4], noise[:, k : 2 * k], noise[:, 2 * k]]
    assert _assert_same(filled).num_accepted.tolist()[:2] == [2, 0]  # the kernel over them is the reference's
    want = rejection_sample_fused(*filled)
    got = rejection_sample_fused(*args[:4], None, None, noise_keys=keys)
    for field in ("output_token_ids", "num_accepted", "accepted_mask", "passed_mask", "commit_columns"):
        assert getattr(got, field).tolist() == getattr(want, field).tolist(), field
    with pytest.raises(KernelArgumentError, match="noise or noise_keys"):
        rejection_sample_fused(*args, noise_keys=keys)
    with pytest.raises(KernelArgumentError, match="noise_keys"):
        rejection_sample_fused(*args[:4], None, None, noise_keys=keys[:, :1].contiguous())
    with pytest.raises(KernelArgumentError, match="shapes"):  # the draft's side is still checked without noise
        rejection_sample_fused(args[0], args[1][:, :, :50].contiguous(), *args[2:4], None, None, noise_keys=keys)


def test_probabilities_formed_from_the_logits_give_the_written_ones_tokens():
    """from_logits: the kernel reads logits and each row's finished statistics (stats.py's finish) and
    forms p and q where it reads them; the same tokens, masks and commit row as over the probabilities
    the probabilities kernel writes from those logits: the bonus race (u = 0) and random tests with
    filled noise, the residual race (u = 1, a row each at T = 0.7, 1 and greedy) with keyed noise; and
    the finished statistics are each row's max, its first index and its softmax sum."""
    from types import SimpleNamespace

    from protospec.kernels.randoms import counter_randoms
    from protospec.kernels.sampling.softmax_sample import probs_into
    from protospec.kernels.sampling.stats import launch_stats

    batch, k, vocab = 3, 2, 200  # two slices a row in the simulator
    gen = torch.Generator().manual_seed(21)
    st = SimpleNamespace(temperature=torch.tensor([0.7, 1.0, 1.0], device=DEV), all_greedy=False, needs_filter=False,
                         is_greedy=torch.tensor([False, False, True], device=DEV))
    # [B, k, V] and [B, k + 1, V]; each row shifted by its own constant (the same probabilities, another
    # max): a row read with another row's statistics would be off by e^(shift difference / T)
    draft_logits = (torch.randn(batch, k, vocab, generator=gen) * 3 + 4 * torch.arange(batch * k).view(batch, k, 1)).to(DEV)
    target_logits = (torch.randn(batch, k + 1, vocab, generator=gen) * 3
                     - 4 * torch.arange(batch * (k + 1)).view(batch, k + 1, 1)).to(DEV)
    q = probs_into(draft_logits.view(-1, vocab), st, torch.empty(batch * k, vocab, device=DEV), k).view(batch, k, vocab)
    p = probs_into(target_logits.view(-1, vocab), st, torch.empty(batch * (k + 1), vocab, device=DEV),
                   k + 1).view(batch, k + 1, vocab)
    draft_ids = torch.multinomial(q.view(-1, vocab).cpu(), 1, generator=gen).view(batch, k).to(DEV)
    draft_rows = launch_stats(draft_logits.view(-1, vocab), st, k, "", False, finish=True)
    target_rows = launch_stats(target_logits.view(-1, vocab), st, k + 1, "", False, finish=True)
    flat = target_logits.view(-1, vocab).cpu() / st.temperature.cpu().repeat_interleave(k + 1)[:, None]
    assert torch.equal(target_rows[1].cpu(), flat.argmax(-1))
    assert torch.allclose(target_rows[0][:, 0].cpu() / st.temperature.cpu().repeat_interleave(k + 1), flat.max(-1).values)
    sums = torch.exp(flat - flat.max(-1, keepdim=True).values).sum(-1)
    assert torch.allclose(target_rows[0][:4, 1].cpu(), sums[:4], rtol=1e-5)  # (greedy rows sum nothing)
    keys = torch.tensor([counter_randoms.split_key(v) for v in (4, 5, 6)], dtype=torch.int64, device=DEV)
    noise = torch.empty(batch, 2 * k + 1, vocab, device=DEV)
    counter_randoms.fill_kernel(keys, noise, torch.empty(batch, k, device=DEV))
    rejected = 0
    for u, keyed in ((torch.zeros(batch, k), False), (torch.ones(batch, k), True),
                     (torch.rand(batch, k, generator=gen), False)):
        u = u.to(DEV)
        noises = (None, None) if keyed else (noise[:, k : 2 * k], noise[:, 2 * k])
        keyed_args = {"noise_keys": keys} if keyed else {}
        want = rejection_sample_fused(draft_ids, q, p, u, *noises, **keyed_args)
        got = rejection_sample_fused(draft_ids, draft_logits, target_logits, u, *noises, **keyed_args,
                                     from_logits=(st, draft_rows, target_rows))
        for field in ("output_token_ids", "num_accepted", "accepted_mask", "passed_mask", "commit_columns"):
            assert getattr(got, field).tolist() == getattr(want, field).tolist(), field
        rejected += (want.num_accepted < k).sum().item()
    assert rejected >= 3  # the residual races ran
    with pytest.raises(KernelArgumentError, match="target row_stats"):
        rejection_sample_fused(draft_ids, draft_logits, target_logits, u, noise[:, k : 2 * k], noise[:, 2 * k],
                               from_logits=(st, draft_rows, draft_rows))

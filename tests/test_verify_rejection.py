"""The verify's probabilities and the rejection sampler in one launch (kernels/sampling/verify_rejection.py): the
probabilities kernel's very bits and the rejection sampler's tokens, masks, counts and commit row over them,
against the two kernels and the torch reference (simulator on CPU, the GPU where there is one)."""
import pytest
import torch

from protospec.config import SamplingParams
from protospec.errors import KernelArgumentError
from protospec.kernels.sampling import verify_rejection
from protospec.kernels.launch.interop import KERNEL_DEVICE_TYPE
from protospec.kernels.sampling.packed_argmax import EMPTY
from protospec.kernels.sampling.softmax_sample import probs_into
from protospec.kernels.primitives import arrivals
from protospec.speculation.rejection import rejection_sample
from protospec.speculation.sampler import SamplingTensors

DEV = KERNEL_DEVICE_TYPE


def _case(seed, temperatures, k, vocab, uniforms=None):
    """Logits [B (k + 1), V] peaked enough that drafts often pass, a draft that proposed from its own
    softmax (one-hot on greedy rows), and the step's random numbers in the engine's layout."""
    batch = len(temperatures)
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(batch, 1, vocab, generator=gen) * 3
    logits = (base + torch.randn(batch, k + 1, vocab, generator=gen)).view(batch * (k + 1), vocab)
    draft_logits = base[:, 0, None] + torch.randn(batch, k, vocab, generator=gen)
    q = torch.softmax(draft_logits, -1)
    draft_ids = torch.multinomial(q.view(-1, vocab), 1, generator=gen).view(batch, k)
    for b, t in enumerate(temperatures):
        if t == 0.0:  # a greedy draft: one-hot at its argmax
            draft_ids[b] = draft_logits[b].argmax(-1)
            q[b] = torch.nn.functional.one_hot(draft_ids[b], vocab).float()
    noise = torch.empty(batch, 2 * k + 1, vocab).exponential_(generator=gen).clamp_min_(1e-30)
    u = torch.rand(batch, k, generator=gen) if uniforms is None else uniforms
    params = [SamplingParams(temperature=t) for t in temperatures]
    st = SamplingTensors.build(params, [torch.Generator() for _ in params], vocab, DEV)
    to = lambda x: x.to(DEV)  # noqa: E731
    return to(logits), st, [to(draft_ids), to(q), to(u), to(noise[:, k : 2 * k]), to(noise[:, 2 * k])]


def _assert_same(logits, st, draft, num_proposed=None, dependent=False):
    batch, k = draft[0].shape
    probs = probs_into(logits, st, torch.empty_like(logits), k + 1).view(batch, k + 1, -1)
    ref = rejection_sample(draft[0], draft[1], probs, *draft[2:], num_proposed)
    flag = torch.tensor([5], dtype=torch.int32, device=DEV)
    got_probs, got = verify_rejection.probs_and_rejection(logits, st, *draft, num_proposed=num_proposed,
                                                          error_flag=flag, dependent=dependent)
    assert torch.equal(got_probs, probs)  # the probabilities kernel's bits
    for field in ("output_token_ids", "num_accepted", "accepted_mask", "passed_mask"):
        assert getattr(got, field).tolist() == getattr(ref, field).tolist(), field
    expected = torch.cat([ref.output_token_ids, ref.num_accepted[:, None], ref.passed_mask.sum(-1, keepdim=True)], 1)
    assert got.commit_columns.tolist() == expected.tolist()
    assert got.commit_flagged.tolist() == expected.flatten().tolist() + [5]
    # the sequences' last blocks reset their arrival counters and the rows' race slots for the next call
    assert int(arrivals._COUNTERS[(logits.device, "verify_rejection")][-1].abs().sum()) == 0
    keys, masses = verify_rejection._slots[str(logits.device)][-1]
    assert (keys == EMPTY).all() and (masses == 0).all()
    return ref


def test_sampled_and_greedy_rows_match_the_two_kernels():
    """Rows at T = 1, 0.7 and greedy over a vocabulary of two slices (the simulator's are 128 entries),
    the last one ragged; u = 0 keeps every draft token (the bonus race), u = 1 rejects the first (the
    residual race at 0), u = (0, 1) keeps one."""
    uniforms = torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    logits, st, draft = _case(1, [1.0, 0.7, 0.0], 2, 200, uniforms=uniforms)
    draft[1][1, 0, draft[0][1, 0]] = 1.0  # q(d) = 1 > p(d): u = 1 rejects
    draft[0][2, 0] = logits[6].argmax()  # the greedy row's first draft token is the target's: kept
    draft[1][2, 0] = torch.nn.functional.one_hot(draft[0][2, 0], 200).float()
    ref = _assert_same(logits, st, draft)
    assert ref.num_accepted.tolist() == [2, 0, 1]


def test_the_residual_fallback_where_p_equals_q():
    """u = 1 rejects even where p == q; the residual is then zero over the whole row and the token is the
    race over p itself, which the sequence's last block runs over the probabilities written."""
    logits, st, draft = _case(3, [0.8], 2, 130, uniforms=torch.ones(1, 2))
    probs = probs_into(logits, st, torch.empty_like(logits), 3).view(1, 3, -1)
    draft[1] = probs[:, :2].clone()  # q = p at every draft position
    assert _assert_same(logits, st, draft).num_accepted.tolist() == [0]


def test_rows_with_fewer_proposals_match_the_reference():
    logits, st, draft = _case(4, [1.0, 0.0], 2, 100, uniforms=torch.zeros(2, 2))
    proposed = torch.tensor([0, 1], dtype=torch.int64, device=DEV)
    ref = _assert_same(logits, st, draft, num_proposed=proposed)
    assert not ref.passed_mask[0].any() and not ref.passed_mask[1, 1:].any()


def test_noise_drawn_from_the_keys_gives_the_tokens_of_the_filled_noise():
    """noise_keys: the kernel draws each Exp(1) number from the sequence's key where the filled form
    reads the spec step's noise block (counter_randoms' numbers at rows k..2k): the same probabilities,
    tokens, masks and commit row, for the bonus race (u = 0), the residual race (u = 1) and the residual
    fallback (q = p on the second sequence: its race over p, in the sequence's last block); and so
    does the rejection kernel that reads the probabilities the statistics and probabilities kernels wrote."""
    from protospec.kernels.randoms import counter_randoms
    from protospec.kernels.sampling.rejection import rejection_sample_fused

    k, vocab = 2, 100
    logits, st, draft = _case(9, [1.0, 0.8, 0.0], k, vocab, uniforms=torch.tensor([[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]))
    probs = probs_into(logits, st, torch.empty_like(logits), k + 1).view(3, k + 1, -1)
    draft[1][1] = probs[1, :k]  # q = p on the second sequence: its residual is zero everywhere
    keys = torch.tensor([counter_randoms.split_key(v) for v in (11, 2**63 + 5, 3)], dtype=torch.int64, device=DEV)
    noise = torch.empty(3, 2 * k + 1, vocab, device=DEV)
    counter_randoms.fill_kernel(keys, noise, torch.empty(3, k, device=DEV))
    filled = [*draft[:3], noise[:, k : 2 * k], noise[:, 2 * k]]
    got_probs, got = verify_rejection.probs_and_rejection(logits, st, *draft[:3], None, None, noise_keys=keys)
    want_probs, want = verify_rejection.probs_and_rejection(logits, st, *filled)
    assert torch.equal(got_probs, want_probs)
    for field in ("output_token_ids", "num_accepted", "accepted_mask", "passed_mask", "commit_columns"):
        assert getattr(got, field).tolist() == getattr(want, field).tolist(), field
    assert want.num_accepted.tolist() == [2, 0, 0]
    # The rejection kernel alone (the probabilities computed apart) draws only row n's numbers from the keys
    keyed_alone = rejection_sample_fused(*draft[:2], want_probs, draft[2], None, None, noise_keys=keys)
    for field in ("output_token_ids", "num_accepted", "accepted_mask", "passed_mask", "commit_columns"):
        assert getattr(keyed_alone, field).tolist() == getattr(want, field).tolist(), field
    with pytest.raises(KernelArgumentError, match="noise or noise_keys"):
        rejection_sample_fused(*draft[:2], want_probs, *filled[2:], noise_keys=keys)
    with pytest.raises(KernelArgumentError, match="noise or noise_keys"):
        verify_rejection.probs_and_rejection(logits, st, *filled, noise_keys=keys)
    with pytest.raises(KernelArgumentError, match="shapes"):  # the draft's side is still checked without noise
        verify_rejection.probs_and_rejection(logits, st, draft[0], draft[1][:, :, :50].contiguous(), draft[2], None,
                                             None, noise_keys=keys)
    with pytest.raises(KernelArgumentError, match="noise_keys"):
        verify_rejection.probs_and_rejection(logits, st, *draft[:3], None, None, noise_keys=keys[:, :1].contiguous())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the wait is a no-op in the simulator: needs a CUDA device")
def test_the_dependent_form_matches():
    """As a programmatic dependent: each thread's logits, q and noise loaded before its wait."""
    _assert_same(*_case(6, [1.0], 2, 130), dependent=True)


def test_bad_arguments_are_named():
    logits, st, draft = _case(7, [1.0], 2, 30)
    with pytest.raises(KernelArgumentError, match="logits"):
        verify_rejection.probs_and_rejection(logits[:2], st, *draft)
    with pytest.raises(KernelArgumentError, match="draft_probs"):
        verify_rejection.probs_and_rejection(logits, st, draft[0], draft[1].double(), *draft[2:])
    with pytest.raises(KernelArgumentError, match="shapes"):
        verify_rejection.probs_and_rejection(logits, st, draft[0], draft[1][:, :, :20].contiguous(), *draft[2:])


def test_it_applies_to_the_fused_rejection_sampler_only():
    from protospec.speculation.acceptance import RejectionSampling, TypicalAcceptance

    st = _case(8, [1.0], 2, 50)[1]
    assert verify_rejection.applies(st, RejectionSampling(fused=True))
    assert not verify_rejection.applies(st, RejectionSampling(fused=False))
    assert not verify_rejection.applies(st, TypicalAcceptance())
    filtered = SamplingTensors.build([SamplingParams(temperature=1.0, top_k=5)], [torch.Generator()], 50, DEV)
    assert not verify_rejection.applies(filtered, RejectionSampling(fused=True))

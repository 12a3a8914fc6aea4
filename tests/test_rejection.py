"""The rejection sampler is lossless: emitted tokens follow the target distribution."""
import torch

from protospec.speculation.rejection import rejection_sample, residual_weights
from protospec.layout import PLACEHOLDER_TOKEN_ID

VOCAB, N = 12, 200_000


def _dists(gen, rows, vocab=VOCAB, sharp=2.0):
    return torch.softmax(torch.randn(rows, vocab, generator=gen) * sharp, -1)


def _run(draft_probs, target_probs, gen):
    """draft_probs [k, V], target_probs [k+1, V], broadcast to N sequences; drafts sampled from q."""
    k = draft_probs.shape[0]
    q = draft_probs.expand(N, k, VOCAB).contiguous()
    p = target_probs.expand(N, k + 1, VOCAB).contiguous()
    draft_ids = torch.multinomial(q.view(-1, VOCAB), 1, generator=gen).view(N, k)
    u = torch.rand(N, k, generator=gen)
    rec = torch.empty(N, k, VOCAB).exponential_(generator=gen)
    bonus = torch.empty(N, VOCAB).exponential_(generator=gen)
    return rejection_sample(draft_ids, q, p, u, rec, bonus)


def _tv(samples, probs):
    counts = torch.bincount(samples, minlength=probs.numel()).double()
    return 0.5 * (counts / counts.sum() - probs.double()).abs().sum().item()


def _tv_bound(probs, n, margin=2.5):
    """margin x the TV distance that n exact samples from probs show on average (sampling noise):
    E|freq_i - p_i| ~ sqrt(2 p_i (1 - p_i) / (pi n))."""
    p = probs.double()
    return margin * 0.5 * torch.sqrt(2 * p * (1 - p) / (torch.pi * n)).sum().item()


def test_emitted_tokens_follow_target_distribution_at_every_position():
    gen = torch.Generator().manual_seed(0)
    k = 3
    q = _dists(gen, k)
    # Targets near the draft (as a trained pair would be), so every position is reached often.
    p = torch.softmax(torch.cat([q.log(), torch.zeros(1, VOCAB)]) + torch.randn(k + 1, VOCAB, generator=gen), -1)
    out = _run(q, p, gen)
    tokens = out.output_token_ids
    # Position j is emitted when positions < j were accepted; conditioned on that, it must be ~ p_j.
    for j in range(k + 1):
        reached = out.num_accepted >= j
        tv = _tv(tokens[reached, j], p[j])
        n = int(reached.sum())
        assert n > 20_000, f"position {j} reached only {n} times"
        assert tv < _tv_bound(p[j], n), f"position {j}: total-variation distance {tv:.4f} from the target"


def test_bound_fails_a_sampler_without_the_recovered_step():
    """The same check on a broken sampler (resample from p on rejection, not from max(0, p - q)):
    its output is q*min(1,p/q) + (1 - beta) p, whose distance from p is far above the bound."""
    gen = torch.Generator().manual_seed(0)
    q, p = _dists(gen, 1)[0], _dists(gen, 1)[0]
    accepted_mass = torch.minimum(p, q)
    broken = accepted_mass + (1 - accepted_mass.sum()) * p
    broken_tv = 0.5 * (broken - p).abs().sum().item()
    assert broken_tv > 5 * _tv_bound(p, N)


def test_empirical_acceptance_rate_is_one_minus_tv():
    gen = torch.Generator().manual_seed(1)
    q, p = _dists(gen, 1), _dists(gen, 2)
    out = _run(q, p, gen)
    expected = torch.minimum(p[0], q[0]).sum().item()  # = 1 - TV(p, q)
    assert abs(out.accepted_mask.float().mean().item() - expected) < 0.01


def test_identical_distributions_always_accept():
    gen = torch.Generator().manual_seed(2)
    q = _dists(gen, 4)
    p = torch.cat([q, _dists(gen, 1)])
    out = _run(q, p, gen)
    assert bool((out.num_accepted == 4).all())
    assert _tv(out.output_token_ids[:, 4], p[4]) < _tv_bound(p[4], N)  # bonus token ~ p_{k+1}


def test_disjoint_supports_always_reject_and_sample_the_target():
    q = torch.zeros(2, VOCAB)
    q[:, :6] = 1 / 6
    p = torch.zeros(3, VOCAB)
    p[:, 6:] = torch.arange(1, 7, dtype=torch.float32) / 21
    out = _run(q, p, torch.Generator().manual_seed(3))
    assert bool((out.num_accepted == 0).all())
    assert _tv(out.output_token_ids[:, 0], p[0]) < _tv_bound(p[0], N)
    assert bool((out.output_token_ids[:, 1:] == PLACEHOLDER_TOKEN_ID).all())


def test_output_layout_accepted_then_one_token_then_placeholders():
    draft = torch.tensor([[5, 6, 7], [5, 6, 7], [5, 6, 7]])
    one_hot = torch.nn.functional.one_hot
    q = one_hot(draft, VOCAB).float()
    target_tokens = torch.tensor([[5, 6, 7, 9], [5, 1, 7, 9], [3, 6, 7, 9]])  # full accept, reject at 1, at 0
    p = one_hot(target_tokens, VOCAB).float()
    out = rejection_sample(draft, q, p, torch.zeros(3, 3), torch.ones(3, 3, VOCAB), torch.ones(3, VOCAB))
    assert out.output_token_ids.tolist() == [[5, 6, 7, 9], [5, 1, -1, -1], [3, -1, -1, -1]]
    assert out.num_accepted.tolist() == [3, 1, 0]
    # Row 1: position 2 (7 == 7) passes its own test after the rejection at 1; it is discarded but
    # counted by vLLM's acceptance rate. Row 2: positions 1 and 2 likewise.
    assert out.passed_mask.tolist() == [[True] * 3, [True, False, True], [False, True, True]]
    assert out.accepted_mask.tolist() == [[True] * 3, [True, False, False], [False, False, False]]


def test_residual_falls_back_to_target_when_no_mass_left():
    p = torch.tensor([[0.5, 0.5, 0.0]])
    assert torch.equal(residual_weights(p, p.clone()), p)
    w = residual_weights(torch.tensor([[0.6, 0.4, 0.0]]), torch.tensor([[0.2, 0.4, 0.4]]))
    assert torch.allclose(w / w.sum(-1, keepdim=True), torch.tensor([[1.0, 0.0, 0.0]]))


def test_analysis_helpers_agree_with_theory():
    from protospec.lab.analysis import empirical_distribution, simulate, tv_distance, without_recovery_distribution

    gen = torch.Generator().manual_seed(11)
    p, q = _dists(gen, 1)[0], _dists(gen, 1)[0]
    accepted, first = simulate(p, q, N, seed=1)
    assert abs(accepted.double().mean().item() - (1 - tv_distance(p, q))) < 0.01
    assert tv_distance(empirical_distribution(first, VOCAB), p) < _tv_bound(p, N)
    assert tv_distance(without_recovery_distribution(p, q), p) > 5 * _tv_bound(p, N)


def test_fewer_proposals_keep_the_output_exactly_the_target_distribution():
    """One-hot proposals (an n-gram proposer's q) for the first position only, none after: position 0
    follows p_0, and where the proposal was kept, position 1 follows p_1 (no residual: nothing was
    proposed there). Checked over 40k rows by total variation."""
    gen = torch.Generator().manual_seed(11)
    rows, k, vocab = 40000, 3, 6
    p = torch.softmax(torch.randn(1, k + 1, vocab, generator=gen) * 1.5, -1).expand(rows, -1, -1).contiguous()
    draft = torch.full((rows, k), 2, dtype=torch.int64)
    q = torch.zeros(rows, k, vocab)
    q[:, 0, 2] = 1.0  # token 2 proposed at position 0 only
    u = torch.rand(rows, k, generator=gen)
    noise = torch.empty(rows, 2 * k + 1, vocab).exponential_(generator=gen)
    out = rejection_sample(draft, q, p, u, noise[:, k : 2 * k], noise[:, 2 * k], torch.ones(rows, dtype=torch.int64))
    first = torch.bincount(out.output_token_ids[:, 0], minlength=vocab).float() / rows
    assert 0.5 * (first - p[0, 0]).abs().sum() < 0.015
    kept = out.num_accepted == 1
    second = torch.bincount(out.output_token_ids[kept, 1], minlength=vocab).float() / kept.sum()
    assert 0.5 * (second - p[0, 1]).abs().sum() < 0.03
    assert (out.output_token_ids[:, 2:] == -1).all() and not out.passed_mask[:, 1:].any()

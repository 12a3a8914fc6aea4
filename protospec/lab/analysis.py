"""Rejection sampling in the large: draw many single-position spec steps from given draft and target
distributions and look at what comes out (used by the rejection-sampling notebook and tests)."""
from __future__ import annotations

import torch

from protospec.speculation.rejection import rejection_sample


def tv_distance(p: torch.Tensor, q: torch.Tensor) -> float:
    return 0.5 * (p.double() - q.double()).abs().sum().item()


def simulate(target_probs: torch.Tensor, draft_probs: torch.Tensor, num_samples: int, seed: int = 0):
    """k = 1 spec steps: the draft samples from q, the sampler accepts or recovers.
    Returns (accepted [N] bool, first emitted token [N] int64)."""
    gen = torch.Generator().manual_seed(seed)
    vocab = target_probs.numel()
    q = draft_probs.expand(num_samples, 1, vocab)
    p = torch.stack([target_probs, target_probs]).expand(num_samples, 2, vocab)  # position 1 = bonus
    drafts = torch.multinomial(draft_probs, num_samples, replacement=True, generator=gen)[:, None]
    out = rejection_sample(drafts, q, p, torch.rand(num_samples, 1, generator=gen),
                           torch.empty(num_samples, 1, vocab).exponential_(generator=gen),
                           torch.empty(num_samples, vocab).exponential_(generator=gen))
    return out.accepted_mask[:, 0], out.output_token_ids[:, 0]


def empirical_distribution(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    counts = torch.bincount(tokens, minlength=vocab).double()
    return counts / counts.sum()


def without_recovery_distribution(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """What a broken sampler emits if it resamples from p (not normalise(max(0, p - q))) after a
    rejection: min(p, q) + (1 - sum min(p, q)) * p. It is not p unless p == q."""
    kept = torch.minimum(target_probs, draft_probs)
    return kept + (1 - kept.sum()) * target_probs

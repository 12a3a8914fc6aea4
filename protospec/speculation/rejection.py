"""Lossless rejection sampling (Leviathan et al. 2023; Chen et al. 2023), batched, on the device.

Glossary, per sequence and spec step with k draft tokens:
- draft token:     d_i, proposed by the draft, sampled from draft_probs[i] (= q_i)
- accepted token:  a draft token kept; d_i is kept with probability min(1, p_i(d_i) / q_i(d_i)),
                   p_i = target_probs[i], and only if d_1..d_{i-1} were all kept
- recovered token: at the first rejected position i, a token sampled from
                   normalise(max(0, p_i - q_i)) instead of d_i; it makes the output exactly p_i
- bonus token:     when all k are accepted, one more token sampled from p_{k+1} (free: the
                   target computed that distribution in the same verify forward)
- output tokens:   [B, k + 1]: accepted tokens, then one recovered or bonus token, then
                   PLACEHOLDER_TOKEN_ID for the empty rest
- fewer proposals: a proposer may offer n_b < k tokens for row b (num_proposed; an n-gram proposer
                   with a short or no match). Positions i >= n_b are not tested; their draft_probs
                   rows must be zero, so at i = n_b (all n_b accepted) the "residual" is p_i itself
                   and the token emitted there follows the target exactly, as a bonus token would.

Random numbers come in as arguments (uniforms and Exp(1) noise), made outside by the caller
from per-request generators, so seeded runs repeat and tests can drive the sampler in bulk.
"""
from __future__ import annotations

import torch

from protospec.layout import PLACEHOLDER_TOKEN_ID, RejectionOutput
from protospec.speculation.sampler import sample_from_probs

def residual_weights(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """max(0, p - q) over the last dim, unnormalised; where it is all zero (p == q), p itself.

    The exponential race samples proportionally to its weights, so the recovered token needs no
    normalisation; skipping it also lets the fused kernel (kernels/sampling/rejection.py) compute the very
    same float32 values. The fallback never changes the output: with p == q every draft token is
    accepted.
    """
    residual = (target_probs - draft_probs).clamp_min(0)
    return torch.where(residual.sum(-1, keepdim=True) > 0, residual, target_probs)


def rejection_sample(
    draft_token_ids: torch.Tensor,  # [B, k] int64
    draft_probs: torch.Tensor,      # [B, k, V] float32
    target_probs: torch.Tensor,     # [B, k + 1, V] float32
    uniforms: torch.Tensor,         # [B, k] float32 in [0, 1)
    recovered_noise: torch.Tensor,  # [B, k, V] Exp(1)
    bonus_noise: torch.Tensor,      # [B, V] Exp(1)
    num_proposed: torch.Tensor | None = None,  # [B] int64 in [0, k]; None: k for every row
) -> RejectionOutput:
    k = draft_token_ids.shape[1]
    ids = draft_token_ids.unsqueeze(-1)
    p_of_draft = target_probs[:, :k].gather(-1, ids).squeeze(-1)  # [B, k]
    q_of_draft = draft_probs.gather(-1, ids).squeeze(-1)           # [B, k]
    # u < p/q, written without the division; q > 0 for a token the draft sampled.
    accepted = uniforms * q_of_draft < p_of_draft                  # [B, k]
    if num_proposed is not None:  # positions past a row's proposals are not tested
        accepted &= torch.arange(k, device=accepted.device)[None, :] < num_proposed[:, None]
    accepted_prefix = accepted.long().cumprod(dim=-1).bool()       # False from the first rejection on
    num_accepted = accepted_prefix.sum(-1)                         # [B]

    recovered = sample_from_probs(residual_weights(target_probs[:, :k], draft_probs), recovered_noise)  # [B, k]
    bonus = sample_from_probs(target_probs[:, k], bonus_noise)     # [B]
    # The token emitted after the accepted prefix: recovered at a rejection, bonus after k accepts.
    last_choices = torch.cat([recovered, bonus[:, None]], dim=1)   # [B, k + 1]

    return RejectionOutput(output_ids(draft_token_ids, num_accepted, last_choices), num_accepted, accepted_prefix,
                           accepted)


def output_ids(draft_token_ids: torch.Tensor, num_accepted: torch.Tensor, last_choices: torch.Tensor) -> torch.Tensor:
    """[B, k + 1] int64: the n = num_accepted kept draft tokens, then last_choices[:, n], then
    PLACEHOLDER_TOKEN_ID (draft_token_ids [B, k], num_accepted [B], last_choices [B, k + 1])."""
    batch, k = draft_token_ids.shape
    position = torch.arange(k + 1, device=draft_token_ids.device)[None, :]  # [1, k + 1]
    padded_drafts = torch.cat([draft_token_ids, draft_token_ids.new_zeros(batch, 1)], dim=1)
    n = num_accepted[:, None]
    return torch.where(position < n, padded_drafts, torch.where(position == n, last_choices, PLACEHOLDER_TOKEN_ID))

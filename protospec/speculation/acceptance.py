"""Acceptance rules: which draft tokens a spec step keeps. Named in registry.py, chosen once per engine.

rejection  lossless rejection sampling (rejection.py, or kernels/sampling/rejection.py as one launch): the
           output follows the target's distribution exactly.
typical    typical acceptance (Cai et al. 2024, "Medusa", section 3.3.1; vLLM's
           TypicalAcceptanceSampler): d_i is kept when the target gives it
               p_i(d_i) > min(posterior_threshold, posterior_alpha * exp(-H(p_i)))
           with H(p_i) the entropy of the target's distribution at position i, and only if
           d_1..d_{i-1} were kept. Confident positions (low entropy) demand a probability near the
           threshold; uncertain ones accept any reasonably likely token. Lossy by design: it keeps
           tokens the target would sample less often than the draft proposes them. The token after
           the kept prefix is sampled from p_i itself (the bonus noise after k kept), so that position
           follows the target; greedy rows (one-hot p) keep exactly the target's argmax matches.
           vLLM's sampler takes the argmax there for every row; sampling keeps temperature > 0
           requests stochastic. The draft's probabilities are not used.
"""
from __future__ import annotations

import torch

from protospec import registry
from protospec.speculation.rejection import output_ids, rejection_sample
from protospec.layout import RejectionOutput
from protospec.speculation.sampler import sample_from_probs

def entropy(probs: torch.Tensor) -> torch.Tensor:
    """-sum p log p over the last dim (0 log 0 = 0), in nats: [..., V] -> [...]."""
    return -torch.special.xlogy(probs, probs).sum(-1)


def typical_acceptance(
    draft_token_ids: torch.Tensor,  # [B, k] int64
    target_probs: torch.Tensor,     # [B, k + 1, V] float32
    posterior_threshold: float,
    posterior_alpha: float,
    recovered_noise: torch.Tensor,  # [B, k, V] Exp(1)
    bonus_noise: torch.Tensor,      # [B, V] Exp(1)
    num_proposed: torch.Tensor | None = None,  # [B] int64 in [0, k]; None: k for every row
) -> RejectionOutput:
    k = draft_token_ids.shape[1]
    p = target_probs[:, :k]                                                   # [B, k, V]
    p_of_draft = p.gather(-1, draft_token_ids.unsqueeze(-1)).squeeze(-1)      # [B, k]
    bar = torch.clamp(posterior_alpha * torch.exp(-entropy(p)), max=posterior_threshold)  # [B, k]
    passed = p_of_draft > bar
    if num_proposed is not None:
        passed &= torch.arange(k, device=passed.device)[None, :] < num_proposed[:, None]
    kept = passed.long().cumprod(dim=-1).bool()
    num_accepted = kept.sum(-1)                                               # [B]
    # The token after the kept prefix follows the target at its position.
    noise = torch.cat([recovered_noise, bonus_noise[:, None]], dim=1)         # [B, k + 1, V]
    last_choices = sample_from_probs(target_probs, noise)                     # [B, k + 1]
    return RejectionOutput(output_ids(draft_token_ids, num_accepted, last_choices), num_accepted, kept, passed)


class RejectionSampling:
    name = registry.REJECTION

    def __init__(self, fused: bool = False):
        if fused:  # one Numba launch instead of ~25 torch ops (the same tokens)
            from protospec.kernels.sampling.rejection import rejection_sample_fused
            self.sample = rejection_sample_fused
        else:
            self.sample = rejection_sample

    def __call__(self, draft_ids, draft_probs, target_probs, randoms, num_proposed=None, error_flag=None,
                 noise_keys=None, from_logits=None) -> RejectionOutput:
        """error_flag: [1] int32 the step's device-built inputs' flag, which the kernel copies into the
        commit's row (RejectionOutput.commit_flagged); the torch path leaves it to commit_row. noise_keys
        [B, 2] int64: the kernel draws the noise from the sequences' keys (a keyed spec step graph).
        from_logits: the kernel's (draft_probs and target_probs are logits)."""
        if self.sample is rejection_sample:
            if noise_keys is not None or from_logits is not None:
                raise ValueError("noise_keys, from_logits: only the fused rejection kernel takes them")
            return rejection_sample(draft_ids, draft_probs, target_probs, randoms.uniforms, randoms.recovered_noise,
                                    randoms.bonus_noise, num_proposed)
        return self.sample(draft_ids, draft_probs, target_probs, randoms.uniforms, randoms.recovered_noise,
                           randoms.bonus_noise, num_proposed, error_flag, noise_keys=noise_keys,
                           from_logits=from_logits)


class TypicalAcceptance:
    name = registry.TYPICAL

    def __init__(self, posterior_threshold: float, posterior_alpha: float):
        self.posterior_threshold, self.posterior_alpha = posterior_threshold, posterior_alpha

    def __call__(self, draft_ids, draft_probs, target_probs, randoms, num_proposed=None, error_flag=None) -> RejectionOutput:
        return typical_acceptance(draft_ids, target_probs, self.posterior_threshold, self.posterior_alpha,
                                  randoms.recovered_noise, randoms.bonus_noise, num_proposed)


def make_acceptance(name: str, fused_rejection: bool, posterior_threshold: float, posterior_alpha: float):
    if name == registry.TYPICAL:
        return TypicalAcceptance(posterior_threshold, posterior_alpha)
    return RejectionSampling(fused_rejection)

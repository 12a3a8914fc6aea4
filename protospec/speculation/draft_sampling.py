"""One draft step's sample into the spec step's buffers: the fused kernel or the torch ops.

Shared by the step-by-step draft loops (draft_loop.py) and the captured one (draft_graph.py), so
every mode samples the same way and the modes' outputs stay comparable token for token.
"""
from __future__ import annotations

import torch

from protospec.speculation.sampler import SamplingTensors, compute_probs, exponential_noise, sample


def sample_draft_step(logits: torch.Tensor, st: SamplingTensors, step: int, draft_ids: torch.Tensor,
                      draft_probs: torch.Tensor, noise_block: torch.Tensor | None, mirror: torch.Tensor | None,
                      fused: bool, dependent: bool = False, then_advance=None,
                      tokens_to: torch.Tensor | None = None, sample_first: bool = False,
                      noise_keys: torch.Tensor | None = None) -> torch.Tensor:
    """logits [B, V] f32 -> draft_ids[:, step] [B] (returned, a view) and draft_probs[:, step] [B, V].
    noise_block: [B, >= k, V] Exp(1) whose [:, step] is this step's noise (None: all greedy).
    mirror: an int64 [B] buffer that also gets the ids (advance_step reads it), or None.
    dependent: the fused kernels launch as programmatic dependents (ModelRunner.launches_dependents).
    then_advance: the AdvanceStepLauncher of the decode inputs the next draft step reads, run after the
    sample (by the fused sampling kernel itself where it applies: kernels/sampling/advance.py), or None.
    tokens_to: a [B] int64 view (any stride) that gets the ids too (the verify's column of this step's
    draft tokens, in a spec step graph), or None.
    sample_first: the token alone (kernels/sampling/gumbel_sample.py), the logits left in draft_probs[:, step] for
    the caller to turn into probabilities (probs_branch.py), where the fused kernels apply.
    noise_keys [B, 2] int64: the rows' counter keys, from which that kernel draws what noise_block
    [:, step] would hold (noise_block then None; only where it applies)."""
    if noise_keys is not None and not (fused and sample_first):
        raise ValueError("noise_keys: only the fused sample-first draft sampler draws its noise from keys")
    if fused:
        from protospec.kernels.sampling.softmax_sample import fused_applies, sample_into

        if fused_applies(st) and sample_first:
            from protospec.kernels.sampling.gumbel_sample import gumbel_sample_into

            gumbel_sample_into(logits, st, step, draft_ids, noise_block, mirror, dependent, then_advance, tokens_to,
                               logits_out=draft_probs, noise_keys=noise_keys)
            return draft_ids[:, step]
        if fused_applies(st):
            sample_into(logits, st, step, draft_probs, draft_ids, noise_block, mirror, dependent, then_advance,
                        tokens_to)
            return draft_ids[:, step]
    noise = noise_block[:, step] if noise_block is not None else None
    ids, probs = sample(logits, st, noise, out=mirror)  # [B], [B, V]
    draft_ids[:, step] = ids
    draft_probs[:, step] = probs
    if tokens_to is not None:
        tokens_to.copy_(ids)
    if then_advance is not None:
        then_advance()
    return draft_ids[:, step]


def target_probs(logits: torch.Tensor, st: SamplingTensors, rows_per_seq: int, fused: bool,
                 dependent: bool = False) -> torch.Tensor:
    """The verify's probabilities: logits [B * rows_per_seq, V] f32 -> [B * rows_per_seq, V] f32."""
    if fused:
        from protospec.kernels.sampling.softmax_sample import fused_applies, probs_into

        if fused_applies(st):
            return probs_into(logits, st, torch.empty_like(logits), rows_per_seq, dependent)
    return compute_probs(logits, st, rows_per_seq=rows_per_seq)


def sample_tokens(logits: torch.Tensor, st: SamplingTensors, fused: bool, dependent: bool = False) -> torch.Tensor:
    """One token per sequence (prefill, target-only decode): logits [B, V] -> ids [B], with the
    sampler the draft steps use (torch ops, or the fused kernel)."""
    if not fused:
        return sample(logits, st)[0]  # no buffers to fill: the target-only baseline stays lean
    batch, vocab = logits.shape
    ids = torch.empty(batch, 1, dtype=torch.int64, device=logits.device)
    probs = torch.empty(batch, 1, vocab, dtype=torch.float32, device=logits.device)
    noise = None if st.all_greedy else exponential_noise((1, vocab), st.generators, logits.device)  # [B, 1, V]
    return sample_draft_step(logits, st, 0, ids, probs, noise, None, fused=True, dependent=dependent)

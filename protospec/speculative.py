"""One speculative step for a batch: propose k draft tokens -> verify -> rejection-sample -> commit.

Positions for a sequence of L tokens (t_0 .. t_{L-1}, the last one not yet in either cache):
  draft step 1  feeds the tokens the draft lacks (t_{L-1}, or d_k and t_{L-1} after a full accept)
  draft step j  feeds d_{j-1} at position L - 2 + j, samples d_j               (j = 2..k)
  verify        feeds t_{L-1}, d_1..d_k at positions L-1 .. L-1+k: k+1 target distributions
So the target writes k+1 lookahead slots, reserved up front; the draft writes k of them.
"""
from __future__ import annotations

import torch

from protospec.block_manager import BlockManager
from protospec.rejection import PLACEHOLDER_TOKEN_ID, RejectionOutput, rejection_sample
from protospec.runner import ModelRunner
from protospec.sampler import SamplingTensors, compute_probs, exponential_noise, sample
from protospec.sequence import Sequence


def rejection_randoms(st: SamplingTensors, k: int, vocab: int, device) -> tuple[torch.Tensor, ...]:
    """uniforms [B, k], recovered noise [B, k, V], bonus noise [B, V] from each request's generator."""
    batch = len(st.generators)
    if st.all_greedy:  # one-hot probabilities make every random draw irrelevant: skip the work
        return (torch.zeros(batch, k, device=device), torch.ones(batch, k, vocab, device=device), torch.ones(batch, vocab, device=device))
    uniforms = torch.stack([torch.rand(k, device=device, generator=g) for g in st.generators])
    return uniforms, exponential_noise((k, vocab), st.generators, device), exponential_noise((vocab,), st.generators, device)


class SpeculativeStep:
    def __init__(self, target: ModelRunner, draft: ModelRunner, block_manager: BlockManager, k: int):
        self.target, self.draft, self.block_manager, self.k = target, draft, block_manager, k
        self.device = target.device

    def reserve_lookahead(self, seqs: list[Sequence]) -> None:
        for seq in seqs:  # positions up to L-1+k must have a slot
            self.block_manager.ensure_capacity(seq.block_table, seq.num_tokens + self.k)

    def propose(self, seqs: list[Sequence], st: SamplingTensors, max_blocks: int) -> tuple[torch.Tensor, torch.Tensor, list[list[int]]]:
        """k draft steps. Returns draft ids [B, k] int64, draft probs [B, k, V], and host copies of the ids."""
        k, batch = self.k, len(seqs)
        draft_ids = torch.empty(batch, k, dtype=torch.int64, device=self.device)
        draft_probs = torch.empty(batch, k, self.draft.vocab_size, dtype=torch.float32, device=self.device)
        proposals: list[list[int]] = [[] for _ in seqs]
        tables = [seq.block_table for seq in seqs]
        for step in range(k):
            if step == 0:
                chunks = [seq.token_ids[seq.num_cached_draft:] for seq in seqs]
                starts = [seq.num_cached_draft for seq in seqs]
            else:
                chunks = [[p[-1]] for p in proposals]
                starts = [seq.num_tokens - 1 + step for seq in seqs]
            inputs = self.draft.prepare(chunks, starts, tables, num_logits=1, max_blocks=max_blocks)
            ids, probs = sample(self.draft.execute(inputs), st)  # [B], [B, V]
            draft_ids[:, step] = ids
            draft_probs[:, step] = probs
            for p, tok in zip(proposals, ids.tolist()):  # the "main" baseline: a host sync every step
                p.append(tok)
        return draft_ids, draft_probs, proposals

    def verify(self, seqs, st, proposals, max_blocks) -> torch.Tensor:
        """Target forward over k+1 positions per sequence -> target probs [B, k+1, V]."""
        chunks = [seq.token_ids[seq.num_cached_target:] + p for seq, p in zip(seqs, proposals)]
        starts = [seq.num_cached_target for seq in seqs]
        tables = [seq.block_table for seq in seqs]
        inputs = self.target.prepare(chunks, starts, tables, num_logits=self.k + 1, max_blocks=max_blocks)
        logits = self.target.execute(inputs)  # [B * (k+1), V]
        return compute_probs(logits, st, rows_per_seq=self.k + 1).view(len(seqs), self.k + 1, -1)

    def commit(self, seqs: list[Sequence], result: RejectionOutput) -> None:
        out_ids = result.output_token_ids.tolist()  # the step's first host sync on the no-sync path
        num_accepted = result.num_accepted.tolist()
        for seq, row, accepted in zip(seqs, out_ids, num_accepted):
            length = seq.num_tokens
            emitted = [t for t in row if t != PLACEHOLDER_TOKEN_ID]
            kept = seq.append_tokens(emitted)
            seq.metrics.record_step(self.k, accepted, kept)
            # Target has K/V for t_{L-1}, d_1..d_accepted; the draft never ran on d_k.
            seq.num_cached_target = length + accepted
            seq.num_cached_draft = length + min(accepted, self.k - 1)
            self.block_manager.shrink(seq.block_table, seq.num_tokens)

    def __call__(self, seqs: list[Sequence], st: SamplingTensors) -> RejectionOutput:
        self.reserve_lookahead(seqs)
        max_blocks = max(len(seq.block_table) for seq in seqs)
        draft_ids, draft_probs, proposals = self.propose(seqs, st, max_blocks)
        target_probs = self.verify(seqs, st, proposals, max_blocks)
        randoms = rejection_randoms(st, self.k, target_probs.shape[-1], self.device)
        result = rejection_sample(draft_ids, draft_probs, target_probs, *randoms)
        self.commit(seqs, result)
        return result

"""Dynamic k: how many of a spec step's draft tokens are proposed, per request, chosen once per engine.

The draft loop still runs k (the engine's num_speculative_tokens, the most a step proposes) steps on
the device, and the verify still covers k + 1 positions: the CUDA graphs, the device-built inputs
and the fixed-k path stay exactly as they are. A limit of n_b < k masks the positions past it
(num_proposed; their draft_probs rows zeroed, rejection.py's rule for positions not proposed), so
what changes is which tokens are tested and kept, not the work done: the measured cost is the mask.

off         every row proposes k.
heuristic   transformers' schedule per request: after a step whose proposals were all kept, k_r + 2,
            otherwise k_r - 1, within [1, k], starting at k. Kept on the host (it knows the outcome
            once the commit has synced); the limits travel with the verify's inputs, after the
            previous step's commit, so an overlapped commit sees the same schedule.
confidence  stop proposing at the first draft step whose top probability falls below the threshold
            (transformers' assistant_confidence_threshold): computed on the device, no sync.
"""
from __future__ import annotations

import torch

from protospec.requests.sequence import Sequence
from protospec.model.inputs import host_to_device
from protospec import registry
from protospec.speculation.step_state import StepState


def apply_limit(s: StepState, limit: torch.Tensor) -> None:
    """num_proposed = min(what the proposer offered, limit) [B] int64; rows past it zeroed in draft_probs."""
    k = s.draft_ids.shape[1]
    s.num_proposed = limit if s.num_proposed is None else torch.minimum(s.num_proposed, limit)
    past = torch.arange(k, device=limit.device)[None, :] >= s.num_proposed[:, None]  # [B, k]
    s.draft_probs.masked_fill_(past[:, :, None], 0.0)


class FixedK:
    name = registry.DYNAMIC_K_OFF

    def limit(self, s: StepState) -> None:
        """Set s.num_proposed (and mask draft_probs) before the step's tokens are tested."""

    def observe(self, seq: Sequence, proposed: int, accepted: int) -> None:
        """One committed spec step of a request."""


class HeuristicK(FixedK):
    name = registry.DYNAMIC_K_HEURISTIC

    def __init__(self, k: int):
        self.k = k
        self.current: dict[int, int] = {}  # seq_id -> its k_r

    def limit(self, s: StepState) -> None:
        limits = [self.current.get(seq.seq_id, self.k) for seq in s.seqs]
        apply_limit(s, host_to_device(limits, torch.int64, s.draft_ids.device))

    def observe(self, seq: Sequence, proposed: int, accepted: int) -> None:
        k_r = self.current.get(seq.seq_id, self.k)
        k_r = k_r + 2 if proposed > 0 and accepted == proposed else k_r - 1
        if seq.finished:
            self.current.pop(seq.seq_id, None)
        else:
            self.current[seq.seq_id] = max(1, min(self.k, k_r))


class ConfidenceK(FixedK):
    name = registry.DYNAMIC_K_CONFIDENCE

    def __init__(self, threshold: float):
        self.threshold = threshold

    def limit(self, s: StepState) -> None:
        k = s.draft_ids.shape[1]
        low = s.draft_probs.amax(-1) < self.threshold  # [B, k]: the draft's confidence at each step
        first_low = torch.where(low.any(-1), low.int().argmax(-1), k)  # [B] steps before the first low one
        apply_limit(s, first_low.to(torch.int64))


def make_dynamic_k(name: str, k: int, confidence_threshold: float) -> FixedK:
    if name == registry.DYNAMIC_K_HEURISTIC:
        return HeuristicK(k)
    if name == registry.DYNAMIC_K_CONFIDENCE:
        return ConfidenceK(confidence_threshold)
    return FixedK()

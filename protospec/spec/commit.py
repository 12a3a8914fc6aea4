"""The overlapped commit's bookkeeping (speculative.py): the next spec step, launched before the
commit's host sync, and what becomes of it.

It is reused only for the very same batch (the same Sequence objects, in order, with the same
SamplingTensors) whose block tables still cover its lookahead. Otherwise it is discarded: what it
wrote to the draft's cache is written again by the step that replaces it, and the random numbers it
drew stay with their requests (seq_id -> their rows), so the replacement draws nothing new for them
and seeded outputs do not depend on whether the commit overlapped.
"""
from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from protospec.spec.sampler import SamplingTensors
    from protospec.engine.sequence import Sequence
    from protospec.spec.step import StepState


class LaunchedStep:
    def __init__(self, counters: Counter):
        self.pending: StepState | None = None  # the next spec step, its draft step 1 already launched
        self._counters = counters              # the draft runner's: counts "first_step_discarded"
        # seq_id -> (uniforms [k], noise [2k + 1, V]) drawn by a discarded step for that request
        self._kept_randoms: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def take(self, seqs: list[Sequence], st: SamplingTensors, lookahead: int, block_size: int) -> StepState | None:
        """The pending step if it was made for this batch and its block tables still hold
        `lookahead` slots past every sequence's end; otherwise it is discarded."""
        pending, self.pending = self.pending, None
        if pending is None:
            return None
        same_batch = pending.st is st and len(pending.seqs) == len(seqs) and all(a is b for a, b in zip(pending.seqs, seqs))
        if same_batch and all(len(seq.block_table) * block_size >= seq.num_tokens + lookahead for seq in seqs):
            return pending
        self._keep_randoms(pending)
        return None

    def discard(self) -> None:
        """Drop the pending step (the batch changed, or a debugger takes over), keeping its randoms."""
        pending, self.pending = self.pending, None
        if pending is not None:
            self._keep_randoms(pending)

    def _keep_randoms(self, pending: StepState) -> None:
        self._counters["first_step_discarded"] += 1
        r = pending.randoms
        if r is not None and r.noise_block is not None:
            for row, seq in enumerate(pending.seqs):
                self._kept_randoms[seq.seq_id] = (r.uniforms[row], r.noise_block[row])

    def clear(self) -> None:
        """Forget the pending step and every kept random number (the engine aborted its requests)."""
        self.pending = None
        self._kept_randoms.clear()

    def kept_randoms(self, seqs: list[Sequence]) -> list | None:
        """Per sequence its kept (uniforms, noise) or None, for SpecStepRandoms.draw(kept=...); each
        is used once (what is not asked for belongs to requests that have ended)."""
        if not self._kept_randoms:
            return None
        kept = [self._kept_randoms.get(seq.seq_id) for seq in seqs]
        self._kept_randoms.clear()
        return kept

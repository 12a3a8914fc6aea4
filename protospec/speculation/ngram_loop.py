"""The n-gram (prompt-lookup) proposer as a draft loop: no draft model, proposals from the sequence's
own tokens (kernels/inputs/ngram_match.py says the rule).

Where the kernels run (a GPU, or the simulator on a CPU with a device way chosen) each sequence's
tokens live in a persistent device history, and a spec step uploads only what is new since the last
one (one pinned host-to-device copy, no sync); the match and the one-hot draft probabilities are
one kernel. With a CPU way (main / sampler) the CPU twin proposes on the host and the step's
tensors are uploaded. Either way a row may get fewer than k proposals (none without a match):
`num_proposed` tells the acceptance rule, and that row's step degrades to a target-only step.
"""
from __future__ import annotations

from collections import Counter

import torch

from protospec.requests.sequence import Sequence
from protospec.kernels.inputs.ngram_match import ngram_match, propose
from protospec.model.inputs import ForwardInputs, host_to_device
from protospec import registry
from protospec.speculation.draft_loop import DraftLoop, DrawRandoms
from protospec.speculation.lookahead import Lookahead
from protospec.speculation.phase_timer import NULL_TIMER
from protospec.speculation.sampler import SamplingTensors
from protospec.speculation.step_state import StepState


class NgramLoop(DraftLoop):
    kind = registry.PROPOSER_KINDS[registry.NGRAM]

    def __init__(self, device: torch.device, vocab_size: int, look: Lookahead, n_min: int, n_max: int,
                 max_num_seqs: int, max_len: int, on_device: bool):
        self.draft, self.look, self.device, self.vocab_size = None, look, device, vocab_size
        self.n_min, self.n_max, self.on_device = n_min, n_max, on_device
        self._counters: Counter[str] = Counter()
        self.timer = NULL_TIMER
        if on_device:
            self.history = torch.zeros(max_num_seqs, max_len, dtype=torch.int64, device=device)  # [n, max_len]
            self.lengths = torch.zeros(max_num_seqs, dtype=torch.int64, device=device)          # [n]
            self._rows: list[tuple[Sequence | None, int]] = [(None, 0)] * max_num_seqs  # (sequence, tokens uploaded)

    @property
    def counters(self) -> Counter:
        return self._counters

    def catch_up(self, seqs: list[Sequence]) -> None:
        """No draft cache to bring up to date."""

    def new_state(self, seqs: list[Sequence], st: SamplingTensors, max_blocks: int) -> StepState:
        batch, k = len(seqs), self.look.k
        state = StepState(seqs, st, max_blocks,
                          torch.zeros(batch, k, dtype=torch.int64, device=self.device),
                          torch.zeros(batch, k, self.vocab_size, dtype=torch.float32, device=self.device))
        state.num_proposed = torch.zeros(batch, dtype=torch.int64, device=self.device)
        return state

    def _upload_history(self, seqs: list[Sequence]) -> None:
        """Each row's new tokens into the device history: one staged copy of (flat index, token) pairs."""
        width = self.history.shape[1]
        index, values = [], []
        for row, seq in enumerate(seqs):
            known_seq, known = self._rows[row]
            start = known if known_seq is seq else 0
            tokens = seq.token_ids
            if len(tokens) > width:
                raise ValueError(f"sequence of {len(tokens)} tokens exceeds the n-gram history of {width}")
            index.extend(range(row * width + start, row * width + len(tokens)))
            values.extend(tokens[start:])
            self._rows[row] = (seq, len(tokens))
        staged = host_to_device(index + values + [seq.num_tokens for seq in seqs], torch.int64, self.device)
        n = len(index)
        if n:
            self.history.view(-1).index_copy_(0, staged[:n], staged[n : 2 * n])
        self.lengths[: len(seqs)].copy_(staged[2 * n :])

    def _propose_on_host(self, s: StepState) -> None:
        k = self.look.k
        proposals = [propose(seq.token_ids, k, self.n_min, self.n_max) for seq in s.seqs]
        ids = [p + [0] * (k - len(p)) for p in proposals]
        staged = host_to_device([t for row in ids for t in row] + [len(p) for p in proposals], torch.int64, self.device)
        batch = len(s.seqs)
        s.draft_ids.copy_(staged[: batch * k].view(batch, k))
        s.num_proposed.copy_(staged[batch * k :])
        proposed = torch.arange(k, device=self.device)[None, :] < s.num_proposed[:, None]  # [B, k]
        s.draft_probs.zero_().scatter_(-1, s.draft_ids[..., None], proposed[..., None].float())

    def draft_step(self, s: StepState, draw_randoms: DrawRandoms) -> ForwardInputs | None:
        """All k proposals at once (no forward): the match, then the step's random numbers."""
        with self.timer.phase("prepare"):
            if self.on_device:
                self._upload_history(s.seqs)
        with self.timer.phase("draft_forward"):
            if self.on_device:
                self._counters["ngram_match:kernel"] += 1
                ngram_match(self.history, self.lengths[: len(s.seqs)], self.n_min, self.n_max, s.draft_ids,
                            s.draft_probs, s.num_proposed)
            else:
                self._counters["ngram_match:cpu"] += 1
                self._propose_on_host(s)
        with self.timer.phase("sampling"):
            if s.randoms is None:
                s.randoms = draw_randoms(s)
        s.step = self.look.k
        return None

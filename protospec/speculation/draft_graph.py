"""The "graph" draft loop: steps 2..k (advance_step -> draft forward -> sampling) as ONE CUDA graph,
and, where draft step 1's inputs were built on the device, steps 1..k as one graph.

In the gpu mode each draft step still costs the CPU a few dozen launches (an advance, a graph
replay for the forward, the sampling ops). Here the whole tail of the loop is one replay, so the
CPU's cost no longer grows with k. It works because nothing in those steps depends on the host:
the advance_step kernel (launched through interop.BoundLaunch, which a capture records; with the fused
sampling kernels, done by the sampling kernel of the sample before it: kernels/sampling/advance.py),
a forward over persistent buffers, and sampling from Exp(1) noise drawn before the loop (SpecStepRandoms).

Everything the graph reads or writes lives in persistent buffers of `rows` (the batch padded to a
bucket): the sampling settings and noise are copied in before a replay, and the draft ids and
probabilities of all k steps are read out of `draft_ids` / `draft_probs` after it.

A step launched by the overlapped commit has its draft step 1 inputs in persistent buffers already
(FirstStepState, written by the first_draft_step kernel): given those (`first`), the replay runs
step 1's forward and sample too, so the host's per-step cost of draft step 1 (a forward replay and
a dozen sampling launches) becomes part of the one replay.
"""
from __future__ import annotations

import torch

from protospec.model.graphs import sync_allowed
from protospec.model.persistent_inputs import PersistentInputs
from protospec.model.runner import ModelRunner
from protospec.speculation.decode_state import DraftDecodeState
from protospec.speculation import probs_branch
from protospec.speculation.draft_sampling import sample_draft_step
from protospec.speculation.sampler import SamplingTensors


class DraftLoopGraph:
    def __init__(self, runner: ModelRunner, decode: DraftDecodeState, k: int, rows: int, width: int, st: SamplingTensors,
                 fused_sampling: bool = False, first: PersistentInputs | None = None,
                 share: "DraftLoopGraph | None" = None):
        """share: a graph of the same rows whose output, noise and settings buffers this one uses too
        (the steps 1..k graph writes where a spec step made for the 2..k graph reads)."""
        device, vocab = runner.device, runner.vocab_size
        self.runner, self.decode, self.k, self.rows, self.width = runner, decode, k, rows, width
        if share is not None:
            self.draft_ids, self.draft_probs, self.noise, self.st = share.draft_ids, share.draft_probs, share.noise, share.st
            self._settings_of = share._settings_of
        else:
            self.draft_ids = torch.zeros(rows, k, dtype=torch.int64, device=device)         # [rows, k]
            self.draft_probs = torch.zeros(rows, k, vocab, dtype=torch.float32, device=device)  # [rows, k, V]
            self.noise = torch.ones(rows, k, vocab, dtype=torch.float32, device=device)     # [rows, k, V] Exp(1)
            # Padding rows sample with harmless settings (temperature 1, no filter).
            self.st = SamplingTensors(
                temperature=torch.ones(rows, device=device), is_greedy=torch.zeros(rows, dtype=torch.bool, device=device),
                top_k=torch.full((rows,), vocab, dtype=torch.int64, device=device), top_p=torch.ones(rows, device=device),
                generators=[], all_greedy=st.all_greedy, any_greedy=st.any_greedy, needs_filter=st.needs_filter,
            )
            # Which SamplingTensors self.st holds now: the engine builds one per batch and never writes
            # to it, so a replay for the same batch skips the four copies.
            self._settings_of: list = [None]
        self.fused = fused_sampling  # how the captured steps sample (draft_sampling.sample_draft_step)
        self.first = first  # draft step 1's device-built buffers: the replay starts at step 1 (None: step 2)
        # The tokens alone (one Gumbel-max launch a step), the probabilities of all k steps after them on a
        # branch (probs_branch.py); the same tokens as the race unless two candidates tie to float32 rounding.
        # (a loop from draft step 1 only: step 1 sampled outside would have left probabilities, not logits)
        sample_first = fused_sampling and first is not None and not st.needs_filter
        self.branch = probs_branch.ProbsBranch(device) if sample_first else None
        self.graph: torch.cuda.CUDAGraph | None = None

    @staticmethod
    def key(rows: int, width: int, st: SamplingTensors, from_first_step: bool = False) -> tuple:
        return rows, width, st.all_greedy, st.any_greedy, st.needs_filter, from_first_step

    def steps(self, noise_block: torch.Tensor | None = None, noise_ready: torch.cuda.Event | None = None,
              tokens_to: torch.Tensor | None = None, join: bool = True,
              noise_keys: torch.Tensor | None = None, statistics: bool = False) -> None:
        """The captured work, issued once: steps 2..k (1..k with `first`) over the graph's buffers.
        A spec step graph's: noise_block [rows, >= k, V] the noise to sample with instead of the graph's
        own (filled inside its replay); noise_ready: an event the first sample waits for (that fill on
        another stream); tokens_to [rows, k + 1] int64: step j's ids also go to column j + 1 (the
        verify's tokens); join=False: the probabilities' branch (self.branch) is left for the caller
        to join before it reads draft_probs; noise_keys [rows, 2] int64: the samples draw their noise
        from these counter keys (the sample-first sampler's; no noise block at all); statistics: the
        branch leaves the logits and makes each row's statistics (ProbsBranch.probabilities')."""
        decode, model, kv_caches = self.decode, self.runner.model, self.runner.kv_caches
        inputs = decode.inputs(self.rows, self.width)
        sampled = decode.sampled_ids[: self.rows]  # [rows] int64: each step's ids, read by advance_step
        keys = None if self.st.all_greedy else noise_keys
        noise = None if self.st.all_greedy or keys is not None else self.noise if noise_block is None else noise_block
        dependent = self.runner.launches_dependents
        if self.first is not None:  # draft step 1: its 2-token rows, the last one's logits
            first = self.first.view(self.rows, self.width)
            logits = model(first.input_ids, first.positions, kv_caches, first.meta)  # [rows, V]
            if noise_ready is not None:
                torch.cuda.current_stream().wait_event(noise_ready)
            sample_draft_step(logits, self.st, 0, self.draft_ids, self.draft_probs, noise, sampled, self.fused,
                              dependent, then_advance=decode.advance if self.k > 1 else None,
                              tokens_to=None if tokens_to is None else tokens_to[:, 1],
                              sample_first=self.branch is not None, noise_keys=keys)
        elif self.k > 1:  # draft step 1 sampled before the replay
            if noise_ready is not None:
                torch.cuda.current_stream().wait_event(noise_ready)
            decode.advance()
        for step in range(1, self.k):  # each sample advances the inputs of the step after it
            logits = model(inputs.input_ids, inputs.positions, kv_caches, inputs.meta)  # [rows, V]
            sample_draft_step(logits, self.st, step, self.draft_ids, self.draft_probs, noise, sampled, self.fused,
                              dependent, then_advance=decode.advance if step < self.k - 1 else None,
                              tokens_to=None if tokens_to is None else tokens_to[:, step + 1],
                              sample_first=self.branch is not None, noise_keys=keys)
        if self.branch is not None:  # the k steps' logits -> probabilities, beside what follows
            self.branch.probabilities(self.draft_probs, self.st, statistics)
            if join:
                self.branch.join()

    def load(self, st: SamplingTensors, draft_noise: torch.Tensor | None, batch: int) -> None:
        """The first `batch` rows' sampling settings (when the batch changed) and draft noise
        ([batch, k, V], None when greedy) into the graph's buffers."""
        if self._settings_of[0] is not st:
            for name in ("temperature", "is_greedy", "top_k", "top_p"):
                getattr(self.st, name)[:batch].copy_(getattr(st, name))
            self._settings_of[0] = st
        if draft_noise is not None:
            self.noise[:batch].copy_(draft_noise)

    def run(self, st: SamplingTensors, draft_noise: torch.Tensor | None, batch: int) -> None:
        """Steps 2..k (1..k with `first`) for the first `batch` rows. draft_noise: [batch, k, V] or None
        (greedy)."""
        self.load(st, draft_noise, batch)
        if self.graph is not None:
            self.graph.replay()
            return
        # First use: run the steps eagerly (this IS the step's real work, and it warms up lazy
        # initialisations outside the capture), then record them for every later spec step.
        self.steps()
        graph = torch.cuda.CUDAGraph()
        with sync_allowed(), torch.cuda.graph(graph):
            self.steps()
        self.graph = graph  # only once captured: a failed capture leaves none

"""The "graph" draft loop: steps 2..k (advance_step -> draft forward -> sampling) as ONE CUDA graph.

In the gpu mode each draft step still costs the CPU a few dozen launches (an advance, a graph
replay for the forward, the sampling ops). Here the whole tail of the loop is one replay, so the
CPU's cost no longer grows with k. It works because nothing in those steps depends on the host:
the advance_step kernel (launched through interop.BoundLaunch, which a capture records), a forward
over persistent buffers, and sampling from Exp(1) noise drawn before the loop (SpecStepRandoms).

Everything the graph reads or writes lives in persistent buffers of `rows` (the batch padded to a
bucket): the sampling settings and noise are copied in before a replay, and the draft ids and
probabilities of all k steps are read out of `draft_ids` / `draft_probs` after it.
"""
from __future__ import annotations

import torch

from protospec.model.graphs import sync_allowed
from protospec.model.runner import ModelRunner
from protospec.spec.decode_state import DraftDecodeState
from protospec.spec.draft_sampling import sample_draft_step
from protospec.spec.sampler import SamplingTensors


class DraftLoopGraph:
    def __init__(self, runner: ModelRunner, decode: DraftDecodeState, k: int, rows: int, width: int, st: SamplingTensors,
                 fused_sampling: bool = False):
        device, vocab = runner.device, runner.vocab_size
        self.runner, self.decode, self.k, self.rows, self.width = runner, decode, k, rows, width
        self.draft_ids = torch.zeros(rows, k, dtype=torch.int64, device=device)         # [rows, k]
        self.draft_probs = torch.zeros(rows, k, vocab, dtype=torch.float32, device=device)  # [rows, k, V]
        self.noise = torch.ones(rows, k, vocab, dtype=torch.float32, device=device)     # [rows, k, V] Exp(1)
        # Padding rows sample with harmless settings (temperature 1, no filter).
        self.st = SamplingTensors(
            temperature=torch.ones(rows, device=device), is_greedy=torch.zeros(rows, dtype=torch.bool, device=device),
            top_k=torch.full((rows,), vocab, dtype=torch.int64, device=device), top_p=torch.ones(rows, device=device),
            generators=[], all_greedy=st.all_greedy, any_greedy=st.any_greedy, needs_filter=st.needs_filter,
        )
        self.fused = fused_sampling  # how the captured steps sample (draft_sampling.sample_draft_step)
        self.graph: torch.cuda.CUDAGraph | None = None

    @staticmethod
    def key(rows: int, width: int, st: SamplingTensors) -> tuple:
        return rows, width, st.all_greedy, st.any_greedy, st.needs_filter

    def _steps(self) -> None:
        decode, model = self.decode, self.runner.model
        inputs = decode.inputs(self.rows, self.width)
        sampled = decode.sampled_ids[: self.rows]
        for step in range(1, self.k):
            decode.advance()
            logits = model(inputs.input_ids, inputs.positions, self.runner.kv_caches, inputs.meta)  # [rows, V]
            noise = None if self.st.all_greedy else self.noise
            sample_draft_step(logits, self.st, step, self.draft_ids, self.draft_probs, noise, sampled, self.fused)

    def run(self, st: SamplingTensors, draft_noise: torch.Tensor | None, batch: int) -> None:
        """Steps 2..k for the first `batch` rows. draft_noise: [batch, k, V] or None (greedy)."""
        for name in ("temperature", "is_greedy", "top_k", "top_p"):
            getattr(self.st, name)[:batch].copy_(getattr(st, name))
        if draft_noise is not None:
            self.noise[:batch].copy_(draft_noise)
        if self.graph is not None:
            self.graph.replay()
            return
        # First use: run the steps eagerly (this IS the step's real work, and it warms up lazy
        # initialisations outside the capture), then record them for every later spec step.
        self._steps()
        with sync_allowed():
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self._steps()

"""How a spec step's k draft tokens are proposed: the draft-loop interface and the CPU-prepared ways.

A draft loop builds the inputs of draft step 1 (`first_inputs`) and of steps 2..k (`next_inputs`),
runs the steps (`draft_step`, `run_steps`) into the spec step's buffers, and owns whatever device
buffers its way needs. The spec step (step.py) only asks it for a new StepState and for the k
proposals, so a new way of proposing plugs in here without touching the step. The ways are named
in registry.py; draft_loops.make_draft_loop builds one by name.

Positions for a sequence of L tokens (t_0 .. t_{L-1}, the last one not yet in either cache):
  draft step 1  feeds t_{L-2}, t_{L-1}: what the draft lacks (t_{L-1}, and d_k = t_{L-2} after a
                full accept), always two tokens so the layout is fixed
  draft step j  feeds d_{j-1} at position L - 2 + j, samples d_j               (j = 2..k)
"""
from __future__ import annotations

from typing import Callable

import torch

from protospec.device_wait import read_back
from protospec.model.inputs import ForwardInputs
from protospec.model.runner import ModelRunner
from protospec import registry
from protospec.speculation.draft_sampling import sample_draft_step
from protospec.speculation.lookahead import Lookahead
from protospec.speculation.phase_timer import NULL_TIMER
from protospec.speculation.randoms import SpecStepRandoms
from protospec.layout import RejectionOutput
from protospec.speculation.sampler import SamplingTensors
from protospec.speculation.step_state import StepState
from protospec.requests.sequence import Sequence

DrawRandoms = Callable[[StepState], SpecStepRandoms]


class DraftLoop:
    """The interface, with the parts every way shares. `kind` (registry.DraftLoopKind) names it."""

    kind: registry.DraftLoopKind

    def __init__(self, draft: ModelRunner, look: Lookahead, fused_sampling: bool, fallback_reason: str, wait_s: float):
        self.draft, self.look = draft, look
        self.wait_s = wait_s  # the bound on a host wait for a draft step's ids (device_wait.py)
        self.fused_sampling = fused_sampling  # kernels/sampling/softmax_sample.py: two launches per draft sample
        self.fallback_reason = fallback_reason  # labels CPU-prepared steps 2..k in the counters
        self.device = draft.device
        self.timer = NULL_TIMER  # the spec step's phase observer (set through SpeculativeStep.timer)

    @property
    def name(self) -> str:
        return self.kind.name

    @property
    def counters(self):
        """Which input path ran how often (the draft runner's counters)."""
        return self.draft.counters

    # ---- the step's buffers ------------------------------------------------------------------
    def new_state(self, seqs: list[Sequence], st: SamplingTensors, max_blocks: int) -> StepState:
        draft_ids, draft_probs = self._outputs(len(seqs), max_blocks, st)
        host_ids = [[] for _ in seqs] if self.kind.host_sync_per_step else None
        return StepState(seqs, st, max_blocks, draft_ids, draft_probs, host_draft_ids=host_ids)

    def _outputs(self, batch: int, max_blocks: int, st: SamplingTensors) -> tuple[torch.Tensor, torch.Tensor]:
        """draft_ids [B, k] int64 and draft_probs [B, k, V] float32 for the step to fill."""
        k = self.look.k
        return (torch.empty(batch, k, dtype=torch.int64, device=self.device),
                torch.empty(batch, k, self.draft.vocab_size, dtype=torch.float32, device=self.device))

    def catch_up(self, seqs: list[Sequence]) -> None:
        """Bring the draft's cache up to t_{L-3} where target-only steps left it behind (speculation
        off above a batch size): draft step 1 feeds only the last two tokens."""
        behind = [seq for seq in seqs if seq.num_cached_draft < seq.num_tokens - 2]
        if not behind:
            return
        chunks = [seq.tokens(seq.num_cached_draft, seq.num_tokens - 2) for seq in behind]
        starts = [seq.num_cached_draft for seq in behind]
        self.draft.execute(self.draft.prepare("catch_up", chunks, starts, [seq.block_table for seq in behind], 0))
        for seq in behind:
            seq.num_cached_draft = seq.num_tokens - 2

    # ---- inputs --------------------------------------------------------------------------------
    def first_inputs(self, s: StepState) -> ForwardInputs:
        """Draft step 1 on the CPU. The draft lacks t_{L-1}, and after a full accept d_k (at L-2) too.
        Feed the last two tokens always: one fixed layout (a CUDA graph can replay it), and rewriting
        the K/V of L-2 stores the same values again."""
        chunks = [seq.tokens(-2) for seq in s.seqs]
        starts = [seq.num_tokens - 2 for seq in s.seqs]
        return self.draft.prepare("first_draft_step", chunks, starts, [seq.block_table for seq in s.seqs], 1,
                                  s.max_blocks)

    def next_inputs(self, s: StepState) -> ForwardInputs:
        """Inputs of draft step s.step + 1 (2..k)."""
        raise NotImplementedError

    def build_first_inputs(self, result: RejectionOutput, seqs: list[Sequence], committed: bool = False) -> ForwardInputs:
        """The next spec step's draft step 1, built on the device from this step's rejection output
        before the host has read it (the overlapped commit): only the device ways can. committed:
        the host has already appended `result`'s last token to each sequence (a result made up from
        the committed state: nothing accepted, that token emitted), so L is one less."""
        raise NotImplementedError(f"the {self.name} draft loop builds draft step 1 on the CPU")

    def error_flag(self) -> torch.Tensor | None:
        """[1] int32 that device-built inputs set to row + 1 on a position their block table does not
        cover; read with the commit's copy (None: this way builds nothing on the device)."""
        return None

    # ---- running the steps ---------------------------------------------------------------------
    def sample_mirror(self, batch: int) -> torch.Tensor | None:
        """An int64 [B] buffer that also gets each step's ids (a device-side advance reads it)."""
        return None

    def after_sample(self, s: StepState, ids: torch.Tensor) -> None:
        """Called with each step's ids [B] once sampled."""

    def draft_step(self, s: StepState, draw_randoms: DrawRandoms) -> ForwardInputs | None:
        """One draft step: inputs, forward, sample into s.draft_ids / s.draft_probs. Returns the
        step's inputs (None where the step's insides are not visible to the host)."""
        timer, batch = self.timer, len(s.seqs)
        with timer.phase("prepare"):
            if s.step == 0:
                inputs = s.first_inputs if s.first_inputs is not None else self.first_inputs(s)
            else:
                inputs = self.next_inputs(s)
        with timer.phase("draft_forward"):
            logits = self.draft.execute(inputs)  # [B, V]
        with timer.phase("sampling"):
            if s.randoms is None:  # drawn while the device runs the forward just queued
                s.randoms = draw_randoms(s)
            ids = sample_draft_step(logits, s.st, s.step, s.draft_ids, s.draft_probs, s.randoms.noise_block,
                                    self.sample_mirror(batch), self.fused_sampling, self.draft.launches_dependents)  # [B]
            self.after_sample(s, ids)
        s.step += 1
        return inputs

    def run_steps(self, s: StepState, draw_randoms: DrawRandoms) -> None:
        """The remaining draft steps, up to k."""
        while s.step < self.look.k:
            self.draft_step(s, draw_randoms)


class CpuPrepareLoop(DraftLoop):
    """Steps 2..k CPU-prepared; the token of each step is copied device to device from the last sample."""

    kind = registry.DRAFT_LOOPS[registry.SAMPLER]

    def next_inputs(self, s: StepState) -> ForwardInputs:
        inputs = self._cpu_step_inputs(s, [[0]] * len(s.seqs))
        inputs.input_ids.copy_(s.draft_ids[:, s.step - 1])
        return inputs

    def _cpu_step_inputs(self, s: StepState, chunks: list[list[int]]) -> ForwardInputs:
        """The CPU rebuilds every tensor of the step (vLLM's prepare_inputs before the change we study)."""
        starts = [seq.num_tokens - 1 + s.step for seq in s.seqs]
        return self.draft.prepare(f"fallback:{self.fallback_reason}", chunks, starts,
                                  [seq.block_table for seq in s.seqs], 1, s.max_blocks)


class CpuPrepareSyncedLoop(CpuPrepareLoop):
    """The baseline: steps 2..k CPU-prepared from the draft ids copied to the host every step (a sync)."""

    kind = registry.DRAFT_LOOPS[registry.MAIN]

    def next_inputs(self, s: StepState) -> ForwardInputs:
        return self._cpu_step_inputs(s, [[ids[-1]] for ids in s.host_draft_ids])

    def after_sample(self, s: StepState, ids: torch.Tensor) -> None:
        for host, tok in zip(s.host_draft_ids, read_back(ids, "a draft step's sample", self.wait_s)):  # its sync
            host.append(tok)

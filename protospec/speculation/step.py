"""One speculative step for a batch: propose k draft tokens -> verify -> rejection-sample -> commit.

The draft loop (draft_loop.py: how the k proposals are made) and the commit policy (commit.py:
whether the next step's draft step 1 is queued before the host sync) are chosen once, by the
engine; this step runs the stages in order and a debugger may pause between them. The verify
feeds t_{L-1}, d_1..d_k at positions L-1 .. L-1+k: k+1 target distributions, so the target writes
k+1 lookahead slots, reserved up front; the draft writes k of them (lookahead.py).
"""
from __future__ import annotations

import contextlib

import torch

from protospec.requests.block_manager import BlockManager
from protospec.requests.sequence import Sequence
from protospec.device_wait import DEFAULT_TIMEOUT_S, copy_to_host, wait_for
from protospec.errors import AdvanceStepError, ConfigError
from protospec.model.runner import ModelRunner
from protospec.speculation.commit import SyncedCommit
from protospec.speculation.draft_loop import DraftLoop
from protospec.speculation.draft_sampling import target_probs
from protospec.speculation.lookahead import Lookahead
from protospec.speculation.phase_timer import NULL_TIMER
from protospec.speculation.randoms import SpecStepRandoms, force_acceptance
from protospec.layout import PLACEHOLDER_TOKEN_ID, RejectionOutput
from protospec.speculation.sampler import SamplingTensors
from protospec.speculation.step_graph import SpecStepGraph, commit_row
from protospec.speculation.step_state import StepState


def check_forced_acceptance(st: SamplingTensors) -> None:
    if st.any_greedy:
        raise ConfigError("forced acceptance needs every request at temperature > 0: a greedy row's tests "
                          "compare one-hot distributions, which no uniform changes")


class SpeculativeStep:
    """loop_guard(device) wraps the draft loop (sync_guard.forbid_host_sync checks that no host sync
    happens there). `timer` observes the stages (a PhaseTimer for the bench's --breakdown)."""

    def __init__(self, target: ModelRunner, draft_loop: DraftLoop, commit_policy: SyncedCommit,
                 block_manager: BlockManager, acceptance, loop_guard=None, fused_sampling: bool = False,
                 step_graph: bool = False, wait_s: float = DEFAULT_TIMEOUT_S,
                 forced_acceptance: float | None = None):
        self.target, self.draft_loop, self.commit_policy = target, draft_loop, commit_policy
        self.block_manager = block_manager
        self.acceptance = acceptance  # acceptance.py: which draft tokens are kept
        self.look: Lookahead = draft_loop.look
        self.k = self.look.k
        self.loop_guard = loop_guard or (lambda device: contextlib.nullcontext())
        self.device = target.device
        self.fused_sampling = fused_sampling  # kernels/sampling/softmax_sample.py: the verify's probabilities in two launches
        # A step launched by the overlapped commit runs whole as one CUDA graph (step_graph.py); the
        # engine turns it on only where it applies (graph draft loop, fixed k, the draft proposer).
        self.step_graph = step_graph
        self._step_graphs: dict = {}  # its DraftLoopGraph (held, so never a reused identity) -> the SpecStepGraph
        self.timer = NULL_TIMER
        self.wait_s = wait_s  # the bound on the host's waits for the device (device_wait.py)
        # For timing only (lab/forced_acceptance.py): each draft token kept with this probability.
        self.forced_acceptance = forced_acceptance

    @property
    def timer(self):
        return self._timer

    @timer.setter
    def timer(self, timer) -> None:
        self._timer = self.draft_loop.timer = timer

    def reserve_lookahead(self, seqs: list[Sequence]) -> None:
        for seq in seqs:  # positions up to L-1+k must have a slot
            self.block_manager.ensure_capacity(seq.block_table, seq.num_tokens + self.look.slots_past_end)

    def draw_randoms(self, s: StepState) -> SpecStepRandoms:
        """The spec step's random numbers (those a discarded launched step drew for these requests kept)."""
        randoms = SpecStepRandoms.draw(s.st, self.k, self.target.vocab_size, self.device,
                                       self.commit_policy.kept_randoms(s.seqs))
        if self.forced_acceptance is not None:
            check_forced_acceptance(s.st)
            force_acceptance(randoms.uniforms, self.forced_acceptance)
        return randoms

    # ---- the stages of one spec step; __call__ runs them in order, a debugger may pause between ----
    def begin(self, seqs: list[Sequence], st: SamplingTensors, launch: bool = False) -> StepState:
        """Reserve lookahead slots, make the draft output buffers (the step's random numbers are drawn
        once draft step 1's forward is queued: the device runs it while the host draws); or take the
        step an overlapped commit launched, if it was made for this batch. launch: where none was,
        let the commit policy build draft step 1 on the device and launch the step now (generate()
        does; a debugger stepping draft step 1 by hand does not)."""
        with self.timer.phase("begin"):
            pending = self.commit_policy.take(seqs, st)
            if pending is not None:
                return pending
            self.reserve_lookahead(seqs)
            self.draft_loop.catch_up(seqs)
        if launch:
            with self.loop_guard(self.device):
                pending = self.commit_policy.launch_now(self, seqs, st)
            if pending is not None:
                return pending
        with self.timer.phase("begin"):
            return self.draft_loop.new_state(seqs, st, max(len(seq.block_table) for seq in seqs))

    def draft_step(self, s: StepState):
        """One draft step (a device-replayed loop may run several); returns its inputs or None."""
        return self.draft_loop.draft_step(s, self.draw_randoms)

    def verify(self, s: StepState) -> torch.Tensor:
        """Target forward over k+1 positions per sequence -> target probs [B, k+1, V]."""
        if s.target_probs is None and s.probs_on_request is not None:  # a step graph wrote no probabilities
            s.draft_probs, s.target_probs = s.probs_on_request()
        if s.target_probs is not None:  # a step graph ran the verify already
            return s.target_probs
        batch, seqs, width = len(s.seqs), s.seqs, self.look.verify_len
        with self.timer.phase("verify"):
            heads = [seq.tokens(seq.num_cached_target) for seq in seqs]
            if s.host_draft_ids is None:  # draft ids are on the device: placeholders, then a device copy
                assert all(len(h) == 1 for h in heads), "the target must lag by exactly one token"
                chunks = [h + [0] * self.k for h in heads]
            else:
                chunks = [h + p for h, p in zip(heads, s.host_draft_ids)]
            starts = [seq.num_cached_target for seq in seqs]
            inputs = self.target.prepare("verify", chunks, starts, [seq.block_table for seq in seqs], width, s.max_blocks)
            if s.host_draft_ids is None:
                inputs.input_ids.view(batch, width)[:, 1:].copy_(s.draft_ids)
            logits = self.target.execute(inputs)  # [B * (k+1), V]
            s.target_probs = target_probs(logits, s.st, width, self.fused_sampling,
                                          self.target.launches_dependents).view(batch, width, -1)
        return s.target_probs

    def reject(self, s: StepState) -> RejectionOutput:
        if s.result is not None:  # a step graph sampled it already
            return s.result
        with self.timer.phase("rejection"):
            s.result = self.acceptance(s.draft_ids, s.draft_probs, s.target_probs, s.randoms, s.num_proposed,
                                       self.draft_loop.error_flag())
        return s.result

    def queue_commit_copy(self, s: StepState) -> None:
        """Queue the one device-to-host copy the commit reads: per row the k + 1 output ids, the
        accepted and the passed counts (and the proposed count, where a proposer may offer fewer than
        k); then the device-built inputs' error flag (0 = none). Queued before any work of the next
        step, so the commit waits for this copy only."""
        with self.timer.phase("commit"):
            flat = s.commit_row
            if flat is None:
                flat = commit_row(s.result, s.num_proposed, self.draft_loop.error_flag())  # [B * (k + 3) (+ 1)] int64
            s.commit_copy = copy_to_host(flat)

    def launch_step_graph(self, s: StepState) -> bool:
        """Run a launched step (its draft step 1's inputs built on the device) whole as one replay:
        draft steps 1..k, verify, rejection and the commit's row (step_graph.py). False where the
        step graph is off; the step then runs stage by stage."""
        if not self.step_graph:
            return False
        batch = len(s.seqs)
        draft_graph = self.draft_loop.first_step_graph(batch, s.max_blocks, s.st)
        if self.forced_acceptance is not None:
            check_forced_acceptance(s.st)
        graph = self._step_graphs.get((draft_graph, self.forced_acceptance))
        if graph is None:
            graph = SpecStepGraph(draft_graph, self.target, self.acceptance, self.fused_sampling,
                                  self.draft_loop.error_flag(), self.forced_acceptance)
            self._step_graphs[draft_graph, self.forced_acceptance] = graph
        with self.timer.phase("step_graph"):
            s.randoms = graph.randoms(s.st, self.commit_policy.kept_randoms(s.seqs))
            probs, result, s.commit_row = graph.run(s.st, s.randoms, batch)
        if graph.from_logits:  # the verify's logits: no probabilities were written
            s.probs_on_request = lambda: graph.probabilities(probs, batch)
        else:
            s.target_probs = probs[:batch]
        s.result = RejectionOutput(result.output_token_ids[:batch], result.num_accepted[:batch],
                                   result.accepted_mask[:batch], result.passed_mask[:batch])
        s.step = self.k
        counters = self.draft_loop.counters
        counters["spec_step_graph"] += 1
        counters["draft_loop_graph"] += 1  # the draft tail is inside this replay too
        counters["gpu_advance"] += self.k - 1  # inside the replay
        return True

    def launch_after_prefill(self, seqs: list[Sequence], st: SamplingTensors, sampled: torch.Tensor,
                             readback: torch.Tensor) -> list:
        """The commit policy's chance to queue the first spec step of freshly prefilled sequences
        before the host reads their first tokens (sampled: [B] int64 on the device). Returns
        `readback` (a 1-D tensor holding those tokens and whatever else the caller reads with them),
        from a copy queued before the launch: the host waits for the prefill only."""
        host, done = copy_to_host(readback)
        with self.loop_guard(self.device):
            self.commit_policy.launch_after_prefill(self, seqs, st, sampled)
        if done is not None:
            wait_for(done, "a prefill's tokens", self.wait_s)
        return host.tolist()

    def commit(self, s: StepState) -> None:
        if s.commit_copy is None:
            self.queue_commit_copy(s)
        with self.timer.phase("commit"):
            host, done = s.commit_copy
            if done is not None:  # the spec step's first host sync on the no-sync paths
                wait_for(done, "a spec step's commit row", self.wait_s)
            flat = host.tolist()
            width = self.look.commit_row_width + (s.num_proposed is not None)
            rows = [flat[i * width : (i + 1) * width] for i in range(len(s.seqs))]
            flag = self.draft_loop.error_flag()
            bad_row = flat[-1] if flag is not None else 0
            if bad_row:
                flag.zero_()
                self.commit_policy.clear()
                raise AdvanceStepError(f"advance_step / first_draft_step: row {bad_row - 1} reached a position its "
                                       "block table does not cover; its K/V write was skipped (the lookahead "
                                       "reservation is broken)")
            # A launched next step keeps its lookahead (the device's block tables list it).
            lookahead = self.commit_policy.kept_lookahead()
            k = self.k
            for seq, row in zip(s.seqs, rows):
                if seq.finished:  # it ended in the commit before this step's launch: its row ran for nothing
                    continue
                accepted, passed = row[k + 1], row[k + 2]
                proposed = row[k + 3] if s.num_proposed is not None else k
                length = seq.num_tokens
                emitted = [t for t in row[: k + 1] if t != PLACEHOLDER_TOKEN_ID]
                kept = seq.append_tokens(emitted)
                seq.metrics.record_step(proposed, accepted, kept, num_passed=passed, num_verified=k + 1)
                # Target has K/V for t_{L-1}, d_1..d_accepted; the draft never ran on d_k.
                seq.num_cached_target = length + accepted
                seq.num_cached_draft = length + min(accepted, self.k - 1)
                self.block_manager.shrink(seq.block_table, seq.num_tokens + lookahead)

    def __call__(self, seqs: list[Sequence], st: SamplingTensors, requests_waiting: bool = False) -> RejectionOutput:
        state = self.begin(seqs, st, launch=True)
        with self.loop_guard(self.device):  # no host sync from here to the rejection sampler
            self.draft_loop.run_steps(state, self.draw_randoms)
        if state.result is None:  # (a step graph's replay did both)
            self.verify(state)
            self.reject(state)
        self.queue_commit_copy(state)
        with self.loop_guard(self.device):  # the next step's draft step 1 needs no sync either
            self.commit_policy.launch_next(self, state, requests_waiting)
        self.commit(state)
        return state.result

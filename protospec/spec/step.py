"""One speculative step for a batch: propose k draft tokens -> verify -> rejection-sample -> commit.

Positions for a sequence of L tokens (t_0 .. t_{L-1}, the last one not yet in either cache):
  draft step 1  feeds t_{L-2}, t_{L-1}: what the draft lacks (t_{L-1}, and d_k = t_{L-2} after a
                full accept), always two tokens so the layout is fixed
  draft step j  feeds d_{j-1} at position L - 2 + j, samples d_j               (j = 2..k)
  verify        feeds t_{L-1}, d_1..d_k at positions L-1 .. L-1+k: k+1 target distributions
So the target writes k+1 lookahead slots, reserved up front; the draft writes k of them.

Overlapped commit (gpu and graph modes, on by default; vLLM's change prepared draft step 1 on the
CPU after the host sync): after the rejection sampler is queued, the commit's copy
to the host is queued, then the NEXT spec step's draft step 1 with inputs the first_draft_step
kernel builds from the rejection output (L' = L + accepted + 1 and the last two tokens are on the
device already). The host then waits only for the copy and commits while the device runs that
step. The next `begin` takes the launched step if the batch is the same; otherwise (a request
finished or joined) it discards it: its K/V writes are rewritten with the same values, and its
random numbers stay with their requests, so outputs do not depend on whether the commit overlapped.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from protospec.engine.block_manager import BlockManager
from protospec.model.graphs import bucket
from protospec.spec.draft_graph import DraftLoopGraph
from protospec.spec.draft_sampling import sample_draft_step, target_probs
from protospec.errors import AdvanceStepError
from protospec.spec.commit import LaunchedStep
from protospec.spec.rejection import PLACEHOLDER_TOKEN_ID, RejectionOutput, rejection_sample
from protospec.spec.phase_timer import NULL_TIMER
from protospec.spec.randoms import SpecStepRandoms
from protospec.model.runner import ModelRunner
from protospec.spec.sampler import SamplingTensors
from protospec.engine.sequence import Sequence

DRAFT_LOOP_MODES = ("main", "sampler", "gpu", "graph")


class SpeculativeStep:
    """mode: main, sampler, gpu or graph (config.DRAFT_LOOP_DOC says what each does).
    overlap_commit: in the gpu and graph modes (module docstring; for k = 1 too, where it is the
    only device-built step); ignored by the CPU-prepare modes. The bench calls gpu without it
    "gpu_sync_commit".
    fallback_reason labels the CPU-prepared steps 2..k of the CPU modes in the counters.
    loop_guard(device) wraps the draft loop (sync_guard.forbid_host_sync to check invariant 2).
    """

    def __init__(self, target: ModelRunner, draft: ModelRunner, block_manager: BlockManager, k: int,
                 mode: str = "main", fallback_reason: str = "disabled_by_user", loop_guard=None,
                 fused_rejection: bool = False, fused_sampling: bool = False, overlap_commit: bool = False):
        if mode not in DRAFT_LOOP_MODES:
            raise ValueError(f"draft loop mode must be one of {DRAFT_LOOP_MODES}, got {mode!r}")
        self.target, self.draft, self.block_manager, self.k = target, draft, block_manager, k
        self.mode, self.fallback_reason = mode, fallback_reason
        self.builds_on_device = mode in ("gpu", "graph")  # the draft's device buffers exist (engine.py)
        self.advances_on_gpu = self.builds_on_device and k > 1  # k = 1 has no step 2 to advance
        self.loop_graphs: dict[tuple, DraftLoopGraph] = {}
        self.loop_guard = loop_guard or (lambda device: contextlib.nullcontext())
        self.timer = NULL_TIMER  # a PhaseTimer for the bench's --breakdown
        self.device = target.device
        self.fused_sampling = fused_sampling  # kernels/sampling.py: one kernel per draft sample / verify's probs
        self.overlap_commit = overlap_commit and self.builds_on_device
        self.launched = LaunchedStep(draft.counters)  # the next step, launched before the commit
        if fused_rejection:
            from protospec.kernels.rejection import rejection_sample_fused
            self.rejection_sample = rejection_sample_fused
        else:
            self.rejection_sample = rejection_sample

    def reserve_lookahead(self, seqs: list[Sequence]) -> None:
        for seq in seqs:  # positions up to L-1+k must have a slot
            self.block_manager.ensure_capacity(seq.block_table, seq.num_tokens + self.k)

    def _loop_graph(self, batch: int, width: int, st: SamplingTensors) -> DraftLoopGraph:
        rows = bucket(batch, self.draft.decode_state.max_num_seqs)
        width = bucket(width, self.draft.decode_state.block_tables.shape[1], smallest=8)
        key = DraftLoopGraph.key(rows, width, st)
        if key not in self.loop_graphs:
            self.loop_graphs[key] = DraftLoopGraph(self.draft, self.k, rows, width, st, self.fused_sampling)
        return self.loop_graphs[key]

    # ---- the stages of one spec step; __call__ runs them in order, a debugger may pause between ----
    def begin(self, seqs: list[Sequence], st: SamplingTensors) -> "StepState":
        """Reserve lookahead slots, make the draft output buffers. (The step's random numbers are
        drawn once draft step 1's forward is queued: the device runs it while the host draws.)
        With the commit overlapped, the step launched by the last commit, if made for this batch."""
        with self.timer.phase("begin"):
            pending = self.launched.take(seqs, st, self.k, self.block_manager.block_size)
            if pending is not None:
                return pending
            self.reserve_lookahead(seqs)
            return self._new_state(seqs, st)

    def _new_state(self, seqs: list[Sequence], st: SamplingTensors) -> "StepState":
        k, batch = self.k, len(seqs)
        max_blocks = max(len(seq.block_table) for seq in seqs)
        graph = self._loop_graph(batch, max_blocks, st) if self.mode == "graph" and self.advances_on_gpu else None
        if graph is not None:  # step 1 writes into the graph's output buffers too
            draft_ids, draft_probs = graph.draft_ids[:batch], graph.draft_probs[:batch]
        else:
            draft_ids = torch.empty(batch, k, dtype=torch.int64, device=self.device)
            draft_probs = torch.empty(batch, k, self.draft.vocab_size, dtype=torch.float32, device=self.device)
        proposals = [[] for _ in seqs] if self.mode == "main" else None
        return StepState(seqs, st, None, max_blocks, draft_ids, draft_probs, proposals, graph)

    def _draft_inputs(self, s: "StepState"):
        step, seqs, tables = s.step, s.seqs, [seq.block_table for seq in s.seqs]
        if step == 0 and s.first_inputs is not None:  # built on the device by the last commit's launch
            return s.first_inputs
        if step == 0:
            # The draft lacks t_{L-1}, and after a full accept d_k (at L-2) too. Feed the last two
            # tokens always: one fixed layout (a CUDA graph can replay it), and rewriting the K/V of
            # L-2 stores the same values again.
            chunks = [seq.token_ids[-2:] for seq in seqs]
            starts = [seq.num_tokens - 2 for seq in seqs]
            inputs = self.draft.prepare("first_draft_step", chunks, starts, tables, 1, s.max_blocks)
            if self.advances_on_gpu:
                self.draft.decode_state.seed(inputs.meta)
            return inputs
        if self.mode == "gpu":
            return self.draft.advance()
        # The CPU rebuilds every tensor; the token comes from the host (main) or is copied device
        # to device from the last sample (sampler).
        chunks = [[p[-1]] for p in s.proposals] if self.mode == "main" else [[0]] * len(seqs)
        starts = [seq.num_tokens - 1 + step for seq in seqs]
        inputs = self.draft.prepare(f"fallback:{self.fallback_reason}", chunks, starts, tables, 1, s.max_blocks)
        if self.mode == "sampler":
            inputs.input_ids.copy_(s.draft_ids[:, step - 1])
        return inputs

    def draft_step(self, s: "StepState"):
        """One draft step: inputs (CPU prepare or GPU advance), forward, sample. In the graph mode,
        the step after the first runs all of steps 2..k as one replay. Returns the step's inputs."""
        timer, batch = self.timer, len(s.seqs)
        if s.loop_graph is not None and s.step == 1:
            with timer.phase("draft_loop_graph"):
                s.loop_graph.run(s.st, s.randoms.draft_noise, batch)
            self.draft.counters["gpu_advance"] += self.k - 1  # inside the replay
            self.draft.counters["draft_loop_graph"] += 1
            s.step = self.k
            return None
        with timer.phase("prepare"):
            inputs = self._draft_inputs(s)
        with timer.phase("draft_forward"):
            logits = self.draft.execute(inputs)
        with timer.phase("sampling"):
            if s.randoms is None:  # kept: what a discarded launched step drew for these requests
                s.randoms = SpecStepRandoms.draw(s.st, self.k, self.draft.vocab_size, self.device,
                                                 self.launched.kept_randoms(s.seqs))
            into = self.draft.decode_state.sampled_ids[:batch] if self.advances_on_gpu else None  # read by advance_step
            ids = sample_draft_step(logits, s.st, s.step, s.draft_ids, s.draft_probs, s.randoms.noise_block, into,
                                    self.fused_sampling)  # [B]
            if s.proposals is not None:  # the "main" baseline: a host sync every draft step
                for p, tok in zip(s.proposals, ids.tolist()):
                    p.append(tok)
        s.step += 1
        return inputs

    def verify(self, s: "StepState") -> torch.Tensor:
        """Target forward over k+1 positions per sequence -> target probs [B, k+1, V]."""
        k, batch, seqs = self.k, len(s.seqs), s.seqs
        with self.timer.phase("verify"):
            heads = [seq.token_ids[seq.num_cached_target:] for seq in seqs]
            if s.proposals is None:  # draft ids are on the device: placeholders, then a device copy
                assert all(len(h) == 1 for h in heads), "the target must lag by exactly one token"
                chunks = [h + [0] * k for h in heads]
            else:
                chunks = [h + p for h, p in zip(heads, s.proposals)]
            starts = [seq.num_cached_target for seq in seqs]
            inputs = self.target.prepare("verify", chunks, starts, [seq.block_table for seq in seqs], k + 1, s.max_blocks)
            if s.proposals is None:
                inputs.input_ids.view(batch, k + 1)[:, 1:].copy_(s.draft_ids)
            logits = self.target.execute(inputs)  # [B * (k+1), V]
            s.target_probs = target_probs(logits, s.st, k + 1, self.fused_sampling).view(batch, k + 1, -1)
        return s.target_probs

    def reject(self, s: "StepState") -> RejectionOutput:
        with self.timer.phase("rejection"):
            r = s.randoms
            s.result = self.rejection_sample(s.draft_ids, s.draft_probs, s.target_probs, r.uniforms, r.recovered_noise,
                                             r.bonus_noise)
        return s.result

    def queue_commit_copy(self, s: "StepState") -> None:
        """Queue the one device-to-host copy the commit reads: per row the k + 1 output ids, the
        accepted and the passed counts; then the device-built inputs' error flag (0 = none). Queued
        before any work of the next step, so the commit waits for this copy only."""
        with self.timer.phase("commit"):
            r, decode = s.result, self.draft.decode_state
            parts = [torch.cat([r.output_token_ids, r.num_accepted[:, None], r.passed_mask.sum(-1, keepdim=True)], 1).flatten()]
            if self.builds_on_device:
                parts.append(decode.error_row.long())
            flat = torch.cat(parts)  # [B * (k + 3) (+ 1)] int64
            if flat.device.type != "cuda":
                s.commit_copy = (flat, None)
                return
            host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
            host.copy_(flat, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
            s.commit_copy = (host, done)

    def launch_next(self, s: "StepState") -> None:
        """Overlapped commit: queue the next spec step's draft step 1, its inputs built on the device
        from this step's rejection output, before the commit's host sync. Not when a sequence may
        reach max_tokens in this step: it may have no next step, and the next step's lookahead
        could pass the blocks its admission promised."""
        if not self.overlap_commit or any(seq.num_remaining <= self.k + 1 for seq in s.seqs):
            return
        seqs = list(s.seqs)  # a copy: the engine's running list changes when requests finish
        for seq in seqs:  # L' <= L + k + 1, and the next step writes up to position L' - 1 + k
            self.block_manager.ensure_capacity(seq.block_table, seq.num_tokens + 2 * self.k + 1)
        nxt = self._new_state(seqs, s.st)
        with self.timer.phase("prepare"):
            nxt.first_inputs = self.draft.first_step_on_device(
                s.result, [seq.block_table for seq in seqs], [seq.num_tokens for seq in seqs],
                [seq.last_token_id for seq in seqs])
            if self.advances_on_gpu:
                self.draft.decode_state.seed(nxt.first_inputs.meta)
        self.draft_step(nxt)
        self.launched.pending = nxt

    def commit(self, s: "StepState") -> None:
        if s.commit_copy is None:
            self.queue_commit_copy(s)
        with self.timer.phase("commit"):
            decode = self.draft.decode_state
            host, done = s.commit_copy
            if done is not None:
                done.synchronize()  # the spec step's first host sync on the no-sync paths
            flat = host.tolist()
            width = self.k + 3
            rows = [flat[i * width : (i + 1) * width] for i in range(len(s.seqs))]
            bad_row = flat[-1] if self.builds_on_device else 0
            if bad_row:
                decode.error_row.zero_()
                self.launched.clear()
                raise AdvanceStepError(f"advance_step / first_draft_step: row {bad_row - 1} reached a position its "
                                       "block table does not cover; its K/V write was skipped (the lookahead "
                                       "reservation is broken)")
            for seq, (*row, accepted, passed) in zip(s.seqs, rows):
                length = seq.num_tokens
                emitted = [t for t in row if t != PLACEHOLDER_TOKEN_ID]
                kept = seq.append_tokens(emitted)
                seq.metrics.record_step(self.k, accepted, kept, num_passed=passed)
                # Target has K/V for t_{L-1}, d_1..d_accepted; the draft never ran on d_k.
                seq.num_cached_target = length + accepted
                seq.num_cached_draft = length + min(accepted, self.k - 1)
                # A launched next step keeps its lookahead (the device's block tables list it).
                lookahead = self.k if self.launched.pending is not None else 0
                self.block_manager.shrink(seq.block_table, seq.num_tokens + lookahead)

    def __call__(self, seqs: list[Sequence], st: SamplingTensors) -> RejectionOutput:
        state = self.begin(seqs, st)
        with self.loop_guard(self.device):  # no host sync from here to the rejection sampler
            while state.step < self.k:
                self.draft_step(state)
        self.verify(state)
        self.reject(state)
        self.queue_commit_copy(state)
        with self.loop_guard(self.device):  # the next step's draft step 1 needs no sync either
            self.launch_next(state)
        self.commit(state)
        return state.result


@dataclass
class StepState:
    """Everything one spec step carries between its stages (see SpeculativeStep)."""

    seqs: list[Sequence]
    st: SamplingTensors
    randoms: SpecStepRandoms | None       # drawn in draft step 1, after its forward is queued
    max_blocks: int                       # block-table width of this step (lookahead included)
    draft_ids: torch.Tensor               # [B, k] int64, filled step by step
    draft_probs: torch.Tensor             # [B, k, V] float32
    proposals: list[list[int]] | None     # host copies of the draft ids (main mode only)
    loop_graph: DraftLoopGraph | None     # graph mode: steps 2..k as one replay
    step: int = 0                         # draft steps done
    target_probs: torch.Tensor | None = None  # [B, k+1, V] after verify
    result: RejectionOutput | None = None     # after reject
    first_inputs: object | None = None        # ForwardInputs of draft step 1 when built on the device
    commit_copy: tuple | None = None          # (host int64 tensor, CUDA event or None): what commit reads

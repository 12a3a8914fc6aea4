"""Commit policies: what the host does around the one sync of a spec step, chosen once per engine.

synced      the host waits for the rejection output, commits, then prepares the next spec step.
overlapped  after the rejection sampler and the commit's copy are queued, the NEXT spec step's draft
            step 1 is queued too, its inputs built on the device from the rejection output
            (L' = L + accepted + 1; the last two tokens are on the device already). The host then
            waits only for the copy and commits while the device runs that step. The next `begin`
            takes the launched step if the batch is the same, or the same but for requests that
            ended in the commit before (a request's end is not known when the next step is queued):
            their rows ran for nothing, the commit skips them, and the step after is built for the
            rest. A step that ran whole as one replay is taken so; otherwise (a request joined, or
            ended before a step run stage by stage) it is discarded: its K/V writes are rewritten
            with the same values, and its random numbers stay with their requests (seq_id -> their
            rows), so outputs do not depend on whether the commit overlapped. Only the device draft
            loops can build draft step 1 on the device; vLLM's change prepared it on the CPU after
            the sync (synced).
"""
from __future__ import annotations

from collections import Counter
from typing import Protocol

import torch

from protospec.requests.block_manager import BlockManager
from protospec.requests.sequence import Sequence
from protospec.layout import PLACEHOLDER_TOKEN_ID, RejectionOutput
from protospec.model.inputs import host_to_device
from protospec import registry
from protospec.speculation.draft_loop import DraftLoop
from protospec.speculation.lookahead import Lookahead
from protospec.speculation.phase_timer import PhaseTimer
from protospec.speculation.randoms import SpecStepRandoms
from protospec.speculation.sampler import SamplingTensors
from protospec.speculation.step_state import StepState


class StepCallbacks(Protocol):
    """What a commit policy uses of the spec step (step.py) to launch the next one: the step holds its
    commit policy and the policy calls back into the step, so the policy names only this much."""
    block_manager: BlockManager
    device: torch.device
    draft_loop: DraftLoop
    timer: PhaseTimer
    step_graph: bool  # a launched step runs whole as one replay

    def draw_randoms(self, s: StepState) -> SpecStepRandoms: ...

    def launch_step_graph(self, s: StepState) -> bool: ...


class SyncedCommit:
    name = registry.SYNCED
    pending: StepState | None = None  # never: nothing is launched ahead

    def take(self, seqs: list[Sequence], st: SamplingTensors) -> StepState | None:
        """A spec step launched ahead for this batch, if any."""
        return None

    def launch_next(self, step: StepCallbacks, s: StepState, requests_waiting: bool = False) -> None:
        """Queue work of the next spec step before the commit's host sync (nothing, here).
        requests_waiting: requests wait to join the batch when one ends."""

    def launch_after_prefill(self, step: StepCallbacks, seqs: list[Sequence], st: SamplingTensors,
                             sampled: torch.Tensor) -> None:
        """Queue the first spec step's work before the host reads the prefill's tokens (nothing, here)."""

    def launch_now(self, step: StepCallbacks, seqs: list[Sequence], st: SamplingTensors) -> StepState | None:
        """A spec step for this batch built and launched now, from the committed state, where none was
        launched ahead (None here: the step is prepared on the CPU)."""
        return None

    def kept_lookahead(self) -> int:
        """Slots a sequence keeps past its end after the commit (a launched step's lookahead)."""
        return 0

    def kept_randoms(self, seqs: list[Sequence]) -> list | None:
        """Random numbers drawn for these requests by a discarded launched step."""
        return None

    def discard(self) -> None:
        """Drop a launched step (the batch changed, or a debugger takes over), keeping its randoms."""

    def clear(self) -> None:
        """Forget everything launched or kept (the engine aborted its requests)."""


class OverlappedCommit(SyncedCommit):
    name = registry.OVERLAPPED

    def __init__(self, counters: Counter, look: Lookahead, block_size: int):
        self.pending = None           # the next spec step, its draft step 1 already launched
        # the draft runner's: "first_step_discarded", "first_step_at_begin", "launched_rows_past_an_end"
        self._counters = counters
        self.look, self.block_size = look, block_size
        # seq_id -> (uniforms [k], noise [2k + 1, V]) drawn by a discarded step for that request
        self._kept_randoms: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def launch_next(self, step: StepCallbacks, s: StepState, requests_waiting: bool = False) -> None:
        """For the step's requests still running (those that ended in the commit before this step are
        left out, their rows of this step's result with them). Not when every one may reach max_tokens
        in this step: then the batch likely has no next step. Where the step runs whole as one replay
        and no request waits to join, one that may end and does gets a row that runs for nothing
        (admission reserved the slots it writes, Lookahead.reserved_slots) and the step is taken for
        the rest. Otherwise none is launched while any request may end: a request that joins, or a
        step run stage by stage, would have it discarded."""
        rows = [i for i, seq in enumerate(s.seqs) if not seq.finished]
        seqs = [s.seqs[i] for i in rows]
        may_finish = [self.look.may_finish_within_step(seq.num_remaining) for seq in seqs]
        if all(may_finish) or (any(may_finish) and (requests_waiting or not step.step_graph)):
            return
        result, st = s.result, s.st
        if len(rows) < len(s.seqs):  # the rows of requests that ended: gathered out on the device
            index = host_to_device(rows, torch.int64, step.device)  # [B'] int64
            result = RejectionOutput(*(t.index_select(0, index) for t in (result.output_token_ids, result.num_accepted,
                                                                           result.accepted_mask, result.passed_mask)))
            st = s.live_st
        self._launch(step, seqs, st, result, self.look.next_step_slots)

    def launch_after_prefill(self, step: StepCallbacks, seqs: list[Sequence], st: SamplingTensors,
                             sampled: torch.Tensor) -> None:
        """The first spec step launched from the prefill's sampled tokens (sampled: [B] int64 on the
        device) before the host reads them, as if a spec step had accepted nothing and emitted that
        token: L' = L + 1, the step writes up to L + k, inside what admission promised. Not for a
        request whose prefill token is its last (max_tokens 1)."""
        if any(seq.num_remaining <= 1 for seq in seqs):
            return
        self._launch(step, list(seqs), st, _emitted_only(sampled, self.look.k), self.look.k + 1)

    def launch_now(self, step: StepCallbacks, seqs: list[Sequence], st: SamplingTensors) -> StepState | None:
        """No step was launched ahead for this batch (a request joined or ended, or one may reach
        max_tokens within the step before): build draft step 1 on the device from the committed state
        anyway, as a result that accepted nothing and emitted each sequence's last token, and launch it
        (where a step graph applies, the whole step as one replay). Same inputs as the CPU's draft
        step 1 (t_{L-2}, t_{L-1} at L-2, L-1), without its prepare and, in a step graph, without the
        verify's. The host has committed, so the step reserves only its own lookahead."""
        self._counters["first_step_at_begin"] += 1
        last = host_to_device([seq.last_token_id for seq in seqs], torch.int64, step.device)  # [B]
        self._launch(step, list(seqs), st, _emitted_only(last, self.look.k), self.look.slots_past_end, committed=True)
        return self.take(seqs, st)

    def _launch(self, step: StepCallbacks, seqs: list[Sequence], st: SamplingTensors, result: RejectionOutput,
                slots_past_end: int, committed: bool = False) -> None:
        """Reserve slots_past_end slots past each sequence's current end, build the next draft step 1
        on the device from `result`, and launch it (or the whole step, where a step graph applies).
        seqs: a copy (the engine's running list changes when requests finish)."""
        self.discard()  # one left from requests that all ended (nothing took it): its randoms are kept
        for seq in seqs:
            step.block_manager.ensure_capacity(seq.block_table, seq.num_tokens + slots_past_end)
        loop = step.draft_loop
        nxt = loop.new_state(seqs, st, max(len(seq.block_table) for seq in seqs))
        with step.timer.phase("prepare"):
            nxt.first_inputs = loop.build_first_inputs(result, seqs, committed)
        if not step.launch_step_graph(nxt):  # the whole step as one replay, where it applies
            loop.draft_step(nxt, step.draw_randoms)
        self.pending = nxt

    def take(self, seqs: list[Sequence], st: SamplingTensors) -> StepState | None:
        """The pending step if it was made for this very batch (the same Sequence objects, in order,
        with the same SamplingTensors), or for this batch and requests that have ended since, where the
        step ran whole (a step graph: nothing is left to prepare for the ended ones), and its block
        tables still hold the lookahead past every sequence's end; otherwise it is discarded. st: the
        batch's settings (the step's own where requests ended: its rows are the step's)."""
        pending, self.pending = self.pending, None
        if pending is None:
            return None
        live = [seq for seq in pending.seqs if not seq.finished]
        ended = len(live) < len(pending.seqs)
        same_batch = (len(live) == len(seqs) and all(a is b for a, b in zip(live, seqs))
                      and (pending.result is not None if ended else pending.st is st))
        lookahead = self.look.slots_past_end
        if same_batch and all(len(seq.block_table) * self.block_size >= seq.num_tokens + lookahead for seq in seqs):
            pending.live_st = st
            if ended:
                self._counters["launched_rows_past_an_end"] += len(pending.seqs) - len(live)
            return pending
        self._keep_randoms(pending)
        return None

    def kept_lookahead(self) -> int:
        return self.look.slots_past_end if self.pending is not None else 0

    def discard(self) -> None:
        pending, self.pending = self.pending, None
        if pending is not None:
            self._keep_randoms(pending)

    def _keep_randoms(self, pending: StepState) -> None:
        self._counters["first_step_discarded"] += 1
        r = pending.randoms
        if r is not None and (r.keys is not None or r.noise_block is not None):  # neither: all greedy
            for row, seq in enumerate(pending.seqs):
                self._kept_randoms[seq.seq_id] = r.kept_row(row)

    def clear(self) -> None:
        self.pending = None
        self._kept_randoms.clear()

    def kept_randoms(self, seqs: list[Sequence]) -> list | None:
        """Per sequence what it kept (SpecStepRandoms.kept_row) or None, for SpecStepRandoms.draw(kept=...); each
        is used once (what is not asked for belongs to requests that have ended)."""
        if not self._kept_randoms:
            return None
        kept = [self._kept_randoms.get(seq.seq_id) for seq in seqs]
        self._kept_randoms.clear()
        return kept


def _emitted_only(tokens: torch.Tensor, k: int) -> RejectionOutput:
    """A rejection output that accepted nothing and emitted `tokens` ([B] int64, on the device)."""
    batch, device = tokens.shape[0], tokens.device
    output = torch.full((batch, k + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int64, device=device)
    output[:, 0] = tokens
    nothing = torch.zeros(batch, k, dtype=torch.bool, device=device)
    return RejectionOutput(output, torch.zeros(batch, dtype=torch.int64, device=device), nothing, nothing)


def make_commit_policy(name: str, counters: Counter, look: Lookahead, block_size: int) -> SyncedCommit:
    if name == registry.OVERLAPPED:
        return OverlappedCommit(counters, look, block_size)
    return SyncedCommit()

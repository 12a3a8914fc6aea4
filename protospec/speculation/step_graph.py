"""A launched spec step as ONE CUDA graph: draft steps 1..k, the verify's inputs, the verify, the
target's probabilities, the rejection sampler and the commit's row, one replay.

The overlapped commit (commit.py) builds the next spec step's draft step 1 on the device from the
rejection output, before the host has read it. From there nothing the step does needs the host:
the draft loop advances on the device (draft_graph.py), the verify's inputs follow from draft step
1's buffers and the draft ids (verify_inputs.py), and the rejection sampler reads random numbers
drawn up front. So the whole step is captured once per batch layout and replayed: per spec step the
host launches the first_draft_step kernel, draws the step's keys, copies the random numbers in,
replays, and queues the commit's copy. The commit then runs while the device works on the next step.
The step's random numbers are filled inside the replay, from the requests' keys (one small copy in):
drawn outside, they would cost a fill and a copy of each block into the graph's buffers.

What only needs draft step 1's buffers goes on a branch of the replay of its own, beside draft step
1's forward: that fill, and the verify's inputs but its draft tokens, which each draft step's sample
writes into the verify's tokens itself. The first sample waits for the branch.

Where the fused rejection kernel takes the step's rows and the draft samples first (the Gumbel
kernel leaves each step's logits), from LOGITS_MIN_ROWS rows no probabilities are written at all:
the draft's and the target's logits get each row's statistics (a statistics kernel each, the draft's
on the branch) and the rejection kernel forms p and q where it reads them, the same bits
(kernels/sampling/rejection.py's from_logits). Who wants the probabilities (the lab) makes them on
request (`probabilities`).

Everything lives in fixed buffers of `rows` (the batch padded to a bucket); the draft side shares
the steps 1..k draft graph's buffers (settings, noise, draft ids and probabilities). The outputs
(target probabilities, the rejection output, the commit's row) are the graph's own tensors,
overwritten by the next replay: the host reads a step's outcome from the commit's copy. Memory: each
(rows, width) layout keeps its own graph pool (a verify's activations, [rows, k + 1, V] probabilities)
and, where its samplers cannot draw from the keys, [rows, 2k + 1, V] of noise, beside the verify graph
the stage-by-stage step captures.
"""
from __future__ import annotations

import torch

from protospec.errors import ConfigError
from protospec.kernels.randoms.counter_randoms import split_key
from protospec.layout import RejectionOutput
from protospec.model.graphs import sync_allowed
from protospec.model.persistent_inputs import PersistentInputs
from protospec.model.runner import ModelRunner
from protospec.speculation.draft_graph import DraftLoopGraph
from protospec.speculation.draft_sampling import target_probs
from protospec import registry
from protospec.kernels.randoms import counter_randoms
from protospec.kernels.sampling.rejection import rejection_sample_fused
from protospec.kernels.sampling.stats import launch_stats
from protospec.speculation.randoms import SpecStepRandoms, force_acceptance
from protospec.speculation.sampler import SamplingTensors
from protospec.speculation.verify_inputs import build_verify_inputs

# Rows from which the step writes no probabilities (from_logits). Below, each row's statistics kernel
# finishing its row (its last block's combine) and the rejection kernel's exponentials cost more
# latency than the probabilities kernels they replace, which overlap their predecessors as dependents
# (NOTES.md has the timings).
LOGITS_MIN_ROWS = 16



def draws_from_keys(st: SamplingTensors, acceptance) -> bool:
    """Whether a step graph's verify draws its noise from the requests' keys: its rejection sampler is
    the fused kernel (not typical acceptance, not the torch sampler) and the fused sampling kernels take
    its rows (no top-k / top-p)."""
    return getattr(acceptance, "sample", None) is rejection_sample_fused and not st.needs_filter


def step_graph_applies(setting: bool | None, draft_loop: str, proposer: str | None, commit: str) -> bool:
    """EngineConfig.spec_step_graph resolved for an engine's draft loop (None: wherever it applies);
    True where it cannot apply is an error that names what is missing."""
    missing = [need for need, absent in (
        ("the graph draft loop", draft_loop != registry.GRAPH),
        ("a draft model", proposer != registry.DRAFT),
        ("the overlapped commit", commit != registry.OVERLAPPED)) if absent]
    if setting and missing:
        raise ConfigError(f"spec_step_graph=True needs {', '.join(missing)}")
    return setting is not False and not missing


def commit_row(result: RejectionOutput, num_proposed: torch.Tensor | None, error_flag: torch.Tensor | None) -> torch.Tensor:
    """What the commit reads, as one int64 vector: per row the k + 1 output ids, the accepted and the
    passed counts (and the proposed count, where a proposer may offer fewer than k); then the error
    flag of device-built inputs (0 = none). [B * (k + 3) (+ B) (+ 1)] int64."""
    if result.commit_flagged is not None and num_proposed is None and error_flag is not None:
        return result.commit_flagged  # the rejection kernel wrote it all (no kernel of its own)
    if result.commit_columns is not None and num_proposed is None:
        parts = [result.commit_columns.flatten()]  # the rejection kernel wrote them (no extra kernels)
    else:
        columns = [result.output_token_ids, result.num_accepted[:, None], result.passed_mask.sum(-1, keepdim=True)]
        if num_proposed is not None:
            columns.append(num_proposed[:, None])
        parts = [torch.cat(columns, 1).flatten()]
    if error_flag is not None:
        parts.append(error_flag.long())
    return torch.cat(parts)


class SpecStepGraph:
    def __init__(self, draft_graph: DraftLoopGraph, target: ModelRunner, acceptance, fused_sampling: bool,
                 error_row: torch.Tensor, forced_acceptance: float | None = None):
        """draft_graph: the steps 1..k graph (its `first` buffers set); acceptance: the step's rule
        (speculation/acceptance.py), called on the padded batch; error_row: [1] int32 the step's device-built
        inputs flag a bad position in; forced_acceptance: for timing only, each draft token kept with
        this probability (randoms.force_acceptance, applied to the uniforms inside the replay)."""
        self.forced_acceptance = forced_acceptance
        if draft_graph.first is None:
            raise ValueError("a spec step graph starts at draft step 1: its draft graph needs the first-step buffers")
        self.draft, self.target, self.acceptance = draft_graph, target, acceptance
        self.fused, self.error_row = fused_sampling, error_row
        rows, width, k, vocab, device = draft_graph.rows, draft_graph.width, draft_graph.k, target.vocab_size, target.device
        self.rows, self.width, self.k = rows, width, k
        self.verify = PersistentInputs("spec_step_graph_verify", rows, k + 1, width, k + 1, target.block_size, device)
        # The step's random numbers (SpecStepRandoms' layout). Greedy graphs keep neutral values, their
        # rejection noise two blocks of their own (contiguous: the rejection kernel copies slices of a
        # block in rows > 1, inside the replay).
        self.greedy = draft_graph.st.all_greedy
        self.uniforms = torch.zeros(rows, k, device=device)                 # [rows, k] U[0, 1)
        # Filled inside the replay from the requests' keys (a step graph runs on a GPU, where draws are
        # batched: randoms.batched_draws). Keyed: the draft samples and the
        # verify's rejection sampler draw the noise from the keys themselves (the sample-first draft
        # sampler and the fused rejection kernel can), so only the uniforms are filled and no
        # [rows, 2k + 1, V] block is filled or read.
        keys_apply = fused_sampling and draft_graph.branch is not None and draws_from_keys(draft_graph.st, acceptance)
        self.keyed = keys_apply and not self.greedy
        self.from_logits = keys_apply and rows >= LOGITS_MIN_ROWS
        self.noise = torch.ones(rows, 2 * k + 1, vocab, device=device) \
            if not self.greedy and not self.keyed else None  # [rows, 2k + 1, V]
        self._no_noise = torch.empty(rows, 0, vocab, device=device)  # [rows, 0, V]: a uniforms-only fill's
        self.greedy_noise = (torch.ones(rows, k, vocab, device=device), torch.ones(rows, vocab, device=device)) \
            if self.greedy else None                                        # [rows, k, V], [rows, V] Exp(1) stand-ins
        self.keys = torch.zeros(rows, 2, dtype=torch.int64, device=device)  # [rows, 2] each key's halves
        self._side: torch.cuda.Stream | None = None  # the side branch's stream
        self.graph: torch.cuda.CUDAGraph | None = None
        # (target probs [rows, k+1, V], or from_logits its logits; RejectionOutput; commit row) of the replays
        self.outputs: tuple | None = None

    def randoms(self, st: SamplingTensors, kept: list | None) -> SpecStepRandoms:
        """The step's random numbers (kept: as SpecStepRandoms.draw's): where the replay fills them,
        the keys only (the numbers as views of the graph's buffers, valid until the next replay; a
        discarded step keeps the keys)."""
        batch = len(st.generators)
        if self.greedy:  # no draw, nothing kept
            return SpecStepRandoms(self.uniforms[:batch], *(n[:batch] for n in self.greedy_noise), noise_block=None)
        return SpecStepRandoms.keyed(st, self.k, self.uniforms[:batch], None if self.keyed else self.noise[:batch], kept)

    def _fill(self) -> None:
        """The step's numbers from the keys, inside the replay."""
        if self.greedy:
            return
        if self.keyed:  # the numbers after the 2k + 1 noise rows
            counter_randoms.fill_kernel(self.keys, self._no_noise, self.uniforms,
                                        first=(2 * self.k + 1) * self._no_noise.shape[2])
        else:
            counter_randoms.fill_kernel(self.keys, self.noise, self.uniforms)
        if self.forced_acceptance is not None:
            force_acceptance(self.uniforms, self.forced_acceptance)

    def _side_branch(self) -> torch.cuda.Event:
        """The fill and the verify's inputs but the draft tokens on a stream of their own,
        forked from the replay's start (eagerly: after the keys' copy); the event the first draft
        sample waits for."""
        if self._side is None:
            self._side = torch.cuda.Stream(self.target.device)
        self._side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self._side):
            self._fill()
            build_verify_inputs(self.draft.first, self.draft.draft_ids, self.verify, self.rows, self.width,
                                self.error_row)
            done = torch.cuda.Event()
            done.record()
        return done

    def _record(self) -> tuple[torch.Tensor, RejectionOutput, torch.Tensor]:
        d, rows, k = self.draft, self.rows, self.k
        tokens = self.verify.input_ids[: rows * (k + 1)].view(rows, k + 1)  # [rows, k + 1] the verify's
        d.steps(noise_block=self.noise, noise_ready=self._side_branch(), tokens_to=tokens, join=False,
                noise_keys=self.keys if self.keyed else None, statistics=self.from_logits)
        v = self.verify.view(rows, self.width)
        logits = self.target.model(v.input_ids, v.positions, self.target.kv_caches, v.meta)  # [rows * (k+1), V]
        if self.greedy:
            randoms = SpecStepRandoms(self.uniforms, *self.greedy_noise, noise_block=None)
        elif self.keyed:
            randoms = SpecStepRandoms(self.uniforms, None, None, noise_block=None)
        else:
            randoms = SpecStepRandoms(self.uniforms, self.noise[:, k : 2 * k], self.noise[:, 2 * k], noise_block=self.noise)
        dependent = self.target.launches_dependents
        if self.from_logits:  # each row's statistics; the rejection kernel forms p and q from the logits
            probs = logits.view(rows, k + 1, -1)  # [rows, k + 1, V] the logits
            target_rows = launch_stats(logits, d.st, k + 1, "", dependent, finish=True)
        else:
            probs = target_probs(logits, d.st, k + 1, self.fused, dependent).view(rows, k + 1, -1)  # [rows, k+1, V]
        if d.branch is not None:  # the draft's probabilities or statistics (probs_branch.py) are read from here on
            d.branch.join()
        kernel = {"noise_keys": self.keys} if self.keyed else {}  # (the fused rejection kernel's arguments)
        if self.from_logits:
            kernel["from_logits"] = (d.st, d.branch.rows, target_rows)
        result = self.acceptance(d.draft_ids, d.draft_probs, probs, randoms, error_flag=self.error_row, **kernel)
        return probs, result, commit_row(result, None, self.error_row)

    def probabilities(self, logits: torch.Tensor, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Where the step wrote none (from_logits), the (draft [batch, k, V], target [batch, k + 1, V])
        probabilities of the last run, made on request as the probabilities kernel writes them, from the
        draft's logits in its buffer and the verify's (logits: run's first output, [rows, k + 1, V])."""
        d, k, vocab = self.draft, self.k, self.target.vocab_size
        draft = d.draft_probs[:batch].reshape(batch * k, vocab)
        target = logits[:batch].reshape(batch * (k + 1), vocab)
        return (target_probs(draft, d.st, k, self.fused).view(batch, k, vocab),
                target_probs(target, d.st, k + 1, self.fused).view(batch, k + 1, vocab))

    def run(self, st, randoms: SpecStepRandoms, batch: int) -> tuple[torch.Tensor, RejectionOutput, torch.Tensor]:
        """The step for the first `batch` rows (randoms: from self.randoms): (target probs, or from_logits
        the verify's logits; rejection output; commit row), each of the padded batch; rows past `batch`
        are padding."""
        if not self.greedy:  # one small copy; the replay fills the numbers from the keys
            keys = torch.tensor([split_key(key) for key in randoms.keys], dtype=torch.int64)  # [batch, 2]
            self.keys[:batch].copy_(keys.pin_memory(), non_blocking=True)
        self.draft.load(st, None, batch)  # the settings: the noise is this graph's
        if self.graph is not None:
            self.graph.replay()
            return self.outputs
        # First use: the step's real work eagerly (it also makes the rejection kernel's cached
        # buffers outside the capture), then the capture for every later launched step.
        eager = self._record()
        graph = torch.cuda.CUDAGraph()
        with sync_allowed(), torch.cuda.graph(graph):
            outputs = self._record()
        self.graph, self.outputs = graph, outputs  # only once captured: a failed capture leaves none
        return eager

"""Target-only decoding on the spec path's footing: STEPS_PER_REPLAY decode steps per CUDA graph replay,
stop rules checked on the device, and the next replay queued before the host reads the last one.

One decode step is a forward over one token a row, a sample, and decode_advance (kernels/), which
records the token and turns the step's inputs into the next step's on the device. Captured STEPS
times in one graph, a replay makes up to STEPS tokens a request with one launch and one host read.
A row stops where the host would stop it (max_tokens, its EOS unless ignore_eos): its later steps
write no K/V and record placeholders, and the host discards nothing it would have kept.

Steady state, per engine step: extend the block tables two replays ahead, replay (the device
continues from where the last replay left its inputs), queue the tokens' copy, then read and commit
the previous replay's tokens while this one runs. A replay queued after one that finished a request
holds that request's row frozen; the next change of the batch uploads the running requests' state
from the host again (and an upload of a new batch waits for nothing).

Random numbers: each request draws one 64-bit key from its generator when it first decodes here; the
Exp(1) noise for its token at position p is counter_randoms' hash of (that key, p), drawn inside the
replay (by the Gumbel-max sampler itself, or filled before the forward for the sampler with
probabilities). A seeded request's tokens therefore depend on its seed and positions only, never on how its
steps are grouped into replays or on the batch it runs in.

Where CUDA graphs are off (the CPU simulator, in tests) the same steps run eagerly, one replay's worth
per engine step, through the same code.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from protospec.device_wait import copy_to_host, wait_for
from protospec.requests.block_manager import BlockManager
from protospec.requests.sequence import Sequence
from protospec.errors import AdvanceStepError
from protospec.kernels.randoms import counter_randoms
from protospec.kernels.randoms.counter_randoms import split_key
from protospec.kernels.sampling.gumbel_sample import gumbel_sample_into
from protospec.kernels.sampling.softmax_sample import fused_applies
from protospec.kernels.inputs.decode_advance import decode_advance, position_keys
from protospec.layout import NULL_BLOCK, PAD_SLOT_ID, PLACEHOLDER_TOKEN_ID
from protospec.model.graphs import bucket, sync_allowed
from protospec.model.inputs import host_to_device
from protospec.model.persistent_inputs import PersistentInputs
from protospec.model.runner import ModelRunner
from protospec.speculation.draft_sampling import sample_draft_step
from protospec.speculation.randoms import step_key
from protospec.speculation.sampler import SamplingTensors

# Tokens a request per replay: enough that the host's work per replay (launch, copy, commit) hides
# behind the device's, few enough that a request stopping early wastes little (its frozen steps).
STEPS_PER_REPLAY = 8
NO_STOP = -1  # a stop id no token has (ignore_eos, or a model without EOS)


class DecodeRows:
    """The device state of up to `rows` decoding requests: the forward's inputs (advanced in place),
    the stop rules, the random keys, the sampling settings and the replay's tokens."""

    def __init__(self, rows: int, max_blocks: int, block_size: int, vocab: int, steps: int, device: torch.device):
        self.rows, self.steps, self.block_size, self.vocab = rows, steps, block_size, vocab
        self.inputs = PersistentInputs("decode_graph", rows, 1, max_blocks, 1, block_size, device)
        i64 = dict(dtype=torch.int64, device=device)
        self.sampled = torch.zeros(rows, **i64)                        # [rows] the step's tokens
        self.stop_ids = torch.full((rows,), NO_STOP, **i64)            # [rows]
        self.remaining = torch.zeros(rows, **i64)                      # [rows] tokens each row may still make
        self.base_keys = torch.zeros(rows, 2, **i64)                   # [rows, 2] each request's key halves
        self.step_keys = torch.zeros(rows, 2, **i64)                   # [rows, 2] the next token's key
        # What the host reads after a replay: [0] the error flag, then [rows, steps] tokens (a row's
        # first batch rows are a prefix, so one copy reads them).
        self.readback = torch.full((1 + rows * steps,), PLACEHOLDER_TOKEN_ID, **i64)
        self.out_tokens = self.readback[1:].view(rows, steps)          # [rows, steps]
        self.error_row = torch.zeros(1, dtype=torch.int32, device=device)
        # [rows, 1, V] Exp(1) noise and the sampler's probabilities: only the sampler with probabilities
        # (top-k / top-p rows) reads them, so they are made when a layout first records it.
        self.noise: torch.Tensor | None = None
        self.probs: torch.Tensor | None = None
        self.no_uniforms = torch.zeros(rows, 0, device=device)         # the fill's uniforms: none needed
        self.ids = torch.zeros(rows, 1, **i64)                         # [rows, 1] the sampler's ids
        # Padding rows sample with harmless settings (temperature 1, no filter); they make no tokens.
        self.temperature = torch.ones(rows, device=device)
        self.is_greedy = torch.zeros(rows, dtype=torch.bool, device=device)
        self.top_k = torch.full((rows,), vocab, **i64)
        self.top_p = torch.ones(rows, device=device)

    def settings(self, st: SamplingTensors) -> SamplingTensors:
        """The rows' sampling settings as SamplingTensors (the batch's host-side flags)."""
        return SamplingTensors(self.temperature, self.is_greedy, self.top_k, self.top_p, generators=[],
                               all_greedy=st.all_greedy, any_greedy=st.any_greedy, needs_filter=st.needs_filter)

    def upload(self, seqs: list[Sequence], st: SamplingTensors, keys: list[int], stop_ids: list[int]) -> None:
        """The batch's state from the host: each request's last token at its position (the target
        has K/V for every earlier one), its budget, stop id and key; padding rows make nothing."""
        rows, batch, bs = self.rows, len(seqs), self.block_size
        state = torch.zeros(rows, 5, dtype=torch.int64)  # [rows, 5] token, position, slot, remaining, stop id
        state[:, 2] = PAD_SLOT_ID
        state[:, 4] = NO_STOP
        for i, seq in enumerate(seqs):
            pos = seq.num_tokens - 1
            state[i] = torch.tensor([seq.last_token_id, pos, seq.block_table[pos // bs] * bs + pos % bs,
                                     seq.num_remaining, stop_ids[i]])
        base = torch.zeros(rows, 2, dtype=torch.int64)                 # [rows, 2] key halves
        base[:batch] = torch.tensor([split_key(k) for k in keys], dtype=torch.int64).view(batch, 2)
        first_keys = position_keys(base, state[:, 1] + 1)              # [rows, 2] the key of each row's next token
        packed = host_to_device(torch.cat([state, base, first_keys], 1).numpy(), torch.int64, self.sampled.device)
        inp = self.inputs
        inp.input_ids.copy_(packed[:, 0])
        inp.positions.copy_(packed[:, 1])
        inp.slot_mapping.copy_(packed[:, 2])
        inp.seq_lens.copy_(packed[:, 1] + 1)
        self.remaining.copy_(packed[:, 3])
        self.stop_ids.copy_(packed[:, 4])
        self.base_keys.copy_(packed[:, 5:7])
        self.step_keys.copy_(packed[:, 7:9])
        self.load_tables(seqs)
        for mine, theirs, pad in ((self.temperature, st.temperature, 1.0), (self.is_greedy, st.is_greedy, False),
                                  (self.top_k, st.top_k, self.top_k.new_tensor(self.vocab)),
                                  (self.top_p, st.top_p, 1.0)):
            mine[:batch].copy_(theirs)
            mine[batch:].fill_(pad)
        inp.num_seqs = batch

    def load_tables(self, seqs: list[Sequence]) -> None:
        """The requests' block tables into their rows (NULL_BLOCK past each row's blocks)."""
        tables = torch.full((len(seqs), self.inputs.max_blocks), NULL_BLOCK, dtype=torch.int32)
        for i, seq in enumerate(seqs):
            tables[i, : len(seq.block_table)] = torch.tensor(seq.block_table, dtype=torch.int32)
        self.inputs.block_tables[: len(seqs)].copy_(host_to_device(tables.numpy(), torch.int32, self.sampled.device))

    def record(self, target: ModelRunner, st: SamplingTensors, width: int, fused: bool) -> None:
        """The replay's work, issued once: STEPS x (forward, sample, decode_advance); the noise filled
        before the forward only where the sampler is not the Gumbel-max kernel, which draws its own
        from the rows' keys."""
        view = self.inputs.view(self.rows, width)
        one_launch = fused and fused_applies(st)  # the token alone (one Gumbel-max launch): no probabilities
        if not one_launch and self.probs is None:
            self.noise = torch.ones(self.rows, 1, self.vocab, device=self.sampled.device)
            self.probs = torch.zeros(self.rows, 1, self.vocab, device=self.sampled.device)
        for step in range(self.steps):
            noise = None
            if not st.all_greedy and not one_launch:  # (the Gumbel-max kernel draws its own numbers)
                counter_randoms.fill_kernel(self.step_keys, self.noise, self.no_uniforms)
                noise = self.noise
            logits = target.model(view.input_ids, view.positions, target.kv_caches, view.meta)  # [rows, V] f32
            if one_launch:
                gumbel_sample_into(logits, st, 0, self.ids, None, self.sampled, dependent=target.launches_dependents,
                                   noise_keys=None if st.all_greedy else self.step_keys)
            else:
                sample_draft_step(logits, st, 0, self.ids, self.probs, noise, self.sampled, fused,
                                  dependent=target.launches_dependents)
            inp = self.inputs
            decode_advance(step, self.block_size, self.sampled, self.stop_ids, self.remaining, self.base_keys,
                           self.step_keys, self.out_tokens, inp.input_ids, inp.positions, inp.seq_lens,
                           inp.slot_mapping, inp.block_tables, self.error_row)
        self.readback[:1].copy_(self.error_row)


class ReplayGraph:
    """DecodeRows.record captured once for a (rows, width, sampling flags) layout, replayed after."""

    def __init__(self, state: DecodeRows, target: ModelRunner, st: SamplingTensors, width: int, fused: bool):
        self.state, self.target, self.st, self.width, self.fused = state, target, state.settings(st), width, fused
        self.graph: torch.cuda.CUDAGraph | None = None

    def run(self, capture: bool) -> None:
        if self.graph is not None:
            self.graph.replay()
            return
        self.state.record(self.target, self.st, self.width, self.fused)  # real work (and lazy inits) first
        if capture:
            graph = torch.cuda.CUDAGraph()
            with sync_allowed(), torch.cuda.graph(graph):
                self.state.record(self.target, self.st, self.width, self.fused)
            self.graph = graph


@dataclass
class Launched:
    """A queued replay: the requests of its rows, and the copy of its tokens on the way to the host."""

    seqs: list[Sequence]
    host: torch.Tensor                  # [1 + batch * steps] int64: the error flag, then the tokens
    done: torch.cuda.Event | None       # ends the copy (None off a GPU)


class MultiStepDecode:
    """Target-only decode steps for the engine's running batch (module docstring)."""

    def __init__(self, target: ModelRunner, block_manager: BlockManager, max_rows: int, max_blocks: int,
                 fused_sampling: bool, eos_token_id: int | None, graphs: bool, wait_s: float):
        self.target, self.block_manager = target, block_manager
        self.max_rows, self.max_blocks, self.steps = max_rows, max_blocks, STEPS_PER_REPLAY
        self.fused, self.eos_token_id, self.graphs, self.wait_s = fused_sampling, eos_token_id, graphs, wait_s
        self._rows: dict[int, DecodeRows] = {}          # rows bucket -> its state
        self._graphs: dict[tuple, ReplayGraph] = {}     # (rows, width, flags) -> its replay
        self._keys: dict[int, int] = {}                 # seq_id -> its key (drawn once)
        self._pending: Launched | None = None
        self._current: tuple[DecodeRows, SamplingTensors] | None = None  # the uploaded batch's state
        self.counters = target.counters  # decode_replays, decode_uploads, decode_graphs beside the target's forwards

    # ---- per engine step ----------------------------------------------------------------------
    def step(self, seqs: list[Sequence], st: SamplingTensors) -> None:
        """Make up to `steps` tokens for each of the running requests `seqs` (the engine's list)."""
        pending = self._pending
        if pending is not None and len(pending.seqs) == len(seqs) and all(a is b for a, b in zip(pending.seqs, seqs)):
            # The same batch: queue the next replay from the device's state, then commit the last one.
            following = self._launch(seqs, st, upload=False) if self._may_continue(seqs) else None
            self._pending = None
            self._commit(pending)
            self._pending = following
            return
        if pending is not None:  # the batch changed: commit what the last replay made for those still here
            self._pending = None
            self._commit(pending)
            if any(s.finished for s in seqs):
                return  # the engine retires them; the next step uploads the batch that is left
        self._pending = self._launch(seqs, st, upload=True)

    def discard(self) -> None:
        """Forget a queued replay (speculation takes over, or the engine aborts): its tokens are never
        committed; K/V it writes past a request's committed tokens is overwritten before it is read."""
        self._pending = None
        self._current = None

    def forget(self, seqs: list[Sequence]) -> None:
        """Drop the keys of requests that left the engine."""
        for seq in seqs:
            self._keys.pop(seq.seq_id, None)

    # ---- internals ----------------------------------------------------------------------------
    def _may_continue(self, seqs: list[Sequence]) -> bool:
        """Whether any request may still need tokens after the queued replay (by budget: a replay
        queued for requests whose budgets it exhausts would only run frozen rows)."""
        return any(s.num_remaining > self.steps for s in seqs)

    def _limit(self, seq: Sequence) -> int:
        return len(seq.prompt_token_ids) + seq.params.max_tokens  # positions a request ever writes: below it

    def _extend_tables(self, seqs: list[Sequence], replays_ahead: int) -> bool:
        """Blocks for the next replays' K/V writes (within each request's reservation); whether any
        table grew."""
        grew = False
        for seq in seqs:
            before = len(seq.block_table)
            self.block_manager.ensure_capacity(seq.block_table, min(seq.num_tokens + replays_ahead * self.steps,
                                                                    self._limit(seq)))
            grew |= len(seq.block_table) != before
        return grew

    def _launch(self, seqs: list[Sequence], st: SamplingTensors, upload: bool) -> Launched:
        batch = len(seqs)
        if upload:
            for seq in seqs:
                if seq.num_cached_target != seq.num_tokens - 1:
                    raise RuntimeError(f"request {seq.seq_id}: the target must lag its tokens by exactly one "
                                       f"({seq.num_cached_target} cached of {seq.num_tokens})")
            self._extend_tables(seqs, 1)
            state = self._state(bucket(batch, self.max_rows))
            keys = [self._key(seq) for seq in seqs]
            stops = [self.eos_token_id if self.eos_token_id is not None and not s.params.ignore_eos else NO_STOP
                     for s in seqs]
            state.upload(seqs, st, keys, stops)
            self._current = (state, st)
            self.counters["decode_uploads"] += 1
        else:
            state, _ = self._current
            # The queued replay may use its whole budget of steps; this one follows it.
            if self._extend_tables(seqs, 2):
                state.load_tables(seqs)
        width = bucket(max(len(s.block_table) for s in seqs), self.max_blocks, smallest=8)
        key = (state.rows, width, st.all_greedy, st.any_greedy, st.needs_filter)
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._graphs[key] = ReplayGraph(state, self.target, st, width, self.fused)
            self.counters["decode_graphs"] += 1
        graph.run(capture=self.graphs)
        self.counters["decode_replays"] += 1
        host, done = copy_to_host(state.readback[: 1 + batch * self.steps])
        if done is None:  # off a GPU the "copy" is the buffer itself, which the next replay overwrites
            host = host.clone()
        return Launched(list(seqs), host, done)

    def _state(self, rows: int) -> DecodeRows:
        if rows not in self._rows:
            self._rows[rows] = DecodeRows(rows, self.max_blocks, self.target.block_size, self.target.vocab_size,
                                          self.steps, self.target.device)
        return self._rows[rows]

    def _key(self, seq: Sequence) -> int:
        if seq.seq_id not in self._keys:
            self._keys[seq.seq_id] = step_key(seq.generator)
        return self._keys[seq.seq_id]

    def _commit(self, launched: Launched) -> None:
        if launched.done is not None:
            wait_for(launched.done, "a decode replay's tokens", self.wait_s)
        flat = launched.host.tolist()
        if flat[0]:
            self._current[0].error_row.zero_()
            self.discard()
            raise AdvanceStepError(f"decode_advance: row {flat[0] - 1} reached a position its block table does not "
                                   "cover; its K/V write was skipped")
        n = self.steps
        for i, seq in enumerate(launched.seqs):
            if seq.finished:  # a replay queued before the host saw it finish: its row made nothing
                continue
            emitted = [t for t in flat[1 + i * n : 1 + (i + 1) * n] if t != PLACEHOLDER_TOKEN_ID]
            seq.append_tokens(emitted)
            seq.num_cached_target = seq.num_tokens - 1
            if len(emitted) < n and not seq.finished:
                self.discard()
                raise RuntimeError(f"request {seq.seq_id}: the device stopped it after {len(emitted)} tokens, the "
                                   "host's stop rules did not (their copies disagree)")

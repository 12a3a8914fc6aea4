"""The engine: loads target (and draft), sizes the KV pool, admits requests, runs steps.

Scheduling is deliberately simple: a waiting queue, and a request is admitted only when the
pool can hold its whole life (prompt + max_tokens + k lookahead slots) on top of what running
requests may still grow into. So a running request never runs out of blocks mid-flight, and a
request that can never fit is refused up front with OutOfKVBlocksError.
"""
from __future__ import annotations

from collections import deque

import torch

from protospec.requests.block_manager import BlockManager, blocks_for
from protospec.engine.decode_graph import MultiStepDecode
from protospec.engine.kv_pool import size_kv_pool
from protospec.engine.prefill import Prefill
from protospec.config import EngineConfig, resolve_device, resolve_dtype
from protospec.kernel_plan import KernelPlan
from protospec.device_wait import read_back
from protospec import registry
from protospec.speculation.acceptance import make_acceptance
from protospec.speculation.commit import make_commit_policy
from protospec.speculation.draft_loop import DraftLoop
from protospec.speculation.draft_loops import make_draft_loop
from protospec.speculation.draft_sampling import sample_tokens
from protospec.speculation.lookahead import Lookahead
from protospec.speculation.ngram_loop import NgramLoop
from protospec.errors import ConfigError, ModelOutputError, OutOfKVBlocksError, VocabMismatchError
from protospec.kernels.launch.interop import KERNEL_DEVICE_TYPE
from protospec.kernels.linear.layer_ops import ACTIVATION_DTYPES
from protospec.model.layer_kernels import (check_linear_kernel, enable_layer_kernels,
                                          resolve_dependent_launch)
from protospec.model.loader import load_model
from protospec.model.runner import ModelRunner
from protospec.speculation.sampler import SamplingTensors
from protospec.requests.sequence import Sequence
from protospec.speculation.step import SpeculativeStep
from protospec.speculation.step_graph import step_graph_applies
from protospec.speculation.sync_guard import forbid_host_sync


class Engine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.k = config.k
        self.look = Lookahead(self.k)
        # Lookahead slots may run past the last kept token: RoPE needs room for them.
        load = dict(load_format=config.load_format, dtype=self.dtype, device=self.device,
                    extra_positions=self.look.extra_positions)
        target = load_model(config.model, seed=config.seed, **load)
        draft = None
        if config.proposer == registry.DRAFT:
            # Same seed: with dummy weights, a draft named like its target IS the target (a test fixture).
            draft = load_model(config.speculative_model, seed=config.seed, **load)
            if draft.config.vocab_size != target.config.vocab_size:
                raise VocabMismatchError(f"draft vocab_size={draft.config.vocab_size} != target vocab_size="
                                         f"{target.config.vocab_size}: draft token ids would mean different tokens to the target")
        model_limits = [m.config.max_position_embeddings for m in (target, draft) if m is not None]
        if config.max_model_len is not None and config.max_model_len > min(model_limits):
            raise ConfigError(f"max_model_len={config.max_model_len} is longer than the model's "
                              f"max_position_embeddings ({min(model_limits)}{', the smaller of the two models' if draft else ''}): "
                              "positions past it have no trained RoPE meaning; leave max_model_len unset or lower it")
        self.max_model_len = config.max_model_len or min(model_limits)
        self.plan = self._resolve_kernel_plan()
        if self.plan.layer_kernels:
            for m in (target, draft):
                if m is not None:
                    enable_layer_kernels(m, self.plan.linear_kernel, self.plan.dependent_launch,
                                         self.plan.prefill_kernels)
        self.num_blocks = size_kv_pool(config, self.device, self.dtype, self.max_model_len + self.look.extra_positions,
                                       [m for m in (target, draft) if m is not None])
        self._sampling_cache: tuple[list[Sequence], SamplingTensors] | None = None
        self.block_manager = BlockManager(self.num_blocks, config.block_size)
        try:  # the KV caches: within the device's memory (size_kv_pool), maybe not within what is free
            self.target = ModelRunner(target, self.num_blocks, config.block_size)
            self.draft = ModelRunner(draft, self.num_blocks, config.block_size) if draft is not None else None
        except torch.OutOfMemoryError as e:
            raise ConfigError(f"the KV pool of {self.num_blocks} blocks does not fit the device's free memory "
                              "(torch.OutOfMemoryError); lower kv_cache_gib or num_kv_blocks") from e
        self.max_blocks_per_seq = blocks_for(self.max_model_len + self.look.extra_positions, config.block_size)
        if self.use_cuda_graphs:
            for runner in (self.target, self.draft):
                if runner is not None:
                    # The widest repeated forward: the verify, or the draft's two-token first step.
                    runner.enable_cuda_graphs(config.max_num_seqs, self.max_blocks_per_seq, max(2, self.look.verify_len))
        self.prefill = Prefill(self.target, self.draft)
        self.vocab_size = target.config.vocab_size
        self._draft_loops: dict[tuple, DraftLoop] = {}  # built once: switching keeps their buffers and graphs
        self.forced_acceptance: float | None = None  # for timing only: lab/forced_acceptance.py
        self.spec_step = self._build_spec_step() if config.proposer is not None else None
        self.eos_token_id = target.config.eos_token_id
        # Target-only steps (no proposer, or speculation off at this batch size): several tokens per
        # CUDA graph replay where graphs run (decode_graph.py); one forward and host read per token else.
        self.decoder = self.multi_step_decode(graphs=True) if self.use_cuda_graphs else None
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.reserved_blocks = 0  # what the running requests' admissions reserved (_admit)

    def multi_step_decode(self, graphs: bool) -> MultiStepDecode:
        """The multi-step decoder over this engine's target and pool (graphs=False: its steps eagerly,
        as the CPU simulator runs them)."""
        return MultiStepDecode(self.target, self.block_manager, self.config.max_num_seqs, self.max_blocks_per_seq,
                               self.fused_sampling, self.eos_token_id, graphs, self.config.device_wait_timeout_s)

    def _resolve_kernel_plan(self) -> KernelPlan:
        """The kernels this engine runs, from its config (None: the measured-fastest choice where it
        applies) and its device; an explicit choice that cannot hold here is an error naming why."""
        cfg = self.config
        layer_kernels = self._resolve_layer_kernels()
        fused_sampling = cfg.fused_sampling
        if fused_sampling is None:  # the sampling kernels by default only where they were measured faster
            fused_sampling = layer_kernels and self.device.type == "cuda"
        check_linear_kernel(cfg.linear_kernel, layer_kernels)
        linear_kernel = cfg.linear_kernel or ("mma_fused" if layer_kernels else "cublas")
        prefill_kernels = cfg.prefill_kernels if cfg.prefill_kernels is not None else self.device.type == "cuda"
        if prefill_kernels and not layer_kernels:
            if cfg.prefill_kernels:
                raise ConfigError("prefill_kernels=True needs the layer kernels (layer_kernels is off here)")
            prefill_kernels = False
        cuda_graphs = cfg.cuda_graphs if cfg.cuda_graphs is not None else self.device.type == "cuda"
        if cuda_graphs and self.device.type != "cuda":
            raise ConfigError("cuda_graphs=True needs a CUDA device")
        return KernelPlan(
            layer_kernels=layer_kernels, linear_kernel=linear_kernel,
            dependent_launch=resolve_dependent_launch(cfg.dependent_launch, linear_kernel, layer_kernels, self.device),
            prefill_kernels=prefill_kernels, fused_sampling=self._resolve_kernel_flag("fused_sampling", fused_sampling),
            fused_rejection=cfg.fused_rejection if cfg.fused_rejection is not None else self.device.type == "cuda",
            cuda_graphs=cuda_graphs)

    # The plan's choices under the names the engine's users read.
    use_layer_kernels = property(lambda self: self.plan.layer_kernels)
    fused_sampling = property(lambda self: self.plan.fused_sampling)
    linear_kernel = property(lambda self: self.plan.linear_kernel)
    dependent_launch = property(lambda self: self.plan.dependent_launch)
    use_cuda_graphs = property(lambda self: self.plan.cuda_graphs)

    def _resolve_kernel_flag(self, name: str, value: bool) -> bool:
        """True only where Numba's kernels run (CUDA, or the simulator on a CPU)."""
        if value and self.device.type != KERNEL_DEVICE_TYPE:
            raise ConfigError(f"{name}=True on device {self.device}: the Numba kernels run on {KERNEL_DEVICE_TYPE} "
                              "tensors here (on a CPU, set NUMBA_ENABLE_CUDASIM=1 before numba is imported)")
        return value

    def _resolve_layer_kernels(self) -> bool:
        cfg = self.config
        supported = self.dtype in ACTIVATION_DTYPES
        if cfg.layer_kernels is None:
            return self.device.type == "cuda" and supported
        if cfg.layer_kernels and not supported:
            raise ConfigError(f"layer_kernels=True with dtype {self.dtype}: the kernels take {ACTIVATION_DTYPES}")
        return self._resolve_kernel_flag("layer_kernels", cfg.layer_kernels)

    def set_draft_loop(self, name: str, overlap_commit: bool | None = None) -> None:
        """Switch the draft loop's way (a name of registry.DRAFT_LOOP_NAMES; overlap_commit None =
        unchanged) between generate() calls, keeping weights, KV pool and captured graphs: the
        ablation compares like with like."""
        if self.spec_step is None:
            raise ConfigError("set_draft_loop needs a speculative model")
        if self.running or self.waiting:
            raise ConfigError("set_draft_loop between generate() calls only")
        previous = (self.config.draft_loop, self.config.overlap_commit)
        self.config.draft_loop = name
        if overlap_commit is not None:
            self.config.overlap_commit = overlap_commit
        try:
            self.config.__post_init__()
            self.spec_step = self._build_spec_step()
        except Exception:  # a refused way leaves the engine as it was
            self.config.draft_loop, self.config.overlap_commit = previous
            raise

    def _build_spec_step(self) -> SpeculativeStep:
        cfg = self.config
        name, reason = registry.resolve(cfg.draft_loop, self.device.type, self.use_cuda_graphs)
        kind = registry.DRAFT_LOOPS[name]
        if kind.needs_cuda_graphs and not self.use_cuda_graphs:
            raise ConfigError(f"draft_loop={name!r} replays the draft loop as a CUDA graph: it needs a CUDA device "
                              "with cuda_graphs on")
        if kind.on_device and self.device.type != KERNEL_DEVICE_TYPE:
            raise ConfigError(f"draft_loop={name!r} on device {self.device}: the advance_step kernel runs on "
                              f"{KERNEL_DEVICE_TYPE} tensors here (on a CPU, set NUMBA_ENABLE_CUDASIM=1 before numba is imported)")
        loop = self._draft_loop(name, reason, kind)
        commit = make_commit_policy(registry.commit_policy_for(loop.kind, cfg.overlap_commit), loop.counters,
                                    self.look, cfg.block_size)
        guard = forbid_host_sync if cfg.check_no_sync else None
        acceptance = make_acceptance(cfg.acceptance, self.plan.fused_rejection, cfg.posterior_threshold,
                                     cfg.posterior_alpha)
        return SpeculativeStep(self.target, loop, commit, self.block_manager, acceptance, guard,
                               fused_sampling=self.fused_sampling, wait_s=cfg.device_wait_timeout_s,
                               forced_acceptance=self.forced_acceptance,
                               step_graph=step_graph_applies(cfg.spec_step_graph, loop.kind.name, cfg.proposer,
                                                             commit.name))

    def _draft_loop(self, name: str, reason: str, kind: registry.DraftLoopKind) -> DraftLoop:
        """The proposer's loop for a draft-loop way, built once (its buffers and graphs are kept)."""
        cfg = self.config
        key = (cfg.proposer, name, reason)
        if key not in self._draft_loops:
            if cfg.proposer == registry.NGRAM:  # a device way matches on the device, a CPU way on the host
                self._draft_loops[key] = NgramLoop(self.device, self.vocab_size, self.look, cfg.prompt_lookup_min,
                                                   cfg.prompt_lookup_max, cfg.max_num_seqs,
                                                   self.max_model_len + self.look.extra_positions, kind.on_device)
            else:
                self._draft_loops[key] = make_draft_loop(name, self.draft, self.look, cfg.max_num_seqs,
                                                         self.max_blocks_per_seq, self.fused_sampling, reason,
                                                         cfg.device_wait_timeout_s)
        return self._draft_loops[key]

    @property
    def draft_loop(self) -> str | None:
        return self.spec_step.draft_loop.name if self.spec_step is not None else None

    # ---- admission -------------------------------------------------------------------------
    def blocks_for_request(self, num_prompt_tokens: int, max_tokens: int) -> int:
        return blocks_for(num_prompt_tokens + max_tokens + self.look.reserved_slots, self.config.block_size)

    def check_fits_pool(self, num_prompt_tokens: int, max_tokens: int) -> None:
        need = self.blocks_for_request(num_prompt_tokens, max_tokens)
        if need > self.block_manager.num_usable_blocks:
            raise OutOfKVBlocksError(
                f"out of KV blocks: a request of {num_prompt_tokens} prompt + {max_tokens} new tokens "
                f"(+ {self.look.reserved_slots} lookahead) needs {need} blocks of {self.config.block_size}, the pool has "
                f"{self.block_manager.num_usable_blocks}; raise num_kv_blocks / kv_cache_gib or shorten the request"
            )

    def _admit(self) -> list[Sequence]:
        """Admit waiting requests in order while the pool can hold every running request's whole life:
        the blocks reserved by admissions (a running total, so admitting costs the same however many
        requests run or wait) stay within the pool. A running request's table never outgrows its
        reservation, so what the reservations promise is always free or already held."""
        admitted = []
        usable = self.block_manager.num_usable_blocks
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            need = self.blocks_for_request(len(seq.prompt_token_ids), seq.params.max_tokens)
            if self.reserved_blocks + need > usable:
                break
            self.waiting.popleft()
            self.block_manager.ensure_capacity(seq.block_table, len(seq.prompt_token_ids))
            seq.reserved_blocks = need
            self.reserved_blocks += need
            self.running.append(seq)
            admitted.append(seq)
        return admitted

    # ---- steps -----------------------------------------------------------------------------
    def sampling_tensors(self, seqs: list[Sequence]) -> SamplingTensors:
        """Built once per batch composition: rebuilding them (four host-to-device copies) after every
        spec step's host sync would keep the GPU waiting for nothing."""
        cached = self._sampling_cache
        if cached is None or len(cached[0]) != len(seqs) or any(a is not b for a, b in zip(cached[0], seqs)):
            st = SamplingTensors.build([s.params for s in seqs], [s.generator for s in seqs], self.vocab_size, self.device)
            self._sampling_cache = cached = (list(seqs), st)  # the very Sequence objects, in order
        return cached[1]

    def _prefill(self, seqs: list[Sequence], launch_first_step: bool) -> None:
        logits = self.prefill([s.prompt_token_ids for s in seqs], [s.block_table for s in seqs])  # [B, V]
        st = self.sampling_tensors(seqs)
        ids = sample_tokens(logits, st, self.fused_sampling, self.target.launches_dependents)  # [B] int64
        # Read with the tokens (no sync of its own): whether each prompt's logits are finite. NaN logits
        # sample token 0 at every position; the prefill is where a model that makes them shows it.
        readback = torch.cat([ids, torch.isfinite(logits).all(-1).long()])  # [2B] int64
        if launch_first_step and len(seqs) == len(self.running) and self.speculating():  # the next batch is this one
            host = self.spec_step.launch_after_prefill(seqs, st, ids, readback)
        else:
            host = read_back(readback, "a prefill's tokens", self.config.device_wait_timeout_s)
        tokens, finite = host[: len(seqs)], host[len(seqs) :]
        if not all(finite):
            bad = [s.seq_id for s, ok in zip(seqs, finite) if not ok]
            raise ModelOutputError(f"the target's logits for the prompts of requests {bad[:5]} hold NaN or inf: the "
                                   "weights or the activations overflow (try float32, or check the checkpoint)")
        for seq, tok in zip(seqs, tokens):
            seq.num_cached_target = seq.num_cached_draft = len(seq.prompt_token_ids)
            seq.append_tokens([tok])

    def _decode(self, seqs: list[Sequence]) -> None:
        """Target-only decoding: one token per sequence per forward."""
        for seq in seqs:
            self.block_manager.ensure_capacity(seq.block_table, seq.num_tokens)
        chunks = [s.tokens(s.num_cached_target) for s in seqs]
        starts = [s.num_cached_target for s in seqs]
        logits = self.target.execute(self.target.prepare("decode", chunks, starts, [s.block_table for s in seqs], num_logits=1))
        ids = sample_tokens(logits, self.sampling_tensors(seqs), self.fused_sampling, self.target.launches_dependents)
        for seq, tok in zip(seqs, read_back(ids, "a decode step's tokens", self.config.device_wait_timeout_s)):
            seq.num_cached_target = seq.num_tokens
            seq.append_tokens([tok])

    def retire_finished(self) -> None:
        if not any(s.finished for s in self.running):
            return
        for seq in self.running:
            if seq.finished:
                self.block_manager.free(seq.block_table)
                self.reserved_blocks -= seq.reserved_blocks
        if self.decoder is not None:
            self.decoder.forget([s for s in self.running if s.finished])
        self.running = [s for s in self.running if not s.finished]

    def speculating(self) -> bool:
        """Whether the next step speculates: a proposer, and no more running requests than
        speculative_disable_by_batch_size."""
        cap = self.config.speculative_disable_by_batch_size
        return self.spec_step is not None and (cap is None or len(self.running) <= cap)

    def admit_and_prefill(self, launch_first_step: bool = True) -> list[Sequence]:
        """Admit the waiting requests that fit and prefill both models for them; returns them.
        launch_first_step: where the admitted requests are the whole batch and the commit is
        overlapped, queue their first spec step before reading the prefill's tokens."""
        admitted = self._admit()
        if admitted:
            self._prefill(admitted, launch_first_step)
        return admitted

    def step(self) -> None:
        """Admit what fits and prefill it; then one spec (or decode) step for the running batch."""
        if self.admit_and_prefill():
            self.retire_finished()
        if not self.running:
            if self.waiting:  # cannot happen after check_fits_pool; guard against a silent hang
                raise OutOfKVBlocksError("no running request and the next waiting one does not fit the pool")
            return
        if self.speculating():
            if self.decoder is not None:  # a queued decode replay is void
                self.decoder.discard()
            self.spec_step(self.running, self.sampling_tensors(self.running), requests_waiting=bool(self.waiting))
        else:
            if self.spec_step is not None:  # speculation off at this batch size: a launched step is void
                self.spec_step.commit_policy.discard()
            if self.decoder is not None:
                self.decoder.step(self.running, self.sampling_tensors(self.running))
            else:
                self._decode(self.running)
        self.retire_finished()

    def abort_all(self) -> None:
        """Drop every request and return its blocks (used when a generate() call fails midway)."""
        if self.spec_step is not None:
            self.spec_step.commit_policy.clear()
        if self.decoder is not None:
            self.decoder.discard()
            self.decoder.forget(self.running + list(self.waiting))
        for seq in self.running + list(self.waiting):
            self.block_manager.free(seq.block_table)
        self.running.clear()
        self.waiting.clear()
        self.reserved_blocks = 0

    def new_generator(self, seed: int | None, fallback: torch.Generator) -> torch.Generator:
        gen = torch.Generator(device=self.device)
        gen.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, (1,), generator=fallback)))
        return gen

"""The public API: LLM(model, speculative_model, num_speculative_tokens).generate(prompts, params).

Every prompt is checked before any engine state changes, so a bad request raises an error that
names the problem and the engine serves the next request as if nothing happened.
"""
from __future__ import annotations

import numbers
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

from protospec.config import EngineConfig, SamplingParams
from protospec.device_wait import synchronize
from protospec.engine.engine import Engine
from protospec.errors import ConcurrentUseError, PromptError, SamplingParamsError
from protospec.model.loader import load_tokenizer
from protospec.requests.metrics import RequestMetrics
from protospec.requests.sequence import FinishReason, Sequence

Prompt = str | list[int]


@dataclass
class RequestOutput:
    request_id: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str | None
    finish_reason: FinishReason
    metrics: RequestMetrics


class LLM:
    def __init__(self, model: str, speculative_model: str | None = None, num_speculative_tokens: int = 5, **engine_kwargs):
        self.config = EngineConfig(model=model, speculative_model=speculative_model,
                                   num_speculative_tokens=num_speculative_tokens, **engine_kwargs)
        self.engine = Engine(self.config)
        self.tokenizer = load_tokenizer(self.engine.target.model.checkpoint_dir)
        self._rng = torch.Generator().manual_seed(self.config.seed)
        self._next_id = 0
        self.metrics = RequestMetrics()  # totals of the last generate() call
        self._busy = threading.Lock()    # held by the generate() call in progress

    # ---- input checks ------------------------------------------------------------------------
    def _to_token_ids(self, prompt: Prompt) -> list[int]:
        """A prompt as a list of Python ints: text (through the tokenizer), a sequence of integers, or
        a 1-D integer tensor / numpy array. Floats, bools and strings as ids are refused by name
        (int() would silently truncate 2.5 to 2 or turn "5" into 5)."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise PromptError("a text prompt needs a tokenizer, and this model has none: pass token ids")
            try:
                prompt.encode("utf-8")
            except UnicodeEncodeError as e:  # a lone surrogate ("\ud800"): no UTF-8, nothing to tokenize
                raise PromptError(f"a text prompt holds a character UTF-8 cannot encode ({e.reason} at index "
                                  f"{e.start}: {prompt[e.start:e.end]!r}); lone surrogates are not text") from None
            return self.tokenizer(prompt)["input_ids"]
        if isinstance(prompt, (torch.Tensor, np.ndarray)):
            dtype = prompt.dtype
            is_int = (not dtype.is_floating_point and not dtype.is_complex and dtype != torch.bool) \
                if isinstance(prompt, torch.Tensor) else np.issubdtype(dtype, np.integer)
            if not is_int or prompt.ndim != 1:
                raise PromptError(f"a tensor or array prompt must be 1-D of an integer dtype, got {prompt.ndim}-D {dtype}")
            return [int(t) for t in prompt.tolist()]
        try:
            items = list(prompt)
        except TypeError:
            raise PromptError(f"a prompt is text, a sequence of token ids or a 1-D integer tensor, "
                              f"got {type(prompt).__name__}") from None
        bad = [t for t in items if not isinstance(t, (int, np.integer)) or isinstance(t, (bool, np.bool_))]
        if bad:
            raise PromptError(f"token ids must be integers, got {type(bad[0]).__name__} {bad[0]!r}"
                              f"{f' (and {len(bad) - 1} more)' if len(bad) > 1 else ''}")
        return [int(t) for t in items]

    def _check_prompt(self, ids: list[int], params: SamplingParams) -> None:
        eng = self.engine
        if not ids:
            raise PromptError("empty prompt: give at least one token")
        bad = [t for t in ids if not 0 <= t < eng.vocab_size]
        if bad:
            raise PromptError(f"token ids {bad[:5]} are outside the vocabulary [0, {eng.vocab_size})")
        if len(ids) + params.max_tokens > eng.max_model_len:
            raise PromptError(
                f"prompt of {len(ids)} tokens + max_tokens={params.max_tokens} exceeds the model's "
                f"max length {eng.max_model_len}"
            )
        eng.check_fits_pool(len(ids), params.max_tokens)

    @staticmethod
    def _as_list(prompts) -> list[Prompt]:
        """One prompt or many: text, a flat sequence of ids (one prompt), a 2-D tensor / array (rows)."""
        if isinstance(prompts, str):
            return [prompts]
        if isinstance(prompts, (torch.Tensor, np.ndarray)):
            return list(prompts) if prompts.ndim == 2 else [prompts]
        if isinstance(prompts, (list, tuple)) and prompts and isinstance(prompts[0], (numbers.Number, np.generic)):
            return [prompts]  # a flat sequence of scalars is one prompt (its elements are checked later)
        try:
            return list(prompts)
        except TypeError:
            raise PromptError(f"prompts are text, token ids or tensors (one, or a list of them), "
                              f"got {type(prompts).__name__}") from None

    # ---- generation --------------------------------------------------------------------------
    def make_sequences(self, prompts, sampling_params=None) -> list[Sequence]:
        """Check every prompt first (nothing changes if one is bad), then make their Sequences."""
        prompt_list = self._as_list(prompts)
        if not prompt_list:
            raise PromptError("no prompts given")
        params = sampling_params or SamplingParams()
        params_list = params if isinstance(params, list) else [params] * len(prompt_list)
        if len(params_list) != len(prompt_list):
            raise PromptError(f"{len(params_list)} sampling params for {len(prompt_list)} prompts")
        wrong = [type(p).__name__ for p in params_list if not isinstance(p, SamplingParams)]
        if wrong:
            raise SamplingParamsError(f"sampling_params must be SamplingParams (or a list of them), got {wrong[0]}")
        token_ids = [self._to_token_ids(p) for p in prompt_list]
        for ids, p in zip(token_ids, params_list):
            self._check_prompt(ids, p)
        eng = self.engine
        seqs = []
        for ids, p in zip(token_ids, params_list):
            seqs.append(Sequence(self._next_id, ids, p, eng.new_generator(p.seed, self._rng), eng.eos_token_id))
            self._next_id += 1
        return seqs

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None) -> list[RequestOutput]:
        """Run the prompts to completion. One caller at a time: a call made while another is running
        (another thread) raises ConcurrentUseError at once and changes nothing; the engine's batch,
        block pool and launched steps belong to one generate() call."""
        if not self._busy.acquire(blocking=False):
            raise ConcurrentUseError("generate() is already running on this LLM in another thread: one LLM "
                                     "serves one caller at a time (make one LLM per thread, or serialise the calls)")
        try:
            return self._generate(prompts, sampling_params)
        finally:
            self._busy.release()

    def _generate(self, prompts, sampling_params) -> list[RequestOutput]:
        eng = self.engine
        seqs = self.make_sequences(prompts, sampling_params)
        eng.waiting.extend(seqs)
        start = time.perf_counter()
        try:
            while eng.waiting or eng.running:
                eng.step()
            synchronize(eng.device, "the call's last work", self.config.device_wait_timeout_s)
        except BaseException:
            eng.abort_all()  # return every block so the engine stays usable
            raise
        elapsed = time.perf_counter() - start

        self.metrics = RequestMetrics()
        outputs = []
        for seq in seqs:
            seq.metrics.elapsed_s = elapsed
            seq.metrics.num_output_tokens = len(seq.output_token_ids)
            self.metrics.merge(seq.metrics)
            text = self.tokenizer.decode(seq.output_token_ids) if self.tokenizer is not None else None
            outputs.append(RequestOutput(seq.seq_id, seq.prompt_token_ids, list(seq.output_token_ids), text, seq.finish_reason, seq.metrics))
        return outputs

    @property
    def counters(self) -> dict[str, dict[str, int]]:
        """Which input path ran how often, per model (see ModelRunner.counters)."""
        out = {"target": dict(self.engine.target.counters)}
        if self.engine.draft is not None:
            out["draft"] = dict(self.engine.draft.counters)
        elif self.engine.spec_step is not None:  # a proposer without a model (n-gram)
            out["proposer"] = dict(self.engine.spec_step.draft_loop.counters)
        return out

"""Python-side state of one request.

Between spec steps a sequence of L tokens has K/V for tokens [0, num_cached) in each cache.
The target is always exactly one behind (num_cached_target == L - 1: the last token was just
sampled). The draft is one behind too, except after a full accept with a bonus token, when it
is two behind: it proposed d_k but never ran a forward on it. The next first draft step feeds
both missing tokens, so every committed token gets its K/V in both caches (invariant 1).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import torch

from protospec.config import SamplingParams
from protospec.requests.metrics import RequestMetrics


class FinishReason(str, Enum):
    LENGTH = "length"
    EOS = "stop"


@dataclass
class Sequence:
    seq_id: int
    prompt_token_ids: list[int]
    params: SamplingParams
    generator: torch.Generator           # per-request rng on the model's device
    eos_token_id: int | None = None
    output_token_ids: list[int] = field(default_factory=list)
    block_table: list[int] = field(default_factory=list)
    reserved_blocks: int = 0             # the pool blocks its admission reserved for its whole life
    num_cached_target: int = 0
    num_cached_draft: int = 0
    finish_reason: FinishReason | None = None
    metrics: RequestMetrics = field(default_factory=RequestMetrics)

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def tokens(self, start: int, end: int | None = None) -> list[int]:
        """token_ids[start:end] (Python's slice rules) without building the whole list first: the
        engine reads a few tokens at the end of every sequence every step, and token_ids copies the
        whole prompt each time, host time that grows with the batch and the prompts."""
        start, end, _ = slice(start, end).indices(self.num_tokens)
        prompt, output = self.prompt_token_ids, self.output_token_ids
        p = len(prompt)
        if end <= start:
            return []
        if start >= p:
            return output[start - p : end - p]
        if end <= p:
            return prompt[start:end]
        return prompt[start:] + output[: end - p]

    @property
    def last_token_id(self) -> int:
        return self.output_token_ids[-1] if self.output_token_ids else self.prompt_token_ids[-1]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_remaining(self) -> int:
        return self.params.max_tokens - len(self.output_token_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def append_tokens(self, token_ids: list[int]) -> int:
        """Append emitted tokens, stopping at max_tokens or EOS. Returns how many were kept."""
        if self.finished:
            return 0
        # The budget and the stop id once, not per token: every spec step commits k + 1 tokens a request.
        room = self.num_remaining
        stop = None if self.params.ignore_eos else self.eos_token_id
        take = token_ids[:room]
        if stop is not None and stop in take:
            take = take[: take.index(stop) + 1]
            self.finish_reason = FinishReason.EOS
        elif len(take) == room:
            self.finish_reason = FinishReason.LENGTH
        self.output_token_ids.extend(take)
        return len(take)

"""Time whole generate() calls, as vLLM's benchmark_latency.py does: warm-up, then timed iterations."""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from protospec.config import SamplingParams
from protospec.engine.llm import LLM
from protospec.requests.metrics import RATE_KEYS, RequestMetrics

PERCENTILES = (10, 25, 50, 75, 90, 99)


@dataclass
class LatencyResult:
    latencies_s: list[float]
    metrics: RequestMetrics = field(default_factory=RequestMetrics)
    # sha256 (16 hex digits) over every timed call's output token ids: two runs with equal digests
    # emitted the same tokens (the ablation compares its modes and peers by it)
    token_digest: str | None = None

    def percentile(self, p: float) -> float:
        return float(np.percentile(self.latencies_s, p))

    def summary(self) -> dict:
        out = {"latencies_s": self.latencies_s, "avg_s": float(np.mean(self.latencies_s))}
        out.update({f"p{p}_s": self.percentile(p) for p in PERCENTILES})
        m = self.metrics
        rates = m.summary()
        out.update({key: rates[key] for key in RATE_KEYS})
        if self.token_digest is not None:
            out["token_digest"] = self.token_digest
        return out


def random_prompts(batch_size: int, input_len: int, seed: int, vocab_size: int = 10000) -> list[list[int]]:
    """Seeded random token ids below 10000 (as the original benchmark's dummy prompts) or the vocab size."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, min(10000, vocab_size), (batch_size, input_len), generator=gen).tolist()


def time_calls(fn, warmup: int, iters: int, on_cuda: bool, progress=None, after_each=None) -> LatencyResult:
    """Wall time of whole calls of fn, synchronised before and after each one."""
    def one() -> float:
        if on_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if on_cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start

    wrap = progress or (lambda it: it)
    for _ in wrap(range(warmup)):
        one()
    result = LatencyResult([])
    for _ in wrap(range(iters)):
        result.latencies_s.append(one())
        if after_each is not None:
            after_each(result)
    return result


def time_generate(llm: LLM, prompts, params: SamplingParams, warmup: int, iters: int, progress=None) -> LatencyResult:
    digest, last = hashlib.sha256(), []

    def call() -> None:
        last[:] = llm.generate(prompts, params)

    def after_each(result: LatencyResult) -> None:  # outside the timed window
        result.metrics.merge(llm.metrics)
        for out in last:
            digest.update(np.asarray(out.token_ids, dtype=np.int64).tobytes())
        result.token_digest = digest.hexdigest()[:16]

    return time_calls(call, warmup, iters, llm.engine.device.type == "cuda", progress, after_each=after_each)

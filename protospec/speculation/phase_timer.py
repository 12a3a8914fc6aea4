"""Where a spec step's time goes: CPU wall time and GPU time (CUDA events) per phase.

Off by default (NULL_TIMER: a shared no-op context), so the headline timings carry no events.
GPU time of a phase = device time between its start and end events on the stream: its kernels
plus any idle gap while the device waited for the CPU to launch them.
"""
from __future__ import annotations

import contextlib
import time
from collections import defaultdict

import torch

PHASES = ("begin", "prepare", "draft_forward", "sampling", "draft_loop_graph", "step_graph", "verify", "rejection",
          "commit")


class PhaseTimer:
    def __init__(self, device: torch.device):
        self.use_events = device.type == "cuda"
        self.cpu_s: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)
        self._events: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []

    @contextlib.contextmanager
    def phase(self, name: str):
        start_cpu = time.perf_counter()
        if self.use_events:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
        yield
        if self.use_events:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._events.append((name, start, end))
        self.cpu_s[name] += time.perf_counter() - start_cpu
        self.counts[name] += 1

    def summary(self) -> dict[str, dict[str, float]]:
        """Totals per phase in milliseconds (synchronises to read the events)."""
        gpu_ms: dict[str, float] = defaultdict(float)
        if self._events:
            torch.cuda.synchronize()
            for name, start, end in self._events:
                gpu_ms[name] += start.elapsed_time(end)
        return {name: {"cpu_ms": self.cpu_s[name] * 1e3, "gpu_ms": gpu_ms.get(name) if self.use_events else None,
                       "calls": self.counts[name]} for name in PHASES if name in self.counts}


class ProfilerPhases:
    """Phases as torch.profiler ranges named "phase:<name>" (kernel_census attributes the GPU's idle
    gaps to them); no events, no syncs."""

    def phase(self, name: str):
        return torch.profiler.record_function(f"phase:{name}")


class _NullTimer:
    _null = contextlib.nullcontext()

    def phase(self, name: str):
        return self._null


NULL_TIMER = _NullTimer()

"""The host's waits on the device, each with a bound.

The engine reads results back at a few points (the prefill's tokens, the commit's row, a draft step's
ids on the CPU-synced path). A plain `.tolist()` or `synchronize()` there waits for as long as the
device takes: if a kernel never ends, neither does the call, and the process hangs with no word of
why. Each wait here polls an event recorded after the work instead and gives up after `timeout_s`,
raising DeviceWaitError with what it waited for. CUDA cannot stop a running kernel, so the error
cannot free the device: it turns a silent hang into a named one, and the engine's later waits are
bounded too (each raises again while the device stays stuck). Polling costs a microsecond or two per
wait over a blocking synchronize, which spins as well.
"""
from __future__ import annotations

import time

import torch

from protospec.errors import DeviceWaitError

DEFAULT_TIMEOUT_S = 300.0  # far above any step or prefill the engine makes; a bound, not a budget


def wait_for(event, what: str, timeout_s: float) -> None:
    """Return once `event` (a torch.cuda.Event, or anything with query()) has completed; raise
    DeviceWaitError if it has not after timeout_s seconds."""
    if event.query():
        return
    deadline = time.monotonic() + timeout_s
    while not event.query():
        if time.monotonic() > deadline:
            raise DeviceWaitError(
                f"the device did not finish {what} within {timeout_s:g} s (device_wait_timeout_s): a kernel is "
                "stuck or far slower than expected. CUDA cannot stop a running kernel, so the engine's requests "
                "were dropped and the device may stay busy; if later calls raise this too, restart the process")


def record_event() -> torch.cuda.Event:
    """An event after everything queued so far on the current stream."""
    done = torch.cuda.Event()
    done.record()
    return done


def copy_to_host(t: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
    """Queue t's copy into pinned host memory: (the host tensor, the event that ends it; None off a GPU,
    where the tensor is the host's already)."""
    if t.device.type != "cuda":
        return t, None
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host, record_event()


def read_back(t: torch.Tensor, what: str, timeout_s: float) -> list:
    """t.tolist(), waiting at most timeout_s for the device work that writes it."""
    host, done = copy_to_host(t)
    if done is not None:
        wait_for(done, what, timeout_s)
    return host.tolist()


def synchronize(device: torch.device, what: str, timeout_s: float) -> None:
    """torch.cuda.synchronize() of the current stream's work, bounded (a no-op off a GPU)."""
    if device.type == "cuda":
        wait_for(record_event(), what, timeout_s)

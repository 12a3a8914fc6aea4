"""Decide, before numba is first imported, whether Numba's CUDA target runs on a real GPU or in
its simulator. numba reads NUMBA_ENABLE_CUDASIM once, at import, so this must run first."""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import warnings

import numpy as np


def choose_numba_cuda_target() -> bool:
    """Turn the simulator on when torch sees no CUDA device. Returns True if it is (or will be) on."""
    if "NUMBA_ENABLE_CUDASIM" not in os.environ:
        import torch

        if not torch.cuda.is_available():
            if "numba" in sys.modules:
                warnings.warn("numba was imported before protospec could enable its CUDA simulator; "
                              "set NUMBA_ENABLE_CUDASIM=1 before importing numba", stacklevel=2)
            os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    return os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


# The simulator runs each thread of a block as a Python thread while the launching thread polls them
# in a busy loop (to release them at a syncthreads). CPython lets a running thread keep the GIL for the
# interpreter's switch interval (5 ms by default) before a waiting one may take it, so at the default
# the block's threads spend most of a launch waiting for the poller to let go; a short interval while
# the launch runs makes the simulated kernels several times faster (NOTES.md has the figures).
SIMULATOR_SWITCH_INTERVAL_S = 1e-5

_shared_lock = threading.Lock()
_switches_lock = threading.Lock()
_switches = {"open": 0, "before": 0.0}  # launches in progress (from any thread), the interval before the first


@contextlib.contextmanager
def short_thread_switches():
    """Within the block, CPython switches between threads every SIMULATOR_SWITCH_INTERVAL_S seconds.
    The interpreter's own interval comes back when the last launch in progress ends (launches from
    several threads at once overlap: none restores the interval under another's feet)."""
    with _switches_lock:
        if _switches["open"] == 0:
            _switches["before"] = sys.getswitchinterval()
        _switches["open"] += 1
        sys.setswitchinterval(SIMULATOR_SWITCH_INTERVAL_S)
    try:
        yield
    finally:
        with _switches_lock:
            _switches["open"] -= 1
            if _switches["open"] == 0:
                sys.setswitchinterval(_switches["before"])


def lock_shared_allocations() -> None:
    """Make the simulator's cuda.shared.array safe for threads that switch often.

    numba-cuda's simulator finds a block's shared array by the source line that asks for it: it looks
    the line up and, on a miss, makes the array and stores it. Two threads that switch between the
    look-up and the store each make an array of their own, so the block's "shared" array is two
    arrays and its threads stop seeing each other's writes (a whole forward came out wrong). With
    the default switch interval a thread all but never switches there; with a short one it does.
    Here the look-up and the store happen under one lock, keyed as the simulator keys them (the
    caller's file and line, so arrays made on other lines never alias). launch/interop.py installs it once,
    when it chooses the simulator."""
    from numba.cuda.simulator import kernelapi

    shared = kernelapi.FakeCUDAShared
    if getattr(shared.array, "locked_by_protospec", False):
        return
    simulators_own = shared.array

    def array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:  # dynamic shared memory (one buffer) or refused: as before
            return simulators_own(self, shape, dtype, alignment)
        caller = sys._getframe(1)
        key = (caller.f_code.co_filename, caller.f_lineno)
        with _shared_lock:
            found = self._allocations.get(key)
            if found is None:
                numpy_dtype = kernelapi.numpy_support.as_dtype(dtype) if isinstance(dtype, kernelapi.types.Type) else dtype
                found = self._allocations[key] = np.empty(shape, numpy_dtype)
        return found

    array.locked_by_protospec = True
    shared.array = array

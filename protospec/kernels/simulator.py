"""Decide, before numba is first imported, whether Numba's CUDA target runs on a real GPU or in
its simulator. numba reads NUMBA_ENABLE_CUDASIM once, at import, so this must run first."""
from __future__ import annotations

import contextlib
import os
import sys
import warnings


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


@contextlib.contextmanager
def short_thread_switches():
    """Within the block, CPython switches between threads every SIMULATOR_SWITCH_INTERVAL_S seconds;
    the interpreter's own interval comes back after it."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(SIMULATOR_SWITCH_INTERVAL_S)
    try:
        yield
    finally:
        sys.setswitchinterval(before)

"""Decide, before numba is first imported, whether Numba's CUDA target runs on a real GPU or in
its simulator. numba reads NUMBA_ENABLE_CUDASIM once, at import, so this must run first."""
from __future__ import annotations

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

"""Numba @cuda.jit kernels and their launchers. launch/interop.py is the only module that knows how torch
tensors become Numba arrays (on a GPU, or in the CUDA simulator on a CPU-only machine)."""
from protospec.kernels.launch.simulator import choose_numba_cuda_target

# numba reads NUMBA_ENABLE_CUDASIM once, at its import: decide before any kernel module imports it.
choose_numba_cuda_target()

"""Numba @cuda.jit kernels and their launchers. interop.py is the only module that knows how torch
tensors become Numba arrays (on a GPU, or in the CUDA simulator on a CPU-only machine)."""

"""Kernel launches through the CUDA driver, by ctypes: one cuLaunchKernel or (for a programmatic
dependent, kernels/launch/dependent_launch.py) cuLaunchKernelEx on a given stream,
with a prebuilt parameter array (interop.TensorLaunch builds it). torch has initialised the driver
and made the context current by the time a kernel launches; a launch on torch's current stream is
captured by torch.cuda.graph like any other.
"""
from __future__ import annotations

import ctypes


class _LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute: an id, 4 bytes of padding, a 64-byte value union (its first int here)."""
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int), ("rest", ctypes.c_char * 60)]


class _LaunchConfig(ctypes.Structure):
    """CUlaunchConfig, for cuLaunchKernelEx."""
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_bytes", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION


def dependent_launch_config(grid: int, block: int, stream_handle: int) -> _LaunchConfig:
    """The launch configuration that lets a kernel start before the previous one in its stream ends
    (the attribute kept alive by the config's reference)."""
    attribute = _LaunchAttribute(id=PROGRAMMATIC_STREAM_SERIALIZATION, value=1)
    config = _LaunchConfig(grid=(grid, 1, 1), block=(block, 1, 1), shared_bytes=0, stream=stream_handle,
                           attrs=ctypes.pointer(attribute), num_attrs=1)
    config._attribute = attribute
    return config


def cu_launch(function, grid: int, block: int, stream_handle: int, params, dependent: bool = False) -> None:
    """One cuLaunchKernel (1-D grid and block, no dynamic shared memory) on the given stream; a dependent
    launch (launch/dependent_launch.py) goes through cuLaunchKernelEx with the programmatic serialization attribute."""
    if dependent:
        if not hasattr(_libcuda(), "cuLaunchKernelEx"):
            raise RuntimeError("this CUDA driver has no cuLaunchKernelEx (CUDA 11.8 or later): no dependent launches")
        config = dependent_launch_config(grid, block, stream_handle)
        rc = _libcuda().cuLaunchKernelEx(ctypes.byref(config), function, params, None)
        what = "cuLaunchKernelEx"
    else:
        rc = _libcuda().cuLaunchKernel(function, grid, 1, 1, block, 1, 1, 0, stream_handle, params, None)
        what = "cuLaunchKernel"
    if rc != 0:
        raise RuntimeError(f"{what} failed with CUresult {rc}")


_LIBCUDA = None


def _libcuda():
    """The CUDA driver library, loaded once (torch has already initialised the driver)."""
    global _LIBCUDA
    if _LIBCUDA is None:
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuLaunchKernel.restype = ctypes.c_int
        lib.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        if hasattr(lib, "cuLaunchKernelEx"):  # CUDA 11.8 and later; only dependent launches need it
            lib.cuLaunchKernelEx.restype = ctypes.c_int
            lib.cuLaunchKernelEx.argtypes = [ctypes.c_void_p] * 4
        _LIBCUDA = lib
    return _LIBCUDA

"""The one place that knows how torch tensors reach Numba kernels.

- On a GPU: `cuda.as_cuda_array` (through `__cuda_array_interface__`, zero-copy), launched on
  torch's current stream. The interface carries no stream, so we pass torch's stream ourselves.
- In the CUDA simulator (CPU-only machines): zero-copy numpy views of CPU tensors; the kernel's
  writes land in the tensors.
- `BoundLaunch`: for persistent tensors, marshal the arguments ONCE and launch with one driver
  call (`cuLaunchKernel` through ctypes). Numba's own dispatch re-types and re-marshals every
  argument on every call, which costs more than the kernel runs; the kernel is the same Numba kernel.
- `TensorLaunch`: for tensors that change every call, marshal them straight from torch (no
  Numba device arrays), then the same single driver call.
"""
from __future__ import annotations

import ctypes
import functools
import struct
import math

import torch

from protospec.kernels.launch.simulator import choose_numba_cuda_target, lock_shared_allocations, short_thread_switches

SIMULATOR = choose_numba_cuda_target()

from numba import cuda  # noqa: E402  (after the simulator decision)

from protospec.errors import KernelArgumentError  # noqa: E402
from protospec.kernels.launch.driver_launch import _libcuda, cu_launch as _cu_launch  # noqa: E402

if SIMULATOR:
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray as _SimulatedDeviceArray

    lock_shared_allocations()

KERNEL_DEVICE_TYPE = "cpu" if SIMULATOR else "cuda"


@functools.cache
def sm_count(device: torch.device) -> int:
    """The device's SMs, which the launches size their grids by (the simulator: a small GPU's 4)."""
    return 4 if SIMULATOR else torch.cuda.get_device_properties(device).multi_processor_count



_placeholders: dict[tuple, torch.Tensor] = {}


def placeholder(dtype: torch.dtype, ndim: int, device: torch.device) -> torch.Tensor:
    """A [1] * ndim zero tensor for a kernel argument the launch does not use (never read or written;
    one per dtype, rank and device, so a launch allocates nothing for it)."""
    key = (dtype, ndim, str(device))
    if key not in _placeholders:
        _placeholders[key] = torch.zeros((1,) * ndim, dtype=dtype, device=device)
    return _placeholders[key]


def check_tensor(name: str, t, dtype: torch.dtype, ndim: int, rows: int | None = None) -> None:
    """Raise KernelArgumentError naming the argument unless t is a contiguous `dtype` tensor of
    `ndim` dims (first dim `rows` when given) on the device kernels run on here."""
    if not isinstance(t, torch.Tensor):
        raise KernelArgumentError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type != KERNEL_DEVICE_TYPE:
        where = "the CUDA simulator (CPU tensors)" if SIMULATOR else "a CUDA device"
        raise KernelArgumentError(f"{name}: tensor is on {t.device}, but kernels run on {where}")
    if t.dtype != dtype:
        raise KernelArgumentError(f"{name}: dtype {t.dtype}, expected {dtype}")
    if t.dim() != ndim:
        raise KernelArgumentError(f"{name}: {t.dim()} dims (shape {tuple(t.shape)}), expected {ndim}")
    if rows is not None and t.shape[0] != rows:
        raise KernelArgumentError(f"{name}: {t.shape[0]} rows (shape {tuple(t.shape)}), expected {rows}")
    if not t.is_contiguous():
        raise KernelArgumentError(f"{name}: tensor is not contiguous (strides {t.stride()})")


def as_numba(t: torch.Tensor):
    """A zero-copy Numba view of a tensor that passed check_tensor. In the simulator a "device array"
    wrapping the tensor's memory: given a plain numpy array, the simulator copies each argument in and
    back out, so two views of one tensor (a cache as values and as words) would undo each other's writes."""
    t = t.detach()
    return _SimulatedDeviceArray(t.numpy()) if SIMULATOR else cuda.as_cuda_array(t)


def launch_config(num_threads: int, threads_per_block: int = 128) -> tuple[int, int]:
    block = max(1, min(threads_per_block, num_threads))
    return math.ceil(num_threads / block), block


_numba_streams: dict[int, object] = {}


def torch_stream_for_numba(device: torch.device):
    """Numba's handle on torch's current stream (cached: creating one costs microseconds)."""
    handle = torch.cuda.current_stream(device).cuda_stream
    if handle not in _numba_streams:
        _numba_streams[handle] = cuda.external_stream(handle)
    return _numba_streams[handle]


def launch(kernel, num_threads: int, tensors_and_scalars: list) -> None:
    """Numba's ordinary launch path (simulator or GPU), on torch's current stream."""
    grid, block = launch_config(num_threads)
    args = [as_numba(a) if isinstance(a, torch.Tensor) else a for a in tensors_and_scalars]
    if SIMULATOR:
        _simulate(kernel, grid, block, args)
        return
    device = next(a for a in tensors_and_scalars if isinstance(a, torch.Tensor)).device
    kernel[grid, block, torch_stream_for_numba(device)](*args)


def _simulate(kernel, grid: int, block: int, numba_args: list) -> None:
    """Numba's simulator runs the kernel's Python, its threads switching often (launch/simulator.py)."""
    with short_thread_switches():
        kernel[grid, block](*numba_args)


class BoundLaunch:
    """A Numba kernel compiled for fixed argument types, its arguments marshalled once.

    Valid while the bound tensors live and keep their storage (persistent buffers). Calling it
    issues one cuLaunchKernel on torch's current stream: no typing, no argument conversion, and
    no synchronisation, so it is also captured by torch.cuda.graph.
    """

    def __init__(self, kernel, num_threads: int, tensors_and_scalars: list, dependent: bool = False):
        if SIMULATOR:
            raise RuntimeError("BoundLaunch needs a real GPU (the simulator has no driver to call)")
        self._dependent = dependent  # launched as a programmatic dependent (launch/dependent_launch.py)
        self.grid, self.block = launch_config(num_threads)
        self._keep = list(tensors_and_scalars)  # the tensors must outlive the binding
        args = [as_numba(a) if isinstance(a, torch.Tensor) else a for a in tensors_and_scalars]
        compiled, self._function = _specialize(kernel, args)
        marshalled, writebacks = [], []
        for ty, value in zip(compiled.argument_types, args):
            compiled._prepare_args(ty, value, 0, writebacks, marshalled)
        self._writebacks = writebacks  # holds Numba's views alive
        # Numba passes array fields (meminfo, parent, nitems, itemsize, data, shape, strides) as
        # pointer-sized ints and scalars as ctypes values; the driver wants a pointer to each.
        self._values = [ctypes.c_int64(v) if isinstance(v, int) else v for v in marshalled]
        self._params = (ctypes.c_void_p * len(self._values))(*[ctypes.addressof(v) for v in self._values])
        self._device = next(a for a in tensors_and_scalars if isinstance(a, torch.Tensor)).device

    def __call__(self) -> None:
        stream_handle = torch.cuda.current_stream(self._device).cuda_stream
        _cu_launch(self._function, self.grid, self.block, stream_handle, self._params, self._dependent)


def array_fields(t: torch.Tensor) -> list[int]:
    """What Numba's compiled kernels take for one C-contiguous array argument, in order: meminfo,
    parent (both 0), number of items, item size, data pointer, the shape, then the strides in bytes
    (numba-cuda's Dispatcher._prepare_args). Strides come from the shape: torch may report any stride
    for a dimension of size 1."""
    itemsize, shape = t.element_size(), list(t.shape)
    strides, step = [], itemsize
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return [0, 0, t.numel(), itemsize, t.data_ptr(), *shape, *reversed(strides)]


def _fields(t: torch.Tensor):
    """array_fields, with the common ranks spelled out (a launch marshals a dozen tensors: the host's
    time per launch is mostly this)."""
    shape, itemsize = t.shape, t.element_size()
    if len(shape) == 1:
        return (0, 0, shape[0], itemsize, t.data_ptr(), shape[0], itemsize)
    if len(shape) == 2:
        rows, cols = shape
        return (0, 0, rows * cols, itemsize, t.data_ptr(), rows, cols, cols * itemsize, itemsize)
    return array_fields(t)


class _Parameters:
    """One launch signature's parameter block: every field and scalar in an 8-byte slot of one buffer,
    written by a single struct.pack_into per launch, and the driver's array of pointers to the slots,
    built once. Reusing the buffer is safe: cuLaunchKernel copies the parameters before it returns
    (a graph capture too), and launches come from one host thread."""

    def __init__(self, types, args):
        fmt = ["<"]
        for ty, a in zip(types, args):
            fmt.append("q" * len(_fields(a)) if isinstance(a, torch.Tensor) else _SCALAR_SLOTS[str(ty)])
        self.layout = struct.Struct("".join(fmt))
        slots = self.layout.size // 8
        self.buffer = ctypes.create_string_buffer(self.layout.size)
        base = ctypes.addressof(self.buffer)
        self.pointers = (ctypes.c_void_p * slots)(*range(base, base + 8 * slots, 8))

    def fill(self, args):
        values = []
        for a in args:
            if isinstance(a, torch.Tensor):
                values.extend(_fields(a))
            else:
                values.append(a)
        self.layout.pack_into(self.buffer, 0, *values)
        return self.pointers


class TensorLaunch:
    """A Numba kernel launched with torch tensors whose storage changes from call to call.

    Numba's dispatch converts each tensor through `__cuda_array_interface__` into a device array
    (tens of microseconds per argument); this marshals the fields Numba's compiled kernels take for
    a C-contiguous array (meminfo, parent, nitems, itemsize, data, shape..., strides...) straight
    from the tensor, then issues one cuLaunchKernel on torch's current stream. The kernel is
    specialised once per (dtype, rank) signature, the first time it sees one.
    """

    def __init__(self, kernel):
        if SIMULATOR:
            raise RuntimeError("TensorLaunch needs a real GPU (the simulator has no driver to call)")
        self.kernel = kernel
        self._compiled: dict[tuple, tuple] = {}
        self.compiled_kernels: dict[tuple, object] = {}  # Numba's compiled kernels, for inspection (registers, ...)

    @staticmethod
    def _signature(args) -> tuple:
        return tuple((a.dtype, a.dim()) if isinstance(a, torch.Tensor) else type(a) for a in args)

    def _compile(self, args) -> tuple:
        compiled, function = _specialize(self.kernel, [as_numba(a) if isinstance(a, torch.Tensor) else a for a in args])
        self.compiled_kernels[self._signature(args)] = compiled
        device = next(a for a in args if isinstance(a, torch.Tensor)).device
        return function, _Parameters(compiled.argument_types, args), device

    def __call__(self, grid: int, block: int, args: list, dependent: bool = False) -> None:
        """args: C-contiguous CUDA tensors and Python ints (callers check them with check_tensor).
        dependent: launch as a programmatic dependent (kernels/launch/dependent_launch.py)."""
        key = self._signature(args)
        if key not in self._compiled:
            self._compiled[key] = self._compile(args)
        function, parameters, device = self._compiled[key]
        _cu_launch(function, grid, block, torch.cuda.current_stream(device).cuda_stream, parameters.fill(args),
                   dependent)


# Each scalar type Numba infers from a Python int or float, as struct packs it into an 8-byte slot.
_SCALAR_SLOTS = {"int64": "q", "int32": "i4x", "float64": "d", "float32": "f4x", "bool": "?7x"}

_tensor_launchers: dict = {}


def launch_tensors(kernel, grid: int, block: int, args: list, dependent: bool = False) -> None:
    """Launch a Numba kernel over torch tensors (checked, C-contiguous) and Python scalars: in the
    simulator through Numba's own dispatch on device-array wrappers of the tensors' memory, on a GPU through a TensorLaunch kept per
    kernel (one cuLaunchKernel on torch's current stream, so CUDA graphs capture it)."""
    if SIMULATOR:
        _simulate(kernel, grid, block, [as_numba(a) if isinstance(a, torch.Tensor) else a for a in args])
        return
    launcher = _tensor_launchers.get(kernel)
    if launcher is None:
        launcher = _tensor_launchers[kernel] = TensorLaunch(kernel)
    launcher(grid, block, args, dependent)


def compiled_resources(kernel, threads_per_block: int) -> list[dict]:
    """For each signature a GPU launch compiled `kernel` for: registers and local (spill) memory per
    thread, static shared memory per block, and how many blocks of `threads_per_block` fit on one SM
    (the driver's occupancy answer). Empty before the first launch, and in the simulator."""
    launcher = _tensor_launchers.get(kernel)
    if launcher is None:
        return []
    out = []
    for key, compiled in launcher.compiled_kernels.items():
        info = {name: getattr(compiled, name, None) for name in ("regs_per_thread", "local_mem_per_thread",
                                                                 "shared_mem_per_block")}
        blocks = ctypes.c_int(0)
        _libcuda().cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(blocks), launcher._compiled[key][0],
                                                               threads_per_block, 0)
        out.append(dict(info, blocks_per_sm=blocks.value))
    return out


def _specialize(kernel, numba_args: list) -> tuple:
    """Compile `kernel` for these arguments' types: (Numba's compiled kernel, its CUfunction handle)."""
    compiled = next(iter(kernel.specialize(*numba_args).overloads.values()))
    if compiled.cooperative:  # a grid sync needs a cooperative launch, which these launches are not
        raise RuntimeError(f"{kernel.__name__} syncs its whole grid; the bound launches do not launch cooperatively")
    return compiled, ctypes.c_void_p(_handle_as_int(compiled._codelibrary.get_cufunc().handle))


def _handle_as_int(handle) -> int:
    try:
        return int(handle)
    except TypeError:
        return int(handle.getPtr())

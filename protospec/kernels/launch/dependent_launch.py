"""Programmatic dependent launch (sm_90 and later): a kernel starts while the one before it finishes.

Why: at batch 1 a decode forward is a chain of short kernels, each paying a launch and a chain of
dependent DRAM loads before its first useful instruction; most of a GEMV's bytes are weights, which
no earlier kernel writes. Launched with the driver's programmatic stream serialization attribute
(driver_launch.cu_launch, dependent=True), a kernel may begin as soon as every block of the kernel before
it has called `allow_dependent_launch()`; it issues its weight loads, then `grid_dependency_wait()`
blocks until that kernel has completed and its writes are visible, and only then reads activations.
A kernel launched this way must call grid_dependency_wait() before it reads anything an earlier kernel
wrote; one that follows a kernel that never allows it simply starts when that kernel ends.

PTX `griddepcontrol.wait` / `griddepcontrol.launch_dependents` (ISA 7.8): inline assembly with a
memory clobber, so LLVM keeps loads on their side of it. ptxas does not: it hoists an unconditional
wait above every load that does not depend on it (`python -m tools.gpu_wait_order` shows
where each kernel's wait landed), so a kernel whose loads must be in flight during its wait calls
`wait_after_issued_loads(nonzero)`, the wait behind a branch on a value that is never 0, which
ptxas does not move it across (launch_dependents, which it does not move loads across either, is
not an option there: it would let the next kernel start early). The CUDA simulator runs kernels one
at a time: there both are no-ops. CUDA graphs keep the dependency when they capture such a launch.

Why the wait ends: griddepcontrol.wait returns when the kernel before this one in the stream has
completed, and that kernel launched this one only after every one of its blocks was resident and had
allowed it (or had exited), so none of its blocks waits for room this kernel's blocks hold. A chain
of dependents that each allow early therefore always has a head that runs; the wait lasts no longer
than the kernels before it, and none of ours waits on anything else.
"""
from __future__ import annotations

import torch

from protospec.kernels.launch import interop
from protospec.kernels.launch.interop import cuda

MIN_CAPABILITY = (9, 0)


def supported(device: torch.device) -> bool:
    """Whether kernels on `device` can be launched as dependents (the simulator: trivially, no-ops)."""
    if interop.SIMULATOR:
        return True
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= MIN_CAPABILITY


if interop.SIMULATOR:
    @cuda.jit(device=True)
    def grid_dependency_wait():
        """Until the kernel this one depends on has completed (the simulator runs kernels in turn)."""
        return 0

    @cuda.jit(device=True)
    def allow_dependent_launch():
        """Let the next kernel launch before this one ends (nothing to do in the simulator)."""
        return 0
else:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    def _asm(text: str):
        def codegen(context, builder, sig, args):  # noqa: ARG001
            fn = ir.FunctionType(ir.VoidType(), [])
            builder.call(ir.InlineAsm(fn, text, "~{memory}", side_effect=True), [])
            return context.get_constant(types.int32, 0)
        return codegen

    @intrinsic
    def grid_dependency_wait(typingctx):  # noqa: ARG001
        """Until the kernel this one depends on has completed and its writes are visible."""
        return types.int32(), _asm("griddepcontrol.wait;")

    @intrinsic
    def allow_dependent_launch(typingctx):  # noqa: ARG001
        """Let the next kernel (if launched as a dependent) start before this one ends."""
        return types.int32(), _asm("griddepcontrol.launch_dependents;")


@cuda.jit(device=True)
def wait_after_issued_loads(nonzero):
    """grid_dependency_wait() that stays below the loads issued before it in the machine code: behind a
    branch on `nonzero`, a runtime value that is never 0 (a dimension of a kernel argument)."""
    if nonzero != 0:
        grid_dependency_wait()
    return 0

"""Divisions by values known only at run time, in 32-bit unsigned arithmetic. Numba divides int64 by
such a value with a subroutine call (dozens of instructions, and Python's floor rule on top), and the
kernels divide their block index or a position first, ahead of the loads whose addresses depend on
it. Every value divided here is a non-negative count below 2^32 (block indices, rows, positions);
`python -m tools.gpu_typecheck --divisions` counts the 64-bit ones left in each kernel."""
from __future__ import annotations

from numba import int64, uint32

from protospec.kernels.launch.interop import cuda


@cuda.jit(device=True)
def divide32(value, divisor):
    """(value // divisor, value % divisor) as int64, for 0 <= value < 2^32 and 0 < divisor < 2^32."""
    quotient = uint32(value) // uint32(divisor)
    return int64(quotient), int64(uint32(value) - quotient * uint32(divisor))


@cuda.jit(device=True)
def block_row_and_part(parts):
    """(blockIdx.x // parts, blockIdx.x % parts), for a grid of rows x `parts` blocks."""
    return divide32(cuda.blockIdx.x, parts)

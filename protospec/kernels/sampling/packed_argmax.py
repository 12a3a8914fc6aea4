"""A row's argmax across blocks as one 64-bit atomic max: no winners array for a last block to reduce.

A sliced sampler's blocks each find their slice's best (value, index); the row's best then took the
row's last block to arrive a load of every slice's winner and a block-wide reduction (barriers), on
the critical path of every draft step. Here each block's thread 0 folds its winner into one int64
per row with atomicMax, so the last block reads the answer with one atomic exchange (which also
resets the slot for the next call or graph replay), in thread 0 alone.

The key orders as reductions.better does (the larger value; of equal values the lower index):
    high 32 bits  the float's bits, made to order as signed integers (negative floats: their lower 31
                  bits flipped), -0.0 counted as +0.0 (they compare equal)
    low 32 bits   0xFFFFFFFF - index (indices < 2^32), so the lower index is the larger key
EMPTY (the smallest int64) is below every key: a slot holds it between calls.

Waits: none. The atomic max and exchange never wait on another block's progress; the last block is
found by an arrival count that every block passes once (arrivals.arrived_last says why that
ends).
"""
from __future__ import annotations

import numpy as np
from numba import float32, int64

from protospec.kernels.launch import interop
from protospec.kernels.launch.interop import cuda

EMPTY = -(2**63)
_LOW = 0xFFFFFFFF

if interop.SIMULATOR:
    @cuda.jit(device=True)
    def float_bits(value):
        """The bits of a float32 as an int32 (its sign bit the integer's)."""
        return int(np.array([value], dtype=np.float32).view(np.int32)[0])
else:
    from llvmlite import ir
    from numba import types
    from numba.core.extending import intrinsic

    @intrinsic
    def float_bits(typingctx, value):  # noqa: ARG001
        """The bits of a float32 as an int32 (its sign bit the integer's)."""
        signature = types.int32(value)

        def codegen(context, builder, sig, args):
            x = context.cast(builder, args[0], sig.args[0], types.float32)
            return builder.bitcast(x, ir.IntType(32))

        return signature, codegen


@cuda.jit(device=True)
def argmax_key(value, index):
    """(value float32, index int64 in [0, 2^32)) as the int64 key above."""
    if value == float32(0.0):
        value = float32(0.0)  # -0.0 == +0.0: one key for both
    bits = int64(float_bits(value))
    if bits < 0:
        bits = bits ^ int64(0x7FFFFFFF)
    return (bits << int64(32)) | (int64(_LOW) - index)


@cuda.jit(device=True)
def key_index(key):
    """The index a key holds."""
    return int64(_LOW) - (key & int64(_LOW))

"""Wide loads for Numba kernels: weights read as 8-byte words, unpacked to float32 in registers.

Why: a memory-bound GEMV wants as many bytes in flight per instruction as it can get; an fp16
element loaded alone moves 2 bytes per lane (64 bytes a warp), an int64 view of the same tensor
moves 8 (256 bytes a warp) in one instruction. Numba has no vector types, so the tensor is viewed as
int64 on the host (`tensor.view(torch.int64)`, last dim a multiple of the word's elements) and the
word is split here: on a GPU by LLVM bit casts (trunc + bitcast + fpext lower to cvt.f32.f16), in
the CUDA simulator by numpy views of the same bits.

`load_flat(array, index)`: element `index` (>= 0) of a C-contiguous array of any rank, counted from
its first element. Numba's own indexing computes an address per dimension and fixes up negative
indices in each; a kernel whose inner loop loads many words (the paged attention's K and V) spends
more instructions on that than on its arithmetic. Here an index is one offset from the data pointer,
so loads whose indices differ by constants share one address register (the constants become the
load's immediate offsets), and the load is marked invariant (the array must not change while the
kernel runs), so it can take the read-only path. `store_flat(array, index, value)` writes the same way. `load_flat_pair(array, index)`: elements `index` and `index + 1` of an
int64 array as one 16-byte load (index even, the data 16-byte aligned): half the load instructions
of two `load_flat`s, which LLVM does not merge by itself (it cannot prove the alignment).
`pack_f16x4(a, b, c, d)`: the word unpack_f16x4 reads back, each value rounded to float16 to nearest
(as a float32 stored into a float16 array is), for a kernel that stores words.
"""
from __future__ import annotations

import numpy as np
from numba import int64

from protospec.kernels.launch import interop
from protospec.kernels.launch.interop import cuda
from protospec.kernels.primitives.warp_mma import pack_half2

if interop.SIMULATOR:
    def _bits(word) -> np.ndarray:
        return np.array([int(word)], dtype=np.int64)

    @cuda.jit(device=True)
    def unpack_f16x4(word):
        """The four float16 values of an int64 word (lowest address first), as float32."""
        h = _bits(word).view(np.float16).astype(np.float32)
        return h[0], h[1], h[2], h[3]

    @cuda.jit(device=True)
    def load_flat(array, index):
        """array's element `index` in C order (read only)."""
        return array.reshape(-1)[index]

    @cuda.jit(device=True)
    def load_flat_pair(array, index):
        """array's elements `index` and `index + 1` in C order (read only)."""
        flat = array.reshape(-1)
        return flat[index], flat[index + 1]

    @cuda.jit(device=True)
    def store_flat(array, index, value):
        """array's element `index` in C order = value."""
        array.reshape(-1)[index] = value
else:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    def _fields(builder, word, width: int, count: int) -> list:
        i64 = ir.IntType(64)
        return [builder.trunc(builder.lshr(word, ir.Constant(i64, width * i)), ir.IntType(width)) for i in range(count)]

    @intrinsic
    def unpack_f16x4(typingctx, word):  # noqa: ARG001
        """The four float16 values of an int64 word (lowest address first), as float32."""
        signature = types.UniTuple(types.float32, 4)(word)

        def codegen(context, builder, sig, args):
            w = context.cast(builder, args[0], sig.args[0], types.int64)
            values = [builder.fpext(builder.bitcast(b, ir.HalfType()), ir.FloatType()) for b in _fields(builder, w, 16, 4)]
            return context.make_tuple(builder, sig.return_type, values)

        return signature, codegen

    def _flat_operands(array, index) -> bool:
        return isinstance(array, types.Array) and array.layout == "C" and isinstance(index, types.Integer)

    def _element_pointer(context, builder, sig, args):
        """The address of element args[1] of array args[0], counted in C order from its first."""
        data = context.make_array(sig.args[0])(context, builder, value=args[0]).data
        return builder.gep(data, [context.cast(builder, args[1], sig.args[1], types.int64)], inbounds=True)

    @intrinsic
    def load_flat(typingctx, array, index):  # noqa: ARG001
        """array's element `index` (>= 0) in C order (the array does not change while the kernel runs)."""
        if not _flat_operands(array, index):
            return None

        def codegen(context, builder, sig, args):
            value = builder.load(_element_pointer(context, builder, sig, args))
            value.set_metadata("invariant.load", builder.module.add_metadata([]))
            return value

        return array.dtype(array, index), codegen

    @intrinsic
    def load_flat_pair(typingctx, array, index):  # noqa: ARG001
        """array's elements `index` and `index + 1` (index even; int64, 16-byte aligned data) in one
        16-byte load, marked invariant as load_flat's."""
        if not _flat_operands(array, index) or array.dtype != types.int64:
            return None
        pair = types.UniTuple(types.int64, 2)

        def codegen(context, builder, sig, args):
            vector = ir.VectorType(ir.IntType(64), 2)
            pointer = builder.bitcast(_element_pointer(context, builder, sig, args), vector.as_pointer())
            value = builder.load(pointer, align=16)
            value.set_metadata("invariant.load", builder.module.add_metadata([]))
            halves = [builder.extract_element(value, ir.Constant(ir.IntType(32), i)) for i in range(2)]
            return context.make_tuple(builder, pair, halves)

        return pair(array, index), codegen

    @intrinsic
    def store_flat(typingctx, array, index, value):  # noqa: ARG001
        """array's element `index` (>= 0) in C order = value (converted to the array's dtype)."""
        if not _flat_operands(array, index):
            return None

        def codegen(context, builder, sig, args):
            element = context.cast(builder, args[2], sig.args[2], sig.args[0].dtype)
            builder.store(element, _element_pointer(context, builder, sig, args))
            return context.get_dummy_value()

        return types.void(array, index, value), codegen


@cuda.jit(device=True)
def load_words(array, index, out, at, pair):
    """out[at] <- array's word `index` (load_flat), and out[at + 1] <- word index + 1 in the same
    16-byte load with `pair` (load_flat_pair)."""
    if pair:
        out[at], out[at + 1] = load_flat_pair(array, index)
    else:
        out[at] = load_flat(array, index)


@cuda.jit(device=True)
def pack_f16x4(a, b, c, d):
    """An int64 word of four float16 values, a at the lowest address (unpack_f16x4's inverse)."""
    return int64(pack_half2(a, b)) | (int64(pack_half2(c, d)) << 32)

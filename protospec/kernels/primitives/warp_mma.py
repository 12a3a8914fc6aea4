"""Tensor-core matrix multiply-accumulate for Numba kernels: one warp, D[16x8] = A[16x16] B[16x8] + C.

Numba has no tensor-core API, so on a GPU these are inline PTX (`mma.sync.aligned.m16n8k16`, fp16
operands, fp32 accumulators; sm_80 and later) and `cvt.rn.f16x2.f32` to pack two floats into the
fp16 pair an operand register holds. The CUDA simulator cannot run PTX: there the same calls are
Python twins that exchange the warp's fragments through shared memory (every thread of the block
must call, as for reductions.xor_exchange).

Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16"), lane = 4 g + t (g = lane // 4, t = lane % 4);
each fp16 operand register holds two consecutive k elements, the lower k in the low half:
  A (row-major 16x16): a0 = A[g][2t : 2t+2], a1 = A[g+8][2t : 2t+2], a2 = A[g][2t+8 : 2t+10], a3 = A[g+8][2t+8 : 2t+10]
  B (16x8, by column):  b0 = B[2t : 2t+2][g],  b1 = B[2t+8 : 2t+10][g]
  C, D (16x8, fp32):    c0, c1 = C[g][2t], C[g][2t+1];  c2, c3 = C[g+8][2t], C[g+8][2t+1]
"""
from __future__ import annotations

import numpy as np

from protospec.kernels.launch import interop
from protospec.kernels.launch.interop import cuda

# uint32 slots per lane in the simulator's exchange: a0..a3, b0, b1
SCRATCH_PER_LANE = 6


def scratch_size(warps: int) -> int:
    """Length of the uint32 shared array the simulator's twin exchanges fragments through (1 on a
    GPU, where the product reads registers and the array is an unused placeholder)."""
    return warps * 32 * SCRATCH_PER_LANE if interop.SIMULATOR else 1


if interop.SIMULATOR:
    # Where each operand element sits in the exchanged fragments [lane, register, half] (the layout above):
    # A[row][k]: lane (row % 8) * 4 + (k % 8) // 2, register (row >= 8) + 2 (k >= 8), half k % 2
    # B[k][col]: lane col * 4 + (k % 8) // 2,       register 4 + (k >= 8),            half k % 2
    _ROW, _K = np.meshgrid(np.arange(16), np.arange(16), indexing="ij")
    _A_AT = ((_ROW % 8) * 4 + (_K % 8) // 2, (_ROW >= 8) + 2 * (_K >= 8), _K % 2)          # [16, 16] each
    _KB, _COL = np.meshgrid(np.arange(16), np.arange(8), indexing="ij")
    _B_AT = (_COL * 4 + (_KB % 8) // 2, 4 + (_KB >= 8), _KB % 2)                          # [16, 8] each

    @cuda.jit(device=True)
    def mma_f16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, scratch, tid):
        """(d0, d1, d2, d3): this lane's D fragment of A B + C (every thread of the block calls)."""
        lane, base = tid % 32, (tid // 32) * 32 * SCRATCH_PER_LANE
        cuda.syncthreads()
        for slot, word in enumerate((a0, a1, a2, a3, b0, b1)):
            scratch[base + lane * SCRATCH_PER_LANE + slot] = int(word) & 0xFFFFFFFF
        cuda.syncthreads()
        words = np.asarray(scratch[base : base + 32 * SCRATCH_PER_LANE], dtype=np.uint32)
        halves = words.view(np.float16).astype(np.float64).reshape(32, SCRATCH_PER_LANE, 2)
        a, b = halves[_A_AT], halves[_B_AT]  # [16, 16], [16, 8]; float64 sums of fp16 products are exact
        g, t = lane // 4, lane % 4
        out = [np.float32(float(c) + float(a[g + 8 * (i // 2)] @ b[:, 2 * t + i % 2]))
               for i, c in enumerate((c0, c1, c2, c3))]
        return out[0], out[1], out[2], out[3]

    @cuda.jit(device=True)
    def pack_half2(lo, hi):
        """uint32 holding fp16(lo) in the low half and fp16(hi) in the high half (round to nearest)."""
        return np.array([lo, hi], dtype=np.float16).view(np.uint32)[0]
else:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    _MMA = ("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
            "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};")

    @intrinsic
    def mma_f16(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, scratch, tid):  # noqa: ARG001
        """(d0, d1, d2, d3): this lane's D fragment of A B + C. The integer operands are truncated to
        32 bits (the fp16 pairs); scratch and tid serve only the simulator's twin."""
        signature = types.UniTuple(types.float32, 4)(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, scratch, tid)

        def codegen(context, builder, sig, args):
            words = [context.cast(builder, v, t, types.uint32) for v, t in zip(args[:6], sig.args[:6])]
            accs = [context.cast(builder, v, t, types.float32) for v, t in zip(args[6:10], sig.args[6:10])]
            f32, i32 = ir.FloatType(), ir.IntType(32)
            fn = ir.FunctionType(ir.LiteralStructType([f32] * 4), [i32] * 6 + [f32] * 4)
            result = builder.call(ir.InlineAsm(fn, _MMA, "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f"), words + accs)
            return context.make_tuple(builder, sig.return_type, [builder.extract_value(result, i) for i in range(4)])

        return signature, codegen

    @intrinsic
    def pack_half2(typingctx, lo, hi):  # noqa: ARG001
        """uint32 holding fp16(lo) in the low half and fp16(hi) in the high half (round to nearest)."""
        signature = types.uint32(lo, hi)

        def codegen(context, builder, sig, args):
            lo_f, hi_f = (context.cast(builder, v, t, types.float32) for v, t in zip(args, sig.args))
            fn = ir.FunctionType(ir.IntType(32), [ir.FloatType()] * 2)
            return builder.call(ir.InlineAsm(fn, "cvt.rn.f16x2.f32 $0, $1, $2;", "=r,f,f"), [hi_f, lo_f])

        return signature, codegen


@cuda.jit(device=True)
def store_fragment(out, at, c0, c1, c2, c3):
    """A lane's four C / D values of one product into out[at .. at + 3] (float32, shared or global)."""
    out[at] = c0
    out[at + 1] = c1
    out[at + 2] = c2
    out[at + 3] = c3

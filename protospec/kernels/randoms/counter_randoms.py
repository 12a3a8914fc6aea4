"""A spec step's random numbers for the whole batch in one pass: a counter-based generator.

Every number is a hash of (the request's 64-bit key for this step, the number's index), so one
kernel fills the batch's [B, 2k + 1, V] Exp(1) noise and [B, k] uniforms, where a draw per request
from its own torch generator costs two launches per request (at batch 64, 128 launches and ~90 MB
written in pieces). A request's numbers depend on its key only, never on its row or its
neighbours, so seeded outputs stay the same whatever batch a request runs in.

The hash is Wellons' "lowbias32" integer finaliser, applied twice (index mixed with the key's low
half, then with its high half). The torch twin (`fill_torch`) computes the very same integers with
int64 ops whose products stay below 2^63 (the constant is split in 16-bit halves), so the CPU path
and the kernel give the same numbers (the float log may differ in the last bit).

Floats from a 32-bit hash h:
  uniform     (h >> 8) * 2^-24                  in [0, 1)   (the accept tests: u < p / q)
  Exp(1)      -log(((h >> 9) + 0.5) * 2^-23)    in (0, 16.6] (never 0: probs / noise stays finite)
"""
from __future__ import annotations

import math

import numpy as np
import torch
from numba import float32, int32, uint64

from protospec.kernels.launch import interop
from protospec.kernels.launch.interop import check_tensor, cuda
from protospec.kernels.primitives.divisions import block_row_and_part, divide32

MASK32 = 0xFFFFFFFF
MULT_A, MULT_B = 0x7FEB352D, 0x846CA68B  # lowbias32's multipliers
KEY_MIX = 0x9E3779B9                     # 2^32 / golden ratio: spreads consecutive indices
THREADS = 256
PER_THREAD = 8  # numbers per thread: a block writes 8 KB of noise
# Numba types int64 (op) uint64 as float64: every integer in the kernel is uint64, constants included.
_MASK32, _MULT_A, _MULT_B, _KEY_MIX = (np.uint64(c) for c in (MASK32, MULT_A, MULT_B, KEY_MIX))


def split_key(key: int) -> tuple[int, int]:
    """A 64-bit key as its (low, high) 32-bit halves, the layout the kernel reads."""
    key &= (1 << 64) - 1
    return key & MASK32, key >> 32


# ---- the kernel ----------------------------------------------------------------------------------
# Numba types integer arithmetic at 64 bits, so the hash written as Python is 64-bit shifts, xors and
# multiplies on a GPU (two or three instructions each, where 32-bit ones take one). There it is built
# as 32-bit LLVM IR instead: the same integers, since a 32-bit multiply keeps exactly the product's low
# half, which is what the masks keep. The simulator runs the Python form.
if interop.SIMULATOR:
    @cuda.jit(device=True)
    def _lowbias32(x):
        x ^= x >> uint64(16)
        x = (x * _MULT_A) & _MASK32
        x ^= x >> uint64(15)
        x = (x * _MULT_B) & _MASK32
        x ^= x >> uint64(16)
        return x

    @cuda.jit(device=True)
    def hash32(index, key_lo, key_hi):
        """The hash of (index, key) as a uint64 in [0, 2^32) (key_lo, key_hi < 2^32)."""
        h = _lowbias32(((index * _KEY_MIX) & _MASK32) ^ key_lo)
        return _lowbias32(h ^ key_hi)
else:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    def _word(value: int) -> ir.Constant:
        """A 32-bit constant, written signed (LLVM reads an i32 literal as signed)."""
        return ir.Constant(ir.IntType(32), value - (1 << 32) if value >= 1 << 31 else value)

    def _lowbias32_ir(builder, x):
        x = builder.xor(x, builder.lshr(x, _word(16)))
        x = builder.mul(x, _word(MULT_A))
        x = builder.xor(x, builder.lshr(x, _word(15)))
        x = builder.mul(x, _word(MULT_B))
        return builder.xor(x, builder.lshr(x, _word(16)))

    @intrinsic
    def hash32(typingctx, index, key_lo, key_hi):  # noqa: ARG001
        """The hash of (index, key) as a uint64 in [0, 2^32) (key_lo, key_hi < 2^32): 32-bit operations."""
        if not all(isinstance(a, types.Integer) for a in (index, key_lo, key_hi)):
            return None

        def codegen(context, builder, sig, args):
            words = [builder.trunc(context.cast(builder, a, t, types.uint64), ir.IntType(32))
                     for a, t in zip(args, sig.args)]
            h = _lowbias32_ir(builder, builder.xor(builder.mul(words[0], _word(KEY_MIX)), words[1]))
            return builder.zext(_lowbias32_ir(builder, builder.xor(h, words[2])), ir.IntType(64))

        return types.uint64(index, key_lo, key_hi), codegen


@cuda.jit(device=True)
def exponential(index, key_lo, key_hi):
    """Number `index` of a key as Exp(1): what the fill writes there, for a kernel that draws its own.
    (h >> 9 < 2^23 converts exactly from a 32-bit integer, a cheaper conversion than from 64 bits.)"""
    u = (float32(int32(hash32(index, key_lo, key_hi) >> uint64(9))) + float32(0.5)) * float32(2.0 ** -23)
    return -math.log(u)


@cuda.jit
def fill_randoms_kernel(keys, noise, uniforms, first):
    """keys [B, 2] int64 (low, high halves) -> noise [B, R * V] f32 Exp(1), uniforms [B, k] f32 U[0, 1).
    Number first + i of a request: noise[i] for i < R * V, then uniforms[i - R * V]. The grid is B
    equal runs of blocks, one run per request (one division per block, none per number)."""
    n_noise, k = noise.shape[1], uniforms.shape[1]
    per_request = n_noise + k
    chunk = cuda.blockDim.x * PER_THREAD
    runs, _ = divide32(per_request + chunk - 1, chunk)
    b, run = block_row_and_part(runs)
    start = run * chunk + cuda.threadIdx.x
    key_lo, key_hi = uint64(keys[b, 0]), uint64(keys[b, 1])
    for j in range(PER_THREAD):
        i = start + j * cuda.blockDim.x
        if i < per_request:
            if i < n_noise:
                noise[b, i] = exponential(uint64(first + i), key_lo, key_hi)
            else:
                h = hash32(uint64(first + i), key_lo, key_hi)
                uniforms[b, i - n_noise] = float32(int32(h >> uint64(8))) * float32(2.0 ** -24)


def fill_kernel(keys: torch.Tensor, noise: torch.Tensor, uniforms: torch.Tensor, first: int = 0) -> None:
    """Fill noise [B, R, V] and uniforms [B, k] (float32, on the kernels' device) from keys [B, 2] int64:
    numbers first .. first + R V + k of each key (first > 0: the uniforms alone, R = 0, where the kernels
    that read the noise draw it from the keys themselves)."""
    check_tensor("keys", keys, torch.int64, 2)
    check_tensor("noise", noise, torch.float32, 3, rows=keys.shape[0])
    check_tensor("uniforms", uniforms, torch.float32, 2, rows=keys.shape[0])
    batch, per_request = keys.shape[0], noise[0].numel() + uniforms.shape[1]
    if batch == 0 or per_request == 0:
        return
    threads = min(THREADS, per_request) if interop.SIMULATOR else THREADS
    runs = -(-per_request // (threads * PER_THREAD))
    interop.launch_tensors(fill_randoms_kernel, batch * runs, threads, [keys, noise.view(batch, -1), uniforms, int(first)])


# ---- the torch twin ------------------------------------------------------------------------------
def _mul32(x: torch.Tensor, const: int) -> torch.Tensor:
    """(x * const) mod 2^32 for x < 2^32 in int64 without overflow: const in 16-bit halves."""
    lo, hi = const & 0xFFFF, const >> 16
    return (x * lo + ((x * hi) & 0xFFFF) * 65536) & MASK32


def _lowbias32_torch(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, MULT_A)
    x = x ^ (x >> 15)
    x = _mul32(x, MULT_B)
    return x ^ (x >> 16)


def hash_torch(index: torch.Tensor, key_lo: torch.Tensor, key_hi: torch.Tensor) -> torch.Tensor:
    """The kernel's hash in int64 torch ops (every value in [0, 2^32))."""
    return _lowbias32_torch(_lowbias32_torch(_mul32(index, KEY_MIX) ^ key_lo) ^ key_hi)


def fill_torch(keys: torch.Tensor, rows: int, vocab: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """keys [B, 2] int64 -> (noise [B, rows, V], uniforms [B, k]) float32, the kernel's numbers."""
    index = torch.arange(rows * vocab + k, dtype=torch.int64, device=keys.device)  # [N]
    h = hash_torch(index[None, :], keys[:, :1], keys[:, 1:])                       # [B, N]
    u = ((h[:, : rows * vocab] >> 9).to(torch.float32) + 0.5) * 2.0 ** -23
    noise = u.log_().neg_().view(-1, rows, vocab)
    uniforms = (h[:, rows * vocab :] >> 8).to(torch.float32) * 2.0 ** -24
    return noise, uniforms

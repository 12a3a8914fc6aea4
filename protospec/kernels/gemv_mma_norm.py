"""The RMSNorm of the tensor-core GEMV's normed forms, and the final norm as a kernel of its own.

gemv_mma_kernel's normed forms fold `rms_norm(x + residual) * w` into x's loads: every block
recomputes the norm of its token rows from their words. The device functions here are that
arithmetic, shared by the fused forms and by `head_norm_kernel`, which runs it once, in one block,
and writes the normed rows; the plain GEMV then reads them. Same lane layout (warp w, lane (g, t):
token g, words w * 48 + 4t + 16c + j), same order of the sum of squares, same roundings: the LM head
gets the same bits either way (a GPU test compares them).

Why not in the head: the LM head is the one GEMV launched in waves (2000 blocks of 16 vocabulary
rows, 3 an SM at the fused form's registers), so its prologue (x and residual loads after the wait,
the reduction, a barrier) is paid by every block; the plain form needs fewer registers, and its
blocks only load x. Launched as a dependent that lets the next kernel start at once, the norm kernel
runs while the head's first wave issues its weight loads. `norm_rows_function` holds the arithmetic
for both places that run it once: this kernel, and the last block of the down projection that
writes the rows (gemv_mma_kernel's NORM_TAIL), which saves the launch.
"""
from __future__ import annotations

import functools
import math

import numpy as np
from numba import float32, int64

from protospec.kernels import interop
from protospec.kernels.dependent_launch import allow_dependent_launch, grid_dependency_wait
from protospec.kernels.interop import cuda
from protospec.kernels.reductions import xor_exchange
from protospec.kernels.warp_mma import pack_half2
from protospec.kernels.word_loads import load_flat, load_flat_mutable, store_flat, unpack_f16x4

# The tensor-core GEMV's lane layout (gemv_mma_kernel.py takes it from here).
WARP = 32
MAX_TOKENS = 8        # token rows a block holds: the product's N (lane group g: token g)
CHUNK = 64            # columns a lane group of 4 covers per chunk (16 each)
CHUNKS_PER_WARP = 3   # a warp's chunks, every word loaded before the first product
WORDS = CHUNKS_PER_WARP * 4  # 8-byte words a lane loads per weight row (and per x row)
MAX_WARPS = 32
COLUMNS_PER_WARP = CHUNK * CHUNKS_PER_WARP


@cuda.jit(device=True)
def summed(x_word, r_word, e, residual):
    """Element e of x's word (plus the residual's, rounded to float16 as add_rms_norm stores it), float32."""
    v = unpack_f16x4(x_word)[e]
    if residual:
        v = float32(np.float16(v + unpack_f16x4(r_word)[e]))
    return v


@cuda.jit(device=True)
def block_inv_rms(xw, rw, residual, g, t, warp, warps, tokens, k_words, eps, squares, shuffle_scratch, tid):
    """1 / rms of token g's row (x + residual with `residual`) over the block's K = 4 k_words columns,
    in every lane of token g. xw, rw [WORDS] int64: the lane's words; squares [warps * MAX_TOKENS]
    float32 shared. Lane groups past the tokens add nothing (their value is unused)."""
    sq = float32(0.0)
    for c in range(CHUNKS_PER_WARP):  # a 16-column tile (4 words) at a time, each summed from 0: the order in
        tile = float32(0.0)           # which a producer's per-tile sums (tile_squares) give the same bits
        for i in range(4 * c, 4 * c + 4):
            for e in range(4):
                v = summed(xw[i], rw[i], e, residual)
                tile += v * v
        sq += tile
    sq = sq if g < tokens else float32(0.0)
    sq += xor_exchange(sq, 1, shuffle_scratch, tid)          # the 4 lanes of token g: the warp's K
    sq += xor_exchange(sq, 2, shuffle_scratch, tid)
    if t == 0:
        squares[warp * MAX_TOKENS + g] = sq
    cuda.syncthreads()
    total = float32(0.0)
    for w in range(warps):
        total += squares[w * MAX_TOKENS + g]
    return float32(1.0) / math.sqrt(total / float32(4 * k_words) + float32(eps))


@cuda.jit(device=True)
def tile_squares(values, token):
    """The sum of squares of one token's 16 values of a tile, values [MAX_TOKENS * 16] float32 (token-major,
    the tile's rows in order), summed from 0 in row order: block_inv_rms's per-tile term, same bits."""
    tile = float32(0.0)
    for r in range(16):
        v = values[token * 16 + r]
        tile += v * v
    return tile


@cuda.jit(device=True)
def load_row_squares(squares, tiles, row, t, warps, out):
    """The per-tile sums of squares block_inv_rms's lanes of this lane group would compute, for token row
    `row`: out[w * CHUNKS_PER_WARP + c] <- squares[row, w * 12 + 4c + t] (the tile of warp w's chunk c:
    words 4t..4t+3), squares [R * tiles] float32, R rows of `tiles` 16-column tiles (tile_squares')."""
    for w in range(warps):
        for c in range(CHUNKS_PER_WARP):
            out[w * CHUNKS_PER_WARP + c] = load_flat(squares, row * tiles + w * (4 * CHUNKS_PER_WARP) + 4 * c + t)


@cuda.jit(device=True)
def inv_rms_from_squares(sq_tiles, g, warps, tokens, k_words, eps, shuffle_scratch, tid):
    """block_inv_rms from the loaded per-tile sums (load_row_squares), without the block's reduction:
    every warp adds all warps' lane sums itself, in block_inv_rms's order, so the bits are its bits."""
    total = float32(0.0)
    for w in range(warps):
        sq = float32(0.0)
        for c in range(CHUNKS_PER_WARP):
            sq += sq_tiles[w * CHUNKS_PER_WARP + c]
        sq = sq if g < tokens else float32(0.0)
        sq += xor_exchange(sq, 1, shuffle_scratch, tid)
        sq += xor_exchange(sq, 2, shuffle_scratch, tid)
        total += sq
    return float32(1.0) / math.sqrt(total / float32(4 * k_words) + float32(eps))


@cuda.jit(device=True)
def normed_halves(x_word, r_word, norm_word, inv_rms, residual):
    """The B fragment's two fp16 pairs of one word: norm_weight * (v * inv_rms), v = x (+ residual)."""
    v0, v1 = summed(x_word, r_word, 0, residual), summed(x_word, r_word, 1, residual)
    v2, v3 = summed(x_word, r_word, 2, residual), summed(x_word, r_word, 3, residual)
    n0, n1, n2, n3 = unpack_f16x4(norm_word)
    return pack_half2(n0 * (v0 * inv_rms), n1 * (v1 * inv_rms)), pack_half2(n2 * (v2 * inv_rms), n3 * (v3 * inv_rms))


@functools.cache
def norm_rows_function(mutable: bool):
    """The device function both final-norm forms run, every thread of one block calling it:
    out[i] = rms_norm(x[x_rows[i]] + residual[x_rows[i]]) * norm_weight, float16, for i < tokens
    (<= MAX_TOKENS), K = 192 x norm_warps; warps past norm_warps (a wider block's) load and store
    nothing. mutable: x was written by the calling kernel's other blocks (loads without the invariant
    mark, which lets the compiler move them above those writes' fences)."""
    load_x = load_flat_mutable if mutable else load_flat

    @cuda.jit(device=True)
    def norm_rows(x64, res64, residual, x_rows, norm64, eps, tokens, out64, norm_warps, squares, shuffle_scratch,
                  tid):
        """x64, res64 [R, K / 4] int64 (float16 words); x_rows [T] int64; norm64 [K / 4] int64;
        out64 [T, K / 4] int64 <- the normed rows. squares [>= warps x MAX_TOKENS] float32 and
        shuffle_scratch [threads] float32: shared."""
        k_words = x64.shape[1]
        warp, lane = tid // WARP, tid % WARP
        g, t = lane // 4, lane % 4
        first = warp * (COLUMNS_PER_WARP // 4) + 4 * t
        active = warp < norm_warps
        row = x_rows[min(g, tokens - 1)]
        xw = cuda.local.array(WORDS, int64)
        rw = cuda.local.array(WORDS, int64)
        nw = cuda.local.array(WORDS, int64)
        for i in range(WORDS):  # the norm weight's words go out with x's: not a load after the reduction
            word = first + 16 * (i // 4) + i % 4
            xw[i] = load_x(x64, row * k_words + word) if active else int64(0)
            rw[i] = load_flat(res64, row * k_words + word) if residual and active else int64(0)
            nw[i] = load_flat(norm64, word) if active else int64(0)
        inv_rms = block_inv_rms(xw, rw, residual, g, t, warp, norm_warps, tokens, k_words, eps, squares,
                                shuffle_scratch, tid)
        if g < tokens and active:
            for i in range(WORDS):
                word = first + 16 * (i // 4) + i % 4
                lo, hi = normed_halves(xw[i], rw[i], nw[i], inv_rms, residual)
                store_flat(out64, g * k_words + word, int64(lo) | (int64(hi) << 32))

    return norm_rows


@functools.cache
def head_norm_kernel(warps: int, residual: bool, dependent: bool):
    """One block of `warps` warps (K = 192 x warps): out[i] = rms_norm(x[x_rows[i]] + residual[x_rows[i]])
    * norm_weight, float16, for i < tokens (<= MAX_TOKENS). DEPENDENT: waits for the kernel before it,
    then lets the next one start at once (its weight loads overlap this kernel). The norm weight is
    read after the wait: a form that loaded it before a branch-pinned wait (as the GEMVs pin theirs)
    decoded other tokens in the engine, because the compiler sank those loads and ptxas moved loads
    above the wait instead (NOTES.md)."""
    options = {} if interop.SIMULATOR else {"fastmath": True}  # gemv_mma_kernel's: the same instructions
    RESIDUAL, DEPENDENT = residual, dependent  # noqa: N806
    THREADS, SQUARES = warps * WARP, warps * MAX_TOKENS  # noqa: N806 (literal sizes for the typer)
    norm_rows = norm_rows_function(False)

    def head_norm(x64, res64, x_rows, norm64, eps, tokens, out64):
        """x64, res64 [R, K / 4] int64 (float16 words); x_rows [T] int64; norm64 [K / 4] int64;
        out64 [T, K / 4] int64 <- the normed rows."""
        if DEPENDENT:
            grid_dependency_wait()
            allow_dependent_launch()
        shuffle_scratch = cuda.shared.array(THREADS, float32)
        squares = cuda.shared.array(SQUARES, float32)
        norm_rows(x64, res64, RESIDUAL, x_rows, norm64, eps, tokens, out64, warps, squares, shuffle_scratch,
                  cuda.threadIdx.x)

    head_norm.__name__ = head_norm.__qualname__ = (f"head_norm_k{warps * COLUMNS_PER_WARP}"
                                                   + ("_residual" if residual else "") + ("_dep" if dependent else ""))
    return cuda.jit(**options)(head_norm)


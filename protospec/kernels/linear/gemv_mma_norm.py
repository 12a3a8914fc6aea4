"""The RMSNorm of the tensor-core GEMV's normed forms, and the per-tile sums of squares of the final norm.

gemv_mma_kernel's normed forms fold `rms_norm(x + residual) * w` into x's loads: every block
recomputes the norm of its token rows from their words (lane layout: warp w, lane (g, t): token g,
words w * 48 + 4t + 16c + j). The final norm, before the LM head, is not recomputed by the head's
~2000 blocks: the last down projection writes its output's 16-column tiles' sums of squares
(tile_squares, in block_inv_rms's order), and the plain LM head, its weight times the norm's, scales
each row by 1 / rms from them (load_row_squares, inv_rms_from_squares).
"""
from __future__ import annotations

import math

import numpy as np
from numba import float32

from protospec.kernels.launch.interop import cuda
from protospec.kernels.primitives.reductions import xor_exchange
from protospec.kernels.primitives.warp_mma import pack_half2
from protospec.kernels.primitives.word_loads import load_flat, unpack_f16x4

# The tensor-core GEMV's lane layout (linear/gemv_mma_kernel.py takes it from here).
WARP = 32
BLOCK_TOKENS = 8      # token rows a block holds: the product's N (lane group g: token g)
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
    in every lane of token g. xw, rw [WORDS] int64: the lane's words; squares [warps * BLOCK_TOKENS]
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
        squares[warp * BLOCK_TOKENS + g] = sq
    cuda.syncthreads()
    total = float32(0.0)
    for w in range(warps):
        total += squares[w * BLOCK_TOKENS + g]
    return float32(1.0) / math.sqrt(total / float32(4 * k_words) + float32(eps))


@cuda.jit(device=True)
def tile_squares(values, token):
    """The sum of squares of one token's 16 values of a tile, values [BLOCK_TOKENS * 16] float32 (token-major,
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

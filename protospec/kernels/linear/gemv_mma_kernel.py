"""y = x @ W.T on tensor cores for a few token rows (T <= MAX_ROWS), float16.

    x [T, K] float16, W [N, K] float16 (nn.Linear's layout), y [T, N] float16; K a multiple of
    CHUNK x CHUNKS_PER_WARP (192: 768 and 3072 are), at most MAX_WARPS warps' worth.

Why: at 6 tokens a CUDA-core GEMV loses to cuBLAS; a tensor-core product takes a 16x16
weight tile and 8 token columns, so the loads set the pace again. Layout: one `mma.m16n8k16`
(primitives/warp_mma.py) with A = a 16-row x 16-column weight tile, B = x^T (16 columns x 8 tokens), D = 16
output rows x 8 tokens. A block owns 16 output rows and 8 token rows (the grid: row tiles x token
tiles, a row tile's token tiles adjacent so its weights are read from memory once and from L2 after);
its warps split K,
each covering CHUNKS_PER_WARP chunks of 64 columns, and every weight word a warp needs is loaded
before its first product (bytes in flight are what a memory-bound kernel needs). The sum over k does
not care in which order the columns go into the products, so they go in the order that makes the
loads wide: in a chunk of 16 8-byte words a row, lane (g, t) (g = lane // 4, t = lane % 4) reads
words 4t..4t+3 of rows g and g + 8 (32 contiguous bytes; the lane group all 16), and word j feeds
product j as the A fragment's "k = 2t" pair (low half) and "k = 2t + 8" pair (high half); the lane's
x word at the same columns of token g feeds B the same way (an instruction's four lanes spread over
one 32-byte sector instead, words t, t + 4, ... a lane, timed slower). Tokens past T feed zeros; rows
past N read row N - 1 and are not written. The warps' D fragments are summed in shared memory.

Fused forms, for a decoder layer's chain (model/layer_kernels.py, linear="mma_fused"):
  norm (+ residual): x + residual, then the RMSNorm, applied to x's words as they are loaded, with
      layer_ops.add_rms_norm's roundings. Each warp's lanes hold its K range for their token, so the
      sum of squares needs only two shuffles and one pass over the warps' sums in shared memory; block
      0 also writes x + residual, the residual stream the next layer adds to.
  glu: W = [gate; up] rows [2I, K]; a block multiplies 16 gate rows and the 16 matching up rows by the
      same x fragments and writes silu(gate) * up, the input of the down projection.
  rope (the qkv projection): a tile's rows g and g + 8 are a head's dims i and i + d/2, the pair HF's
      rotate-half RoPE mixes, so the lane holding D[g] holds its partner and rotates both in the epilogue:
      q goes to y [T, h * d], k and v straight into the paged cache (layer_ops.rope_and_cache's work).
  x_rows: token i's x row is x[x_rows[i]]: the embedding table gathered by token ids in the first
      layer's qkv, the rows whose logits are wanted in the LM head (there with a float32 y).
linear/gemv_mma.py launches it (argument checks), linear/gemv_mma_twin.py is its torch twin, tools/gemv_cost.py times it."""
from __future__ import annotations

import functools
import math

import numpy as np
from numba import float32, int64, uint32

from protospec.kernels.launch import interop
from protospec.kernels.launch.interop import cuda
from protospec.kernels.linear.gemv_mma_norm import (BLOCK_TOKENS, CHUNKS_PER_WARP, COLUMNS_PER_WARP, MAX_WARPS,  # noqa: F401
                                             WARP, WORDS, block_inv_rms, inv_rms_from_squares, load_row_squares,
                                             normed_halves, summed, tile_squares)
from protospec.kernels.linear.gemv_mma_rope import rope_and_store, rope_inputs
from protospec.kernels.linear.gemv_mma_shapes import MAX_ROWS, check_forms, supports, variant_name, warps_for  # noqa: F401
from protospec.kernels.primitives.warp_mma import mma_f16, pack_half2, scratch_size, store_fragment
from protospec.kernels.primitives.word_loads import load_flat, load_words, store_flat, unpack_f16x4
from protospec.kernels.launch.dependent_launch import allow_dependent_launch, grid_dependency_wait, wait_after_issued_loads

TILE_ROWS = 16        # output rows per block: the product's M
LOW32 = 0xFFFFFFFF


@functools.cache
def gemv_mma_kernel(warps: int, norm: bool = False, residual: bool = False, glu: bool = False,
                    gather: bool = False, rope_dim: int = 0, dependent: bool = False, allow_early: bool = False,
                    squares_out: bool = False, squares_scale: bool = False, wide_loads: bool = False,
                    float_out: bool = False, rope_early: bool = False):
    """The kernel for blocks of `warps` warps (K = 192 x warps); NORM folds the RMSNorm (after adding
    the residual with RESIDUAL) into x's loads; GLU computes silu(gate) * up from a [2I, K] weight;
    GATHER reads token i's x (and residual) row x_rows[i]; ROPE_DIM (the head size; 0 = off) rotates
    q and k and stores k and v in the cache; DEPENDENT loads the weights, then waits for the kernel
    before it (a programmatic dependent launch: launch/dependent_launch.py) and only then reads x.
    With NORM the norm's weight words are loaded with the weights, before the wait (not after the
    norm's reduction: timed faster). ALLOW_EARLY (with DEPENDENT) lets the next kernel launch once this
    one's weight loads are issued, before its wait: only where the next kernel reads nothing before its
    own wait that a kernel still running may write (a GEMV reads weights there; the attention's early
    loads read cached keys). A dependent form without it keeps its wait below the weight loads in the
    machine code (ptxas hoists a plain wait above them: dependent_launch.wait_after_issued_loads), so
    the weights stream while the kernel before ends. SQUARES_OUT: y = x W^T + residual and its tiles'
    sums of squares a token; SQUARES_SCALE: y's rows times 1 / rms of x's rows from such sums (the
    norm's weight folded into W by the caller): with the two, the final norm between the last down
    projection and the LM head needs no launch and no reduction in the LM head's ~2000 blocks.
    WIDE_LOADS: 16-byte weight loads (half the load instructions; same bits); FLOAT_OUT: float32 y (the
    LM head's logits) from the accumulator, not rounded to float16. ROPE_EARLY: the epilogue's positions,
    slots and cos / sin rows loaded before the wait (RopeCache.inputs_before_wait)."""
    options = {} if interop.SIMULATOR else {"fastmath": True}
    check_forms(norm, glu, gather, rope_dim, squares_out, squares_scale)
    NORM, RESIDUAL, GLU, GATHER, ROPE_DIM, DEPENDENT = norm, residual, glu, gather, rope_dim, dependent  # noqa: N806
    NORM_WORDS = WORDS if norm else 1  # noqa: N806
    HALF, GROUPS = rope_dim // 2, max(1, rope_dim // 16)  # GROUPS: blocks (8 dim pairs each) per head
    SCRATCH = scratch_size(warps)     # array sizes must be literals to the typer: products taken here
    PRODUCTS = 2 if glu else 1
    PARTIALS = warps * WARP * 4 * PRODUCTS  # each lane's D fragments, per warp
    SQUARES = warps * BLOCK_TOKENS    # each warp's sum of squares per token
    THREADS = warps * WARP
    UP_WORDS = WORDS if glu else 1
    ALLOW_EARLY = dependent and allow_early  # noqa: N806
    PIN_LOADS = dependent and not allow_early  # noqa: N806
    SQUARES_OUT, SQUARES_SCALE = squares_out, squares_scale  # noqa: N806
    WIDE, LOAD_WORDS, FLOAT_OUT = wide_loads, 2 if wide_loads else 1, float_out  # noqa: N806
    ROW_WORDS, SQUARE_TILES = (4 if squares_out else 1), (warps * CHUNKS_PER_WARP if squares_scale else 1)  # noqa: N806
    TILE_VALUES = BLOCK_TOKENS * TILE_ROWS if squares_out else 1  # noqa: N806
    ROPE_EARLY = rope_dim and rope_early  # noqa: N806

    def gemv_mma(x64, x_rows, res64, norm64, eps, w64, all_tokens, y, res_out64, positions, cos, sin, kv_cache, slots,
                 row_squares):
        """x64, res64 [R, K / 4] int64 (float16 words; R = T unless GATHER); x_rows [T] int64 (GATHER);
        norm64 [K / 4] int64; w64 [N (2I with GLU), K / 4] int64; y [T, N (I; h * d with ROPE)] float16
        or float32; res_out64 [T, K / 4] int64 <- x + residual (NORM; block 0 writes it).
        ROPE: positions [T] int64, cos / sin [P, d], kv_cache [2, blocks, block_size, kvh, d], slots [T]
        int64 (-1: no store). SQUARES_OUT: res64 [T, N / 4] the residual, row_squares [T, N / 16] float32
        <- y's tiles' sums of squares. SQUARES_SCALE: row_squares [R, K / 16] float32, x's rows'.
        """
        n_rows, k_words = w64.shape[0] // PRODUCTS, w64.shape[1]
        tid = cuda.threadIdx.x
        warp, lane = tid // WARP, tid % WARP
        g, t = lane // 4, lane % 4
        # A row tile's token tiles are adjacent blocks (its weights come from L2 after the first). The
        # division is 32-bit and skipped at one token tile: a 64-bit one by a runtime value is a
        # subroutine call, ahead of every load of the block.
        token_tiles = uint32(all_tokens + BLOCK_TOKENS - 1) // uint32(BLOCK_TOKENS)
        block = uint32(cuda.blockIdx.x)
        tile = int64(block // token_tiles) if token_tiles > uint32(1) else int64(block)
        tok0 = (int64(block) - tile * int64(token_tiles)) * BLOCK_TOKENS  # this block's first token row
        tokens = min(BLOCK_TOKENS, all_tokens - tok0)                # ... and its count (the lane groups past it: zeros)
        n0 = tile * TILE_ROWS
        head = tile // GROUPS                                        # ROPE: this block's head ...
        dim = (tile % GROUPS) * 8 + g                                # ... and the lane's dim pair (dim, dim + d/2)
        if ROPE_DIM:
            row_lo = head * ROPE_DIM + dim
            row_hi = row_lo + HALF
        else:
            row_lo = min(n0 + g, n_rows - 1)
            row_hi = min(n0 + g + 8, n_rows - 1)
        token = min(g, tokens - 1)                                   # a real row's words (zeroed below)
        first = warp * (COLUMNS_PER_WARP // 4) + 4 * t              # this lane's first word in a row
        w_lo = cuda.local.array(WORDS, int64)
        w_hi = cuda.local.array(WORDS, int64)
        u_lo = cuda.local.array(UP_WORDS, int64)                     # GLU: the up rows (gate rows in w_*)
        u_hi = cuda.local.array(UP_WORDS, int64)
        xw = cuda.local.array(WORDS, int64)
        nw = cuda.local.array(NORM_WORDS, int64)                     # NORM: the norm weight's words
        rw = cuda.local.array(WORDS, int64)
        row_res = cuda.local.array(ROW_WORDS, int64)                 # SQUARES_OUT: the residual at D's 4 entries
        sq_tiles = cuda.local.array(SQUARE_TILES, float32)           # SQUARES_SCALE: x's row's per-tile sums
        tile_values = cuda.shared.array(TILE_VALUES, float32)          # SQUARES_OUT: y's tile a token
        angles = cuda.local.array(4, float32)                        # ROPE: cos, sin of tokens 2t, 2t + 1 ...
        slot_of = cuda.local.array(2, int64)                         # ... and their cache slots (rope_inputs)
        b_lo = cuda.local.array(WORDS, uint32)                       # B fragments: x (normalised) pairs
        b_hi = cuda.local.array(WORDS, uint32)
        mma_scratch = cuda.shared.array(SCRATCH, uint32)             # the simulator's products
        shuffle_scratch = cuda.shared.array(THREADS, float32)        # the simulator's shuffles
        partials = cuda.shared.array(PARTIALS, float32)
        squares = cuda.shared.array(SQUARES, float32)
        x_row = tok0 + token
        if GATHER and not DEPENDENT:
            x_row = x_rows[tok0 + token]
        for c in range(CHUNKS_PER_WARP):                             # every load before any product
            for j in range(4):
                word = first + 16 * c + j
                if j % LOAD_WORDS == 0:  # WIDE: words j and j + 1 of a row in one load
                    load_words(w64, row_lo * k_words + word, w_lo, c * 4 + j, WIDE)
                    load_words(w64, row_hi * k_words + word, w_hi, c * 4 + j, WIDE)
                    if GLU:
                        load_words(w64, (n_rows + row_lo) * k_words + word, u_lo, c * 4 + j, WIDE)
                        load_words(w64, (n_rows + row_hi) * k_words + word, u_hi, c * 4 + j, WIDE)
                if NORM:
                    nw[c * 4 + j] = load_flat(norm64, word)
                if not DEPENDENT:
                    xw[c * 4 + j] = load_flat(x64, x_row * k_words + word)
                    if RESIDUAL:
                        rw[c * 4 + j] = load_flat(res64, x_row * k_words + word)
        if ROPE_EARLY:  # written before the forward: loaded while the kernel before ends
            rope_inputs(positions, cos, sin, slots, t, dim, tok0, tokens, angles, slot_of)
        if DEPENDENT:  # the weights are in flight; x is the previous kernel's output
            if ALLOW_EARLY:
                allow_dependent_launch()
            if PIN_LOADS:
                wait_after_issued_loads(k_words)                     # not hoisted above the weight loads
            else:
                grid_dependency_wait()
            if not ALLOW_EARLY:
                allow_dependent_launch()
            if GATHER:
                x_row = x_rows[tok0 + token]
            for i in range(WORDS):
                word = first + 16 * (i // 4) + i % 4
                xw[i] = load_flat(x64, x_row * k_words + word)
                if RESIDUAL:
                    rw[i] = load_flat(res64, x_row * k_words + word)
        if ROPE_DIM and not ROPE_EARLY:  # with x's words, not in the epilogue
            rope_inputs(positions, cos, sin, slots, t, dim, tok0, tokens, angles, slot_of)
        if SQUARES_SCALE:  # with x's words: the same round trip
            load_row_squares(row_squares, k_words // 4, x_row, t, warps, sq_tiles)
        if SQUARES_OUT and warp == 0:  # the residual at this lane's D entries (rows n0 + g (+ 8), tokens 2t (+ 1))
            for i in range(4):
                n = min(n0 + g + 8 * (i // 2), n_rows - 1)
                row_res[i] = load_flat(res64, (tok0 + min(2 * t + i % 2, tokens - 1)) * (n_rows // 4) + n // 4)
        inv_rms = float32(1.0)
        if SQUARES_SCALE:
            inv_rms = inv_rms_from_squares(sq_tiles, g, warps, tokens, k_words, eps, shuffle_scratch, tid)
            if warp == 0 and t == 0:  # for warp 0's epilogue (after the partials' barrier)
                squares[g] = inv_rms
        elif NORM:  # v = x + residual, rounded as add_rms_norm stores it; 1 / rms over the block's K
            inv_rms = block_inv_rms(xw, rw, RESIDUAL, g, t, warp, warps, tokens, k_words, eps, squares,
                                    shuffle_scratch, tid)
        for i in range(WORDS):
            if NORM:
                word = first + 16 * (i // 4) + i % 4
                gw = nw[i]
                if tile == 0 and g < tokens:                         # the residual stream, once a token
                    v0, v1 = summed(xw[i], rw[i], 0, RESIDUAL), summed(xw[i], rw[i], 1, RESIDUAL)
                    v2, v3 = summed(xw[i], rw[i], 2, RESIDUAL), summed(xw[i], rw[i], 3, RESIDUAL)
                    store_flat(res_out64, (tok0 + g) * k_words + word, int64(pack_half2(v0, v1)) | (int64(pack_half2(v2, v3)) << 32))
                b_lo[i], b_hi[i] = normed_halves(xw[i], rw[i], gw, inv_rms, RESIDUAL)
            else:
                b_lo[i] = uint32(xw[i] & LOW32)
                b_hi[i] = uint32((xw[i] >> 32) & LOW32)
            if g >= tokens:                                          # padding token columns: zeros
                b_lo[i] = uint32(0)
                b_hi[i] = uint32(0)
        d0 = d1 = d2 = d3 = e0 = e1 = e2 = e3 = float32(0.0)
        for i in range(WORDS):
            a, b = w_lo[i], w_hi[i]
            d0, d1, d2, d3 = mma_f16(a & LOW32, b & LOW32, (a >> 32) & LOW32, (b >> 32) & LOW32,
                                     b_lo[i], b_hi[i], d0, d1, d2, d3, mma_scratch, tid)
            if GLU:
                a, b = u_lo[i], u_hi[i]
                e0, e1, e2, e3 = mma_f16(a & LOW32, b & LOW32, (a >> 32) & LOW32, (b >> 32) & LOW32,
                                         b_lo[i], b_hi[i], e0, e1, e2, e3, mma_scratch, tid)
        base = tid * 4 * PRODUCTS
        store_fragment(partials, base, d0, d1, d2, d3)
        if GLU:
            store_fragment(partials, base + 4, e0, e1, e2, e3)
        cuda.syncthreads()
        sums = cuda.local.array(4, float32)                          # warp 0: D[g + 8 (i // 2)][2t + i % 2]
        if warp == 0:
            for i in range(4):
                s = float32(0.0)
                up = float32(0.0)
                for w in range(warps):
                    s += partials[(w * WARP + lane) * 4 * PRODUCTS + i]
                    if GLU:
                        up += partials[(w * WARP + lane) * 4 * PRODUCTS + 4 + i]
                if GLU:  # gate and up rounded as the separate path stores them, then silu(gate) * up
                    gate = float32(np.float16(s))
                    s = gate / (float32(1.0) + math.exp(-gate)) * float32(np.float16(up))
                if SQUARES_SCALE:
                    s *= squares[2 * t + i % 2]
                sums[i] = s if FLOAT_OUT else float32(np.float16(s))  # float16 y as the unfused path stores it
                if SQUARES_OUT:  # + the residual, rounded as add_rms_norm stores the stream
                    n = n0 + g + 8 * (i // 2)
                    sums[i] = float32(np.float16(sums[i] + unpack_f16x4(row_res[i])[n % 4]))
                    tile_values[(2 * t + i % 2) * TILE_ROWS + g + 8 * (i // 2)] = sums[i]
            for i in range(4):
                tok = 2 * t + i % 2
                n = n0 + g + 8 * (i // 2)
                if ROPE_DIM:
                    if i < 2 and tok < tokens:
                        rope_and_store(sums[i], sums[i + 2], tok0 + tok, head, dim, HALF, angles[2 * i], angles[2 * i + 1],
                                       slot_of[i], y, kv_cache)
                elif tok < tokens and n < n_rows:
                    y[tok0 + tok, n] = sums[i]
        if SQUARES_OUT:  # each token's sum of squares over the tile's rows, in their order
            cuda.syncthreads()
            if tid < tokens:
                row_squares[(tok0 + tid) * (n_rows // TILE_ROWS) + tile] = tile_squares(tile_values, tid)
    # The kernel's name says its form (a profile then tells qkv, o, gate/up, down and the LM head apart).
    gemv_mma.__name__ = gemv_mma.__qualname__ = variant_name(warps, norm, residual, glu, gather, rope_dim, dependent,
                                                             ALLOW_EARLY, PIN_LOADS, SQUARES_OUT, SQUARES_SCALE, WIDE,
                                                             ROPE_EARLY, FLOAT_OUT)
    return cuda.jit(**options)(gemv_mma)

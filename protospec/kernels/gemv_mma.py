"""y = x @ W.T on tensor cores for a verify window's few token rows (T <= 8), float16.

    x [T, K] float16, W [N, K] float16 (nn.Linear's layout), y [T, N] float16; K a multiple of
    CHUNK x CHUNKS_PER_WARP (192: 768 and 3072 are), at most MAX_WARPS warps' worth.

Why: at 6 tokens the CUDA-core GEMVs (gemv.py) do 6 multiply-adds per weight they load and lost to
cuBLAS by 1.7-4x (bench.gemv_cost); a tensor-core product takes a 16x16 weight tile and 8 token
columns in one instruction, so the loads, not the arithmetic, set the pace again.

Layout. One `mma.m16n8k16` (warp_mma.py) with A = a 16-row x 16-column weight tile, B = x^T (16
columns x 8 tokens), D = 16 output rows x 8 tokens. A block owns 16 output rows; its warps split K,
each covering CHUNKS_PER_WARP chunks of 64 columns, and every weight word a warp needs is loaded
before its first product (bytes in flight are what a memory-bound kernel needs). The sum over k does
not care in which order the columns go into the products, so they go in the order that makes the
loads wide: in a chunk, lane (g, t) (g = lane // 4, t = lane % 4) reads 16 contiguous columns
(four 8-byte words) of rows g and g + 8, 64 contiguous columns per row across the lane group; word
j of them feeds product j as the A fragment's "k = 2t" pair (low half) and "k = 2t + 8" pair (high
half), and the lane's x word at the same columns of token g feeds B the same way. Tokens past T feed
zeros; rows past N read row N - 1 and are not written. The warps' D fragments are summed in shared
memory and written as float16.

torch's twin: torch.nn.functional.linear (bench.gemv_cost times both against the bytes floor).
"""
from __future__ import annotations

import functools

import torch
from numba import float32, int64, uint32

from protospec.errors import KernelArgumentError
from protospec.kernels import interop
from protospec.kernels.interop import check_tensor, cuda
from protospec.kernels.warp_mma import mma_f16, scratch_size
from protospec.kernels.word_loads import load_flat

WARP = 32
TILE_ROWS = 16        # output rows per block: the product's M
MAX_TOKENS = 8        # the product's N
CHUNK = 64            # columns a lane group of 4 covers per chunk (16 each)
CHUNKS_PER_WARP = 3   # a warp's chunks, every word loaded before the first product
WORDS = CHUNKS_PER_WARP * 4  # 8-byte words a lane loads per weight row (and per x row)
MAX_WARPS = 32
LOW32 = 0xFFFFFFFF
COLUMNS_PER_WARP = CHUNK * CHUNKS_PER_WARP


def warps_for(k: int) -> int:
    """Warps a block splits K over (K / 192)."""
    return k // COLUMNS_PER_WARP


@functools.cache
def gemv_mma_kernel(warps: int):
    """The kernel for blocks of `warps` warps (K = 192 x warps)."""
    options = {} if interop.SIMULATOR else {"fastmath": True}
    SCRATCH = scratch_size(warps)     # array sizes must be literals to the typer: products taken here
    PARTIALS = warps * WARP * 4       # each lane's D fragment, per warp

    @cuda.jit(**options)
    def gemv_mma(x64, w64, tokens, y):
        """x64 [T, K / 4] int64 (float16 words); w64 [N, K / 4] int64; tokens = T; y [T, N] float16."""
        n_rows, k_words = w64.shape[0], w64.shape[1]
        tid = cuda.threadIdx.x
        warp, lane = tid // WARP, tid % WARP
        g, t = lane // 4, lane % 4
        n0 = cuda.blockIdx.x * TILE_ROWS
        row_lo = min(n0 + g, n_rows - 1)
        row_hi = min(n0 + g + 8, n_rows - 1)
        token = min(g, tokens - 1)                                   # a real row's words (zeroed below)
        first = warp * (COLUMNS_PER_WARP // 4) + 4 * t               # this lane's first word in a row
        w_lo = cuda.local.array(WORDS, int64)
        w_hi = cuda.local.array(WORDS, int64)
        xw = cuda.local.array(WORDS, int64)
        mma_scratch = cuda.shared.array(SCRATCH, uint32)           # the simulator's products
        partials = cuda.shared.array(PARTIALS, float32)
        for c in range(CHUNKS_PER_WARP):                             # every load before any product
            for j in range(4):
                word = first + 16 * c + j
                w_lo[c * 4 + j] = load_flat(w64, row_lo * k_words + word)
                w_hi[c * 4 + j] = load_flat(w64, row_hi * k_words + word)
                xw[c * 4 + j] = load_flat(x64, token * k_words + word)
        d0, d1, d2, d3 = float32(0.0), float32(0.0), float32(0.0), float32(0.0)
        for i in range(WORDS):
            a, b = w_lo[i], w_hi[i]
            xb = xw[i] if g < tokens else int64(0)
            d0, d1, d2, d3 = mma_f16(a & LOW32, b & LOW32, (a >> 32) & LOW32, (b >> 32) & LOW32,
                                     xb & LOW32, (xb >> 32) & LOW32, d0, d1, d2, d3, mma_scratch, tid)
        base = tid * 4
        partials[base] = d0
        partials[base + 1] = d1
        partials[base + 2] = d2
        partials[base + 3] = d3
        cuda.syncthreads()
        if warp == 0:
            for i in range(4):                                       # D[g + 8 (i // 2)][2t + i % 2]
                s = float32(0.0)
                for w in range(warps):
                    s += partials[(w * WARP + lane) * 4 + i]
                tok = 2 * t + i % 2
                n = n0 + g + 8 * (i // 2)
                if tok < tokens and n < n_rows:
                    y[tok, n] = s
    return gemv_mma


def supports(k: int) -> bool:
    return k % COLUMNS_PER_WARP == 0 and 1 <= warps_for(k) <= MAX_WARPS


def gemv_mma(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [T, K] float16 (T <= 8), weight [N, K] float16 -> [T, N] float16."""
    check_tensor("gemv_mma x", x, torch.float16, 2)
    check_tensor("gemv_mma weight", weight, torch.float16, 2)
    tokens, k = x.shape
    n = weight.shape[0]
    if weight.shape[1] != k:
        raise KernelArgumentError(f"gemv_mma: x has {k} columns, the weight {weight.shape[1]}")
    if not 1 <= tokens <= MAX_TOKENS:
        raise KernelArgumentError(f"gemv_mma: 1 to {MAX_TOKENS} token rows, got {tokens}")
    if not supports(k):
        raise KernelArgumentError(f"gemv_mma: K = {k} must be a multiple of {COLUMNS_PER_WARP} "
                                  f"(at most {MAX_WARPS * COLUMNS_PER_WARP})")
    y = torch.empty(tokens, n, dtype=torch.float16, device=x.device)
    warps = warps_for(k)
    interop.launch_tensors(gemv_mma_kernel(warps), -(-n // TILE_ROWS), warps * WARP,
                           [x.view(torch.int64), weight.view(torch.int64), tokens, y])
    return y

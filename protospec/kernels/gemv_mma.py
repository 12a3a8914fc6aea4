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

Fused forms, for a decoder layer's chain (model/layer_kernels.py, linear="mma_fused"):
  norm (+ residual): x + residual, then the RMSNorm, applied to x's words as they are loaded, with
      layer_ops.add_rms_norm's roundings. Each warp's lanes hold its K range for their token, so the
      sum of squares needs only two shuffles and one pass over the warps' sums in shared memory; block
      0 also writes x + residual, the residual stream the next layer adds to.
  glu: W = [gate; up] rows [2I, K]; a block multiplies 16 gate rows and the 16 matching up rows by the
      same x fragments and writes silu(gate) * up, the input of the down projection.

torch's twin: gemv_mma_reference (torch.nn.functional.linear with add_rms_norm's and silu_and_mul's
roundings); bench.gemv_cost times the kernel against cuBLAS and the bytes floor.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch
from numba import float32, int64, uint32

from protospec.errors import KernelArgumentError
from protospec.kernels import interop
from protospec.kernels.interop import check_tensor, cuda
from protospec.kernels.reductions import xor_exchange
from protospec.kernels.warp_mma import mma_f16, pack_half2, scratch_size
from protospec.kernels.word_loads import load_flat, store_flat, unpack_f16x4

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
def gemv_mma_kernel(warps: int, norm: bool = False, residual: bool = False, glu: bool = False):
    """The kernel for blocks of `warps` warps (K = 192 x warps); NORM folds the RMSNorm (after adding
    the residual with RESIDUAL) into x's loads; GLU computes silu(gate) * up from a [2I, K] weight."""
    options = {} if interop.SIMULATOR else {"fastmath": True}
    NORM, RESIDUAL, GLU = norm, residual, glu  # noqa: N806 (compile-time constants)
    SCRATCH = scratch_size(warps)     # array sizes must be literals to the typer: products taken here
    PRODUCTS = 2 if glu else 1
    PARTIALS = warps * WARP * 4 * PRODUCTS  # each lane's D fragments, per warp
    SQUARES = warps * MAX_TOKENS      # each warp's sum of squares per token
    THREADS = warps * WARP
    UP_WORDS = WORDS if glu else 1

    @cuda.jit(**options)
    def gemv_mma(x64, res64, norm64, eps, w64, tokens, y, res_out64):
        """x64, res64 [T, K / 4] int64 (float16 words); norm64 [K / 4] int64; w64 [N (2I with GLU), K / 4]
        int64; y [T, N (I)] float16; res_out64 [T, K / 4] int64 <- x + residual (NORM; block 0 writes it)."""
        n_rows, k_words = w64.shape[0] // PRODUCTS, w64.shape[1]
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
        u_lo = cuda.local.array(UP_WORDS, int64)                     # GLU: the up rows (gate rows in w_*)
        u_hi = cuda.local.array(UP_WORDS, int64)
        xw = cuda.local.array(WORDS, int64)
        rw = cuda.local.array(WORDS, int64)
        b_lo = cuda.local.array(WORDS, uint32)                       # B fragments: x (normalised) pairs
        b_hi = cuda.local.array(WORDS, uint32)
        mma_scratch = cuda.shared.array(SCRATCH, uint32)             # the simulator's products
        shuffle_scratch = cuda.shared.array(THREADS, float32)        # the simulator's shuffles
        partials = cuda.shared.array(PARTIALS, float32)
        squares = cuda.shared.array(SQUARES, float32)
        for c in range(CHUNKS_PER_WARP):                             # every load before any product
            for j in range(4):
                word = first + 16 * c + j
                w_lo[c * 4 + j] = load_flat(w64, row_lo * k_words + word)
                w_hi[c * 4 + j] = load_flat(w64, row_hi * k_words + word)
                if GLU:
                    u_lo[c * 4 + j] = load_flat(w64, (n_rows + row_lo) * k_words + word)
                    u_hi[c * 4 + j] = load_flat(w64, (n_rows + row_hi) * k_words + word)
                xw[c * 4 + j] = load_flat(x64, token * k_words + word)
                if RESIDUAL:
                    rw[c * 4 + j] = load_flat(res64, token * k_words + word)
        inv_rms = float32(1.0)
        if NORM:  # v = x + residual, rounded as add_rms_norm stores it; 1 / rms over the block's K
            sq = float32(0.0)
            for i in range(WORDS):
                for e in range(4):
                    v = _summed(xw[i], rw[i], e, RESIDUAL)
                    sq += v * v
            sq = sq if g < tokens else float32(0.0)
            sq += xor_exchange(sq, 1, shuffle_scratch, tid)          # the 4 lanes of token g: the warp's K
            sq += xor_exchange(sq, 2, shuffle_scratch, tid)
            if t == 0:
                squares[warp * MAX_TOKENS + g] = sq
            cuda.syncthreads()
            total = float32(0.0)
            for w in range(warps):
                total += squares[w * MAX_TOKENS + g]
            inv_rms = float32(1.0) / math.sqrt(total / float32(4 * k_words) + float32(eps))
        for i in range(WORDS):
            if NORM:
                word = first + 16 * (i // 4) + i % 4
                gw = load_flat(norm64, word)
                v0, v1 = _summed(xw[i], rw[i], 0, RESIDUAL), _summed(xw[i], rw[i], 1, RESIDUAL)
                v2, v3 = _summed(xw[i], rw[i], 2, RESIDUAL), _summed(xw[i], rw[i], 3, RESIDUAL)
                if cuda.blockIdx.x == 0 and g < tokens:              # the residual stream, once
                    store_flat(res_out64, g * k_words + word, int64(pack_half2(v0, v1)) | (int64(pack_half2(v2, v3)) << 32))
                n0_, n1_, n2_, n3_ = unpack_f16x4(gw)
                b_lo[i] = pack_half2(n0_ * (v0 * inv_rms), n1_ * (v1 * inv_rms))
                b_hi[i] = pack_half2(n2_ * (v2 * inv_rms), n3_ * (v3 * inv_rms))
            else:
                b_lo[i] = uint32(xw[i] & LOW32)
                b_hi[i] = uint32((xw[i] >> 32) & LOW32)
            if g >= tokens:                                          # padding token columns: zeros
                b_lo[i] = uint32(0)
                b_hi[i] = uint32(0)
        d0, d1, d2, d3 = float32(0.0), float32(0.0), float32(0.0), float32(0.0)
        e0, e1, e2, e3 = float32(0.0), float32(0.0), float32(0.0), float32(0.0)
        for i in range(WORDS):
            a, b = w_lo[i], w_hi[i]
            d0, d1, d2, d3 = mma_f16(a & LOW32, b & LOW32, (a >> 32) & LOW32, (b >> 32) & LOW32,
                                     b_lo[i], b_hi[i], d0, d1, d2, d3, mma_scratch, tid)
            if GLU:
                a, b = u_lo[i], u_hi[i]
                e0, e1, e2, e3 = mma_f16(a & LOW32, b & LOW32, (a >> 32) & LOW32, (b >> 32) & LOW32,
                                         b_lo[i], b_hi[i], e0, e1, e2, e3, mma_scratch, tid)
        base = tid * 4 * PRODUCTS
        partials[base] = d0
        partials[base + 1] = d1
        partials[base + 2] = d2
        partials[base + 3] = d3
        if GLU:
            partials[base + 4] = e0
            partials[base + 5] = e1
            partials[base + 6] = e2
            partials[base + 7] = e3
        cuda.syncthreads()
        if warp == 0:
            for i in range(4):                                       # D[g + 8 (i // 2)][2t + i % 2]
                s = float32(0.0)
                up = float32(0.0)
                for w in range(warps):
                    s += partials[(w * WARP + lane) * 4 * PRODUCTS + i]
                    if GLU:
                        up += partials[(w * WARP + lane) * 4 * PRODUCTS + 4 + i]
                if GLU:  # gate and up rounded as the separate path stores them, then silu(gate) * up
                    gate = float32(np.float16(s))
                    s = gate / (float32(1.0) + math.exp(-gate)) * float32(np.float16(up))
                tok = 2 * t + i % 2
                n = n0 + g + 8 * (i // 2)
                if tok < tokens and n < n_rows:
                    y[tok, n] = s
    return gemv_mma


@cuda.jit(device=True)
def _summed(x_word, r_word, e, residual):
    """Element e of x's word (plus the residual's, rounded to float16 as add_rms_norm stores it), float32."""
    v = unpack_f16x4(x_word)[e]
    if residual:
        v = float32(np.float16(v + unpack_f16x4(r_word)[e]))
    return v


def gemv_mma_reference(x: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor | None = None,
                       residual: torch.Tensor | None = None, eps: float = 1e-6, glu: bool = False):
    """gemv_mma's torch twin, same arguments and results, rounding where the kernel and the separate
    layer kernels round: x + residual and the normalised x to float16, gate and up to float16."""
    stream = x.float() if residual is None else (x.float() + residual.float()).half().float()
    h = x.float()
    if norm_weight is not None:
        h = (norm_weight.float() * (stream * torch.rsqrt(stream.pow(2).mean(-1, keepdim=True) + eps))).half().float()
    out = h @ weight.float().T
    if glu:
        gate, up = out.chunk(2, dim=-1)
        gate, up = gate.half().float(), up.half().float()
        out = gate * torch.sigmoid(gate) * up
    return (out.half(), stream.half()) if norm_weight is not None else out.half()


def supports(k: int) -> bool:
    return k % COLUMNS_PER_WARP == 0 and 1 <= warps_for(k) <= MAX_WARPS


def gemv_mma(x: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor | None = None,
             residual: torch.Tensor | None = None, eps: float = 1e-6, glu: bool = False):
    """x [T, K] float16 (T <= 8), weight [N, K] float16 -> y [T, N] float16.
    norm_weight [K]: y = rms_norm(x + residual) * norm_weight @ W.T, and returns (y, x + residual) (a new
    tensor: the residual stream for the next layer; residual None = x alone). glu: weight [2I, K]
    (gate rows, then up rows), y [T, I] = silu(gate) * up."""
    check_tensor("gemv_mma x", x, torch.float16, 2)
    check_tensor("gemv_mma weight", weight, torch.float16, 2)
    tokens, k = x.shape
    n = weight.shape[0] // 2 if glu else weight.shape[0]
    if weight.shape[1] != k:
        raise KernelArgumentError(f"gemv_mma: x has {k} columns, the weight {weight.shape[1]}")
    if not 1 <= tokens <= MAX_TOKENS:
        raise KernelArgumentError(f"gemv_mma: 1 to {MAX_TOKENS} token rows, got {tokens}")
    if not supports(k):
        raise KernelArgumentError(f"gemv_mma: K = {k} must be a multiple of {COLUMNS_PER_WARP} "
                                  f"(at most {MAX_WARPS * COLUMNS_PER_WARP})")
    if glu and weight.shape[0] % 2:
        raise KernelArgumentError(f"gemv_mma: glu takes gate and up rows, an even count, got {weight.shape[0]}")
    if residual is not None and norm_weight is None:
        raise KernelArgumentError("gemv_mma: a residual is added only with the norm (norm_weight)")
    if norm_weight is not None:
        check_tensor("gemv_mma norm_weight", norm_weight, torch.float16, 1, rows=k)
    if residual is not None:
        check_tensor("gemv_mma residual", residual, torch.float16, 2)
        if residual.shape != x.shape:
            raise KernelArgumentError(f"gemv_mma: residual {tuple(residual.shape)} must match x {tuple(x.shape)}")
    y = torch.empty(tokens, n, dtype=torch.float16, device=x.device)
    x64 = x.view(torch.int64)
    norm = norm_weight is not None
    res_out = torch.empty_like(x) if norm else y
    warps = warps_for(k)
    kernel = gemv_mma_kernel(warps, norm, residual is not None, glu)
    interop.launch_tensors(kernel, -(-n // TILE_ROWS), warps * WARP, [
        x64, x64 if residual is None else residual.view(torch.int64),
        x64[0] if norm_weight is None else norm_weight.view(torch.int64), float(eps), weight.view(torch.int64),
        tokens, y, res_out.view(torch.int64) if norm else x64])
    return (y, res_out) if norm else y

"""y = x @ W.T for decode-shaped activations (a few token rows): the linear layers of a batch-1 forward,
optionally with the RMSNorm that feeds them folded in (y = rms_norm(x) * g @ W.T, one launch for two).

    x [M, K] act (M <= MAX_TOKENS token rows), W [N, K] float16 (nn.Linear's layout), y [M, N] act
    g [K] act, the norm's weight (norm_weight=...; without it x is used as it is)

A warp owns ROWS consecutive output rows. Its lanes walk K together, lane l reading columns
l, l + 32, ... (a warp's load of one weight row is 64 contiguous bytes), UNROLL columns per lane
per step for every owned row before any of them is used: ROWS x UNROLL independent loads in flight
per lane, which is what a memory-bound GEMV needs (a one-load-at-a-time loop leaves the memory
system idle between a load and its multiply-add). The x values of a step are read once for all the
warp's rows (L1-resident: x is a few KB). Accumulation is float32; the row sums are finished by
warp shuffles. K must be a multiple of 32 x UNROLL (768 and 3072 are, for UNROLL 8).

With the norm folded in, each warp first sums its token rows' squares (x is a few KB and stays in
L1, so the extra pass reads no memory) and scales x as it loads it, rounding the normalised value to
the activation dtype as layer_ops.add_rms_norm stores it, so the fused and separate ways feed the
GEMV the same numbers up to the rounding of the mean square.

words=True reads W as 8-byte words (an int64 view: 4 float16 values a load, kernels/word_loads.py)
instead of one 2-byte value a load; UNROLL then counts words, and K must be a multiple of
4 x 32 x UNROLL (768 and 3072 are, for UNROLL 1, 2, 3 or 6).

torch's twin: torch.nn.functional.linear. bench.gemv_cost times both against the bytes floor.
"""
from __future__ import annotations

import functools

import math

import numpy as np
import torch
from numba import float32, int64

from protospec.errors import KernelArgumentError
from protospec.kernels import interop
from protospec.kernels.interop import check_tensor, cuda
from protospec.kernels.reductions import xor_exchange
from protospec.kernels.word_loads import load_flat, unpack_f16x4

MAX_TOKENS = 8
WARP = 32
WARPS_PER_BLOCK = 1 if interop.SIMULATOR else 4  # the simulator runs an OS thread per CUDA thread


@functools.cache
def gemv_kernel(rows: int, unroll: int, tokens: int, norm: bool = False, half: bool = True, words: bool = False):
    """The kernel for ROWS output rows per warp, UNROLL columns (words: 4-column words) per lane per
    step, TOKENS token rows; NORM folds the RMSNorm in, HALF rounds the normalised activations to
    float16 (else float32)."""
    options = {} if interop.SIMULATOR else {"fastmath": True}
    if words:
        return _make_word_kernel(rows, unroll, tokens, norm, half, options)
    return _make_kernel(rows, unroll, tokens, norm, half, options)


def _row_parts(ROWS: int, TOKENS: int, NORM: bool, HALF: bool, options: dict):  # noqa: N803
    """The device functions both kernels share (compiled with the kernel's options): the folded norm's
    inverse RMS per token row, the activation as the GEMV consumes it, and the warp sums written out."""

    @cuda.jit(device=True, **options)
    def inverse_rms(x, k_cols, eps, inv_rms, scratch, tid):
        """inv_rms[t] = 1 / sqrt(mean(x[t]^2) + eps) with NORM (every lane of the warp), else 1."""
        lane = tid % WARP
        for t in range(TOKENS):
            inv_rms[t] = float32(1.0)
            if NORM:
                sq = float32(0.0)
                for k in range(lane, k_cols, WARP):
                    v = float32(x[t, k])
                    sq += v * v
                for step in range(5):
                    sq += xor_exchange(sq, 1 << step, scratch, tid)
                inv_rms[t] = float32(1.0) / math.sqrt(sq / float32(k_cols) + float32(eps))

    @cuda.jit(device=True, **options)
    def activation(x, t, k, inv_rms, norm_w):
        """x[t, k] as the GEMV consumes it (normalised, scaled and rounded as add_rms_norm stores it)."""
        v = float32(x[t, k])
        if NORM:
            v = float32(norm_w[k]) * (v * inv_rms)
            v = float32(np.float16(v)) if HALF else v  # numba-cuda's float16 cast
        return v

    @cuda.jit(device=True, **options)
    def write_rows(acc, y, first_row, n_rows, scratch, tid):
        """Each accumulator summed across the warp; lane 0 writes the rows that exist."""
        for c in range(ROWS * TOKENS):
            s = acc[c]
            for step in range(5):
                s += xor_exchange(s, 1 << step, scratch, tid)
            acc[c] = s
        if tid % WARP == 0:
            for r in range(ROWS):
                n = first_row + r
                if n < n_rows:
                    for t in range(TOKENS):
                        y[t, n] = acc[r * TOKENS + t]

    return inverse_rms, activation, write_rows


def _make_kernel(ROWS: int, UNROLL: int, TOKENS: int, NORM: bool, HALF: bool, options: dict):  # noqa: N803
    STEP = WARP * UNROLL
    CELLS = ROWS * TOKENS        # accumulators per lane: [ROWS, TOKENS]
    LOADS = ROWS * UNROLL        # weights per lane per step: [ROWS, UNROLL]
    XS = TOKENS * UNROLL         # activations per lane per step: [TOKENS, UNROLL]
    SCRATCH = WARP * 4           # array sizes must be literals to the typer: products are taken here
    inverse_rms, activation, write_rows = _row_parts(ROWS, TOKENS, NORM, HALF, options)

    @cuda.jit(**options)
    def gemv(x, w, norm_w, eps, y):
        n_rows, k_cols = w.shape[0], w.shape[1]
        tid = cuda.threadIdx.x
        lane = tid % WARP
        first_row = (cuda.blockIdx.x * (cuda.blockDim.x // WARP) + tid // WARP) * ROWS
        acc = cuda.local.array(CELLS, float32)
        wv = cuda.local.array(LOADS, float32)
        xv = cuda.local.array(XS, float32)
        scratch = cuda.shared.array(SCRATCH, float32)  # the simulator's shuffles (a block is one warp there)
        inv_rms = cuda.local.array(TOKENS, float32)
        inverse_rms(x, k_cols, eps, inv_rms, scratch, tid)
        for c in range(CELLS):
            acc[c] = float32(0.0)
        for k0 in range(lane, k_cols, STEP):
            for r in range(ROWS):  # every load of the step issued before the first multiply-add
                n = min(first_row + r, n_rows - 1)  # rows past N read a real row, their sums are dropped
                for u in range(UNROLL):  # flat: one address per row, the unrolled columns as immediates
                    wv[r * UNROLL + u] = float32(load_flat(w, n * k_cols + k0 + u * WARP))
            for t in range(TOKENS):
                for u in range(UNROLL):
                    xv[t * UNROLL + u] = activation(x, t, k0 + u * WARP, inv_rms[t], norm_w)
            for r in range(ROWS):
                for t in range(TOKENS):
                    s = acc[r * TOKENS + t]
                    for u in range(UNROLL):
                        s += wv[r * UNROLL + u] * xv[t * UNROLL + u]
                    acc[r * TOKENS + t] = s
        write_rows(acc, y, first_row, n_rows, scratch, tid)
    return gemv


def _make_word_kernel(ROWS: int, UNROLL: int, TOKENS: int, NORM: bool, HALF: bool, options: dict):  # noqa: N803
    STEP = WARP * UNROLL         # words per warp per step
    CELLS = ROWS * TOKENS        # accumulators per lane: [ROWS, TOKENS]
    LOADS = ROWS * UNROLL        # words per lane per step: [ROWS, UNROLL]
    SCRATCH = WARP * 4
    inverse_rms, activation, write_rows = _row_parts(ROWS, TOKENS, NORM, HALF, options)

    @cuda.jit(**options)
    def gemv_words(x, w, norm_w, eps, y):
        """x [T, K] act; w [N, K / 4] int64 (float16 words); norm_w [K] act; y [T, N] act."""
        n_rows, k_words = w.shape[0], w.shape[1]
        tid = cuda.threadIdx.x
        lane = tid % WARP
        first_row = (cuda.blockIdx.x * (cuda.blockDim.x // WARP) + tid // WARP) * ROWS
        acc = cuda.local.array(CELLS, float32)
        wv = cuda.local.array(LOADS, int64)
        scratch = cuda.shared.array(SCRATCH, float32)  # the simulator's shuffles (a block is one warp there)
        inv_rms = cuda.local.array(TOKENS, float32)
        inverse_rms(x, 4 * k_words, eps, inv_rms, scratch, tid)
        for c in range(CELLS):
            acc[c] = float32(0.0)
        for k0 in range(lane, k_words, STEP):
            for r in range(ROWS):  # every word of the step issued before the first multiply-add
                n = min(first_row + r, n_rows - 1)  # rows past N read a real row, their sums are dropped
                for u in range(UNROLL):  # flat: one address per row, the unrolled words as immediates
                    wv[r * UNROLL + u] = load_flat(w, n * k_words + k0 + u * WARP)
            for t in range(TOKENS):
                for u in range(UNROLL):
                    c = 4 * (k0 + u * WARP)
                    x0, x1 = activation(x, t, c, inv_rms[t], norm_w), activation(x, t, c + 1, inv_rms[t], norm_w)
                    x2, x3 = activation(x, t, c + 2, inv_rms[t], norm_w), activation(x, t, c + 3, inv_rms[t], norm_w)
                    for r in range(ROWS):
                        w0, w1, w2, w3 = unpack_f16x4(wv[r * UNROLL + u])
                        acc[r * TOKENS + t] += w0 * x0 + w1 * x1 + w2 * x2 + w3 * x3
        write_rows(acc, y, first_row, n_rows, scratch, tid)
    return gemv_words


def rows_per_warp(n: int) -> int:
    """Enough warps to spread over the GPU for small N, several rows per warp (more loads in flight) for large N."""
    return 4 if n >= 8192 else 2 if n >= 2048 else 1


def columns_per_step(unroll: int, words: bool = False) -> int:
    """K must be a multiple of this: a warp's columns per step."""
    return WARP * unroll * (4 if words else 1)


def gemv(x: torch.Tensor, weight: torch.Tensor, rows: int | None = None, unroll: int = 8,
         norm_weight: torch.Tensor | None = None, eps: float = 1e-6, words: bool = False) -> torch.Tensor:
    """x [M, K] float16/float32, weight [N, K] float16 -> [M, N] in x's dtype; with norm_weight [K]
    (x's dtype) x is RMS-normalised and scaled by it first; words: W read as 8-byte words (unroll
    counts words)."""
    if x.dtype not in (torch.float16, torch.float32):
        raise KernelArgumentError(f"gemv: x must be float16 or float32, got {x.dtype}")
    check_tensor("gemv x", x, x.dtype, 2)
    check_tensor("gemv weight", weight, torch.float16, 2)
    tokens, k = x.shape
    n = weight.shape[0]
    if weight.shape[1] != k:
        raise KernelArgumentError(f"gemv: x has {k} columns, the weight {weight.shape[1]}")
    if not 1 <= tokens <= MAX_TOKENS:
        raise KernelArgumentError(f"gemv: 1 to {MAX_TOKENS} token rows, got {tokens}")
    if k % columns_per_step(unroll, words):
        raise KernelArgumentError(f"gemv: K = {k} must be a multiple of {columns_per_step(unroll, words)} "
                                  f"(32 lanes x unroll {unroll}{' x 4 columns a word' if words else ''})")
    if norm_weight is not None:
        check_tensor("gemv norm_weight", norm_weight, x.dtype, 1, rows=k)
    rows = rows or rows_per_warp(n)
    y = torch.empty(tokens, n, dtype=x.dtype, device=x.device)
    warps = -(-n // rows)
    blocks = -(-warps // WARPS_PER_BLOCK)
    kernel = gemv_kernel(rows, unroll, tokens, norm_weight is not None, x.dtype == torch.float16, words)
    interop.launch_tensors(kernel, blocks, WARPS_PER_BLOCK * WARP, [x, weight.view(torch.int64) if words else weight,
                                                                    x[0] if norm_weight is None else norm_weight, float(eps), y])
    return y

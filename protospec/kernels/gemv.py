"""y = x @ W.T for decode-shaped activations (a few token rows): the linear layers of a batch-1 forward.

    x [M, K] act (M <= MAX_TOKENS token rows), W [N, K] float16 (nn.Linear's layout), y [M, N] act

A warp owns ROWS consecutive output rows. Its lanes walk K together, lane l reading columns
l, l + 32, ... (a warp's load of one weight row is 64 contiguous bytes), UNROLL columns per lane
per step for every owned row before any of them is used: ROWS x UNROLL independent loads in flight
per lane, which is what a memory-bound GEMV needs (a one-load-at-a-time loop leaves the memory
system idle between a load and its multiply-add). The x values of a step are read once for all the
warp's rows (L1-resident: x is a few KB). Accumulation is float32; the row sums are finished by
warp shuffles. K must be a multiple of 32 x UNROLL (768 and 3072 are, for UNROLL 8).

torch's twin: torch.nn.functional.linear. bench.gemv_cost times both against the bytes floor.
"""
from __future__ import annotations

import functools

import torch
from numba import float32

from protospec.errors import KernelArgumentError
from protospec.kernels import interop
from protospec.kernels.interop import check_tensor, cuda
from protospec.kernels.reductions import xor_exchange

MAX_TOKENS = 8
WARP = 32
WARPS_PER_BLOCK = 1 if interop.SIMULATOR else 4  # the simulator runs an OS thread per CUDA thread


@functools.cache
def gemv_kernel(rows: int, unroll: int, tokens: int):
    """The kernel for ROWS output rows per warp, UNROLL columns per lane per step, TOKENS token rows."""
    options = {} if interop.SIMULATOR else {"fastmath": True}
    return _make_kernel(rows, unroll, tokens, options)


def _make_kernel(ROWS: int, UNROLL: int, TOKENS: int, options: dict):  # noqa: N803 (frozen as constants)
    STEP = WARP * UNROLL
    CELLS = ROWS * TOKENS        # accumulators per lane: [ROWS, TOKENS]
    LOADS = ROWS * UNROLL        # weights per lane per step: [ROWS, UNROLL]
    XS = TOKENS * UNROLL         # activations per lane per step: [TOKENS, UNROLL]
    SCRATCH = WARP * 4           # array sizes must be literals to the typer: products are taken here

    @cuda.jit(**options)
    def gemv(x, w, y):
        n_rows, k_cols = w.shape[0], w.shape[1]
        tid = cuda.threadIdx.x
        lane = tid % WARP
        first_row = (cuda.blockIdx.x * (cuda.blockDim.x // WARP) + tid // WARP) * ROWS
        acc = cuda.local.array(CELLS, float32)
        wv = cuda.local.array(LOADS, float32)
        xv = cuda.local.array(XS, float32)
        scratch = cuda.shared.array(SCRATCH, float32)  # the simulator's shuffles (a block is one warp there)
        for c in range(CELLS):
            acc[c] = float32(0.0)
        for k0 in range(lane, k_cols, STEP):
            for r in range(ROWS):  # every load of the step issued before the first multiply-add
                n = min(first_row + r, n_rows - 1)  # rows past N read a real row, their sums are dropped
                for u in range(UNROLL):
                    wv[r * UNROLL + u] = float32(w[n, k0 + u * WARP])
            for t in range(TOKENS):
                for u in range(UNROLL):
                    xv[t * UNROLL + u] = float32(x[t, k0 + u * WARP])
            for r in range(ROWS):
                for t in range(TOKENS):
                    s = acc[r * TOKENS + t]
                    for u in range(UNROLL):
                        s += wv[r * UNROLL + u] * xv[t * UNROLL + u]
                    acc[r * TOKENS + t] = s
        for c in range(CELLS):
            s = acc[c]
            for step in range(5):
                s += xor_exchange(s, 1 << step, scratch, tid)
            acc[c] = s
        if lane == 0:
            for r in range(ROWS):
                n = first_row + r
                if n < n_rows:
                    for t in range(TOKENS):
                        y[t, n] = acc[r * TOKENS + t]
    return gemv


def rows_per_warp(n: int) -> int:
    """Enough warps to spread over the GPU for small N, several rows per warp (more loads in flight) for large N."""
    return 4 if n >= 8192 else 2 if n >= 2048 else 1


def gemv(x: torch.Tensor, weight: torch.Tensor, rows: int | None = None, unroll: int = 8) -> torch.Tensor:
    """x [M, K] float16/float32, weight [N, K] float16 -> [M, N] in x's dtype."""
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
    if k % (WARP * unroll):
        raise KernelArgumentError(f"gemv: K = {k} must be a multiple of {WARP * unroll} (32 lanes x unroll {unroll})")
    rows = rows or rows_per_warp(n)
    y = torch.empty(tokens, n, dtype=x.dtype, device=x.device)
    warps = -(-n // rows)
    blocks = -(-warps // WARPS_PER_BLOCK)
    interop.launch_tensors(gemv_kernel(rows, unroll, tokens), blocks, WARPS_PER_BLOCK * WARP,
                           [x, weight, y])
    return y

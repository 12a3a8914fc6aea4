"""y = x @ W.T on tensor cores for a few token rows (T <= MAX_ROWS, 8 a block), float16, with the
fused forms a decoder layer uses (the norm and residual add, SiLU x up, RoPE with the cache store,
gathered rows, float32 logits, the final norm's sums of squares): the checked entry point. The
kernel and its layout are in linear/gemv_mma_kernel.py, its torch twin in linear/gemv_mma_twin.py.
"""
from __future__ import annotations

import torch

from protospec.errors import KernelArgumentError
from protospec.kernels.launch import interop
from protospec.kernels.launch.dependent_launch import supported as dependents_supported
from protospec.kernels.linear.gemv_mma_kernel import (BLOCK_TOKENS, COLUMNS_PER_WARP, MAX_WARPS, TILE_ROWS, WARP,  # noqa: F401
                                               MAX_ROWS, gemv_mma_kernel, supports, warps_for)
from protospec.kernels.linear.gemv_mma_twin import RopeCache, gemv_mma_reference  # noqa: F401
from protospec.kernels.launch.interop import check_tensor


def gemv_mma(x: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor | None = None,
             residual: torch.Tensor | None = None, eps: float = 1e-6, glu: bool = False,
             x_rows: torch.Tensor | None = None, rope: RopeCache | None = None, out_dtype: torch.dtype = torch.float16,
             dependent_launch: bool = False, allow_early: bool = False, residual_squares: torch.Tensor | None = None,
             row_squares: torch.Tensor | None = None):
    """x [T, K] float16 (T <= MAX_ROWS), weight [N, K] float16 -> y [T, N] float16 (out_dtype: or float32).
    norm_weight [K]: y = rms_norm(x + residual) * norm_weight @ W.T, and returns (y, x + residual) (a new
    tensor: the residual stream for the next layer; residual None = x alone). glu: weight [2I, K]
    (gate rows, then up rows), y [T, I] = silu(gate) * up. x_rows [T] int64: token i's x (and residual)
    row is x_rows[i] (x [R, K], any R). rope: weight is a qkv projection; y is q [T, h, d], rotated, and
    k (rotated) and v are stored in rope.kv_cache. dependent_launch: start while the kernel before
    it ends, its weight loads overlapping that kernel (sm_90 and later: launch/dependent_launch.py).
    allow_early (with dependent_launch): the next kernel may launch before this one's wait
    (gemv_mma_kernel). residual_squares [T, N] float16 (the plain float16 form, N a multiple of 16):
    y is x @ W.T + residual_squares, and the call returns (y, squares [T, N / 16] float32), each
    16-column tile's sum of squares of y a row. row_squares [R, K / 16] float32 (the plain form):
    such sums over x's rows; y's rows are scaled by 1 / rms(x's row) (eps), the norm's weight folded
    into `weight` by the caller. The pair is the final norm between the last down projection and the
    LM head with no launch of its own."""
    check_tensor("gemv_mma x", x, torch.float16, 2)
    check_tensor("gemv_mma weight", weight, torch.float16, 2)
    k = x.shape[1]
    tokens = x.shape[0] if x_rows is None else x_rows.shape[0]
    n = weight.shape[0] // 2 if glu else weight.shape[0]
    if weight.shape[1] != k:
        raise KernelArgumentError(f"gemv_mma: x has {k} columns, the weight {weight.shape[1]}")
    if x_rows is not None:
        check_tensor("gemv_mma x_rows", x_rows, torch.int64, 1)
    if not 1 <= tokens <= MAX_ROWS:
        raise KernelArgumentError(f"gemv_mma: 1 to {MAX_ROWS} token rows, got {tokens}")
    if not supports(k):
        raise KernelArgumentError(f"gemv_mma: K = {k} must be a multiple of {COLUMNS_PER_WARP} "
                                  f"(at most {MAX_WARPS * COLUMNS_PER_WARP})")
    if glu and weight.shape[0] % 2:
        raise KernelArgumentError(f"gemv_mma: glu takes gate and up rows, an even count, got {weight.shape[0]}")
    if residual is not None and norm_weight is None:
        raise KernelArgumentError("gemv_mma: a residual is added only with the norm (norm_weight)")
    if dependent_launch and not dependents_supported(x.device):
        raise KernelArgumentError(f"gemv_mma: dependent_launch needs compute capability 9.0 or later ({x.device})")
    if out_dtype not in (torch.float16, torch.float32):
        raise KernelArgumentError(f"gemv_mma: out_dtype float16 or float32, got {out_dtype}")
    _check_squares(residual_squares, row_squares, x, tokens, n, k, norm_weight is not None or glu or x_rows is not None
                   or rope is not None or out_dtype != torch.float16,
                   norm_weight is not None or glu or rope is not None or residual_squares is not None)
    if norm_weight is not None:
        check_tensor("gemv_mma norm_weight", norm_weight, torch.float16, 1, rows=k)
    if residual is not None:
        check_tensor("gemv_mma residual", residual, torch.float16, 2)
    if residual is not None and residual.shape != x.shape:
        raise KernelArgumentError(f"gemv_mma: residual {tuple(residual.shape)} must match x {tuple(x.shape)}")
    if rope is not None:
        rope.check(weight.shape[0], tokens, glu, out_dtype)
    y = torch.empty(tokens, rope.num_heads * rope.head_dim if rope else n, dtype=out_dtype, device=x.device)
    x64 = x.view(torch.int64)
    norm = norm_weight is not None
    res_out = torch.empty(tokens, k, dtype=torch.float16, device=x.device) if norm else y
    warps, tiles = warps_for(k), -(-n // TILE_ROWS) * -(-tokens // BLOCK_TOKENS)  # row tiles x token tiles
    kernel = gemv_mma_kernel(warps, norm, residual is not None, glu, x_rows is not None, rope.head_dim if rope else 0,
                             dependent_launch, allow_early, residual_squares is not None, row_squares is not None,
                             weight.data_ptr() % 16 == 0, out_dtype == torch.float32,
                             rope is not None and rope.inputs_before_wait)
    index = x64[0] if x_rows is None else x_rows             # unused int64 / float / cache arguments: stand-ins
    table = y if rope is None else rope.cos
    squares = interop.placeholder(torch.float32, 1, x.device)  # the forms that take no sums (never read)
    if residual_squares is not None:  # the residual where the normed forms take theirs; the sums out
        residual, squares = residual_squares, torch.empty(tokens, n // TILE_ROWS, dtype=torch.float32, device=x.device)
    elif row_squares is not None:
        squares = row_squares
    interop.launch_tensors(kernel, tiles, warps * WARP, [
        x64, index, x64 if residual is None else residual.view(torch.int64),
        x64[0] if norm_weight is None else norm_weight.view(torch.int64), float(eps), weight.view(torch.int64),
        tokens, y, res_out.view(torch.int64) if norm else x64,
        index if rope is None else rope.positions, table, table if rope is None else rope.sin,
        y.view(1, 1, 1, *y.shape) if rope is None else rope.kv_cache, index if rope is None else rope.slot_mapping,
        squares.view(-1)], dependent=dependent_launch)
    if residual_squares is not None:
        return y, squares
    out = y if rope is None else y.view(tokens, rope.num_heads, rope.head_dim)  # q [T, h, d] with rope
    return (out, res_out) if norm else out


def _check_squares(residual_squares: torch.Tensor | None, row_squares: torch.Tensor | None, x: torch.Tensor,
                   tokens: int, n: int, k: int, not_plain: bool, other_form: bool) -> None:
    """gemv_mma's residual_squares (the plain float16 form) and row_squares (the plain form): shapes,
    dtypes and forms."""
    if residual_squares is not None:
        if not_plain or n % TILE_ROWS:
            raise KernelArgumentError("gemv_mma: residual_squares takes the plain float16 form (no norm, glu, x_rows "
                                      f"or rope) and N a multiple of {TILE_ROWS}, got N = {n}")
        check_tensor("gemv_mma residual_squares", residual_squares, torch.float16, 2)
        if residual_squares.shape != (tokens, n):
            raise KernelArgumentError(f"gemv_mma: residual_squares {tuple(residual_squares.shape)} must match y "
                                      f"({tokens}, {n})")
    if row_squares is not None:
        if other_form:
            raise KernelArgumentError("gemv_mma: row_squares takes the plain form (no norm, glu, rope or residual_squares)")
        check_tensor("gemv_mma row_squares", row_squares, torch.float32, 2)
        if row_squares.shape != (x.shape[0], k // TILE_ROWS):
            raise KernelArgumentError(f"gemv_mma: row_squares {tuple(row_squares.shape)} must be x's rows by its "
                                      f"16-column tiles ({x.shape[0]}, {k // TILE_ROWS})")

"""The tensor-core GEMV's shape rules and its kernels' names (linear/gemv_mma_kernel.py builds the kernels)."""
from __future__ import annotations

from protospec.kernels.linear.gemv_mma_norm import COLUMNS_PER_WARP, MAX_WARPS


# Token rows one call takes: a block holds 8 (BLOCK_TOKENS), a row tile's weights serve each further 8
# from L2, so the bytes from memory stay the weights' while L2 traffic grows with the rows; past a few
# dozen rows cuBLAS's GEMM tiles (which reuse weights across their 64-256 rows in shared memory) win.
MAX_ROWS = 256


def warps_for(k: int) -> int:
    """Warps a block splits K over (K / 192)."""
    return k // COLUMNS_PER_WARP


def supports(k: int) -> bool:
    return k % COLUMNS_PER_WARP == 0 and 1 <= warps_for(k) <= MAX_WARPS


def variant_name(warps: int, norm: bool, residual: bool, glu: bool, gather: bool, rope_dim: int, dependent: bool,
                 allow_early: bool = False, pin_loads: bool = False, squares_out: bool = False,
                 squares_scale: bool = False, wide_loads: bool = False, rope_early: bool = False,
                 float_out: bool = False) -> str:
    """e.g. gemv_mma_k768_norm_residual_rope_dep_pin_w16: K, then each fused form the kernel takes (early:
    lets the next kernel launch before its own wait; pin: the wait kept below the weight loads; squares:
    adds the residual and writes its tiles' sums of squares; scaled: its rows scaled by 1 / rms from
    such sums; w16: 16-byte weight loads; ropeearly: the RoPE's inputs loaded before the wait; f32: float32 y, the LM head's logits)."""
    forms = [f for f, on in (("norm", norm), ("residual", residual), ("glu", glu), ("gather", gather),
                             ("rope", rope_dim), ("dep", dependent), ("early", allow_early), ("pin", pin_loads),
                             ("squares", squares_out), ("scaled", squares_scale), ("w16", wide_loads),
                             ("ropeearly", rope_early), ("f32", float_out)) if on]
    return "_".join(["gemv_mma", f"k{warps * COLUMNS_PER_WARP}", *forms])


def check_forms(norm: bool, glu: bool, gather: bool, rope_dim: int, squares_out: bool, squares_scale: bool) -> None:
    """Raise ValueError for a combination of forms gemv_mma_kernel does not build."""
    if squares_out and (norm or glu or gather or rope_dim):
        raise ValueError("gemv_mma_kernel: the squares only for the plain form")
    if squares_scale and (norm or glu or rope_dim):
        raise ValueError("gemv_mma_kernel: scaled rows only for the plain form")

"""The tensor-core GEMV's shape rules and its kernels' names (gemv_mma_kernel.py builds the kernels)."""
from __future__ import annotations

from protospec.kernels.gemv_mma_norm import COLUMNS_PER_WARP, MAX_WARPS


def warps_for(k: int) -> int:
    """Warps a block splits K over (K / 192)."""
    return k // COLUMNS_PER_WARP


def supports(k: int) -> bool:
    return k % COLUMNS_PER_WARP == 0 and 1 <= warps_for(k) <= MAX_WARPS


def variant_name(warps: int, norm: bool, residual: bool, glu: bool, gather: bool, rope_dim: int, dependent: bool,
                 prefetch_norm: bool = False, max_registers: int = 0, stats: bool = False, splits: int = 1,
                 allow_early: bool = False, pin_loads: bool = False, norm_tail: bool = False,
                 squares_out: bool = False, squares_in: bool = False, squares_scale: bool = False,
                 wide_loads: bool = False, rope_early: bool = False) -> str:
    """e.g. gemv_mma_k768_norm_residual_rope_dep: K, then each fused form the kernel takes (regs128: at
    most 128 registers a thread; split4: a tile's K over 4 blocks of `warps` warps; early: lets the next
    kernel launch before its own wait; pin: the wait kept below the weight loads; normtail: the last
    block runs the final norm; squares: adds the residual and writes its tiles' sums of squares;
    fromsquares: its norm from such sums; scaled: its rows scaled by 1 / rms from them; w16: 16-byte
    weight loads; ropeearly: the RoPE's inputs loaded before the wait)."""
    forms = [f for f, on in (("norm", norm), ("residual", residual), ("glu", glu), ("gather", gather),
                             ("rope", rope_dim), ("dep", dependent), ("prefetch", prefetch_norm),
                             (f"regs{max_registers}", max_registers), ("stats", stats), (f"split{splits}", splits > 1),
                             ("early", allow_early), ("pin", pin_loads), ("normtail", norm_tail),
                             ("squares", squares_out), ("fromsquares", squares_in), ("scaled", squares_scale),
                             ("w16", wide_loads), ("ropeearly", rope_early)) if on]
    return "_".join(["gemv_mma", f"k{warps * splits * COLUMNS_PER_WARP}", *forms])


def check_forms(norm: bool, residual: bool, glu: bool, gather: bool, rope_dim: int, stats: bool, splits: int,
                norm_tail: bool, squares_out: bool, squares_in: bool, squares_scale: bool) -> None:
    """Raise ValueError for a combination of forms gemv_mma_kernel does not build."""
    if stats and (glu or rope_dim):
        raise ValueError("gemv_mma_kernel: tile statistics only for the plain and normed forms")
    if splits > 1 and (norm or glu or gather or rope_dim or stats):
        raise ValueError("gemv_mma_kernel: split K only for the plain form")
    if (norm_tail or squares_out) and (norm or glu or gather or rope_dim or stats or splits > 1):
        raise ValueError("gemv_mma_kernel: the norm tail and the squares only for the plain unsplit form")
    if squares_in and (not norm or residual or glu) or squares_scale and (norm or glu or rope_dim or splits > 1):
        raise ValueError("gemv_mma_kernel: squares_in for the normed form without a residual, scale the plain one")

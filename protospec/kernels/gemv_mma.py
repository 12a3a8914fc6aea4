"""y = x @ W.T on tensor cores for a verify window's few token rows (T <= 8), float16, with the
fused forms a decoder layer uses (the norm and residual add, SiLU x up, RoPE with the cache store,
gathered rows, float32 logits): the checked entry point; and head_norm, the normed forms' norm as a
kernel of its own (gemv_mma_norm.py). The kernel and its layout are in gemv_mma_kernel.py, its
torch twin in gemv_mma_twin.py.
"""
from __future__ import annotations

import functools

import torch

from protospec.errors import KernelArgumentError
from protospec.kernels import interop
from protospec.kernels.dependent_launch import supported as dependents_supported
from protospec.kernels.gemv_mma_kernel import (COLUMNS_PER_WARP, MAX_TOKENS, MAX_WARPS, TILE_ROWS, WARP,  # noqa: F401
                                               gemv_mma_kernel, supports, warps_for)
from protospec.kernels.gemv_mma_norm import head_norm_kernel
from protospec.kernels.gemv_mma_twin import RopeCache, TailNorm, gemv_mma_reference, head_norm_reference  # noqa: F401
from protospec.kernels.interop import check_tensor
from protospec.kernels.logit_stats import LogitStats, attach
from protospec.kernels.paged_attention import arrival_counters

# The normed forms load the norm's weight with the weights, before a dependent's wait, instead of
# after the norm's reduction (same bits). On: timed faster (bench and kernel_census: --prefetch-norm off
# for the plain order); set before any graph is captured.
PREFETCH_NORM = True

# The LM head is the one linear launched with more blocks than fit on the GPU at once (2000 blocks of
# 16 vocabulary rows): they run in waves of (blocks an SM holds) x SMs, each wave a whole chain of
# loads, norm and products. Its registers a thread (0: the compiler's choice) and its norm-weight
# prefetch (which gains only in the first wave, and costs registers) set how many blocks an SM holds.
# Set before any graph is captured (bench and kernel_census: --lm-head-max-registers, --lm-head-prefetch-norm).
LM_HEAD_MAX_REGISTERS = 0
LM_HEAD_PREFETCH_NORM = True

# The LM head also writes each 16-row vocabulary tile's softmax statistics (logit_stats.py), which the
# sampling kernels then combine instead of reading the logits for them (rows at T = 1 or greedy).
# Set before any graph is captured (bench and kernel_census: --logit-stats).
LOGIT_STATS = False

# The o and down projections (N = 768) are 48 tiles of 16 rows: one block each leaves most SMs idle
# while 48 of them pull the weight (down's 4.7 MB). Split K over this many blocks a tile (1: unsplit;
# same bits). Set before any graph is captured (bench and kernel_census: --o-k-splits, --down-k-splits).
O_K_SPLITS = 1
DOWN_K_SPLITS = 1

# The linears ("o", "gate_up", "down") that let the next kernel launch before their own wait (their
# next kernel is a GEMV, whose loads before its wait are weights), so its weights stream during this
# one's whole wait, not only its tail. Never qkv: the attention after it loads cached keys before its
# wait. Set before any graph is captured (bench and kernel_census: --gemv-early-allow).
EARLY_ALLOW: frozenset = frozenset({"o", "gate_up", "down"})

# The dependent forms' wait kept below their weight loads in the machine code (ptxas otherwise hoists
# it above all of them: `python -m protospec.kernels.gpu_wait_order`), so the weights stream while the
# kernel before ends, as the dependent launch meant. Same bits. Set before any graph is captured
# (bench and kernel_census: --pin-weight-loads).
PIN_WEIGHT_LOADS = True

# The weights' 8-byte words loaded two at a time (one 16-byte load: half the load instructions a block
# issues; the same words, so the same bits), where the weight's data is 16-byte aligned. On: timed
# faster (data/results/README.md). Set before any graph is captured (bench and kernel_census:
# --wide-weight-loads).
WIDE_WEIGHT_LOADS = True

# The qkv projection's RoPE inputs (positions, slots, cos / sin rows) loaded before its wait where the
# forward did not write them (RopeCache.inputs_before_wait: every layer but the first), not after it.
# Same bits. Set before any graph is captured (bench and kernel_census: --rope-inputs-early).
ROPE_INPUTS_BEFORE_WAIT = True


def gemv_mma(x: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor | None = None,
             residual: torch.Tensor | None = None, eps: float = 1e-6, glu: bool = False,
             x_rows: torch.Tensor | None = None, rope: RopeCache | None = None, out_dtype: torch.dtype = torch.float16,
             dependent_launch: bool = False, max_registers: int = 0, prefetch_norm: bool | None = None,
             logit_stats: bool = False, k_splits: int = 1, allow_early: bool = False,
             tail_norm: TailNorm | None = None, residual_squares: torch.Tensor | None = None,
             row_squares: torch.Tensor | None = None):
    """x [T, K] float16 (T <= 8), weight [N, K] float16 -> y [T, N] float16 (out_dtype: or float32).
    norm_weight [K]: y = rms_norm(x + residual) * norm_weight @ W.T, and returns (y, x + residual) (a new
    tensor: the residual stream for the next layer; residual None = x alone). glu: weight [2I, K]
    (gate rows, then up rows), y [T, I] = silu(gate) * up. x_rows [T] int64: token i's x (and residual)
    row is x_rows[i] (x [R, K], any R). rope: weight is a qkv projection; y is q [T, h, d], rotated, and
    k (rotated) and v are stored in rope.kv_cache. dependent_launch: start while the kernel before
    it ends, its weight loads overlapping that kernel (sm_90 and later: dependent_launch.py).
    max_registers: at most that many registers a thread (0: the compiler's choice); prefetch_norm: the
    normed forms load the norm weight before the wait (None: PREFETCH_NORM). Neither changes the bits.
    logit_stats (float32 y; not with glu or rope): y also carries its tiles' softmax statistics
    (logit_stats.attached(y)). k_splits (the plain form): a 16-row tile's K over that many blocks, the
    last to finish summing every warp's products in the unsplit order (the same bits). allow_early
    (with dependent_launch): the next kernel may launch before this one's wait (gemv_mma_kernel).
    tail_norm (the plain float16 form, unsplit): the last block to finish also norms y's wanted rows
    (head_norm's arithmetic and bits), and the call returns (y, normed [T', N]): the LM head's norm
    without a launch of its own. residual_squares [T, N] float16 (the plain float16 form, unsplit, N a
    multiple of 16): y is x @ W.T + residual_squares, and the call returns (y, squares [T, N / 16]
    float32), each 16-column tile's sum of squares of y a row; row_squares: such sums over x's rows
    [R, K / 16]. With norm_weight (no residual) they give the normed form's norm without the block's
    reduction, the same bits; without it (the plain form) y's rows are scaled by 1 / rms(x's row)
    (eps), the norm's weight folded into `weight` by the caller. Either pair is the final norm
    between the last down projection and the LM head with no launch and no last block of its own."""
    check_tensor("gemv_mma x", x, torch.float16, 2)
    check_tensor("gemv_mma weight", weight, torch.float16, 2)
    k = x.shape[1]
    tokens = x.shape[0] if x_rows is None else x_rows.shape[0]
    n = weight.shape[0] // 2 if glu else weight.shape[0]
    if weight.shape[1] != k:
        raise KernelArgumentError(f"gemv_mma: x has {k} columns, the weight {weight.shape[1]}")
    if x_rows is not None:
        check_tensor("gemv_mma x_rows", x_rows, torch.int64, 1)
    if not 1 <= tokens <= MAX_TOKENS:
        raise KernelArgumentError(f"gemv_mma: 1 to {MAX_TOKENS} token rows, got {tokens}")
    if not supports(k):
        raise KernelArgumentError(f"gemv_mma: K = {k} must be a multiple of {COLUMNS_PER_WARP} "
                                  f"(at most {MAX_WARPS * COLUMNS_PER_WARP})")
    if glu and weight.shape[0] % 2:
        raise KernelArgumentError(f"gemv_mma: glu takes gate and up rows, an even count, got {weight.shape[0]}")
    if residual is not None and norm_weight is None:
        raise KernelArgumentError("gemv_mma: a residual is added only with the norm (norm_weight)")
    if dependent_launch and not dependents_supported(x.device):
        raise KernelArgumentError(f"gemv_mma: dependent_launch needs compute capability 9.0 or later ({x.device})")
    if max_registers and not 32 <= max_registers <= 255:
        raise KernelArgumentError(f"gemv_mma: max_registers 0 or 32 to 255, got {max_registers}")
    if logit_stats and (out_dtype != torch.float32 or glu or rope is not None):
        raise KernelArgumentError("gemv_mma: logit_stats takes float32 logits from the plain or normed forms")
    if k_splits != 1 and (k_splits < 1 or warps_for(k) % k_splits or norm_weight is not None or glu
                          or x_rows is not None or rope is not None or logit_stats):
        raise KernelArgumentError(f"gemv_mma: k_splits {k_splits} must divide K's {warps_for(k)} warps, plain form only")
    if out_dtype not in (torch.float16, torch.float32):
        raise KernelArgumentError(f"gemv_mma: out_dtype float16 or float32, got {out_dtype}")
    if tail_norm is not None:
        _check_tail_norm(tail_norm, tokens, n, k, norm_weight is not None or glu or x_rows is not None or rope is not None
                         or logit_stats or k_splits != 1 or out_dtype != torch.float16)
    _check_squares(residual_squares, row_squares, x, tokens, n, k, norm_weight is not None or glu or x_rows is not None
                   or rope is not None or logit_stats or k_splits != 1 or out_dtype != torch.float16
                   or tail_norm is not None, residual is not None or glu or rope is not None or k_splits != 1
                   or tail_norm is not None)
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
    warps, tiles = warps_for(k) // k_splits, -(-n // TILE_ROWS)
    kernel = gemv_mma_kernel(warps, norm, residual is not None, glu, x_rows is not None, rope.head_dim if rope else 0,
                             dependent_launch, norm and (PREFETCH_NORM if prefetch_norm is None else prefetch_norm),
                             max_registers, logit_stats, k_splits, allow_early, PIN_WEIGHT_LOADS,
                             tail_norm is not None, tail_norm is not None and tail_norm.residual is not None,
                             residual_squares is not None, row_squares is not None and norm,
                             row_squares is not None and not norm,
                             WIDE_WEIGHT_LOADS and weight.data_ptr() % 16 == 0, out_dtype == torch.float32,
                             rope is not None and rope.inputs_before_wait and ROPE_INPUTS_BEFORE_WAIT)
    index = x64[0] if x_rows is None else x_rows             # unused int64 / float / cache arguments: stand-ins
    table = y if rope is None else rope.cos
    stats = LogitStats.empty(tokens, n, x.device) if logit_stats else LogitStats(x64.view(torch.float32), x64,
                                                                                   x64.view(torch.float32))
    partials, counters = _split_buffers(tiles * warps_for(k) * WARP * 4, tiles, x.device, k_splits > 1)
    if tail_norm is not None:  # the norm's operands where the normed forms take theirs
        normed = torch.empty(tail_norm.rows.shape[0], n, dtype=torch.float16, device=x.device)
        index, residual, norm_weight, eps, res_out = tail_norm.rows, tail_norm.residual, tail_norm.norm_weight, \
            tail_norm.eps, normed
        counters = arrival_counters(x.device, 1, "gemv_norm_tail")
    if residual_squares is not None:  # the residual where the normed forms take theirs; the sums as the partials
        residual, partials = residual_squares, torch.empty(tokens, n // TILE_ROWS, dtype=torch.float32, device=x.device)
    elif row_squares is not None:
        partials = row_squares
    interop.launch_tensors(kernel, tiles * k_splits, warps * WARP, [
        x64, index, x64 if residual is None else residual.view(torch.int64),
        x64[0] if norm_weight is None else norm_weight.view(torch.int64), float(eps), weight.view(torch.int64),
        tokens, y, res_out.view(torch.int64) if norm or tail_norm is not None else x64,
        index if rope is None else rope.positions, table, table if rope is None else rope.sin,
        y.view(1, 1, 1, *y.shape) if rope is None else rope.kv_cache, index if rope is None else rope.slot_mapping,
        stats.tile_max, stats.tile_index, stats.tile_sum, partials.view(-1), counters,
        y.view(torch.int64) if tail_norm is not None else x64],  # y's words: N is a multiple of 4 only there
        dependent=dependent_launch)
    if logit_stats:
        attach(y, stats)
    if tail_norm is not None:
        return y, normed
    if residual_squares is not None:
        return y, partials
    out = y if rope is None else y.view(tokens, rope.num_heads, rope.head_dim)  # q [T, h, d] with rope
    return (out, res_out) if norm else out


def head_norm(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
              x_rows: torch.Tensor, dependent_launch: bool = False) -> torch.Tensor:
    """rms_norm(x[x_rows] + residual[x_rows]) * norm_weight -> [T, K] float16 (T = len(x_rows) <= 8),
    with the normed forms' arithmetic (gemv_mma_norm.py): gemv_mma of the result equals the normed
    form's gemv_mma(x, W, norm_weight, residual, eps, x_rows=x_rows) bit for bit. One block.
    dependent_launch: wait for the kernel before it, then let the next start (sm_90 and later)."""
    check_tensor("head_norm x", x, torch.float16, 2)
    check_tensor("head_norm x_rows", x_rows, torch.int64, 1)
    k, tokens = x.shape[1], x_rows.shape[0]
    if not 1 <= tokens <= MAX_TOKENS:
        raise KernelArgumentError(f"head_norm: 1 to {MAX_TOKENS} token rows, got {tokens}")
    if not supports(k):
        raise KernelArgumentError(f"head_norm: K = {k} must be a multiple of {COLUMNS_PER_WARP} "
                                  f"(at most {MAX_WARPS * COLUMNS_PER_WARP})")
    check_tensor("head_norm norm_weight", norm_weight, torch.float16, 1, rows=k)
    if residual is not None:
        check_tensor("head_norm residual", residual, torch.float16, 2)
        if residual.shape != x.shape:
            raise KernelArgumentError(f"head_norm: residual {tuple(residual.shape)} must match x {tuple(x.shape)}")
    if dependent_launch and not dependents_supported(x.device):
        raise KernelArgumentError(f"head_norm: dependent_launch needs compute capability 9.0 or later ({x.device})")
    out = torch.empty(tokens, k, dtype=torch.float16, device=x.device)
    x64 = x.view(torch.int64)
    kernel = head_norm_kernel(warps_for(k), residual is not None, dependent_launch)
    interop.launch_tensors(kernel, 1, warps_for(k) * WARP, [
        x64, x64 if residual is None else residual.view(torch.int64), x_rows, norm_weight.view(torch.int64),
        float(eps), tokens, out.view(torch.int64)], dependent=dependent_launch)
    return out


def _check_tail_norm(tail: TailNorm, tokens: int, n: int, k: int, fused: bool) -> None:
    """gemv_mma's tail_norm: the plain float16 unsplit form only; its norm spans y's N columns with
    at most the block's warps."""
    if fused:
        raise KernelArgumentError("gemv_mma: tail_norm takes the plain float16 form (no norm, glu, x_rows, rope, "
                                  "logit_stats or k_splits)")
    if not supports(n) or warps_for(n) > warps_for(k):
        raise KernelArgumentError(f"gemv_mma: tail_norm over N = {n} columns needs a multiple of {COLUMNS_PER_WARP} "
                                  f"no wider than K = {k}")
    check_tensor("gemv_mma tail_norm rows", tail.rows, torch.int64, 1)
    if not 1 <= tail.rows.shape[0] <= MAX_TOKENS:
        raise KernelArgumentError(f"gemv_mma: tail_norm: 1 to {MAX_TOKENS} rows, got {tail.rows.shape[0]}")
    check_tensor("gemv_mma tail_norm norm_weight", tail.norm_weight, torch.float16, 1, rows=n)
    if tail.residual is not None:
        check_tensor("gemv_mma tail_norm residual", tail.residual, torch.float16, 2)
        if tail.residual.shape != (tokens, n):
            raise KernelArgumentError(f"gemv_mma: tail_norm residual {tuple(tail.residual.shape)} must match y "
                                      f"({tokens}, {n})")


def _check_squares(residual_squares: torch.Tensor | None, row_squares: torch.Tensor | None, x: torch.Tensor,
                   tokens: int, n: int, k: int, not_plain: bool, other_form: bool) -> None:
    """gemv_mma's residual_squares (the plain float16 form, unsplit) and row_squares (the normed form
    without a residual, or the plain unsplit one): shapes, dtypes and forms."""
    if residual_squares is not None:
        if not_plain or n % TILE_ROWS:
            raise KernelArgumentError("gemv_mma: residual_squares takes the plain float16 form (no norm, glu, x_rows, "
                                      f"rope, logit_stats, k_splits or tail_norm) and N a multiple of {TILE_ROWS}, "
                                      f"got N = {n}")
        check_tensor("gemv_mma residual_squares", residual_squares, torch.float16, 2)
        if residual_squares.shape != (tokens, n):
            raise KernelArgumentError(f"gemv_mma: residual_squares {tuple(residual_squares.shape)} must match y "
                                      f"({tokens}, {n})")
    if row_squares is not None:
        if other_form:
            raise KernelArgumentError("gemv_mma: row_squares takes the normed form without a residual, or the "
                                      "plain one (no glu, rope, k_splits or tail_norm)")
        check_tensor("gemv_mma row_squares", row_squares, torch.float32, 2)
        if row_squares.shape != (x.shape[0], k // TILE_ROWS):
            raise KernelArgumentError(f"gemv_mma: row_squares {tuple(row_squares.shape)} must be x's rows by its "
                                      f"16-column tiles ({x.shape[0]}, {k // TILE_ROWS})")


_SPLIT_PARTIALS: dict = {}


def _split_buffers(floats: int, tiles: int, device: torch.device, split: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The split-K form's scratch: its warps' products [>= floats] float32 and arrival counters [>= tiles]
    int32 (zero between calls). One growing buffer per device (a call reads only what it wrote, and the
    kernels of a forward run one after another); the old ones stay alive for the graphs that captured
    them. Unsplit calls get 1-element stand-ins."""
    if not split:
        return _stand_ins(device)
    kept = _SPLIT_PARTIALS.setdefault(device, [])
    if not kept or kept[-1].numel() < floats:
        kept.append(torch.empty(max(floats, 2 * kept[-1].numel() if kept else 0), dtype=torch.float32, device=device))
    return kept[-1], arrival_counters(device, tiles, "gemv_split")


@functools.cache
def _stand_ins(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(1, dtype=torch.float32, device=device), torch.zeros(1, dtype=torch.int32, device=device)

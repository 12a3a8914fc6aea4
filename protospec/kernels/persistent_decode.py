"""A whole decode forward (one token per sequence) of a Llama model in one persistent kernel.

Why: at batch 1 a decode forward of a small model is launch-bound (~10 kernels per layer, each a few
microseconds of fixed cost against well under a microsecond of weights); one cooperative kernel pays
one launch and a grid-wide sync per phase instead (bench.grid_sync_cost times one: it grows with the
grid, so the grid is one block of THREADS per SM). The phases (kernels/decode_phases.py): per layer
qkv (RMSNorm, RoPE and the cache write folded in), attention, o, gate_up (RMSNorm and SiLU folded in),
down; then the LM head. Five syncs a layer: RoPE needs both halves of a head's row (a warp computes
the pair), the norms need a whole residual row (every block recomputes the token's inverse RMS from
it: a few KB from L2, where a phase of its own would cost a sync). Each phase stages its input rows in
shared memory first, so a launch takes tokens_per_launch tokens (the host launches again for more).
kernels/phase_kernels.py runs the same phases as one ordinary kernel each, for comparison.

TIMELINE builds a variant whose block 0 stamps the GPU clock after every phase (bench.persistent_phases
reads it). The CUDA simulator runs a cooperative grid of one block of one warp (its grid sync is a
block barrier, its shuffles block barriers too): every loop is then uniform.

Why its grid syncs end: the launch is cooperative (driver_launch), which the driver refuses unless
every block of the grid can be resident at once, and every block runs the same phases in the same
order, so every block reaches every sync; no block spins on a counter or flag of its own making.
"""
from __future__ import annotations

import functools

from numba import float32, int64

from protospec.kernels import interop, persistent_phases
from protospec.kernels.interop import cuda
from protospec.kernels.decode_phases import make_decode_phases
from protospec.kernels.persistent_phases import DEVICE, WARP
from protospec.kernels.word_loads import global_timer

THREADS = WARP if interop.SIMULATOR else 256
MAX_TOKENS = 64          # tokens per launch at most (their inverse RMS sit in shared memory)
STAGED = 8192            # float32 activations a block stages per phase: tokens x the widest GEMV input
MAX_HEAD_DIM = 128       # a lane holds a whole K row in registers (as int64 words)
LM_HEAD_ROWS = 4         # LM head rows per warp item, at most 4 (their words all in flight: registers against latency)


def unsupported(hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int) -> str | None:
    """Why the kernel cannot run this shape, or None: rows are read as 8-byte words (4 float16 values),
    a lane holds a K row, a block stages one token's widest GEMV input at least."""
    if head_dim % 4 or head_dim > MAX_HEAD_DIM:
        return f"head_dim {head_dim} must be a multiple of 4 and at most {MAX_HEAD_DIM}"
    if tokens_per_launch(hidden, heads * head_dim, intermediate) < 1:
        return f"a GEMV input of {max(hidden, heads * head_dim, intermediate)} values does not fit the {STAGED} staged"
    for name, size in (("hidden_size", hidden), ("heads x head_dim", heads * head_dim), ("intermediate_size", intermediate)):
        if size % 4:
            return f"{name} {size} must be a multiple of 4 (weights are read as 8-byte words)"
    if heads % kv_heads:
        return f"{heads} heads do not share {kv_heads} KV heads evenly"
    return None


def tokens_per_launch(hidden: int, attention_width: int, intermediate: int) -> int:
    """Tokens one launch takes: as many rows of the widest GEMV input as the staging buffer holds."""
    return min(MAX_TOKENS, STAGED // max(hidden, attention_width, intermediate))


def stamps(layers: int) -> int:
    """Clock stamps a TIMELINE launch writes: the start, 5 per layer, after the head."""
    return 2 + 5 * layers


def phase_names(layers: int) -> list[str]:
    """What ends at each stamp after the first (layer 0's qkv reads the embedding rows itself)."""
    per_layer = ("qkv", "attention", "o", "gate_up", "down")
    return [*(f"layer{i}.{p}" for i in range(layers) for p in per_layer), "lm_head"]


def decode_kernel(hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int, layers: int, vocab: int,
                  half: bool = True, timeline: bool = False, threads: int = THREADS):
    """The kernel for one model shape (its sizes are compile-time constants), compiled on first use;
    half: float16 weights and cache (else float32); threads per block (a multiple of 32). The build
    knobs LM_HEAD_ROWS and persistent_phases.V_KEYS_PER_LOAD are read now, part of the cache key."""
    return _cached_kernel(hidden, heads, kv_heads, head_dim, intermediate, layers, vocab, half, timeline, threads,
                          LM_HEAD_ROWS, persistent_phases.V_KEYS_PER_LOAD)


@functools.cache
def _cached_kernel(*shape_and_knobs):
    return _make_kernel(*shape_and_knobs)


def _make_kernel(H: int, NH: int, KVH: int, D: int, I: int, L: int, V: int, HALF: bool, TIMELINE: bool,  # noqa: N803
                 THREADS: int, LM: int, V_KEYS: int):
    phases = make_decode_phases(H, NH, KVH, D, I, V, HALF, THREADS, LM, V_KEYS)
    qkv, attend, o, gate_up, down, lm = phases[:6]
    WORD_REGS, MERGE, SCRATCH = phases.word_regs, phases.merge, phases.scratch
    WARPS = THREADS // WARP
    STAMPS = stamps(L) if TIMELINE else 1
    options = {} if interop.SIMULATOR else {"fastmath": True, "launch_bounds": (THREADS, 1)}

    @cuda.jit(**DEVICE)
    def phase_done(timeline, stamp, tid):
        """Block 0 stamps the clock when a phase has ended everywhere (TIMELINE builds)."""
        if TIMELINE and cuda.blockIdx.x == 0 and tid == 0:
            timeline[stamp] = global_timer()
        return stamp + 1

    @cuda.jit(**options)
    def decode_forward(ids, positions, slots, block_tables, embed, norm1, norm2, norm_f, w_qkv, w_o, w_gu, w_down, w_lm,
                       cos, sin, kv, kv_words, eps, scale, resid, q, a, act, logits, timeline):
        """
        ids, positions, slots [T] int64 (T <= tokens_per_launch); block_tables [T, W] int32 (a token's sequence's)
        embed [V, H]; norm1, norm2 [L, H]; norm_f [1, H]; cos, sin [P, d]; kv [L, 2, blocks, bs, KVH, d]
        as int64 words: kv_words (kv's); w_qkv [L, QKV, H/e]; w_o [L, H, NH d/e]; w_gu [L, 2 I, H/e];
        w_down [L, H, I/e]; w_lm [1, V, H/e]
        scratch (float32): resid [T, H]; q, a [T, NH d]; act [T, I]; out: logits [T, V] float32
        timeline [stamps] int64 (TIMELINE; else unused)
        """
        grid = cuda.cg.this_grid()
        tid = cuda.threadIdx.x
        gwarp = cuda.blockIdx.x * WARPS + tid // WARP
        gwarps = cuda.gridDim.x * WARPS
        tokens = ids.shape[0]
        scratch = cuda.shared.array(SCRATCH, float32)  # the simulator's warp exchanges (4 rows at once)
        xs = cuda.shared.array(STAGED, float32)        # the phase's input rows: [T, cols]
        inv = cuda.shared.array(MAX_TOKENS, float32)
        qs = cuda.shared.array(D, float32)
        part_max = cuda.shared.array(WARPS, float32)
        part_sum = cuda.shared.array(WARPS, float32)
        part_acc = cuda.shared.array(MERGE, float32)
        words = cuda.local.array(WORD_REGS, int64)
        sums = cuda.local.array(4, float32)
        stamp = phase_done(timeline, 0, tid)
        for layer in range(L):
            qkv(layer, ids, positions, slots, embed, resid, norm1, w_qkv, cos, sin, q, kv, eps, tokens,
                inv, xs, words, sums, scratch, tid, gwarp, gwarps)
            grid.sync()
            stamp = phase_done(timeline, stamp, tid)
            attend(q, kv_words, layer, block_tables, positions, tokens, scale, a, qs, part_max, part_sum, part_acc,
                   scratch, tid)
            grid.sync()
            stamp = phase_done(timeline, stamp, tid)
            o(w_o, layer, a, ids, tokens, resid, norm1, inv, xs, words, sums, scratch, tid, gwarp, gwarps)
            grid.sync()
            stamp = phase_done(timeline, stamp, tid)
            gate_up(layer, ids, resid, norm2, w_gu, act, eps, tokens, inv, xs, words, sums, scratch, tid, gwarp, gwarps)
            grid.sync()
            stamp = phase_done(timeline, stamp, tid)
            down(w_down, layer, act, ids, tokens, resid, norm1, inv, xs, words, sums, scratch, tid, gwarp, gwarps)
            grid.sync()
            stamp = phase_done(timeline, stamp, tid)
        lm(ids, resid, norm_f, w_lm, logits, eps, tokens, inv, xs, words, sums, scratch, tid, gwarp, gwarps)
        if TIMELINE:
            grid.sync()
            phase_done(timeline, STAMPS - 1, tid)

    return decode_forward


def grid_blocks(kernel, threads: int, args: list, sm_count: int) -> int:
    """One block per SM, or fewer if fewer fit at once (1 in the simulator): a grid sync costs more
    the more blocks it waits for."""
    return min(interop.max_cooperative_blocks(kernel, threads, args), sm_count)

"""A whole decode forward (one token per sequence) of a Llama model in one persistent kernel.

Why: at batch 1 a decode forward of a small model is launch-bound (~10 kernels per layer, each a few
microseconds of fixed cost against well under a microsecond of weights); one cooperative kernel pays
one launch and a grid-wide sync per phase instead (bench.grid_sync_cost times one: it grows with the
grid, so the grid is one block of THREADS per SM). Phases, separated by grid syncs:
  per layer:  qkv  rotated q into q; rotated k and v into the paged cache  (RMSNorm folded in; layer 0
                   reads the embedding rows and starts the residual from them)
              attn a = softmax(q K^T s) V over the context                  (a block per (token, head))
              o    resid += a W_o^T
              mlp  act = silu(h W_gate^T) * (h W_up^T), h = rmsnorm(resid)  (RMSNorm folded in)
              down resid += act W_down^T
  final:           logits = rmsnorm(resid) W_lm^T (float32)                  (RMSNorm folded in)
Five syncs a layer: RoPE needs both halves of a head's row (a warp computes the pair), the norms need
a whole residual row (every block recomputes the token's inverse RMS from it: a few KB from L2, where
a phase of its own would cost a sync). Each phase stages its input rows in shared memory first, so a
launch takes tokens_per_launch tokens (the host launches again for more). The staging, GEMVs and
attention are in kernels/persistent_phases.py. Activations stay float32 between phases; weights and
the cache are read as int64 words (kernels/word_loads.py).

TIMELINE builds a variant whose block 0 stamps the GPU clock after every phase (bench.persistent_phases
reads it). The CUDA simulator runs a cooperative grid of one block of one warp (its grid sync is a
block barrier, its shuffles block barriers too): every loop is then uniform.
"""
from __future__ import annotations

import functools
import math

from numba import float32, int64

from protospec.kernels import interop, persistent_phases
from protospec.kernels.interop import cuda
from protospec.kernels.persistent_phases import DEVICE, WARP, make_phases
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


def decode_kernel(hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int, layers: int,
                  half: bool = True, timeline: bool = False, threads: int = THREADS):
    """The kernel for one model shape (its sizes are compile-time constants), compiled on first use;
    half: float16 weights and cache (else float32); threads per block (a multiple of 32). The build
    knobs LM_HEAD_ROWS and persistent_phases.V_KEYS_PER_LOAD are read now, part of the cache key."""
    return _cached_kernel(hidden, heads, kv_heads, head_dim, intermediate, layers, half, timeline, threads,
                          LM_HEAD_ROWS, persistent_phases.V_KEYS_PER_LOAD)


@functools.cache
def _cached_kernel(*shape_and_knobs):
    return _make_kernel(*shape_and_knobs)


def _make_kernel(H: int, NH: int, KVH: int, D: int, I: int, L: int, HALF: bool, TIMELINE: bool, THREADS: int,  # noqa: N803, C901
                 LM: int, V_KEYS: int):
    if not 1 <= LM <= 4:
        raise ValueError(f"LM_HEAD_ROWS = {LM}: 1 to 4 rows per item (a warp's sums hold 4)")
    stage, make_gemv, attention = make_phases(NH, KVH, D, HALF, THREADS, V_KEYS)
    qkv_load, qkv_dot, qkv_words = make_gemv(2, H)           # RoPE pairs (i, i + d/2), V pairs (c, c + 1)
    o_phase, o_words = _residual_phase(stage, make_gemv, NH * D, H)       # resid += a W_o^T
    gu_load, gu_dot, gu_words = make_gemv(4, H)             # (gate, up) for two consecutive rows
    down_phase, down_words = _residual_phase(stage, make_gemv, I, H)      # resid += act W_down^T
    lm_load, lm_dot, lm_words = make_gemv(LM, H)
    WORD_REGS = max(qkv_words, o_words, gu_words, down_words, lm_words)
    WARPS = THREADS // WARP
    MERGE = WARPS * D
    HALF_D = D // 2
    QKV = (NH + 2 * KVH) * D
    QK_PAIRS = (NH + KVH) * HALF_D
    V_PAIRS = KVH * HALF_D
    STAMPS = stamps(L) if TIMELINE else 1
    SCRATCH = 4 * THREADS if interop.SIMULATOR else 1
    options = {} if interop.SIMULATOR else {"fastmath": True, "launch_bounds": (THREADS, 1)}

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
        lane = tid % WARP
        gwarp = cuda.blockIdx.x * WARPS + tid // WARP
        gwarps = cuda.gridDim.x * WARPS
        tokens, vocab = ids.shape[0], w_lm.shape[1]
        block_size = kv.shape[3]
        scratch = cuda.shared.array(SCRATCH, float32)  # the simulator's warp exchanges (4 rows at once)
        xs = cuda.shared.array(STAGED, float32)        # the phase's input rows: [T, cols]
        inv = cuda.shared.array(MAX_TOKENS, float32)
        qs = cuda.shared.array(D, float32)
        part_max = cuda.shared.array(WARPS, float32)
        part_sum = cuda.shared.array(WARPS, float32)
        part_acc = cuda.shared.array(MERGE, float32)
        words = cuda.local.array(WORD_REGS, int64)
        sums = cuda.local.array(4, float32)
        stamp = 0
        if TIMELINE and cuda.blockIdx.x == 0 and tid == 0:
            timeline[0] = global_timer()
        for layer in range(L):
            if layer == 0:  # the embedding rows feed the first norm directly; the residual starts from them
                stage(embed, ids, True, tokens, H, True, norm1, 0, eps, inv, xs, scratch, tid)
                for item in range(cuda.blockIdx.x * THREADS + tid, tokens * H, cuda.gridDim.x * THREADS):
                    resid[item // H, item % H] = float32(embed[ids[item // H], item % H])
            else:
                stage(resid, ids, False, tokens, H, True, norm1, layer, eps, inv, xs, scratch, tid)
            for item in range(gwarp, QK_PAIRS + V_PAIRS, gwarps):
                rope = item < QK_PAIRS
                head, i = item // HALF_D, item % HALF_D
                r0 = head * D + i if rope else (NH + KVH) * D + 2 * (item - QK_PAIRS)
                qkv_load(w_qkv, layer, r0, HALF_D if rope else 1, 0, QKV, words, lane)
                for t in range(tokens):
                    qkv_dot(words, xs, t, sums, scratch, tid)
                    slot = slots[t]
                    block, offset = slot // block_size, slot % block_size
                    if lane == 0 and rope:
                        p = min(positions[t], cos.shape[0] - 1)  # a padding row's position may run past the table
                        lo = sums[0] * float32(cos[p, i]) - sums[1] * float32(sin[p, i])
                        hi = sums[1] * float32(cos[p, i + HALF_D]) + sums[0] * float32(sin[p, i + HALF_D])
                        if head < NH:
                            q[t, r0] = lo
                            q[t, r0 + HALF_D] = hi
                        elif slot >= 0:
                            kv[layer, 0, block, offset, head - NH, i] = lo
                            kv[layer, 0, block, offset, head - NH, i + HALF_D] = hi
                    elif lane == 0 and slot >= 0:
                        c = r0 - (NH + KVH) * D
                        kv[layer, 1, block, offset, c // D, c % D] = sums[0]
                        kv[layer, 1, block, offset, c // D, c % D + 1] = sums[1]
            grid.sync()
            stamp += 1
            if TIMELINE and cuda.blockIdx.x == 0 and tid == 0:
                timeline[stamp] = global_timer()
            attention(q, kv_words, layer, block_tables, positions, tokens, scale, a, qs, part_max, part_sum, part_acc,
                      scratch, tid)
            grid.sync()
            stamp += 1
            if TIMELINE and cuda.blockIdx.x == 0 and tid == 0:
                timeline[stamp] = global_timer()
            o_phase(w_o, layer, a, ids, tokens, resid, norm1, inv, xs, words, sums, scratch, tid, gwarp, gwarps)
            grid.sync()
            stamp += 1
            if TIMELINE and cuda.blockIdx.x == 0 and tid == 0:
                timeline[stamp] = global_timer()
            stage(resid, ids, False, tokens, H, True, norm2, layer, eps, inv, xs, scratch, tid)
            for item in range(gwarp, I // 2, gwarps):
                r0 = 2 * item
                gu_load(w_gu, layer, r0, I, 1, 2 * I, words, lane)
                for t in range(tokens):
                    gu_dot(words, xs, t, sums, scratch, tid)
                    if lane == 0:
                        act[t, r0] = sums[0] / (float32(1.0) + math.exp(-sums[0])) * sums[1]
                        act[t, r0 + 1] = sums[2] / (float32(1.0) + math.exp(-sums[2])) * sums[3]
            grid.sync()
            stamp += 1
            if TIMELINE and cuda.blockIdx.x == 0 and tid == 0:
                timeline[stamp] = global_timer()
            down_phase(w_down, layer, act, ids, tokens, resid, norm1, inv, xs, words, sums, scratch, tid, gwarp, gwarps)
            grid.sync()
            stamp += 1
            if TIMELINE and cuda.blockIdx.x == 0 and tid == 0:
                timeline[stamp] = global_timer()
        stage(resid, ids, False, tokens, H, True, norm_f, 0, eps, inv, xs, scratch, tid)
        for item in range(gwarp, (vocab + LM - 1) // LM, gwarps):
            r0 = LM * item
            lm_load(w_lm, 0, r0, 1, 2, vocab, words, lane)
            for t in range(tokens):
                lm_dot(words, xs, t, sums, scratch, tid)
                if lane == 0:
                    for n in range(LM):
                        if r0 + n < vocab:
                            logits[t, r0 + n] = sums[n]
        if TIMELINE:
            grid.sync()
            if cuda.blockIdx.x == 0 and tid == 0:
                timeline[STAMPS - 1] = global_timer()

    return decode_forward


def _residual_phase(stage, make_gemv, COLS: int, H: int):  # noqa: N803
    """A phase that adds src W^T (W [L, H, COLS] as words) into the residual: a warp per output row
    (one writer per element); src staged as it is (no norm). Returns (phase, its word registers)."""
    load, dot, word_regs = make_gemv(1, COLS)

    @cuda.jit(**DEVICE)
    def phase(w, layer, src, ids, tokens, resid, unused_norm, inv, xs, words, sums, scratch, tid, gwarp, gwarps):
        lane = tid % WARP
        stage(src, ids, False, tokens, COLS, False, unused_norm, layer, 0.0, inv, xs, scratch, tid)
        for item in range(gwarp, H, gwarps):
            load(w, layer, item, 1, 2, H, words, lane)
            for t in range(tokens):
                dot(words, xs, t, sums, scratch, tid)
                if lane == 0:
                    resid[t, item] += sums[0]

    return phase, word_regs


def grid_blocks(kernel, threads: int, args: list, sm_count: int) -> int:
    """One block per SM, or fewer if fewer fit at once (1 in the simulator): a grid sync costs more
    the more blocks it waits for."""
    return min(interop.max_cooperative_blocks(kernel, threads, args), sm_count)

"""The persistent decode forward's phases (kernels/decode_phases.py) as one ordinary kernel each.

Why: a persistent kernel holds every phase in one body, so the compiler allocates registers for the
hungriest phase everywhere (the persistent forward spills registers: data/results/README.md); here each
phase is compiled alone and launched with as many blocks as it has work, a kernel boundary standing
in for the grid sync. Same arithmetic, same buffers, so the two ways give the same logits and cache
(a test checks it); bench.persistent_phases times both.

A forward is 5 launches a layer plus the LM head: qkv(layer), attend(layer), o(layer), gate_up(layer),
down(layer), ..., lm.
"""
from __future__ import annotations

import functools

from numba import float32, int64

from protospec.kernels import interop
from protospec.kernels.decode_phases import make_decode_phases
from protospec.kernels.interop import cuda
from protospec.kernels.persistent_decode import MAX_TOKENS, STAGED
from protospec.kernels.persistent_phases import WARP


@functools.cache
def phase_kernels(hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int, vocab: int, half: bool,
                  threads: int, lm_rows: int, v_keys: int) -> dict:
    """{phase: (kernel, blocks)} for one model shape, compiled on first use (attend's blocks: one per
    (token, head), None here)."""
    return _make_kernels(hidden, heads, kv_heads, head_dim, intermediate, vocab, half, threads, lm_rows, v_keys)


def _make_kernels(H: int, NH: int, KVH: int, D: int, I: int, V: int, HALF: bool, THREADS: int, LM: int,  # noqa: N803
                  V_KEYS: int) -> dict:
    phases = make_decode_phases(H, NH, KVH, D, I, V, HALF, THREADS, LM, V_KEYS)
    WORD_REGS, MERGE, SCRATCH = phases.word_regs, phases.merge, phases.scratch
    WARPS = THREADS // WARP
    options = {} if interop.SIMULATOR else {"fastmath": True}
    qkv, attend, o, gate_up, down, lm = phases[:6]

    @cuda.jit(**options)
    def qkv_kernel(layer, ids, positions, slots, embed, resid, norm1, w_qkv, cos, sin, q, kv, eps):
        tid = cuda.threadIdx.x
        scratch = cuda.shared.array(SCRATCH, float32)
        xs = cuda.shared.array(STAGED, float32)
        inv = cuda.shared.array(MAX_TOKENS, float32)
        words = cuda.local.array(WORD_REGS, int64)
        sums = cuda.local.array(4, float32)
        qkv(layer, ids, positions, slots, embed, resid, norm1, w_qkv, cos, sin, q, kv, eps, ids.shape[0],
            inv, xs, words, sums, scratch, tid, cuda.blockIdx.x * WARPS + tid // WARP, cuda.gridDim.x * WARPS)

    @cuda.jit(**options)
    def attend_kernel(layer, q, kv_words, block_tables, positions, scale, a):
        tid = cuda.threadIdx.x
        scratch = cuda.shared.array(SCRATCH, float32)
        qs = cuda.shared.array(D, float32)
        part_max = cuda.shared.array(WARPS, float32)
        part_sum = cuda.shared.array(WARPS, float32)
        part_acc = cuda.shared.array(MERGE, float32)
        attend(q, kv_words, layer, block_tables, positions, positions.shape[0], scale, a, qs, part_max, part_sum,
               part_acc, scratch, tid)

    def residual_kernel(phase):
        @cuda.jit(**options)
        def kernel(layer, w, src, ids, resid, unused_norm):
            tid = cuda.threadIdx.x
            scratch = cuda.shared.array(SCRATCH, float32)
            xs = cuda.shared.array(STAGED, float32)
            inv = cuda.shared.array(MAX_TOKENS, float32)
            words = cuda.local.array(WORD_REGS, int64)
            sums = cuda.local.array(4, float32)
            phase(w, layer, src, ids, ids.shape[0], resid, unused_norm, inv, xs, words, sums, scratch, tid,
                  cuda.blockIdx.x * WARPS + tid // WARP, cuda.gridDim.x * WARPS)
        return kernel

    @cuda.jit(**options)
    def gate_up_kernel(layer, ids, resid, norm2, w_gu, act, eps):
        tid = cuda.threadIdx.x
        scratch = cuda.shared.array(SCRATCH, float32)
        xs = cuda.shared.array(STAGED, float32)
        inv = cuda.shared.array(MAX_TOKENS, float32)
        words = cuda.local.array(WORD_REGS, int64)
        sums = cuda.local.array(4, float32)
        gate_up(layer, ids, resid, norm2, w_gu, act, eps, ids.shape[0], inv, xs, words, sums, scratch, tid,
                cuda.blockIdx.x * WARPS + tid // WARP, cuda.gridDim.x * WARPS)

    @cuda.jit(**options)
    def lm_kernel(ids, resid, norm_f, w_lm, logits, eps):
        tid = cuda.threadIdx.x
        scratch = cuda.shared.array(SCRATCH, float32)
        xs = cuda.shared.array(STAGED, float32)
        inv = cuda.shared.array(MAX_TOKENS, float32)
        words = cuda.local.array(WORD_REGS, int64)
        sums = cuda.local.array(4, float32)
        lm(ids, resid, norm_f, w_lm, logits, eps, ids.shape[0], inv, xs, words, sums, scratch, tid,
           cuda.blockIdx.x * WARPS + tid // WARP, cuda.gridDim.x * WARPS)

    # A warp per GEMV item. The simulator starts a thread per CUDA thread for every block: two blocks
    # there (each walks its share of the items), enough to exercise a grid of several blocks
    blocks = {name: min(2, -(-n // WARPS)) if interop.SIMULATOR else -(-n // WARPS) for name, n in phases.items.items()}
    return {"qkv": (qkv_kernel, blocks["qkv"]), "attend": (attend_kernel, None), "o": (residual_kernel(o), blocks["o"]),
            "gate_up": (gate_up_kernel, blocks["gate_up"]), "down": (residual_kernel(down), blocks["down"]),
            "lm": (lm_kernel, blocks["lm"])}

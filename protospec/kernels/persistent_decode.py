"""A whole decode forward (one token per sequence) of a Llama model in one persistent kernel.

Why: at batch 1 a decode forward of a small model is launch-bound (~10 kernels per layer, each a few
microseconds of fixed cost against well under a microsecond of weights); one cooperative kernel
pays one launch and a grid-wide sync per phase instead (bench.grid_sync_cost times a sync). The
phases, each a grid-stride loop over its work items, separated by grid syncs:
  embed          resid[t] = embed[ids[t]]
  per layer:     norm      h = rmsnorm(resid) * w1                    (a block per token)
                 qkv       qkv = h W_qkv^T                            (a warp per (token, output row))
                 rope      q, k rotated; k, v into the paged cache    (a thread per pair of dims)
                 attention a = softmax(q K^T s) V over the context    (a block per (token, head))
                 o         resid += a W_o^T
                 norm      h = rmsnorm(resid) * w2
                 gate_up   act = silu(h W_gate^T) * (h W_up^T)
                 down      resid += act W_down^T
  final:         norm, then logits = h W_lm^T (float32)
Activations stay float32 between phases (resid, h, qkv, q, a, act in scratch buffers); weights and
the cache are the model's dtype. A correctness building block with a torch twin (the model's own
forward); EngineConfig.persistent_decode routes decode forwards to it (model/persistent_forward.py).

The CUDA simulator runs a cooperative grid of one block (its grid sync is a block barrier), and its
shuffles are block barriers too, so there a block is one warp: every loop is then uniform.
"""
from __future__ import annotations

import functools
import math

from numba import float32

from protospec.kernels import interop
from protospec.kernels.interop import cuda
from protospec.kernels.reductions import tree_sum, xor_exchange

WARP = 32
THREADS = WARP if interop.SIMULATOR else 128
MERGE_BYTES = 40 * 1024  # the attention phase merges a block's (max, sum, acc[d]) through shared memory


def supports(head_dim: int) -> bool:
    """Every thread's attention accumulator (head_dim floats) fits the block's merge buffer."""
    return head_dim % 2 == 0 and THREADS * head_dim * 4 <= MERGE_BYTES


@functools.cache
def decode_kernel(hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int, layers: int):
    """The kernel for one model shape (its sizes are compile-time constants), compiled on first use."""
    return _make_kernel(hidden, heads, kv_heads, head_dim, intermediate, layers)


def _make_kernel(H: int, NH: int, KVH: int, D: int, I: int, L: int):  # noqa: N803 (Numba freezes them as constants)
    HALF = D // 2
    GROUP = NH // KVH
    QKV = (NH + 2 * KVH) * D
    MERGED = THREADS * D
    WARPS = THREADS // WARP
    UNROLL = 2 if interop.SIMULATOR else 8  # the simulator: still a masked tail at these tiny widths
    STEP = WARP * UNROLL
    NO_KEY = float32(-1e30)
    PLAIN, ADD, GATE = 0, 1, 2  # how a GEMV's output row lands: written, added to the residual, or gated

    if interop.SIMULATOR:  # its shuffles cost two block barriers each: sum through shared memory once
        @cuda.jit(device=True)
        def warp_sum(value, scratch, tid):
            cuda.syncthreads()
            scratch[tid] = value
            cuda.syncthreads()
            total = float32(0.0)
            for i in range(WARP):
                total += scratch[tid // WARP * WARP + i]
            return total
    else:
        @cuda.jit(device=True)
        def warp_sum(value, scratch, tid):
            for step in range(5):
                value += xor_exchange(value, 16 >> step, scratch, tid)
            return value

    @cuda.jit(device=True)
    def gemv(x, w, layer, rows, cols, tokens, out, mode, scratch, tid):
        """out[t, r] (by mode) = sum_c x[t, c] w[layer, r, c] for every (token, row); a warp per item,
        its lanes over c (coalesced weight rows). GATE: out[t, r] = silu(row r) * row (r + rows)."""
        lane = tid % WARP
        wv = cuda.local.array(UNROLL, float32)  # this step's weights, activations ([UNROLL] each)
        wu = cuda.local.array(UNROLL, float32)
        xs = cuda.local.array(UNROLL, float32)
        first = cuda.blockIdx.x * WARPS + tid // WARP
        for item in range(first, tokens * rows, cuda.gridDim.x * WARPS):
            t = item // rows
            r = item % rows
            acc, up = float32(0.0), float32(0.0)
            for c0 in range(lane, cols, STEP):
                # UNROLL columns' loads first (clamped indices, no branch), then their multiply-adds:
                # loads in flight together, as kernels/gemv.py measured a memory-bound GEMV wants
                for u in range(UNROLL):
                    c = min(c0 + u * WARP, cols - 1)
                    wv[u] = float32(w[layer, r, c])
                    xs[u] = x[t, c] if c0 + u * WARP < cols else float32(0.0)
                    if mode == GATE:
                        wu[u] = float32(w[layer, r + rows, c])
                for u in range(UNROLL):
                    acc += xs[u] * wv[u]
                    if mode == GATE:
                        up += xs[u] * wu[u]
            acc = warp_sum(acc, scratch, tid)
            if mode == GATE:
                up = warp_sum(up, scratch, tid)
            if lane == 0:
                if mode == ADD:
                    out[t, r] += acc
                elif mode == GATE:
                    out[t, r] = acc / (float32(1.0) + math.exp(-acc)) * up
                else:
                    out[t, r] = acc

    @cuda.jit(device=True)
    def rms_norm(resid, w, layer, tokens, eps, h, partial, tid):
        """h[t] = resid[t] / sqrt(mean(resid[t]^2) + eps) * w[layer], a block per token."""
        for t in range(cuda.blockIdx.x, tokens, cuda.gridDim.x):
            total = float32(0.0)
            for c in range(tid, H, THREADS):
                total += resid[t, c] * resid[t, c]
            partial[tid] = total
            cuda.syncthreads()
            tree_sum(partial, tid, THREADS)
            inv = float32(1.0) / math.sqrt(partial[0] / float32(H) + float32(eps))
            for c in range(tid, H, THREADS):
                h[t, c] = resid[t, c] * inv * float32(w[layer, c])
            cuda.syncthreads()

    @cuda.jit(device=True)
    def rope_and_cache(qkv, positions, slots, cos, sin, kv, layer, tokens, q, gid, gsize):
        """q (rotated) into q; k (rotated) and v into the cache at each token's slot (none below 0)."""
        block_size = kv.shape[3]
        for item in range(gid, tokens * (NH + KVH) * HALF, gsize):
            t = item // ((NH + KVH) * HALF)
            head = item // HALF % (NH + KVH)
            i = item % HALF
            p = positions[t]
            base = head * D  # q heads, then k heads, in qkv's row
            x1, x2 = qkv[t, base + i], qkv[t, base + i + HALF]
            lo = x1 * float32(cos[p, i]) - x2 * float32(sin[p, i])
            hi = x2 * float32(cos[p, i + HALF]) + x1 * float32(sin[p, i + HALF])
            if head < NH:
                q[t, base + i] = lo
                q[t, base + i + HALF] = hi
            elif slots[t] >= 0:
                kvh = head - NH
                kv[layer, 0, slots[t] // block_size, slots[t] % block_size, kvh, i] = lo
                kv[layer, 0, slots[t] // block_size, slots[t] % block_size, kvh, i + HALF] = hi
        for item in range(gid, tokens * KVH * D, gsize):
            t = item // (KVH * D)
            if slots[t] >= 0:
                kvh = item // D % KVH
                kv[layer, 1, slots[t] // block_size, slots[t] % block_size, kvh, item % D] = qkv[t, (NH + KVH) * D + item % (KVH * D)]

    @cuda.jit(device=True)
    def attend(q, kv, layer, block_tables, positions, tokens, scale, a, stats, merged, tid):
        """a[t, head] = softmax over keys 0..position of (q . k) scale, times V: a block per (token,
        head); each thread an online softmax over keys tid, tid + THREADS, ..., merged at the end."""
        block_size = kv.shape[3]
        acc = cuda.local.array(D, float32)
        for item in range(cuda.blockIdx.x, tokens * NH, cuda.gridDim.x):
            t = item // NH
            head = item % NH
            kvh = head // GROUP
            m, l = NO_KEY, float32(0.0)
            for e in range(D):
                acc[e] = float32(0.0)
            # A row whose position runs past its table (a padding row, a sequence the host is about to
            # stop) reads no block id beyond the table
            keys = min(positions[t] + 1, block_tables.shape[1] * block_size)
            for j in range(tid, keys, THREADS):
                block = block_tables[t, j // block_size]
                s = float32(0.0)
                for e in range(D):
                    s += q[t, head * D + e] * float32(kv[layer, 0, block, j % block_size, kvh, e])
                s *= float32(scale)
                top = max(m, s)
                alpha, p = math.exp(m - top), math.exp(s - top)
                l = l * alpha + p
                for e in range(D):
                    acc[e] = acc[e] * alpha + p * float32(kv[layer, 1, block, j % block_size, kvh, e])
                m = top
            stats[tid] = m
            cuda.syncthreads()
            top = NO_KEY
            for i in range(THREADS):
                top = max(top, stats[i])
            weight = math.exp(m - top) if l > float32(0.0) else float32(0.0)
            for e in range(D):
                merged[tid * D + e] = acc[e] * weight
            cuda.syncthreads()
            stats[tid] = l * weight
            cuda.syncthreads()
            total = float32(0.0)
            for i in range(THREADS):
                total += stats[i]
            for e in range(tid, D, THREADS):
                value = float32(0.0)
                for i in range(THREADS):
                    value += merged[i * D + e]
                a[t, head * D + e] = value / total
            cuda.syncthreads()

    @cuda.jit
    def decode_forward(ids, positions, slots, block_tables, embed, norm1, norm2, norm_f, w_qkv, w_o, w_gu, w_down, w_lm,
                       cos, sin, kv, eps, scale, resid, h, qkv, q, a, act, logits):
        """
        ids, positions, slots [T] int64; block_tables [T, W] int32 (a token's sequence's table)
        embed [V, H]; norm1, norm2 [L, H]; norm_f [1, H]; w_qkv [L, QKV, H]; w_o [L, H, NH D]
        w_gu [L, 2 I, H]; w_down [L, H, I]; w_lm [1, V, H]; cos, sin [P, D]; kv [L, 2, blocks, bs, KVH, D]
        scratch (float32): resid, h [T, H]; qkv [T, QKV]; q, a [T, NH D]; act [T, I]; out: logits [T, V] f32
        """
        grid = cuda.cg.this_grid()
        tid = cuda.threadIdx.x
        gid = cuda.blockIdx.x * THREADS + tid
        gsize = cuda.gridDim.x * THREADS
        tokens = ids.shape[0]
        scratch = cuda.shared.array(THREADS, float32)
        stats = cuda.shared.array(THREADS, float32)
        merged = cuda.shared.array(MERGED, float32)
        for item in range(gid, tokens * H, gsize):
            resid[item // H, item % H] = float32(embed[ids[item // H], item % H])
        grid.sync()
        for layer in range(L):
            rms_norm(resid, norm1, layer, tokens, eps, h, scratch, tid)
            grid.sync()
            gemv(h, w_qkv, layer, QKV, H, tokens, qkv, PLAIN, scratch, tid)
            grid.sync()
            rope_and_cache(qkv, positions, slots, cos, sin, kv, layer, tokens, q, gid, gsize)
            grid.sync()
            attend(q, kv, layer, block_tables, positions, tokens, scale, a, stats, merged, tid)
            grid.sync()
            gemv(a, w_o, layer, H, NH * D, tokens, resid, ADD, scratch, tid)
            grid.sync()
            rms_norm(resid, norm2, layer, tokens, eps, h, scratch, tid)
            grid.sync()
            gemv(h, w_gu, layer, I, H, tokens, act, GATE, scratch, tid)
            grid.sync()
            gemv(act, w_down, layer, H, I, tokens, resid, ADD, scratch, tid)
            grid.sync()
        rms_norm(resid, norm_f, 0, tokens, eps, h, scratch, tid)
        grid.sync()
        gemv(h, w_lm, 0, w_lm.shape[1], H, tokens, logits, PLAIN, scratch, tid)

    return decode_forward


def grid_blocks(kernel, args: list) -> int:
    """As many blocks as can be resident at once: a cooperative grid's largest (1 in the simulator)."""
    return interop.max_cooperative_blocks(kernel, THREADS, args)

"""The device functions the persistent decode kernel (kernels/persistent_decode.py) is built from:
a warp-per-row-group GEMV over weights read as 8-byte words, the RMSNorm scale folded into the GEMV's
activation loads, and a block-per-(token, head) attention over the paged cache.

GEMV (`make_gemv(rows, cols)`): a warp owns ROWS weight rows of an item and loads all of their words
(cols / ELEMS words a row, WPL per lane, lane l reading words l, l + 32, ...) into registers before the
first multiply-add, so every byte an item needs is in flight at once; then, for each token, it dots
them with the token's activation row (float32, L1/L2-resident) and sums across the warp with a xor
butterfly, so every lane ends with the sums. Rows of an item: r0 + (n // 2) s_out + (n % 2) s_in, which
covers consecutive rows (s_in 1, s_out 2), RoPE's pairs (i, i + d/2) and SiLU's (gate, up) pairs (s_in
= I). The weights are read once per forward whatever the token count.

Attention (`make_attention()`): a block per (token, head); warp w walks keys w KU, (w + WARPS) KU, ...
loading KU keys' K and V (its lanes over the head's dims: one coalesced row per key) before scoring
any, an online softmax per warp, merged across the block's warps in shared memory.
"""
from __future__ import annotations

import math

from numba import float32

from protospec.kernels import interop
from protospec.kernels.interop import cuda
from protospec.kernels.reductions import xor_exchange
from protospec.kernels.word_loads import unpack_f16x4, unpack_f32x2

WARP = 32
# inlined into the kernel (NVVM's alwaysinline): a device function left as a call takes its arrays by
# pointer, so they live in local memory and each load waits for the store that spills it
DEVICE = {"device": True} if interop.SIMULATOR else {"device": True, "forceinline": True}
NO_KEY = -1e30


def make_phases(H: int, NH: int, KVH: int, D: int, I: int, HALF: bool, THREADS: int, KU: int):  # noqa: N803, C901
    """Device functions for one model shape; HALF: the weights and cache are float16 (else float32)."""
    ELEMS = 4 if HALF else 2          # values per int64 word
    WARPS = THREADS // WARP
    DS = -(-D // WARP)                # head dims per lane
    KV_REGS = KU * DS
    GROUP = NH // KVH

    if interop.SIMULATOR:  # a shuffle costs two block barriers there: one exchange through shared memory
        @cuda.jit(**DEVICE)
        def warp_sum(value, scratch, tid):
            cuda.syncthreads()
            scratch[tid] = value
            cuda.syncthreads()
            total = float32(0.0)
            for i in range(WARP):
                total += scratch[tid // WARP * WARP + i]
            return total

        @cuda.jit(**DEVICE)
        def warp_sums(sums, rows, scratch, tid):
            """sums[:rows] summed across the warp, every lane getting the totals."""
            cuda.syncthreads()
            for n in range(rows):
                scratch[n * THREADS + tid] = sums[n]
            cuda.syncthreads()
            for n in range(rows):
                total = float32(0.0)
                for i in range(WARP):
                    total += scratch[n * THREADS + tid // WARP * WARP + i]
                sums[n] = total
    else:
        @cuda.jit(**DEVICE)
        def warp_sum(value, scratch, tid):
            for step in range(5):
                value += xor_exchange(value, 16 >> step, scratch, tid)
            return value

        @cuda.jit(**DEVICE)
        def warp_sums(sums, rows, scratch, tid):
            """sums[:rows] summed across the warp (a xor butterfly), every lane getting the totals."""
            for n in range(rows):
                sums[n] = warp_sum(sums[n], scratch, tid)

    @cuda.jit(**DEVICE)
    def inverse_rms(x, tokens, eps, inv, scratch, tid):
        """inv[t] = 1 / sqrt(mean(x[t]^2) + eps) for every token, by the block's warps (then a barrier)."""
        lane, warp = tid % WARP, tid // WARP
        for t in range(warp, tokens, WARPS):
            total = float32(0.0)
            for c in range(lane, H, WARP):
                total += x[t, c] * x[t, c]
            total = warp_sum(total, scratch, tid)
            if lane == 0:
                inv[t] = float32(1.0) / math.sqrt(total / float32(H) + float32(eps))
        cuda.syncthreads()

    def make_gemv(ROWS: int, COLS: int):  # noqa: N803
        WORDS = COLS // ELEMS
        WPL = -(-WORDS // WARP)

        @cuda.jit(**DEVICE)
        def load(w, layer, r0, s_in, s_out, rows, words, lane):
            """words[n WPL + u] = word lane + 32 u of row n of the item (rows past the matrix clamped)."""
            for n in range(ROWS):
                r = min(r0 + (n // 2) * s_out + (n % 2) * s_in, rows - 1)
                for u in range(WPL):
                    words[n * WPL + u] = w[layer, r, min(lane + u * WARP, WORDS - 1)]

        @cuda.jit(**DEVICE)
        def dot(words, x, t, scale, g, layer, use_g, sums, scratch, tid):
            """sums[n] = sum_c row_n[c] x[t, c] (x[t, c] scale g[layer, c] when use_g), on every lane."""
            lane = tid % WARP
            for n in range(ROWS):
                sums[n] = float32(0.0)
            for u in range(WPL):
                i = lane + u * WARP
                keep = float32(1.0) if i < WORDS else float32(0.0)  # a masked tail word adds nothing
                c = min(i, WORDS - 1) * ELEMS
                x0, x1 = x[t, c] * keep * scale, x[t, c + 1] * keep * scale
                if use_g:
                    x0, x1 = x0 * float32(g[layer, c]), x1 * float32(g[layer, c + 1])
                if HALF:
                    x2, x3 = x[t, c + 2] * keep * scale, x[t, c + 3] * keep * scale
                    if use_g:
                        x2, x3 = x2 * float32(g[layer, c + 2]), x3 * float32(g[layer, c + 3])
                    for n in range(ROWS):
                        w0, w1, w2, w3 = unpack_f16x4(words[n * WPL + u])
                        sums[n] += w0 * x0 + w1 * x1 + w2 * x2 + w3 * x3
                else:
                    for n in range(ROWS):
                        w0, w1 = unpack_f32x2(words[n * WPL + u])
                        sums[n] += w0 * x0 + w1 * x1
            warp_sums(sums, ROWS, scratch, tid)

        return load, dot, WPL * ROWS

    @cuda.jit(**DEVICE)
    def attention(q, kv, layer, block_tables, positions, tokens, scale, a, warp_max, warp_sum_exp, warp_acc,
                  scratch, tid):
        """a[t, head d : (head + 1) d] = softmax over keys 0..positions[t] of q . k scale, times V."""
        lane, warp = tid % WARP, tid // WARP
        block_size = kv.shape[3]
        qd = cuda.local.array(DS, float32)
        acc = cuda.local.array(DS, float32)
        kk = cuda.local.array(KV_REGS, float32)
        vv = cuda.local.array(KV_REGS, float32)
        for item in range(cuda.blockIdx.x, tokens * NH, cuda.gridDim.x):
            t, head = item // NH, item % NH
            kvh = head // GROUP
            for j in range(DS):
                d = lane + j * WARP
                qd[j] = q[t, head * D + min(d, D - 1)] if d < D else float32(0.0)
                acc[j] = float32(0.0)
            m, l = float32(NO_KEY), float32(0.0)
            # a row whose position runs past its table (padding, a stopping sequence) reads inside it
            keys = min(positions[t] + 1, block_tables.shape[1] * block_size)
            for k0 in range(warp * KU, keys, WARPS * KU):
                for u in range(KU):  # every load of the step first: KU keys in flight
                    key = min(k0 + u, keys - 1)
                    block, offset = block_tables[t, key // block_size], key % block_size
                    for j in range(DS):
                        d = min(lane + j * WARP, D - 1)
                        kk[u * DS + j] = float32(kv[layer, 0, block, offset, kvh, d])
                        vv[u * DS + j] = float32(kv[layer, 1, block, offset, kvh, d])
                for u in range(KU):
                    s = float32(0.0)
                    for j in range(DS):
                        s += qd[j] * kk[u * DS + j]
                    s = warp_sum(s, scratch, tid) * float32(scale)
                    real = k0 + u < keys
                    top = max(m, s) if real else m
                    alpha = math.exp(m - top)
                    p = math.exp(s - top) if real else float32(0.0)
                    l = l * alpha + p
                    for j in range(DS):
                        acc[j] = acc[j] * alpha + p * vv[u * DS + j]
                    m = top
            if lane == 0:
                warp_max[warp], warp_sum_exp[warp] = m, l
            for j in range(DS):
                d = lane + j * WARP
                if d < D:
                    warp_acc[warp * D + d] = acc[j]
            cuda.syncthreads()
            for e in range(tid, D, THREADS):
                top = float32(NO_KEY)
                for w in range(WARPS):
                    top = max(top, warp_max[w])
                total, value = float32(0.0), float32(0.0)
                for w in range(WARPS):
                    weight = math.exp(warp_max[w] - top) if warp_sum_exp[w] > float32(0.0) else float32(0.0)
                    total += warp_sum_exp[w] * weight
                    value += warp_acc[w * D + e] * weight
                a[t, head * D + e] = value / total
            cuda.syncthreads()

    return inverse_rms, make_gemv, attention

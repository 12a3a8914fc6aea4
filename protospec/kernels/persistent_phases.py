"""The device functions the persistent decode kernel (kernels/persistent_decode.py) is built from:
the phase's activations staged in shared memory (the RMSNorm applied as they are), a warp-per-row-group
GEMV over weights read as 8-byte words, and a block-per-(token, head) attention over the paged cache.

Staging (`stage`): a block copies its phase's input rows into shared memory once, normalised and
scaled when an RMSNorm feeds the GEMV (each block recomputes the token's inverse RMS: a row of a few
KB from L2, cheaper than a phase of its own and its grid sync), so a GEMV's activations cost a shared
load each, not a trip to L2 after its weights arrive.

GEMV (`make_gemv(rows, cols)`): a warp owns ROWS weight rows of an item and loads all of their words
(cols / ELEMS words a row, WPL per lane, lane l reading words l, l + 32, ...) into registers before the
first multiply-add, so every byte an item needs is in flight at once; then, for each token, it dots
them with the staged activations and sums across the warp with a xor butterfly, so every lane ends
with the sums. Rows of an item: r0 + (n // 2) s_out + (n % 2) s_in, which covers consecutive rows
(s_in 1, s_out 2), RoPE's pairs (i, i + d/2) and SiLU's (gate, up) pairs (s_in = I). The weights are
read once per launch whatever its token count.

Attention (`attention`): a block per (token, head); its warps take 32-key chunks in turn, a lane per
key: the lane loads its key's whole K row as words and scores it alone (no shuffles per key), the
chunk's softmax statistics take one warp reduction each, and the V rows of the chunk's 32 keys are
loaded before any is used (lanes over the row's words, each key's block and offset broadcast from the
lane that looked it up). Warps keep an online softmax; the block merges them in shared memory.
"""
from __future__ import annotations

import math

from numba import float32, int32, int64, uint32

from protospec.kernels import interop
from protospec.kernels.interop import cuda
from protospec.kernels.reductions import xor_exchange
from protospec.kernels.word_loads import load_flat, load_flat_mutable, unpack_f16x4, unpack_f32x2

WARP = 32
# inlined into the kernel (NVVM's alwaysinline): a device function left as a call takes its arrays by
# pointer, so they live in local memory and each load waits for the store that spills it
DEVICE = {"device": True} if interop.SIMULATOR else {"device": True, "forceinline": True}
NO_KEY = -1e30
V_KEYS_PER_LOAD = 32  # V rows of a 32-key chunk loaded together: more bytes in flight, more registers


def make_phases(NH: int, KVH: int, D: int, HALF: bool, THREADS: int, VK: int = V_KEYS_PER_LOAD):  # noqa: N803, C901
    """Device functions for one model shape; HALF: the weights and cache are float16 (else float32);
    VK: V rows the attention loads together (a divisor of 32)."""
    if WARP % VK:
        raise ValueError(f"V rows loaded together: {VK} does not divide a warp's 32 keys")
    ELEMS = 4 if HALF else 2          # values per int64 word
    WARPS = THREADS // WARP
    GROUP = NH // KVH
    KW = D // ELEMS                   # words in a K or V row
    VW = -(-KW // WARP)               # V words per lane
    V_REGS = VK * VW                  # V words per lane: [VK keys, VW]
    DV = VW * ELEMS                   # a lane's accumulators

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
        def warp_max(value, scratch, tid):
            cuda.syncthreads()
            scratch[tid] = value
            cuda.syncthreads()
            top = value
            for i in range(WARP):
                top = max(top, scratch[tid // WARP * WARP + i])
            return top

        @cuda.jit(**DEVICE)
        def publish(value, slot, scratch, tid):
            """Make `value` readable by the warp's lanes through lane_value (a float32, or an int below 2^24)
            in slot 1..3. Slot 0 is warp_sum's and warp_max's; warp_sums uses slots 0..rows-1, safe
            because no published value is live during a GEMV."""
            cuda.syncthreads()
            scratch[slot * THREADS + tid] = value
            cuda.syncthreads()

        @cuda.jit(**DEVICE)
        def lane_value(value, lane, slot, scratch, tid):
            """`value` as lane `lane` of this warp published it in `slot`."""
            return scratch[slot * THREADS + tid // WARP * WARP + lane]

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
        def warp_max(value, scratch, tid):
            for step in range(5):
                value = max(value, cuda.shfl_xor_sync(0xFFFFFFFF, value, 16 >> step))
            return value

        @cuda.jit(**DEVICE)
        def publish(value, slot, scratch, tid):
            """Nothing to do on a GPU: lane_value reads registers."""

        @cuda.jit(**DEVICE)
        def lane_value(value, lane, slot, scratch, tid):
            """`value` as lane `lane` of this warp holds it."""
            return cuda.shfl_sync(0xFFFFFFFF, value, lane)

        @cuda.jit(**DEVICE)
        def warp_sums(sums, rows, scratch, tid):
            """sums[:rows] summed across the warp (a xor butterfly), every lane getting the totals."""
            for n in range(rows):
                sums[n] = warp_sum(sums[n], scratch, tid)

    @cuda.jit(**DEVICE)
    def stage(src, ids, from_embed, tokens, cols, norm, g, layer, eps, inv, xs, scratch, tid):
        """xs[t cols + c] = x[t, c] for every token, x[t] = src[ids[t]] if from_embed else src[t]; with
        norm, x[t] / sqrt(mean(x[t]^2) + eps) * g[layer] (RMSNorm). Ends with a block barrier."""
        lane, warp = tid % WARP, tid // WARP
        if norm:
            for t in range(warp, tokens, WARPS):
                row = ids[t] if from_embed else t
                total = float32(0.0)
                for c in range(lane, cols, WARP):
                    v = float32(src[row, c])
                    total += v * v
                total = warp_sum(total, scratch, tid)
                if lane == 0:
                    inv[t] = float32(1.0) / math.sqrt(total / float32(cols) + float32(eps))
            cuda.syncthreads()
        for item in range(tid, tokens * cols, THREADS):
            t, c = item // cols, item % cols
            row = ids[t] if from_embed else t
            v = float32(src[row, c])
            xs[item] = v * inv[t] * float32(g[layer, c]) if norm else v
        cuda.syncthreads()

    def make_gemv(ROWS: int, COLS: int):  # noqa: N803
        WORDS = COLS // ELEMS
        WPL = -(-WORDS // WARP)

        @cuda.jit(**DEVICE)
        def load(w, layer, r0, s_in, s_out, rows, words, lane):
            """words[n WPL + u] = word lane + 32 u of row n of the item (rows past the matrix clamped).
            Flat loads from one address per row (word_loads.load_flat: the weights never change)."""
            for n in range(ROWS):
                r = min(r0 + (n // 2) * s_out + (n % 2) * s_in, rows - 1)
                row = (layer * w.shape[1] + r) * WORDS
                for u in range(WPL):
                    if WORDS % WARP == 0:  # every lane's every word is in the row: no clamp
                        words[n * WPL + u] = load_flat(w, row + lane + u * WARP)
                    else:
                        words[n * WPL + u] = load_flat(w, row + min(lane + u * WARP, WORDS - 1))

        @cuda.jit(**DEVICE)
        def dot(words, xs, t, sums, scratch, tid):
            """sums[n] = sum_c row_n[c] xs[t COLS + c], on every lane."""
            lane = tid % WARP
            for n in range(ROWS):
                sums[n] = float32(0.0)
            for u in range(WPL):
                i = lane + u * WARP
                keep = float32(1.0) if i < WORDS else float32(0.0)  # a masked tail word adds nothing
                c = t * COLS + min(i, WORDS - 1) * ELEMS
                if HALF:
                    x0, x1, x2, x3 = xs[c] * keep, xs[c + 1] * keep, xs[c + 2] * keep, xs[c + 3] * keep
                    for n in range(ROWS):
                        w0, w1, w2, w3 = unpack_f16x4(words[n * WPL + u])
                        sums[n] += w0 * x0 + w1 * x1 + w2 * x2 + w3 * x3
                else:
                    x0, x1 = xs[c] * keep, xs[c + 1] * keep
                    for n in range(ROWS):
                        w0, w1 = unpack_f32x2(words[n * WPL + u])
                        sums[n] += w0 * x0 + w1 * x1
            warp_sums(sums, ROWS, scratch, tid)

        return load, dot, WPL * ROWS

    @cuda.jit(**DEVICE)
    def cache_row(kv_words, layer, kv, block, offset, kvh):
        """The flat offset of word 0 of a K (kv 0) or V (kv 1) row in the cache's words [L, 2, blocks,
        block_size, KVH, KW]: one address per row, its words at constant offsets. The loads are not
        marked invariant: the persistent kernel writes this cache in an earlier phase."""
        slots = kv_words.shape[2] * kv_words.shape[3]
        return (((layer * 2 + kv) * slots + block * kv_words.shape[3] + offset) * KVH + kvh) * KW

    @cuda.jit(**DEVICE)
    def load_v(kv_words, layer, kvh, block, offset, j0, vw, scratch, tid):
        """vw[jj VW + v] = word lane + 32 v of the V row of the chunk's key j0 + jj, for jj < VK (each key's
        block and offset as its lane published them)."""
        lane = tid % WARP
        for jj in range(VK):
            block_j = int32(lane_value(block, j0 + jj, 1, scratch, tid))
            offset_j = int32(lane_value(offset, j0 + jj, 2, scratch, tid))
            row = cache_row(kv_words, layer, 1, block_j, offset_j, kvh)
            for v in range(VW):
                vw[jj * VW + v] = load_flat_mutable(kv_words, row + min(lane + v * WARP, KW - 1))

    @cuda.jit(**DEVICE)
    def attention(q, kv_words, layer, block_tables, positions, tokens, scale, a, qs, part_max, part_sum, part_acc,
                  scratch, tid):
        """a[t, head d : (head + 1) d] = softmax over keys 0..positions[t] of q . k scale, times V."""
        lane, warp = tid % WARP, tid // WARP
        block_size = kv_words.shape[3]
        kw = cuda.local.array(KW, int64)       # this lane's key's K row
        vw = cuda.local.array(V_REGS, int64)   # VK keys' V rows: [VK, VW words of this lane]
        acc = cuda.local.array(DV, float32)    # this lane's dims: words lane, lane + 32, ... of a V row
        for item in range(cuda.blockIdx.x, tokens * NH, cuda.gridDim.x):
            t, head = item // NH, item % NH
            kvh = head // GROUP
            for d in range(tid, D, THREADS):
                qs[d] = q[t, head * D + d] * float32(scale)
            for i in range(DV):
                acc[i] = float32(0.0)
            m, l = float32(NO_KEY), float32(0.0)
            cuda.syncthreads()
            # a row whose position runs past its table (padding, a stopping sequence) reads inside it
            keys = min(positions[t] + 1, block_tables.shape[1] * block_size)
            for k0 in range(warp * WARP, keys, WARPS * WARP):
                key = min(k0 + lane, keys - 1)
                column = int32(uint32(key) // uint32(block_size))  # 32 bits: a 64-bit division is a call
                block, offset = int32(block_tables[t, column]), int32(key - column * block_size)
                row = cache_row(kv_words, layer, 0, block, offset, kvh)
                for w in range(KW):
                    kw[w] = load_flat_mutable(kv_words, row + w)
                publish(block, 1, scratch, tid)
                publish(offset, 2, scratch, tid)
                load_v(kv_words, layer, kvh, block, offset, 0, vw, scratch, tid)  # in flight while K is scored
                s = float32(0.0)
                for w in range(KW):
                    if HALF:
                        k0_, k1_, k2_, k3_ = unpack_f16x4(kw[w])
                        s += k0_ * qs[4 * w] + k1_ * qs[4 * w + 1] + k2_ * qs[4 * w + 2] + k3_ * qs[4 * w + 3]
                    else:
                        k0_, k1_ = unpack_f32x2(kw[w])
                        s += k0_ * qs[2 * w] + k1_ * qs[2 * w + 1]
                real = k0 + lane < keys
                s = s if real else float32(NO_KEY)
                top = max(m, warp_max(s, scratch, tid))
                p = math.exp(s - top) if real else float32(0.0)
                alpha = math.exp(m - top)
                l = l * alpha + warp_sum(p, scratch, tid)
                m = top
                for i in range(DV):
                    acc[i] *= alpha
                publish(p, 3, scratch, tid)
                for j0 in range(0, WARP, VK):
                    if j0 > 0:
                        load_v(kv_words, layer, kvh, block, offset, j0, vw, scratch, tid)
                    for jj in range(VK):
                        p_j = lane_value(p, j0 + jj, 3, scratch, tid)
                        for v in range(VW):
                            if HALF:
                                v0, v1, v2, v3 = unpack_f16x4(vw[jj * VW + v])
                                acc[4 * v] += p_j * v0
                                acc[4 * v + 1] += p_j * v1
                                acc[4 * v + 2] += p_j * v2
                                acc[4 * v + 3] += p_j * v3
                            else:
                                v0, v1 = unpack_f32x2(vw[jj * VW + v])
                                acc[2 * v] += p_j * v0
                                acc[2 * v + 1] += p_j * v1
            if lane == 0:
                part_max[warp], part_sum[warp] = m, l
            for v in range(VW):
                w = lane + v * WARP
                if w < KW:
                    for e in range(ELEMS):
                        part_acc[warp * D + w * ELEMS + e] = acc[v * ELEMS + e]
            cuda.syncthreads()
            for d in range(tid, D, THREADS):
                top = float32(NO_KEY)
                for w in range(WARPS):
                    top = max(top, part_max[w])
                total, value = float32(0.0), float32(0.0)
                for w in range(WARPS):
                    weight = math.exp(part_max[w] - top) if part_sum[w] > float32(0.0) else float32(0.0)
                    total += part_sum[w] * weight
                    value += part_acc[w * D + d] * weight
                a[t, head * D + d] = value / total
            cuda.syncthreads()

    return stage, make_gemv, attention

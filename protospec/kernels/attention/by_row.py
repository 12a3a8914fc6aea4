"""Paged attention, one block per (query token, head, chunk of keys): the shape for few rows.

Split-K ("flash-decoding"): the keys of each (query token, head) are cut into chunks of CHUNK keys,
one block per chunk, so a decode step at batch 1 still spreads over ~100 blocks. Each block writes
its chunk's max m, sum l of exp(s - m) and acc = sum_j exp(s_j - m) V_j; attention/paged_attention.py's combine
kernel merges the chunks. Loads are unrolled by four so each thread keeps several in flight, and
short chunks make many blocks: at batch 1 latency, not bandwidth, is what attention waits on.

Its cost grows with the block table's width (chunks cover the table, not the context) and with the
query tokens (each re-reads the keys): attention/paged_attention.py sends wide batches of verify windows to
attention/by_kv_head.py instead.
"""
from __future__ import annotations

import functools
import math

from numba import float32, int32

from protospec.kernels.launch import interop
from protospec.kernels.launch.interop import cuda

THREADS = 32 if interop.SIMULATOR else 128  # per block; also the largest head_dim served
# Keys per block; THREADS / CHUNK threads share a key's dot product (the chunk sizes are compared
# by bench.layer_kernel_cost's history in data/results).
CHUNK = 16 if interop.SIMULATOR else 32
MAX_HEAD_DIM = THREADS


@functools.cache
def partial_kernel(chunk: int):
    """The partial kernel for `chunk` keys per block (a compile-time constant: shared-memory sizes);
    layer_kernel_cost compares chunk sizes."""
    if chunk < 1 or THREADS % chunk:
        raise ValueError(f"chunk must divide {THREADS} threads, got {chunk}")
    return _make_partial_kernel(chunk, THREADS // chunk)


def _make_partial_kernel(CHUNK: int, KEY_THREADS: int):  # noqa: N803 (Numba freezes them as constants)
    @cuda.jit
    def attention_partial_kernel(q, kv_cache, block_tables, positions, part_acc, part_max, part_sum, query_len, scale):
        """
        q [T, h, d] act      kv_cache [2, blocks, block_size, kvh, d] act      block_tables [S, W] int32
        positions [T] int64  part_acc [T * h, C, d] f32 out   part_max, part_sum [T * h, C] f32 out
        Grid: T * h * C blocks, C = chunks; block b -> (row = b // C = t * h + head, chunk = b % C).
        """
        num_chunks = part_max.shape[1]
        row = cuda.blockIdx.x // num_chunks
        chunk = cuda.blockIdx.x % num_chunks
        num_heads = q.shape[1]
        t = row // num_heads
        head = row % num_heads
        tid = cuda.threadIdx.x
        head_dim = q.shape[2]
        block_size = kv_cache.shape[2]
        kv_head = head // (num_heads // kv_cache.shape[3])
        seq = t // query_len
        first = chunk * CHUNK

        q_scaled = cuda.shared.array(MAX_HEAD_DIM, float32)
        scores = cuda.shared.array(CHUNK, float32)
        key_block = cuda.shared.array(CHUNK, int32)
        key_offset = cuda.shared.array(CHUNK, int32)
        partial = cuda.shared.array(THREADS, float32)
        # Independent loads first (q, this chunk's block ids, the position), one wait for all of them:
        # the block ids of the whole table width are valid, so they need not wait for the position.
        for e in range(tid, head_dim, THREADS):
            q_scaled[e] = float32(q[t, head, e]) * float32(scale)
        if tid < CHUNK and first + tid < block_tables.shape[1] * block_size:
            j = first + tid
            key_block[tid] = block_tables[seq, j // block_size]
            key_offset[tid] = j % block_size
        num_keys = min(positions[t] + 1, block_tables.shape[1] * block_size)  # padding rows stay in range
        count = min(CHUNK, num_keys - first)  # keys of this chunk (<= 0: nothing to do)
        cuda.syncthreads()

        # Scores: KEY_THREADS threads per key, each a strided share of the dims, 4 loads in flight.
        key = tid // KEY_THREADS
        part = tid % KEY_THREADS
        dot = float32(0.0)
        if key < count:
            block, offset = key_block[key], key_offset[key]
            a0, a1, a2, a3 = float32(0.0), float32(0.0), float32(0.0), float32(0.0)
            step = 4 * KEY_THREADS
            e = part
            while e + 3 * KEY_THREADS < head_dim:
                k0 = float32(kv_cache[0, block, offset, kv_head, e])
                k1 = float32(kv_cache[0, block, offset, kv_head, e + KEY_THREADS])
                k2 = float32(kv_cache[0, block, offset, kv_head, e + 2 * KEY_THREADS])
                k3 = float32(kv_cache[0, block, offset, kv_head, e + 3 * KEY_THREADS])
                a0 += q_scaled[e] * k0
                a1 += q_scaled[e + KEY_THREADS] * k1
                a2 += q_scaled[e + 2 * KEY_THREADS] * k2
                a3 += q_scaled[e + 3 * KEY_THREADS] * k3
                e += step
            while e < head_dim:
                a0 += q_scaled[e] * float32(kv_cache[0, block, offset, kv_head, e])
                e += KEY_THREADS
            dot = (a0 + a1) + (a2 + a3)
        partial[tid] = dot
        cuda.syncthreads()
        if tid < CHUNK:
            s = float32(0.0)
            for p in range(KEY_THREADS):
                s += partial[tid * KEY_THREADS + p]
            scores[tid] = s
        cuda.syncthreads()

        # The chunk's max and sum (CHUNK is small: one thread each, from shared memory).
        top = float32(-math.inf)
        for j in range(count):
            top = max(top, scores[j])
        cuda.syncthreads()
        if tid < count:
            scores[tid] = math.exp(scores[tid] - top)
        cuda.syncthreads()

        # acc[e] = sum_j p_j V_j[e]: groups of head_dim threads, 4 keys per round.
        groups = THREADS // head_dim
        group = tid // head_dim
        e = tid % head_dim
        acc = float32(0.0)
        if group < groups:
            j = group
            while j + 3 * groups < count:
                v0 = float32(kv_cache[1, key_block[j], key_offset[j], kv_head, e])
                v1 = float32(kv_cache[1, key_block[j + groups], key_offset[j + groups], kv_head, e])
                v2 = float32(kv_cache[1, key_block[j + 2 * groups], key_offset[j + 2 * groups], kv_head, e])
                v3 = float32(kv_cache[1, key_block[j + 3 * groups], key_offset[j + 3 * groups], kv_head, e])
                acc += scores[j] * v0 + scores[j + groups] * v1 + scores[j + 2 * groups] * v2 + scores[j + 3 * groups] * v3
                j += 4 * groups
            while j < count:
                acc += scores[j] * float32(kv_cache[1, key_block[j], key_offset[j], kv_head, e])
                j += groups
        partial[tid] = acc
        cuda.syncthreads()
        if group == 0:
            for g in range(1, groups):
                acc += partial[g * head_dim + e]
            part_acc[row, chunk, e] = acc
        if tid == 0:
            total = float32(0.0)
            for j in range(count):
                total += scores[j]
            part_max[row, chunk] = top  # -inf for an empty chunk
            part_sum[row, chunk] = total
    return attention_partial_kernel

"""Paged attention, one block per (sequence, KV head, row chunk, split): the shape for wide batches.

The block's "rows" are the query rows that share a KV head: every query token of the sequence times
every query head of the GQA group (k + 1 = 6 tokens x 1 head in a verify of an MHA model), so each
K/V row is read once per KV head, not once per query token and head. The block walks its keys in
tiles of TILE: K and V staged in shared memory as float32 (coalesced along head_dim), scores
s[r, j] = q_r . k_j * scale (-inf past row r's position: causal inside a verify window, blind to
stale slots past the sequence's end), then an online softmax (running max m and sum l per row).
With splits > 1 each split covers 1/splits of the sequence's real context (computed on the device
from its largest query position, so no block works past the end) and writes (acc, m, l) for
paged_attention.py's combine kernel, in the same layout as attention_by_row.py's chunks.
"""
from __future__ import annotations

import functools
import math

from numba import float32, int32

from protospec.kernels import interop
from protospec.kernels.interop import cuda

THREADS = 32 if interop.SIMULATOR else 128  # per block (the simulator runs an OS thread per CUDA thread)
MAX_HEAD_DIM = 256
# Keys per tile: K and V of a tile take TILE * head_dim float32 each in shared memory; the simulator
# gets short tiles so that the CPU tests cross tile boundaries with short contexts.
TILE_ELEMENTS = 2048
MAX_TILE = 8 if interop.SIMULATOR else 32
# Query rows per block (query tokens x heads of a GQA group), bounded by shared memory; more rows
# take more row chunks (blocks) that re-read the same keys, mostly from L2.
ROW_ELEMENTS = 1024


def tile_keys(head_dim: int) -> int:
    return max(1, min(MAX_TILE, TILE_ELEMENTS // head_dim))


def rows_per_block(rows: int, head_dim: int) -> int:
    return max(1, min(rows, ROW_ELEMENTS // head_dim))


@functools.cache
def attention_kernel(rows: int, head_dim: int):
    """The kernel for `rows` query rows per block and `head_dim` (compile-time constants: shared
    memory sizes and loop bounds), compiled on first use."""
    return _make_attention_kernel(rows, head_dim, tile_keys(head_dim), max(1, min(4, THREADS // (rows * tile_keys(head_dim)))))


def _make_attention_kernel(R: int, D: int, TILE: int, PARTS: int):  # noqa: N803 (Numba freezes them as constants)
    # Shared-memory sizes must be compile-time constants: closure names, not expressions.
    CELLS = R * TILE           # scores per tile
    KPAD = D + 1               # padded K rows: threads of a warp read one dim of 32 keys, no bank conflicts
    OUTS = R * D               # query and accumulator cells
    K_CELLS = TILE * KPAD
    V_CELLS = TILE * D
    S_CELLS = PARTS * CELLS
    DIMS_PER_PART = -(-D // PARTS)

    @cuda.jit
    def attention_tile_kernel(q, kv_cache, block_tables, positions, query_len, scale, out,
                              part_acc, part_max, part_sum):
        """
        q            [T, h, d] act                      kv_cache [2, num_blocks, block_size, kvh, d] act
        block_tables [S, W] int32 (null-block padded)   positions [T] int64 (key count = position + 1)
        query_len    tokens per sequence (T = S * query_len)          scale  float (1 / sqrt(d))
        out          [T, h * d] act, written when splits == 1 (part_max.shape[1] == 1)
        part_acc     [T * h, splits, d] f32 out; part_max, part_sum [T * h, splits] f32 out (splits > 1)
        Grid: S * kvh * chunks * splits blocks, b -> (((seq * kvh + kv_head) * chunks + chunk) * splits + split);
        a chunk is R rows of the group's query_len * (h // kvh) rows (row = query token * group + head in group).
        """
        splits = part_max.shape[1]
        num_heads = q.shape[1]
        kv_heads = kv_cache.shape[3]
        group = num_heads // kv_heads
        group_rows = query_len * group
        chunks = (group_rows + R - 1) // R
        block_size = kv_cache.shape[2]
        b = cuda.blockIdx.x
        split = b % splits
        chunk = (b // splits) % chunks
        kv_head = (b // (splits * chunks)) % kv_heads
        seq = b // (splits * chunks * kv_heads)
        tid = cuda.threadIdx.x

        q_s = cuda.shared.array(OUTS, float32)           # scaled queries
        acc_s = cuda.shared.array(OUTS, float32)         # unnormalised outputs
        k_s = cuda.shared.array(K_CELLS, float32)
        v_s = cuda.shared.array(V_CELLS, float32)
        s_s = cuda.shared.array(S_CELLS, float32)  # partial dot products, then p
        row_pos = cuda.shared.array(R, int32)            # -1: a row past the group (no key visible)
        row_max = cuda.shared.array(R, float32)
        row_sum = cuda.shared.array(R, float32)
        row_alpha = cuda.shared.array(R, float32)
        key_block = cuda.shared.array(TILE, int32)
        key_offset = cuda.shared.array(TILE, int32)
        span_s = cuda.shared.array(2, int32)             # [first key, end key) of this split

        # Independent loads first: queries, row positions, the sequence's length.
        for i in range(tid, OUTS, THREADS):
            r = i // D
            gr = chunk * R + r
            acc_s[i] = float32(0.0)
            if gr < group_rows:
                t = seq * query_len + gr // group
                q_s[i] = float32(q[t, kv_head * group + gr % group, i % D]) * float32(scale)
            else:
                q_s[i] = float32(0.0)
        for r in range(tid, R, THREADS):
            gr = chunk * R + r
            row_pos[r] = int32(positions[seq * query_len + gr // group]) if gr < group_rows else int32(-1)
            row_max[r] = float32(-math.inf)
            row_sum[r] = float32(0.0)
        if tid == 0:
            last = positions[seq * query_len]
            for i in range(1, query_len):
                last = max(last, positions[seq * query_len + i])
            # Padding rows of a captured batch may hold any position: never read past the table.
            keys = min(last + 1, block_tables.shape[1] * block_size)
            span = (keys + splits - 1) // splits
            span_s[0] = min(split * span, keys)
            span_s[1] = min(split * span + span, keys)
        cuda.syncthreads()
        first, end = span_s[0], span_s[1]

        # Block ids of the first tile, in registers; each tile stages them and prefetches the next.
        next_block, next_offset = int32(0), int32(0)
        if tid < TILE and first + tid < end:
            j = first + tid
            next_block = block_tables[seq, j // block_size]
            next_offset = j % block_size
        tile_start = first
        while tile_start < end:
            count = min(TILE, end - tile_start)
            if tid < TILE:
                key_block[tid] = next_block
                key_offset[tid] = next_offset
            cuda.syncthreads()
            if tid < TILE and tile_start + TILE + tid < end:
                j = tile_start + TILE + tid
                next_block = block_tables[seq, j // block_size]
                next_offset = j % block_size
            # Stage K and V: consecutive threads read consecutive dims of a key row (coalesced).
            for i in range(tid, V_CELLS, THREADS):
                j = i // D
                e = i % D
                if j < count:
                    k_s[j * KPAD + e] = float32(kv_cache[0, key_block[j], key_offset[j], kv_head, e])
                    v_s[i] = float32(kv_cache[1, key_block[j], key_offset[j], kv_head, e])
                else:  # zeros, not stale cache bytes: p = 0 must not meet a NaN
                    k_s[j * KPAD + e] = float32(0.0)
                    v_s[i] = float32(0.0)
            cuda.syncthreads()

            # Scores, PARTS threads per (row, key), each a share of the dims.
            for i in range(tid, S_CELLS, THREADS):
                part = i // CELLS
                cell = i % CELLS
                r = cell // TILE
                j = cell % TILE
                dot = float32(0.0)
                e0 = part * DIMS_PER_PART
                for e in range(e0, min(e0 + DIMS_PER_PART, D)):
                    dot += q_s[r * D + e] * k_s[j * KPAD + e]
                if part == 0 and (j >= count or tile_start + j > row_pos[r]):
                    dot = float32(-math.inf)
                s_s[i] = dot
            cuda.syncthreads()

            # Per row: sum the parts, the tile's max, the rescale of what came before.
            for r in range(tid, R, THREADS):
                top = row_max[r]
                m_old = top
                for j in range(TILE):
                    s = s_s[r * TILE + j]
                    for part in range(1, PARTS):
                        s += s_s[part * CELLS + r * TILE + j]
                    s_s[r * TILE + j] = s
                    top = max(top, s)
                row_max[r] = top
                row_alpha[r] = float32(1.0) if top == -math.inf else math.exp(m_old - top)
            cuda.syncthreads()
            for cell in range(tid, CELLS, THREADS):
                s = s_s[cell]
                s_s[cell] = float32(0.0) if s == -math.inf else math.exp(s - row_max[cell // TILE])
            cuda.syncthreads()

            # acc[r, e] = acc[r, e] alpha_r + sum_j p_rj v_j[e]; threads of a warp take consecutive e.
            for i in range(tid, OUTS, THREADS):
                r = i // D
                e = i % D
                a = float32(0.0)
                for j in range(TILE):
                    a += s_s[r * TILE + j] * v_s[j * D + e]
                acc_s[i] = acc_s[i] * row_alpha[r] + a
            for r in range(tid, R, THREADS):
                total = float32(0.0)
                for j in range(TILE):
                    total += s_s[r * TILE + j]
                row_sum[r] = row_sum[r] * row_alpha[r] + total
            cuda.syncthreads()
            tile_start += TILE

        for i in range(tid, OUTS, THREADS):
            r = i // D
            gr = chunk * R + r
            if gr < group_rows:
                t = seq * query_len + gr // group
                head = kv_head * group + gr % group
                e = i % D
                if splits == 1:
                    out[t, head * D + e] = acc_s[i] / row_sum[r] if row_sum[r] > float32(0.0) else float32(0.0)
                else:
                    row = t * num_heads + head
                    part_acc[row, split, e] = acc_s[i]
                    if e == 0:
                        part_max[row, split] = row_max[r]  # -inf, sum 0 for a split with no key
                        part_sum[row, split] = row_sum[r]
    return attention_tile_kernel

"""Paged attention, flash-decoding style: a block per (sequence, KV head, row chunk, split) walks its
keys in tiles of THREADS, one key per thread for the scores and one (row, dim) cell per thread for
the weighted sum of values.

The rows are, as in attention_by_kv_head.py, the query rows that share a KV head (query tokens x the
heads of a GQA group), so each K/V row is read once per KV head. What differs is the split of work:
  scores   thread t of a tile owns key t: its dot product with every row's scaled query, the queries
           read from shared memory (every thread reads the same address: a broadcast), no shuffles
  softmax  per tile and row, the max over the tile's keys (a warp reduction, then across warps
           through shared memory) and the rows' running max / rescale factor, the same in every thread
  values   thread t owns dim t % D of rows t // D, t // D + THREADS / D, ...: for each key of the tile,
           one V element (the D threads of a row read one contiguous V row) times each of its rows'
           weights, the weights read from shared memory
Why: by_kv_head sums each score across a lane group with dependent shuffles (18 per key and lane at 6
rows) and holds every row's query and accumulator in registers, which caps occupancy; here a score
costs its own thread D multiply-adds, and a thread holds only a few cells.

With splits > 1 each split covers 1/splits of the chunk's real context and writes (acc, max, sum) for
paged_attention.py's combine kernel, the layout attention_by_kv_head.py writes.
"""
from __future__ import annotations

import functools
import math

from numba import float32, int64

from protospec.kernels import interop
from protospec.kernels.interop import cuda
from protospec.kernels.reductions import xor_exchange

MAX_ROWS = 8        # query rows per block (a row's weights for a tile live in shared memory)
GPU_THREADS = 128   # keys per tile on a GPU


def supports(head_dim: int) -> bool:
    """A head size that divides the block's threads (a row's dims map onto consecutive threads)."""
    return 1 <= head_dim <= GPU_THREADS and GPU_THREADS % head_dim == 0 and head_dim & (head_dim - 1) == 0


def threads_per_block(head_dim: int) -> int:
    """128 on a GPU; in the simulator (an OS thread per CUDA thread) one row of dims: head_dim."""
    return head_dim if interop.SIMULATOR else GPU_THREADS


def rows_per_block(rows: int) -> int:
    return max(1, min(rows, MAX_ROWS))


def attention_kernel(rows: int, head_dim: int):
    return _compiled(rows, head_dim)


@functools.cache
def _compiled(rows: int, head_dim: int):
    threads = threads_per_block(head_dim)
    options = {} if interop.SIMULATOR else {"fastmath": True}
    return _make_kernel(rows, head_dim, threads, min(32, threads), options)


def _make_kernel(R: int, D: int, THREADS: int, WARP: int, options: dict):  # noqa: N803 (Numba freezes them as constants)
    ROWS_PER_PASS = THREADS // D              # rows whose cells one pass of the threads covers
    CELLS = (R + ROWS_PER_PASS - 1) // ROWS_PER_PASS
    WARPS = THREADS // WARP
    WARP_STEPS = WARP.bit_length() - 1
    NO_KEY = float32(-1e30)  # finite: fast-math assumes no infinities
    # Shared and local array sizes must be literals to Numba's typer: products are taken here, not in the kernel.
    Q_CELLS, P_CELLS, MAX_CELLS = R * D, R * THREADS, R * WARPS

    @cuda.jit(**options)
    def attention_tile_kernel(q, kv_flat, num_blocks, block_size, kv_heads, block_tables, positions, query_len, scale,
                              out, part_acc, part_max, part_sum):
        """
        q            [T, h, d] act              kv_flat  the cache [2, num_blocks, block_size, kvh, d] as one dim
        block_tables [S, W] int32               positions [T] int64 (key count = position + 1)
        out          [T, h * d] act when splits == 1; else part_acc [T * h, splits, d], part_max / part_sum [T * h, splits]
        Grid: S * kvh * chunks * splits blocks, as attention_by_kv_head's.
        """
        splits = part_max.shape[1]
        num_heads = q.shape[1]
        group = num_heads // kv_heads
        group_rows = query_len * group
        chunks = (group_rows + R - 1) // R
        b = cuda.blockIdx.x
        split = b % splits
        chunk = (b // splits) % chunks
        kv_head = (b // (splits * chunks)) % kv_heads
        seq = b // (splits * chunks * kv_heads)
        tid = cuda.threadIdx.x
        warp, lane = tid // WARP, tid % WARP

        q_sh = cuda.shared.array(Q_CELLS, float32)           # [R, D] scaled queries
        p_sh = cuda.shared.array(P_CELLS, float32)           # [R, THREADS] this tile's weights
        v_base = cuda.shared.array(THREADS, int64)           # [THREADS] flat index of each key's V row
        tile_max = cuda.shared.array(MAX_CELLS, float32)     # [R, WARPS]
        scratch = cuda.shared.array(THREADS, float32)        # the simulator's shuffles

        row_pos = cuda.local.array(R, int64)
        run_max = cuda.local.array(R, float32)
        alpha = cuda.local.array(R, float32)
        s = cuda.local.array(R, float32)
        acc = cuda.local.array(CELLS, float32)
        total = cuda.local.array(CELLS, float32)

        last = int64(-1)
        for r in range(R):
            gr = chunk * R + r
            row_pos[r] = -1
            run_max[r] = NO_KEY
            if gr < group_rows:
                row_pos[r] = positions[seq * query_len + gr // group]
                last = max(last, row_pos[r])
        for cell in range(tid, R * D, THREADS):
            gr = chunk * R + cell // D
            value = float32(0.0)
            if gr < group_rows:
                value = float32(q[seq * query_len + gr // group, kv_head * group + gr % group, cell % D]) * float32(scale)
            q_sh[cell] = value
        for c in range(CELLS):
            acc[c] = float32(0.0)
            total[c] = float32(0.0)
        # Padding rows of a captured batch may hold any position: never read past the table.
        keys = min(last + 1, block_tables.shape[1] * block_size)
        span = (keys + splits - 1) // splits
        first = min(split * span, keys)
        end = min(first + span, keys)
        tiles = (end - first + THREADS - 1) // THREADS
        v_offset = int64(num_blocks) * block_size * kv_heads * D  # where the V half of the cache starts
        cuda.syncthreads()

        for tile in range(tiles):
            j = first + tile * THREADS + tid
            for r in range(R):
                s[r] = NO_KEY
            if j < end:
                k_base = ((int64(block_tables[seq, j // block_size]) * block_size + j % block_size) * kv_heads + kv_head) * D
                v_base[tid] = k_base + v_offset
                for r in range(R):
                    s[r] = float32(0.0)
                for e in range(D):
                    k = float32(kv_flat[k_base + e])
                    for r in range(R):
                        s[r] += q_sh[r * D + e] * k
                for r in range(R):
                    if j > row_pos[r]:  # causal inside a verify window; stale slots past a row's position
                        s[r] = NO_KEY
            # The tile's max per row: inside each warp, then across warps.
            for r in range(R):
                m = s[r]
                for step in range(WARP_STEPS):
                    m = max(m, xor_exchange(m, 1 << step, scratch, tid))
                if lane == 0:
                    tile_max[r * WARPS + warp] = m
            cuda.syncthreads()
            for r in range(R):
                top = run_max[r]
                for w in range(WARPS):
                    top = max(top, tile_max[r * WARPS + w])
                alpha[r] = math.exp(run_max[r] - top)
                run_max[r] = top
                p_sh[r * THREADS + tid] = math.exp(s[r] - top) if s[r] > NO_KEY else float32(0.0)
            cuda.syncthreads()
            count = min(THREADS, end - (first + tile * THREADS))
            e = tid % D
            for c in range(CELLS):
                r = tid // D + c * ROWS_PER_PASS
                if r < R:
                    acc[c] *= alpha[r]
                    total[c] *= alpha[r]
            for t in range(count):
                v = float32(kv_flat[v_base[t] + e])
                for c in range(CELLS):
                    r = tid // D + c * ROWS_PER_PASS
                    if r < R:
                        p = p_sh[r * THREADS + t]
                        acc[c] += p * v
                        total[c] += p
            cuda.syncthreads()  # p_sh, v_base and tile_max are rewritten by the next tile

        e = tid % D
        for c in range(CELLS):
            r = tid // D + c * ROWS_PER_PASS
            gr = chunk * R + r
            if r < R and gr < group_rows:
                t = seq * query_len + gr // group
                head = kv_head * group + gr % group
                if splits == 1:
                    out[t, head * D + e] = acc[c] / total[c] if total[c] > float32(0.0) else float32(0.0)
                else:
                    row = t * num_heads + head
                    part_acc[row, split, e] = acc[c]
                    if e == 0:
                        part_max[row, split] = run_max[r]  # NO_KEY, sum 0 for a split with no key
                        part_sum[row, split] = total[c]
    return attention_tile_kernel

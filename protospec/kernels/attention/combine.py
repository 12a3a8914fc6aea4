"""Combining split-K attention partials: out = sum_c acc_c e^(m_c - M) / sum_c l_c e^(m_c - M).

It runs inside the by_kv_head and mma attention kernels, where the last split block of a row group
to finish combines the group's rows: one launch per split-K attention, not two (a combine kernel
after the attention measured slower: data/results/README.md).

`row_group_writer` is the tail both row-group kernels (by_kv_head, mma) share: merge the warps'
partial results of a block, write the rows or the split's partials, combine when last.
"""
from __future__ import annotations

import functools
import math

from numba import float32, int64, uint32

from protospec.kernels.launch import interop
from protospec.kernels.launch.interop import cuda
from protospec.kernels.primitives.divisions import block_row_and_part
from protospec.kernels.primitives.arrivals import arrived_last

OPTIONS = {} if interop.SIMULATOR else {"fastmath": True}
NO_KEY = float32(-1e30)  # below every real max; finite, because fast-math assumes no infinities


# The splits of a row are read 4 at a time: four independent loads in flight per wait (a loop of
# one load per iteration waits out the L2's latency once per split, and the combine is a chain of them).
UNROLL = 4


@cuda.jit(device=True, **OPTIONS)
def row_scale(part_max, part_sum, row):
    """(M, 1 / L) of `row` from its splits, part_max / part_sum [rows, C] f32: M the largest max, L the
    splits' sums rescaled to it. A split that saw no key has sum 0 and weighs 0; a row with no key at
    all gets 1 / L = 0. Indices past the last split are clamped to it (loads with no branch) and weigh 0."""
    splits = part_max.shape[1]
    top = NO_KEY
    for c in range(0, splits, UNROLL):
        for u in range(UNROLL):
            top = max(top, part_max[row, min(c + u, splits - 1)])
    total = float32(0.0)
    for c in range(0, splits, UNROLL):
        for u in range(UNROLL):
            at = min(c + u, splits - 1)
            m, l = part_max[row, at], part_sum[row, at]
            total += l * math.exp(m - top) if c + u < splits and l > float32(0.0) else float32(0.0)
    return top, (float32(1.0) / total if total > float32(0.0) else float32(0.0))


@cuda.jit(device=True, **OPTIONS)
def combine_cell(part_acc, part_max, part_sum, row, e, top, inv_total):
    """Output element e of `row`: sum_c acc_c e^(m_c - M) / L, with (M, 1 / L) from row_scale; part_acc [rows, C, d]."""
    splits = part_max.shape[1]
    acc = float32(0.0)
    for c in range(0, splits, UNROLL):
        for u in range(UNROLL):
            at = min(c + u, splits - 1)
            a, m, l = part_acc[row, at, e], part_max[row, at], part_sum[row, at]
            acc += a * math.exp(m - top) if c + u < splits and l > float32(0.0) else float32(0.0)
    return acc * inv_total


@cuda.jit(device=True)
def row_group_block(rows_per_chunk, group, kv_heads, query_len, splits):
    """(seq, kv_head, chunk, split, group, group_rows) of this block in the grid both row-group kernels
    launch: block b = ((seq * kv_heads + kv_head) * chunks + chunk) * splits + split, a chunk being
    rows_per_chunk of the group_rows = query_len * group rows that share a KV head (group = heads per
    KV head). The divisions are 32-bit: a 64-bit one by a runtime value is a subroutine call."""
    group_rows = query_len * group
    chunks = (group_rows + rows_per_chunk - 1) // rows_per_chunk
    b = uint32(cuda.blockIdx.x)
    by_split = b // uint32(splits)        # (seq * kv_heads + kv_head) * chunks + chunk
    by_chunk = by_split // uint32(chunks)  # seq * kv_heads + kv_head
    return (int64(by_chunk // uint32(kv_heads)), int64(by_chunk % uint32(kv_heads)), int64(by_split % uint32(chunks)),
            int64(b % uint32(splits)), group, group_rows)


@functools.cache
def row_group_writer(R: int, D: int, WARPS: int, THREADS: int, GROUP: int, STRIDE: int = 0):  # noqa: N803 (Numba freezes them as constants)
    """The tail of a block that holds R query rows of one (sequence, KV head, row chunk, split): a
    device function that merges its WARPS warps' (acc, max, sum) from shared memory and writes the
    rows to out (one split) or the split's partials, then, with split-K, combines the row group in
    the last split block to arrive. Every thread of the block calls it, after a barrier.
    GROUP: heads per KV head, a compile-time constant so that a row's token and head cost no runtime
    division; STRIDE: floats between two rows of merged_acc (0: D; wider rows
    spread a warp's stores over the shared-memory banks)."""
    RS = STRIDE or D
    WEIGHTS = WARPS * R  # a shared array's size must be a constant, not an expression, for the GPU typer

    @cuda.jit(device=True, **OPTIONS)
    def write_row_group(merged_acc, merged_max, merged_sum, seq, kv_head, chunk, split, query_len, out,
                        part_acc, part_max, part_sum, counters, last_block, tid):
        """merged_acc [WARPS * R * D], merged_max / merged_sum [WARPS * R] f32 (shared): warp w's row r at
        w * R + r; row r of the chunk is query token (chunk * R + r) // group, head kv_head * group + its
        remainder. out [T, h * D] act; part_* [T * h, splits, (D)] f32; counters, last_block: arrived_last."""
        splits = part_max.shape[1]
        num_heads = out.shape[1] // D
        group = GROUP
        group_rows = query_len * group
        # Each row's merge once (a thread per row): warp w's weight e^(m_w - M), the row's max M and
        # its total; a cell is then a weighted sum of WARPS values.
        warp_weight = cuda.shared.array(WEIGHTS, float32)
        merged_top = cuda.shared.array(R, float32)
        merged_total = cuda.shared.array(R, float32)
        for r in range(tid, R, THREADS):
            top = NO_KEY
            for w in range(WARPS):
                top = max(top, merged_max[w * R + r])
            total = float32(0.0)
            for w in range(WARPS):
                weight = math.exp(merged_max[w * R + r] - top)
                warp_weight[w * R + r] = weight
                total += merged_sum[w * R + r] * weight
            merged_top[r] = top
            merged_total[r] = total
        cuda.syncthreads()
        for cell in range(tid, R * D, THREADS):
            r = cell // D
            e = cell % D
            gr = chunk * R + r
            if gr < group_rows:
                a = float32(0.0)
                for w in range(WARPS):
                    a += merged_acc[(w * R + r) * RS + e] * warp_weight[w * R + r]
                total = merged_total[r]
                t = seq * query_len + gr // group
                head = kv_head * group + gr % group
                if splits == 1:
                    out[t, head * D + e] = a / total if total > float32(0.0) else float32(0.0)
                else:
                    row = t * num_heads + head
                    part_acc[row, split, e] = a
                    if e == 0:
                        part_max[row, split] = merged_top[r]  # NO_KEY, sum 0 for a split with no key
                        part_sum[row, split] = total
        if splits > 1 and arrived_last(counters, block_row_and_part(splits)[0], splits, last_block, tid):
            # Each row's scale once (a thread per row), then every cell in one round of loads.
            row_top = cuda.shared.array(R, float32)
            row_inv = cuda.shared.array(R, float32)
            for r in range(tid, R, THREADS):
                gr = chunk * R + r
                if gr < group_rows:
                    t = seq * query_len + gr // group
                    row_top[r], row_inv[r] = row_scale(part_max, part_sum, t * num_heads + kv_head * group + gr % group)
            cuda.syncthreads()
            for cell in range(tid, R * D, THREADS):
                r = cell // D
                gr = chunk * R + r
                if gr < group_rows:
                    t = seq * query_len + gr // group
                    head = kv_head * group + gr % group
                    out[t, head * D + cell % D] = combine_cell(part_acc, part_max, part_sum, t * num_heads + head,
                                                               cell % D, row_top[r], row_inv[r])

    return write_row_group

"""Paged attention, one block per (sequence, KV head, row chunk, split): the shape for wide batches.

The block's "rows" are the query rows that share a KV head: every query token of the sequence times
every query head of the GQA group (k + 1 = 6 tokens x 1 head in a verify of an MHA model), so each
K/V row is read once per KV head, not once per query token and head.

Inside the block, a group of G = head_dim / 8 lanes owns one key at a time and each lane 8 of its
dims (dims lane, lane + G, ...: the group's loads of a K or V row are contiguous). Every row's scaled
query and output accumulator live in the lanes' registers, so a key costs its K and V loads, the
rows' dot products (a G-lane shuffle sum), and an online-softmax update per row, with no shared
memory and no barrier. The THREADS / G groups of a block walk interleaved keys (the block's keys in
flight at once); at the end the groups' (max, sum, accumulator) are merged by shuffles inside each
warp, then across warps through shared memory.

Why this layout: staging K/V tiles in shared memory with a barrier per phase (an earlier version)
spent its time in shared-memory traffic and barriers; here the multiply-adds' operands are registers
and a block's loads are independent of one another.

Indexing: K and V by one flat offset per step (word_loads.load_flat), the step's cache-block column
advanced by adding, heads per KV head a compile-time constant: Numba's per-dimension 64-bit index
arithmetic and its 64-bit division calls were most of the tensor-core path's instructions
(data/results/README.md, "fewer instructions per key tile"), and this kernel indexes the same way.

With splits > 1 each split covers 1/splits of the chunk's real context (from its rows' largest
position, so no block works past the end) and writes (acc, max, sum) per row and split, and the
last split block of a row group to finish (an atomic arrival count) combines the group's rows
(attention/combine.py).
"""
from __future__ import annotations

import functools
import math

from numba import float32, int32, int64, uint32

from protospec.kernels.launch import interop
from protospec.kernels.attention.combine import row_group_block, row_group_writer
from protospec.kernels.launch.interop import cuda
from protospec.kernels.primitives.reductions import xor_exchange
from protospec.kernels.primitives.word_loads import load_flat

DIMS_PER_LANE = 8
THREADS = 128  # per block, on a GPU
MAX_HEAD_DIM = 32 * DIMS_PER_LANE
# Query rows per block (query tokens x heads of a GQA group): each takes 2 x 8 registers per lane
# (query and accumulator); more rows take more row chunks (blocks) that re-read the keys from L2.
MAX_ROWS = 6
FILL_BLOCKS_PER_SM = 4
# Rows + keys per lane group (U) that a lane's registers hold (each costs 2 x 8 of them): at 6 rows a
# group loads 2 keys per step, at 1 row 4 (keys_per_group). More keys in flight, fewer dependent steps.
ROW_KEY_BUDGET = 8
# Compile options (GPU only): launch bounds that cap the registers so MIN_BLOCKS_PER_SM blocks fit on
# an SM (more blocks in flight to cover the key loads' latency), and fast-math (approximate exp, fused
# multiply-adds).
MIN_BLOCKS_PER_SM = 3
FASTMATH = True


def supports(head_dim: int) -> bool:
    """head_dim = 8 x a power of two lanes, at most a warp."""
    lanes = head_dim // DIMS_PER_LANE
    return head_dim % DIMS_PER_LANE == 0 and 1 <= lanes <= 32 and lanes & (lanes - 1) == 0


def rows_per_block(rows: int, kv_pairs: int | None = None, sm_count: int | None = None) -> int:
    """Query rows per block: up to MAX_ROWS; halved where the (sequence, KV head) pairs would leave
    fewer than FILL_BLOCKS_PER_SM blocks per SM (more blocks in flight beat re-reading the keys from
    L2 once more: a batch-16 verify runs faster with 3 rows per block, a batch-64 one with 6)."""
    chosen = max(1, min(rows, MAX_ROWS))
    if kv_pairs is not None and sm_count and chosen > 1 and kv_pairs * -(-rows // chosen) < FILL_BLOCKS_PER_SM * sm_count:
        chosen = -(-chosen // 2)
    return chosen


def warp_lanes(head_dim: int) -> int:
    """32 on a GPU. The simulator runs an OS thread per CUDA thread and a shuffle costs it two
    block-wide barriers, so there a "warp" is two lane groups and a block two warps: the same code
    paths (group sums, the merge inside a warp, the merge across warps) with few threads."""
    return min(32, 2 * (head_dim // DIMS_PER_LANE)) if interop.SIMULATOR else 32


def threads_per_block(head_dim: int) -> int:
    return 2 * warp_lanes(head_dim) if interop.SIMULATOR else THREADS


def keys_per_group(rows: int, block_size: int) -> int:
    """Keys a lane group loads per step (U): as many as the register budget leaves beside the rows, a
    power of two that divides block_size (a step's U keys then share one cache block)."""
    keys = 1
    while keys * 2 <= max(1, ROW_KEY_BUDGET - rows) and block_size % (keys * 2) == 0:
        keys *= 2
    return keys


def keys_in_flight(head_dim: int, rows: int = 1, block_size: int = 1) -> int:
    """Keys a block works on per step (U per lane group)."""
    return threads_per_block(head_dim) // (head_dim // DIMS_PER_LANE) * keys_per_group(rows, block_size)


def attention_kernel(rows: int, head_dim: int, block_size: int, group: int):
    """The kernel for `rows` query rows per block, `head_dim`, the keys per group that block_size
    allows and `group` heads per KV head (compile-time constants: register arrays, loop bounds, and a
    row's token and head without a runtime division), compiled on first use."""
    return _compiled(rows, head_dim, keys_per_group(rows, block_size), group)


@functools.cache
def _compiled(rows: int, head_dim: int, keys: int, group: int):
    threads = threads_per_block(head_dim)
    options = {} if interop.SIMULATOR else {"fastmath": FASTMATH, "launch_bounds": (threads, MIN_BLOCKS_PER_SM)}
    return _make_attention_kernel(rows, head_dim, keys, group, threads, warp_lanes(head_dim), options)


def _make_attention_kernel(R: int, D: int, U: int, GROUP: int, THREADS: int, WARP: int, options: dict):  # noqa: N803 (Numba freezes them as constants)
    DPL = DIMS_PER_LANE
    G = D // DPL                              # lanes per key
    SLOTS = THREADS // G                      # lane groups per block
    STEP = SLOTS * U                          # keys per block per step
    UD = U * DPL
    RU = R * U
    BRANCH_FREE = R > 1
    WARPS = THREADS // WARP
    GROUP_STEPS = G.bit_length() - 1          # shuffle steps that sum a dot product over G lanes
    WARP_STEPS = (WARP // G).bit_length() - 1  # shuffle steps that merge the warp's groups
    RD = R * DPL
    MERGED = WARPS * R * D
    MERGED_ROWS = WARPS * R
    write_rows = row_group_writer(R, D, WARPS, THREADS, GROUP)
    NO_KEY = float32(-1e30)  # the max of a row with no key yet: finite, because fast-math assumes no infinities

    @cuda.jit(**options)
    def attention_group_kernel(q, kv_cache, block_tables, positions, query_len, scale, out,
                               part_acc, part_max, part_sum, counters):
        """
        q            [T, h, d] act                      kv_cache [2, num_blocks, block_size, kvh, d] act
        block_tables [S, W] int32 (null-block padded)   positions [T] int64 (key count = position + 1)
        query_len    tokens per sequence (T = S * query_len)          scale  float (1 / sqrt(d))
        out          [T, h * d] act, written when splits == 1 (part_max.shape[1] == 1)
        part_acc     [T * h, splits, d] f32 out; part_max, part_sum [T * h, splits] f32 out (splits > 1)
        counters     [S * kvh * chunks] int32, zero on entry and on exit; with splits > 1 the last split
                     block of each row group to finish (counted there) combines the group's rows into out
        Grid: S * kvh * chunks * splits blocks, b -> (((seq * kvh + kv_head) * chunks + chunk) * splits + split);
        a chunk is R rows of the group's query_len * (h // kvh) rows (row = query token * group + head in group).
        """
        splits = part_max.shape[1]
        kv_heads = kv_cache.shape[3]
        seq, kv_head, chunk, split, group, group_rows = row_group_block(R, GROUP, kv_heads, query_len, splits)
        block_size = kv_cache.shape[2]
        tid = cuda.threadIdx.x
        lane = tid % G            # which dims of the key: lane, lane + G, ...
        slot = tid // G           # which lane group: keys slot * U .. slot * U + U - 1 of each step

        scratch = cuda.shared.array(THREADS, float32)     # the simulator's shuffles
        merged_acc = cuda.shared.array(MERGED, float32)   # per warp, after its own merge
        merged_max = cuda.shared.array(MERGED_ROWS, float32)
        merged_sum = cuda.shared.array(MERGED_ROWS, float32)
        last_block = cuda.shared.array(1, int32)          # 1: this block combines its row group

        q_reg = cuda.local.array(RD, float32)     # [R, DPL] scaled queries, this lane's dims
        acc = cuda.local.array(RD, float32)       # [R, DPL] unnormalised outputs
        run_max = cuda.local.array(R, float32)
        run_sum = cuda.local.array(R, float32)
        row_pos = cuda.local.array(R, int32)      # -1: a row past the group (sees no key)
        k_reg = cuda.local.array(UD, float32)     # [U, DPL] this step's keys, this lane's dims
        v_reg = cuda.local.array(UD, float32)
        scores = cuda.local.array(RU, float32)    # [R, U] this step's scaled scores

        last = int32(-1)
        # Loads at clamped (always valid) rows with no branch, so they are in flight together; rows past
        # the group are then masked (no key, zero query).
        real_rows = min(R, group_rows - chunk * R)   # >= 1: a chunk holds at least one row
        for r in range(R):
            gr = chunk * R + min(r, real_rows - 1)
            t = seq * query_len + gr // group
            head = kv_head * group + gr % group
            pos = int32(load_flat(positions, t))
            last = max(last, pos)
            run_max[r] = NO_KEY
            run_sum[r] = float32(0.0)
            row_pos[r] = pos if r < real_rows else int32(-1)
            for i in range(DPL):
                value = float32(load_flat(q, (t * q.shape[1] + head) * D + i * G + lane)) * float32(scale)
                q_reg[r * DPL + i] = value if r < real_rows else float32(0.0)
                acc[r * DPL + i] = float32(0.0)
        # Padding rows of a captured batch may hold any position: never read past the table.
        keys = min(last + 1, block_tables.shape[1] * block_size)
        # (Divisions by runtime values in 32 bits: a 64-bit one is a subroutine call.)
        span = (int64(uint32(keys + splits - 1) // uint32(splits)) + U - 1) // U * U  # a multiple of U: a step's U keys share a block
        first = min(split * span, keys)
        end = min(first + span, keys)
        iters = (end - first + STEP - 1) // STEP   # the same for every thread (the simulator's barriers)

        # Flat element offsets (word_loads.load_flat: one address per step, the keys' and dims' offsets
        # as constants): a key is kv_heads * D elements, a cache block block_size keys, V a whole cache
        # after K. The step's cache-block column and offset advance by adding (no division).
        key_stride = kv_heads * D
        block_elements = block_size * key_stride
        lane_base = kv_head * D + lane
        v_offset = kv_cache.shape[1] * block_elements
        table = block_tables.shape[1]
        j = first + slot * U      # this group's first key of the step; j .. j + U - 1 lie in one block
        column = int64(uint32(j) // uint32(block_size))
        offset = j - column * block_size
        jump = int64(uint32(STEP) // uint32(block_size))
        rest = STEP - jump * block_size
        next_block = load_flat(block_tables, seq * table + column) if j < end else 0
        for _ in range(iters):
            key_block = next_block
            base = key_block * block_elements + offset * key_stride + lane_base
            column += jump
            offset += rest
            if offset >= block_size:
                offset -= block_size
                column += 1
            if j + STEP < end:  # the next step's block id, one step ahead of its K/V loads
                next_block = load_flat(block_tables, seq * table + column)
            # Every load of the step first (U keys' K and V in flight at once), then the math. The
            # block holds the whole step, so past `end` the loads stay inside it; those keys are zeroed.
            for u in range(U):
                for i in range(DPL):
                    k_value = float32(load_flat(kv_cache, base + u * key_stride + i * G))
                    v_value = float32(load_flat(kv_cache, v_offset + base + u * key_stride + i * G))
                    k_reg[u * DPL + i] = k_value if j + u < end else float32(0.0)
                    v_reg[u * DPL + i] = v_value if j + u < end else float32(0.0)
            # Every row's U scores first: independent dot products and shuffle sums the compiler can
            # interleave (no branch between them; masks are selects).
            for r in range(R):
                for u in range(U):
                    s = float32(0.0)
                    for i in range(DPL):
                        s += q_reg[r * DPL + i] * k_reg[u * DPL + i]
                    for step in range(GROUP_STEPS):
                        s += xor_exchange(s, G >> (step + 1), scratch, tid)
                    # Causal inside a verify window; blind to stale slots past the row's position.
                    scores[r * U + u] = s if j + u < end and j + u <= row_pos[r] else NO_KEY
            # Then one online-softmax update per row for the step's U keys. With several rows it has
            # no branch (alpha is 1 where the max did not move, 0 at a row's first key), so the rows'
            # updates interleave; a single row skips the rescale while its max holds, as it mostly does.
            for r in range(R):
                top = run_max[r]
                for u in range(U):
                    top = max(top, scores[r * U + u])
                if BRANCH_FREE or top > run_max[r]:
                    alpha = math.exp(run_max[r] - top)
                    run_max[r] = top
                    run_sum[r] *= alpha
                    for i in range(DPL):
                        acc[r * DPL + i] *= alpha
                for u in range(U):
                    s = scores[r * U + u]
                    p = math.exp(s - top) if s > NO_KEY else float32(0.0)
                    run_sum[r] += p
                    for i in range(DPL):
                        acc[r * DPL + i] += p * v_reg[u * DPL + i]
            j += STEP

        # Merge the warp's groups: lanes with the same `lane` hold the same dims.
        for step in range(WARP_STEPS):
            mask = G << step
            for r in range(R):
                m_other = xor_exchange(run_max[r], mask, scratch, tid)
                s_other = xor_exchange(run_sum[r], mask, scratch, tid)
                top = max(run_max[r], m_other)
                mine = math.exp(run_max[r] - top)  # 0 for a group that saw no key (sum and acc 0 anyway)
                theirs = math.exp(m_other - top)
                run_sum[r] = run_sum[r] * mine + s_other * theirs
                run_max[r] = top
                for i in range(DPL):
                    a_other = xor_exchange(acc[r * DPL + i], mask, scratch, tid)
                    acc[r * DPL + i] = acc[r * DPL + i] * mine + a_other * theirs
        # Then the warps, through shared memory: the first group of each warp writes its merge.
        warp = tid // WARP
        if tid % WARP < G:
            for r in range(R):
                merged_max[warp * R + r] = run_max[r]
                merged_sum[warp * R + r] = run_sum[r]
                for i in range(DPL):
                    merged_acc[(warp * R + r) * D + i * G + lane] = acc[r * DPL + i]
        cuda.syncthreads()
        write_rows(merged_acc, merged_max, merged_sum, seq, kv_head, chunk, split, query_len, out,
                   part_acc, part_max, part_sum, counters, last_block, tid)
    return attention_group_kernel

"""Attention for decode-shaped forwards, read straight from the paged KV cache (Numba kernels).

Work unit: one block per (sequence, KV head, row chunk, split). Its "rows" are the query rows that
share the KV head: every query token of the sequence times every query head of the GQA group
(k + 1 = 6 tokens x 1 head in a verify of an MHA model), so each K/V row is read from memory once
per KV head, not once per query token and head. The block walks its keys in tiles of TILE:
  stage    the tile's K and V rows (fp16 or fp32) into shared memory as float32, coalesced along
           head_dim; the next tile's block ids are already loading meanwhile
  scores   s[r, j] = q_r . k_j * scale, -inf where key j lies past row r's position (causal inside
           a verify window, blind to stale slots past the sequence's end, as the torch path's mask)
  softmax  online: per row the running max m and sum l; acc[r] = acc[r] e^(m_old - m) + sum_j p_rj v_j
Split-K only where the batch does not fill the GPU: the host picks `splits` from the number of
(sequence, KV head, row chunk) groups against the SM count; the keys a split covers are computed
on the device from the sequence's real length (its largest query position + 1), so no block
works on keys past the end. With splits > 1 each block writes (acc, m, l) and a combine kernel
merges them: out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M).

Why it is laid out so. The previous kernel (one block per (query token, head, chunk of 32 keys),
then a combine) took 14 us per call at batch 1 but 371 us at batch 64 for 63 MB of K/V (H200,
seed configuration). Its grid was sized by the block table's width, not the context: 384 tokens x
12 heads x 16 chunks = 73,728 blocks per verify layer, a third of them with no key to read, each
a chain of ~6 dependent loads and 5 barriers for at most 32 keys; 19 MB of float32 partials went
out and back; and each K/V row was read once per query token (6x in a verify). The time was
blocks x dependent-latency chain, not bytes. Here a verify layer at batch 64 is 768 blocks that
each read their keys once, a tile at a time, with one fp32 partial per row and split at most.

Only uniform layouts (every sequence feeds query_len tokens: decode, draft step 1, verify) take
this path; token t belongs to sequence t // query_len.
"""
from __future__ import annotations

import functools
import math

import torch
from numba import float32, int32

from protospec.errors import KernelArgumentError
from protospec.kernels import interop
from protospec.kernels.interop import check_tensor, cuda

THREADS = 32 if interop.SIMULATOR else 128  # per block (the simulator runs an OS thread per CUDA thread)
MAX_HEAD_DIM = 256
# Keys per tile: K and V of a tile take TILE * head_dim float32 each in shared memory; the simulator
# gets short tiles so that the CPU tests cross tile boundaries with short contexts.
TILE_ELEMENTS = 2048
MAX_TILE = 8 if interop.SIMULATOR else 32
# Query rows per block (query tokens x heads of a GQA group), bounded by shared memory; more rows
# take more row chunks (blocks) that re-read the same keys, mostly from L2.
ROW_ELEMENTS = 1024
# Split-K until this many blocks per SM are in flight (measured: see bench.attention_cost).
BLOCKS_PER_SM = 2


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


@cuda.jit
def attention_combine_kernel(part_acc, part_max, part_sum, out):
    """part_acc [T * h, S, d], part_max, part_sum [T * h, S] f32 -> out [T, h * d] act.
    Block = row (t * h + head), thread = e."""
    row = cuda.blockIdx.x
    head_dim = part_acc.shape[2]
    num_heads = out.shape[1] // head_dim
    t = row // num_heads
    head = row % num_heads
    top = float32(-math.inf)
    for c in range(part_max.shape[1]):
        top = max(top, part_max[row, c])
    for e in range(cuda.threadIdx.x, head_dim, cuda.blockDim.x):
        acc, total = float32(0.0), float32(0.0)
        for c in range(part_max.shape[1]):
            if part_sum[row, c] > float32(0.0):
                w = math.exp(part_max[row, c] - top)
                acc += part_acc[row, c, e] * w
                total += part_sum[row, c] * w
        out[t, head * head_dim + e] = acc / total if total > float32(0.0) else float32(0.0)


def supports(num_heads: int, head_dim: int, max_keys: int) -> bool:
    """Whether these kernels can serve a layout (checked on the host; otherwise use the torch path)."""
    return 1 <= head_dim <= MAX_HEAD_DIM and num_heads >= 1 and max_keys >= 1


@functools.cache
def _sm_count(device: torch.device) -> int:
    return 4 if interop.SIMULATOR else torch.cuda.get_device_properties(device).multi_processor_count


def choose_splits(groups: int, max_keys: int, head_dim: int, device: torch.device) -> int:
    """Split-K factor: 1 where `groups` blocks already fill the GPU, else enough splits for
    BLOCKS_PER_SM blocks per SM, at most one per tile of the widest possible context."""
    target = BLOCKS_PER_SM * _sm_count(device)
    if groups >= target:
        return 1
    return max(1, min(-(-target // groups), -(-max_keys // tile_keys(head_dim))))


def paged_attention(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor, positions: torch.Tensor,
                    query_len: int, scale: float, splits: int | None = None) -> torch.Tensor:
    """q [T, h, d] (K/V of these tokens already in the cache) -> [T, h * d].
    splits: the split-K factor; None picks it from the shape (choose_splits)."""
    check_tensor("q", q, q.dtype, 3)
    check_tensor("kv_cache", kv_cache, q.dtype, 5)
    check_tensor("block_tables", block_tables, torch.int32, 2)
    check_tensor("positions", positions, torch.int64, 1, rows=q.shape[0])
    tokens, heads, head_dim = q.shape
    kv_heads = kv_cache.shape[3]
    max_keys = block_tables.shape[1] * kv_cache.shape[2]
    if not supports(heads, head_dim, max_keys):
        raise KernelArgumentError(f"paged_attention: head_dim {head_dim} is too large (at most {MAX_HEAD_DIM})")
    if kv_cache.shape[4] != head_dim or heads % kv_heads or tokens != block_tables.shape[0] * query_len:
        raise KernelArgumentError(f"paged_attention: {heads} heads of {head_dim} over {kv_heads} kv heads of "
                                  f"{kv_cache.shape[4]}, {tokens} tokens for {block_tables.shape[0]} sequences x "
                                  f"query_len {query_len}")
    group_rows = query_len * (heads // kv_heads)
    rows = rows_per_block(group_rows, head_dim)
    groups = block_tables.shape[0] * kv_heads * -(-group_rows // rows)
    if splits is None:
        splits = choose_splits(groups, max_keys, head_dim, q.device)
    elif splits < 1:
        raise KernelArgumentError(f"paged_attention: splits must be >= 1, got {splits}")
    dev = q.device
    out = torch.empty(tokens, heads * head_dim, dtype=q.dtype, device=dev)
    if splits == 1:  # placeholders with the right rank (never written); separate tensors, not views of
        # one another: the simulator copies each array argument back after the kernel
        part_acc = torch.empty(1, 1, 1, dtype=torch.float32, device=dev)
        part_max, part_sum = (torch.empty(1, 1, dtype=torch.float32, device=dev) for _ in range(2))
    else:
        part_acc = torch.empty(tokens * heads, splits, head_dim, dtype=torch.float32, device=dev)
        part_max, part_sum = (torch.empty(tokens * heads, splits, dtype=torch.float32, device=dev) for _ in range(2))
    interop.launch_tensors(attention_kernel(rows, head_dim), groups * splits, THREADS,
                           [q, kv_cache, block_tables, positions, int(query_len), float(scale), out,
                            part_acc, part_max, part_sum])
    if splits > 1:
        interop.launch_tensors(attention_combine_kernel, tokens * heads, min(128, head_dim),
                               [part_acc, part_max, part_sum, out])
    return out

"""Attention for decode-shaped forwards, read straight from the paged KV cache: one Numba kernel.

Work unit: one block per (sequence, KV head, row chunk, split). Its "rows" are the query rows that
share the KV head: every query token of the sequence times every query head of the GQA group
(k + 1 = 6 tokens x 1 head in a verify of an MHA model), so each K/V row is read from memory once
per KV head, not once per query token and head. The block stages the block ids of its keys in
shared memory once, then walks its keys in tiles of TILE:
  load     the tile's K and V (fp16 or fp32) into registers, every load of the tile issued before
           any is used; the next tile's loads go out before this tile is computed (software pipeline)
  scores   s[r, j] = q_r . k_j * scale, -inf where key j lies past row r's position (causal inside
           a verify window, blind to stale slots past the sequence's end, as the torch path's mask)
  softmax  online: per row the running max m and sum l; acc[r] = acc[r] e^(m_old - m) + sum_j p_rj v_j
Split-K only where the batch does not fill the GPU: the host picks `splits` from the number of
(sequence, KV head, row chunk) groups against the SM count; the keys a split covers follow from the
sequence's real length (its largest query position + 1), computed on the device, so no block works
past the end. Each split publishes (acc, m, l); the group's last block to arrive (an atomic counter)
merges them, out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M), and resets the counter: no second
kernel.

Why it is laid out so. The previous kernel (one block per (query token, head, chunk of 32 keys),
then a combine kernel) took 14 us per call at batch 1 but 371 us at batch 64 for 63 MB of K/V (H200,
seed configuration). Its grid was sized by the block table's width, not the context: 384 tokens x
12 heads x 16 chunks = 73,728 blocks per verify layer, a third with no key to read, each a chain of
~6 dependent loads and 5 barriers for at most 32 keys; 19 MB of float32 partials went out and back;
each K/V row was read once per query token (6x in a verify). Its time was blocks x a dependent-latency
chain, not bytes. A first version of this kernel (same work units, K/V staged by a plain strided
loop) still ran at 17-26x the bytes floor at batch 64: each thread had one 2-byte load in flight at a
time, far too few bytes in flight to cover memory latency; hence the unrolled, pipelined loads.

Only uniform layouts (every sequence feeds query_len tokens: decode, draft step 1, verify) take
this path; token t belongs to sequence t // query_len.
"""
from __future__ import annotations

import functools
import math

import torch
from numba import float32, int32, int64

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
MAX_TABLE_BLOCKS = 512  # block ids a block stages in shared memory (a table at most this wide)
# Split-K until this many blocks per SM are in flight (bench.attention_cost measures the choice).
BLOCKS_PER_SM = 2
MAX_SPLIT_GROUPS = 4096  # split-K arrival counters per device (split-K only runs below ~2 blocks per SM)


def tile_keys(head_dim: int) -> int:
    return max(1, min(MAX_TILE, TILE_ELEMENTS // head_dim))


def rows_per_block(rows: int, head_dim: int) -> int:
    return max(1, min(rows, ROW_ELEMENTS // head_dim))


def partial_stride(splits: int, rows: int, head_dim: int) -> int:
    """Floats per group in the split-K partials: splits x rows x (acc[d], max, sum), rounded up to
    whole 128-byte lines so that no cache line holds two groups' partials."""
    return -(-splits * rows * (head_dim + 2) // 32) * 32


@functools.cache
def attention_kernel(rows: int, head_dim: int):
    """The kernel for `rows` query rows per block and `head_dim` (compile-time constants: shared
    memory sizes and unrolled loops), compiled on first use."""
    return _make_attention_kernel(rows, head_dim, tile_keys(head_dim))


def _make_attention_kernel(R: int, D: int, TILE: int):  # noqa: N803 (Numba freezes them as constants)
    # Shared-memory sizes and unrolled trip counts must be compile-time constants: closure names.
    CELLS = R * TILE                     # scores per tile
    KPAD = D + 1                         # padded K rows: a warp reads one dim of 32 keys without bank conflicts
    OUTS = R * D                         # query and accumulator cells
    K_CELLS = TILE * KPAD
    V_CELLS = TILE * D
    LOADS = -(-V_CELLS // THREADS)       # K (and V) elements each thread loads per tile, held in registers
    ENTRY = D + 2                        # one row's split-K partial: acc[D], max, sum

    @cuda.jit
    def attention_tile_kernel(q, kv_flat, block_size, kv_heads, block_tables, positions, query_len, scale, splits, out,
                              partials, counters):
        """
        q            [T, h, d] act                      kv_flat  the cache [2, num_blocks, block_size, kvh, d] act, flat
        block_tables [S, W] int32 (null-block padded)   positions [T] int64 (key count = position + 1)
        query_len    tokens per sequence (T = S * query_len)     scale (1 / sqrt(d))     splits  split-K factor
        out          [T, h * d] act
        partials     [groups, partial_stride] f32 scratch, counters [>= groups] int32 zeros (splits > 1 only;
                     the last block of a group to arrive combines its group's splits and resets its counter)
        Grid: groups * splits blocks, b -> (group = (seq * kvh + kv_head) * chunks + chunk, split = b % splits);
        a chunk is R rows of the group's query_len * (h // kvh) rows (row = query token * group + head in group).
        """
        num_heads = q.shape[1]
        group = num_heads // kv_heads
        group_rows = query_len * group
        chunks = (group_rows + R - 1) // R
        v_offset = kv_flat.shape[0] // 2  # V follows K
        b = cuda.blockIdx.x
        split = b % splits
        g = b // splits
        chunk = g % chunks
        kv_head = (g // chunks) % kv_heads
        seq = g // (chunks * kv_heads)
        tid = cuda.threadIdx.x

        q_s = cuda.shared.array(OUTS, float32)           # scaled queries
        acc_s = cuda.shared.array(OUTS, float32)         # unnormalised outputs
        k_s = cuda.shared.array(K_CELLS, float32)
        v_s = cuda.shared.array(V_CELLS, float32)
        p_s = cuda.shared.array(CELLS, float32)          # scores, then exp(score - max)
        row_pos = cuda.shared.array(R, int32)            # -1: a row past the group (no key visible)
        row_max = cuda.shared.array(R, float32)          # running max of the tiles folded so far
        row_sum = cuda.shared.array(R, float32)
        tile_max = cuda.shared.array(R, float32)         # this tile's max, then folded into row_max
        tile_sum = cuda.shared.array(R, float32)
        ids = cuda.shared.array(MAX_TABLE_BLOCKS, int32)  # block ids of this split's keys
        key_base = cuda.shared.array(TILE, int64)         # flat index of each key's K row (the tile being loaded)
        k_reg = cuda.local.array(LOADS, float32)          # a tile's K and V in flight (registers, once unrolled)
        v_reg = cuda.local.array(LOADS, float32)
        span_s = cuda.shared.array(2, int32)             # [first key, end key) of this split
        last_s = cuda.shared.array(1, int32)

        # Independent loads first: queries, row positions, the sequence's length.
        for i in range(tid, OUTS, THREADS):
            gr = chunk * R + i // D
            acc_s[i] = float32(0.0)
            if gr < group_rows:
                q_s[i] = float32(q[seq * query_len + gr // group, kv_head * group + gr % group, i % D]) * float32(scale)
            else:
                q_s[i] = float32(0.0)
        for r in range(tid, R, THREADS):
            gr = chunk * R + r
            row_pos[r] = int32(positions[seq * query_len + gr // group]) if gr < group_rows else int32(-1)
            row_max[r] = float32(-math.inf)
            row_sum[r] = float32(0.0)
            tile_max[r] = float32(-math.inf)
            tile_sum[r] = float32(0.0)
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
        first_block = first // block_size
        for i in range(tid, (end + block_size - 1) // block_size - first_block, THREADS):
            ids[i] = block_tables[seq, first_block + i]
        cuda.syncthreads()

        # Tile 0's key rows, then its K and V into registers: every load of a tile is issued before
        # any is used (bytes in flight are what covers memory latency), consecutive threads reading
        # consecutive dims of a key row (coalesced); zeros past the last key, not stale cache bytes.
        if tid < TILE and first + tid < end:
            key = first + tid
            key_base[tid] = ((ids[key // block_size - first_block] * block_size + key % block_size) * kv_heads + kv_head) * D
        cuda.syncthreads()
        count = min(TILE, end - first)
        for n in range(LOADS):
            i = tid + n * THREADS
            k_reg[n] = float32(0.0)
            v_reg[n] = float32(0.0)
            if i < V_CELLS and i // D < count:
                k_reg[n] = float32(kv_flat[key_base[i // D] + i % D])
                v_reg[n] = float32(kv_flat[v_offset + key_base[i // D] + i % D])

        tile_start = first
        while tile_start < end:
            count = min(TILE, end - tile_start)
            cuda.syncthreads()  # the previous tile's readers are done with k_s, v_s, p_s, key rows, row stats
            for r in range(tid, R, THREADS):  # fold the previous tile (a no-op before the first)
                m_new = max(row_max[r], tile_max[r])
                alpha = float32(1.0) if m_new == -math.inf else math.exp(row_max[r] - m_new)
                row_sum[r] = row_sum[r] * alpha + tile_sum[r]
                row_max[r] = m_new
                tile_max[r] = float32(-math.inf)
            for n in range(LOADS):
                i = tid + n * THREADS
                if i < V_CELLS:
                    k_s[(i // D) * KPAD + i % D] = k_reg[n]
                    v_s[i] = v_reg[n]
            nxt = tile_start + TILE  # the next tile's key rows: one division per key, none per element
            if tid < TILE and nxt + tid < end:
                key = nxt + tid
                key_base[tid] = ((ids[key // block_size - first_block] * block_size + key % block_size) * kv_heads + kv_head) * D
            cuda.syncthreads()
            # The next tile's loads go out now and land while this tile is computed.
            next_count = min(TILE, end - nxt)
            for n in range(LOADS):
                i = tid + n * THREADS
                k_reg[n] = float32(0.0)
                v_reg[n] = float32(0.0)
                if i < V_CELLS and i // D < next_count:
                    k_reg[n] = float32(kv_flat[key_base[i // D] + i % D])
                    v_reg[n] = float32(kv_flat[v_offset + key_base[i // D] + i % D])

            # Scores: a thread per (row, key), -inf where the key lies past the row's position.
            for cell in range(tid, CELLS, THREADS):
                r = cell // TILE
                j = cell % TILE
                if j < count and tile_start + j <= row_pos[r]:
                    a0, a1, a2, a3 = float32(0.0), float32(0.0), float32(0.0), float32(0.0)
                    for e in range(0, D - 3, 4):
                        a0 += q_s[r * D + e] * k_s[j * KPAD + e]
                        a1 += q_s[r * D + e + 1] * k_s[j * KPAD + e + 1]
                        a2 += q_s[r * D + e + 2] * k_s[j * KPAD + e + 2]
                        a3 += q_s[r * D + e + 3] * k_s[j * KPAD + e + 3]
                    for e in range(D - D % 4, D):
                        a0 += q_s[r * D + e] * k_s[j * KPAD + e]
                    s = (a0 + a1) + (a2 + a3)
                    p_s[cell] = s
                    cuda.atomic.max(tile_max, r, s)
                else:
                    p_s[cell] = float32(-math.inf)
            cuda.syncthreads()
            for cell in range(tid, CELLS, THREADS):
                s = p_s[cell]
                p_s[cell] = float32(0.0) if s == -math.inf else math.exp(s - max(row_max[cell // TILE], tile_max[cell // TILE]))
            cuda.syncthreads()

            # acc[r, e] = acc[r, e] alpha_r + sum_j p_rj v_j[e]; a warp takes consecutive e of one row.
            for i in range(tid, OUTS, THREADS):
                r = i // D
                e = i % D
                m_new = max(row_max[r], tile_max[r])
                alpha = float32(1.0) if m_new == -math.inf else math.exp(row_max[r] - m_new)
                a0, a1, t0, t1 = float32(0.0), float32(0.0), float32(0.0), float32(0.0)
                for j in range(0, TILE - 1, 2):
                    p0 = p_s[r * TILE + j]
                    p1 = p_s[r * TILE + j + 1]
                    a0 += p0 * v_s[j * D + e]
                    a1 += p1 * v_s[(j + 1) * D + e]
                    t0 += p0
                    t1 += p1
                if TILE % 2:
                    a0 += p_s[r * TILE + TILE - 1] * v_s[(TILE - 1) * D + e]
                    t0 += p_s[r * TILE + TILE - 1]
                acc_s[i] = acc_s[i] * alpha + (a0 + a1)
                if e == 0:
                    tile_sum[r] = t0 + t1
            tile_start += TILE
        cuda.syncthreads()
        for r in range(tid, R, THREADS):  # fold the last tile
            m_new = max(row_max[r], tile_max[r])
            alpha = float32(1.0) if m_new == -math.inf else math.exp(row_max[r] - m_new)
            row_sum[r] = row_sum[r] * alpha + tile_sum[r]
            row_max[r] = m_new
        cuda.syncthreads()

        if splits == 1:
            for i in range(tid, OUTS, THREADS):
                r = i // D
                gr = chunk * R + r
                if gr < group_rows:
                    t = seq * query_len + gr // group
                    head = kv_head * group + gr % group
                    out[t, head * D + i % D] = acc_s[i] / row_sum[r] if row_sum[r] > float32(0.0) else float32(0.0)
            return

        # Split-K: publish this split's (acc, max, sum); the group's last block to arrive merges them.
        for i in range(tid, OUTS, THREADS):
            r = i // D
            base = (split * R + r) * ENTRY
            partials[g, base + i % D] = acc_s[i]
            if i % D == 0:
                partials[g, base + D] = row_max[r]  # -inf, sum 0 for a split with no key
                partials[g, base + D + 1] = row_sum[r]
        cuda.threadfence()  # this block's partials reach L2 before its arrival is counted
        cuda.syncthreads()
        if tid == 0:
            arrived = cuda.atomic.add(counters, g, 1)
            last_s[0] = 1 if arrived == splits - 1 else 0
            if arrived == splits - 1:
                counters[g] = 0  # every block of the group has arrived: ready for the next call
        cuda.syncthreads()
        if last_s[0] == 0:
            return
        cuda.threadfence()
        for i in range(tid, OUTS, THREADS):
            r = i // D
            gr = chunk * R + r
            if gr < group_rows:
                top = float32(-math.inf)
                for c in range(splits):
                    top = max(top, partials[g, (c * R + r) * ENTRY + D])
                acc, total = float32(0.0), float32(0.0)
                for c in range(splits):
                    base = (c * R + r) * ENTRY
                    if partials[g, base + D + 1] > float32(0.0):
                        w = math.exp(partials[g, base + D] - top)
                        acc += partials[g, base + i % D] * w
                        total += partials[g, base + D + 1] * w
                t = seq * query_len + gr // group
                head = kv_head * group + gr % group
                out[t, head * D + i % D] = acc / total if total > float32(0.0) else float32(0.0)
    return attention_tile_kernel


def supports(num_heads: int, head_dim: int, table_width: int) -> bool:
    """Whether the kernel can serve a layout (checked on the host; otherwise use the torch path)."""
    return 1 <= head_dim <= MAX_HEAD_DIM and num_heads >= 1 and 1 <= table_width <= MAX_TABLE_BLOCKS


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


_split_counters: dict[torch.device, torch.Tensor] = {}


def split_counters(device: torch.device) -> torch.Tensor:
    """The device's split-K arrival counters ([MAX_SPLIT_GROUPS] int32, zero between calls: the last
    block of each group resets its own). Made on first use, which must not be inside a CUDA graph
    capture (a graph's memory is private to it): the engine's warm-up forward runs first. Calls that
    share them must not overlap, i.e. run on one stream per device (the engine does)."""
    if device not in _split_counters:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise KernelArgumentError("paged_attention: the first split-K call on a device must run outside a CUDA "
                                      "graph capture (run the forward once before capturing it)")
        _split_counters[device] = torch.zeros(MAX_SPLIT_GROUPS, dtype=torch.int32, device=device)
    return _split_counters[device]


def paged_attention(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor, positions: torch.Tensor,
                    query_len: int, scale: float, splits: int | None = None) -> torch.Tensor:
    """q [T, h, d] (K/V of these tokens already in the cache) -> [T, h * d]. One kernel launch.
    splits: the split-K factor; None picks it from the shape (choose_splits)."""
    check_tensor("q", q, q.dtype, 3)
    check_tensor("kv_cache", kv_cache, q.dtype, 5)
    check_tensor("block_tables", block_tables, torch.int32, 2)
    check_tensor("positions", positions, torch.int64, 1, rows=q.shape[0])
    tokens, heads, head_dim = q.shape
    kv_heads, width = kv_cache.shape[3], block_tables.shape[1]
    if not supports(heads, head_dim, width):
        raise KernelArgumentError(f"paged_attention: head_dim {head_dim} is too large (at most {MAX_HEAD_DIM}) or the "
                                  f"block table's {width} columns are more than {MAX_TABLE_BLOCKS}")
    if kv_cache.shape[4] != head_dim or heads % kv_heads or tokens != block_tables.shape[0] * query_len:
        raise KernelArgumentError(f"paged_attention: {heads} heads of {head_dim} over {kv_heads} kv heads of "
                                  f"{kv_cache.shape[4]}, {tokens} tokens for {block_tables.shape[0]} sequences x "
                                  f"query_len {query_len}")
    group_rows = query_len * (heads // kv_heads)
    rows = rows_per_block(group_rows, head_dim)
    groups = block_tables.shape[0] * kv_heads * -(-group_rows // rows)
    if splits is None:
        splits = choose_splits(groups, width * kv_cache.shape[2], head_dim, q.device)
    elif splits < 1:
        raise KernelArgumentError(f"paged_attention: splits must be >= 1, got {splits}")
    if splits > 1 and groups > MAX_SPLIT_GROUPS:
        raise KernelArgumentError(f"paged_attention: {groups} groups are too many to split (at most {MAX_SPLIT_GROUPS})")
    dev = q.device
    out = torch.empty(tokens, heads * head_dim, dtype=q.dtype, device=dev)
    if splits == 1:  # the partials and counters are not touched: placeholders of the right rank
        partials = torch.empty(1, 1, dtype=torch.float32, device=dev)
        counters = torch.empty(1, dtype=torch.int32, device=dev)
    else:
        partials = torch.empty(groups, partial_stride(splits, rows, head_dim), dtype=torch.float32, device=dev)
        counters = split_counters(dev)
    interop.launch_tensors(attention_kernel(rows, head_dim), groups * splits, THREADS,
                           [q, kv_cache.view(-1), int(kv_cache.shape[2]), int(kv_heads), block_tables, positions, int(query_len), float(scale), int(splits), out,
                            partials, counters])
    return out

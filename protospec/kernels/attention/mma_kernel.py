"""The tensor-core attention's kernel (attention/mma.py holds its shape rules, constants and launch
choices): a warp walks 16-key tiles of its split, S = Q K^T and O += P V as warp matrix multiplies,
an online softmax per row, then the warps' merge and the split-K tail (attention/combine.py)."""
from __future__ import annotations

from numba import float32, int32, int64, uint32

from protospec.kernels.launch import interop
from protospec.kernels.attention.combine import row_group_block, row_group_writer
from protospec.kernels.attention.mma_tile import tile_functions
from protospec.kernels.launch.dependent_launch import allow_dependent_launch, grid_dependency_wait
from protospec.kernels.launch.interop import cuda
from protospec.kernels.primitives.reductions import xor_exchange
from protospec.kernels.primitives.warp_mma import mma_f16, pack_half2, scratch_size
from protospec.kernels.primitives.word_loads import load_flat

TILE = 16                      # keys per warp per step (two n-tiles of 8 for S, the k of P V)
LOW32 = 0xFFFFFFFF
LOW16 = 0xFFFF


def make_mma_kernel(RH: int, D: int, WARPS: int, GROUP: int, options: dict,  # noqa: N803 (Numba: constants)
                    DEPENDENT: bool = False):  # noqa: N803
    """RH 8-row halves a chunk (1 or 2), head dim D, WARPS warps a block, GROUP query heads a KV head.
    DEPENDENT: launched as a programmatic dependent, which issues the loads no kernel of the forward
    writes (positions, table entries, a first tile of keys older than its tokens) before its wait: the
    wait then overlaps them instead of preceding them.
    Each tile's K and V words go out before the products of the tile before it (a second set of words
    in flight during this tile's products), so a warp's walk waits on a load only at its first tile."""
    R = 8 * RH                 # rows per chunk: g (and g + 8 when RH = 2) for lane 4 g + t
    KT = D // 16               # k-tiles of S = Q K^T (16 dims each)
    NT = D // 8                # n-tiles of O = P V (8 dims each)
    VW = NT // 4               # 8-byte words of V per key per lane (NT consecutive dims)
    THREADS = 32 * WARPS
    STEP = TILE * WARPS
    QA, KB, VK, OD = KT * 4, 2 * KT, 4 * VW, NT * 4  # local arrays: Q's A fragments, K and V words, O
    RS = D + 1                 # merged rows one float wider: a warp's stores spread over the banks
    MERGED, MERGED_ROWS = WARPS * R * RS, WARPS * R
    SCRATCH = scratch_size(WARPS)
    SHUFFLES = THREADS if interop.SIMULATOR else 1  # a GPU shuffles through registers
    NO_KEY = float32(-1e30)    # finite: fast-math assumes no infinities
    write_rows = row_group_writer(R, D, WARPS, THREADS, GROUP, RS)

    load_tile, softmax_row = tile_functions(KT, VW, NO_KEY)

    def attention_mma_kernel(q64, kv64, block_tables, positions, query_len, scale, out, part_acc, part_max, part_sum,
                             counters):
        """
        q64          [T, h, d / 4] int64: the fp16 queries as 8-byte words
        kv64         [2, num_blocks, block_size, kvh, d / 4] int64: the fp16 cache as words
        block_tables [S, W] int32; positions [T] int64; query_len, scale, out, part_*, counters:
        as by_kv_head's kernel. Grid: S * kvh * chunks * splits blocks of R rows, as by_kv_head's.
        """
        splits = part_max.shape[1]
        kv_heads = kv64.shape[3]
        seq, kv_head, chunk, split, group, group_rows = row_group_block(R, GROUP, kv_heads, query_len, splits)
        block_size = kv64.shape[2]
        tid = cuda.threadIdx.x
        lane = tid % 32
        warp = tid // 32
        g = lane // 4
        t = lane % 4

        shuffle_scratch = cuda.shared.array(SHUFFLES, float32)  # the simulator's shuffles
        mma_scratch = cuda.shared.array(SCRATCH, uint32)       # the simulator's matrix products
        merged_acc = cuda.shared.array(MERGED, float32)
        merged_max = cuda.shared.array(MERGED_ROWS, float32)
        merged_sum = cuda.shared.array(MERGED_ROWS, float32)
        last_block = cuda.shared.array(1, int32)            # 1: this block combines its row group

        qa = cuda.local.array(QA, uint32)    # [KT, 4] A fragments of Q: a0..a3 per k-tile
        kb = cuda.local.array(KB, int64)     # [2, KT] K words: keys key0 + 8 n + g, dims 16 kt + 4 t ..
        vw = cuda.local.array(VK, int64)     # [4, VW] V words: keys key0 + 2t, + 1, + 8, + 9; dims g NT ..
        kb2 = cuda.local.array(KB, int64)    # the next tile's K and V words, in flight during this one's
        vw2 = cuda.local.array(VK, int64)
        s = cuda.local.array(8, float32)     # [2, 4] this step's S fragments (one per 8 keys)
        o = cuda.local.array(OD, float32)    # [NT, 4] O fragments: rows g, g + 8; dims (2t + i) NT + nt
        for i in range(OD):
            o[i] = float32(0.0)
        # This lane's rows (g, g + 8) and their queries; the chunk's last position bounds the keys.
        # Every load first, at clamped (always valid) indices and with no branch, then the arithmetic:
        # loads behind a branch and consumed at once would each wait out their latency in turn.
        real_rows = min(R, group_rows - chunk * R)     # >= 1: a chunk holds at least one row
        table = block_tables.shape[1]
        # The first split's first tile (every block's, without split-K) starts at key warp * TILE: its
        # cache block's table entry goes out with the positions' loads instead of after them (clamped
        # to the table: past it the tile holds no key and the entry is not used).
        early_block = load_flat(block_tables, seq * table + min(int64(uint32(warp * TILE) // uint32(block_size)), table - 1))
        last = int64(-1)
        for r in range(R):
            last = max(last, load_flat(positions, seq * query_len + (chunk * R + min(r, real_rows - 1)) // group))
        pos_lo, pos_hi = int64(-1), int64(-1)
        for hi in range(RH):  # this lane's rows g (a0 / a2) and g + 8 (a1 / a3): their positions
            r = g + 8 * hi
            pos = load_flat(positions, seq * query_len + (chunk * R + min(r, real_rows - 1)) // group)
            pos = pos if r < real_rows else int64(-1)
            pos_lo, pos_hi = (pos, pos_hi) if hi == 0 else (pos_lo, pos)
        # Padding rows of a captured batch may hold any position: never read past the table.
        # (Divisions by runtime values in 32 bits: a 64-bit one is a subroutine call.)
        keys = min(last + 1, table * block_size)
        span = (int64(uint32(keys + splits - 1) // uint32(splits)) + TILE - 1) // TILE * TILE
        first = min(split * span, keys)
        end = min(first + span, keys)
        iters = (end - first + STEP - 1) // STEP   # the same for every thread (the simulator's barriers)
        scale32 = float32(scale)
        m_lo, m_hi = NO_KEY, NO_KEY
        l_lo, l_hi = float32(0.0), float32(0.0)
        # Flat word offsets: a key is kv_heads * D / 4 words, a cache block block_size keys, V a whole
        # cache after K. The tile's cache-block column and offset advance by adding (no division).
        key_stride = kv_heads * (D // 4)
        block_words = block_size * key_stride
        k_lane = g * key_stride + kv_head * (D // 4) + t
        v_lane = kv64.shape[1] * block_words + 2 * t * key_stride + kv_head * (D // 4) + g * VW
        key0 = first + warp * TILE
        column = int64(uint32(key0) // uint32(block_size))
        offset = key0 - column * block_size
        jump = int64(uint32(STEP) // uint32(block_size))
        rest = STEP - jump * block_size
        block = 0
        if key0 < end:
            block = early_block if split == 0 else load_flat(block_tables, seq * table + column)
        # The cache-block columns a step and two steps ahead (advanced by adding, as `offset`);
        # the entry a step ahead is a table's: no kernel of this forward writes it.
        next_block, after = int64(0), int64(0)
        column2, offset2 = column + jump, offset + rest
        if offset2 >= block_size:
            offset2 -= block_size
            column2 += 1
        if key0 + STEP < end:
            next_block = load_flat(block_tables, seq * table + column2)
        column2 += jump
        offset2 += rest
        if offset2 >= block_size:
            offset2 -= block_size
            column2 += 1
        prefetched = False
        if DEPENDENT:  # the first tile before the wait if no kernel of this forward writes its keys
            oldest_new = load_flat(positions, seq * query_len)  # the sequence's first query token
            prefetched = key0 + TILE <= oldest_new
            if prefetched:
                load_tile(kv64, block * block_words + offset * key_stride, k_lane, v_lane, key_stride, key0, end, t,
                          kb, vw)
            grid_dependency_wait()  # everything below may be the previous kernel's output (q, the new K/V)
            allow_dependent_launch()
        for hi in range(RH):  # the rows' queries (a real row's, clamped; zeroed here if past: no branch)
            r = g + 8 * hi
            gr = chunk * R + min(r, real_rows - 1)
            tok, head = seq * query_len + gr // group, kv_head * group + gr % group
            for kt in range(KT):
                word = load_flat(q64, (tok * q64.shape[1] + head) * (D // 4) + kt * 4 + t)
                word = word if r < real_rows else int64(0)
                qa[kt * 4 + hi] = uint32(word & LOW32)
                qa[kt * 4 + 2 + hi] = uint32((word >> 32) & LOW32)
        for i in range(QA):
            if RH == 1 and i % 2 == 1:  # rows g + 8 do not exist
                qa[i] = uint32(0)
        if not prefetched:  # the first tile now; each iteration then loads the one after its own
            load_tile(kv64, block * block_words + offset * key_stride, k_lane, v_lane, key_stride, key0, end, t, kb, vw)
        for _ in range(iters):
            # The next tile's words (its offset in its cache block advanced by adding; the block's table
            # entry came a step ago), and the entry of the one after it.
            offset += rest
            if offset >= block_size:
                offset -= block_size
            if key0 + STEP < end:  # the same for the warp's lanes; no load is waited on here
                load_tile(kv64, next_block * block_words + offset * key_stride, k_lane, v_lane, key_stride,
                          key0 + STEP, end, t, kb2, vw2)
            else:  # no tile left: zeros, as load_tile gives V past the end (K's scores are masked)
                for i in range(KB):
                    kb2[i] = int64(0)
                for i in range(VK):
                    vw2[i] = int64(0)
            after = load_flat(block_tables, seq * table + column2) if key0 + 2 * STEP < end else 0
            column2 += jump
            offset2 += rest
            if offset2 >= block_size:
                offset2 -= block_size
                column2 += 1
            # S = Q K^T, 8 keys per product, scaled.
            for n in range(2):
                c0, c1, c2, c3 = float32(0.0), float32(0.0), float32(0.0), float32(0.0)
                for kt in range(KT):
                    word = kb[n * KT + kt]
                    c0, c1, c2, c3 = mma_f16(qa[kt * 4], qa[kt * 4 + 1], qa[kt * 4 + 2], qa[kt * 4 + 3], word & LOW32,
                                             (word >> 32) & LOW32, c0, c1, c2, c3, mma_scratch, tid)
                    if RH == 1:  # rows g + 8 do not exist: constant zeros free their registers
                        c2, c3 = float32(0.0), float32(0.0)
                s[4 * n] = c0 * scale32
                s[4 * n + 1] = c1 * scale32
                s[4 * n + 2] = c2 * scale32
                s[4 * n + 3] = c3 * scale32
            m_lo, alpha_lo, p_lo = softmax_row(s, 0, m_lo, pos_lo, key0 + 2 * t, end, shuffle_scratch, tid)
            l_lo = l_lo * alpha_lo + p_lo
            alpha_hi = float32(1.0)
            if RH == 2:
                m_hi, alpha_hi, p_hi = softmax_row(s, 1, m_hi, pos_hi, key0 + 2 * t, end, shuffle_scratch, tid)
                l_hi = l_hi * alpha_hi + p_hi
            # P as the A operand (the C fragments of S, as fp16 pairs), then O = O alpha + P V.
            a0 = pack_half2(s[0], s[1])
            a1 = pack_half2(s[2], s[3]) if RH == 2 else uint32(0)
            a2 = pack_half2(s[4], s[5])
            a3 = pack_half2(s[6], s[7]) if RH == 2 else uint32(0)
            for nt in range(NT):
                w, shift = nt // 4, 16 * (nt % 4)
                b0 = ((vw[w] >> shift) & LOW16) | (((vw[VW + w] >> shift) & LOW16) << 16)
                b1 = ((vw[2 * VW + w] >> shift) & LOW16) | (((vw[3 * VW + w] >> shift) & LOW16) << 16)
                o[nt * 4], o[nt * 4 + 1], o[nt * 4 + 2], o[nt * 4 + 3] = mma_f16(
                    a0, a1, a2, a3, b0, b1, o[nt * 4] * alpha_lo, o[nt * 4 + 1] * alpha_lo, o[nt * 4 + 2] * alpha_hi,
                    o[nt * 4 + 3] * alpha_hi, mma_scratch, tid)
                if RH == 1:
                    o[nt * 4 + 2], o[nt * 4 + 3] = float32(0.0), float32(0.0)
            key0 += STEP
            # The next step's words (the copy waits for their loads, due by then).
            for i in range(KB):
                kb[i] = kb2[i]
            for i in range(VK):
                vw[i] = vw2[i]
            next_block = after

        # A row's sum over its 4 lanes; then the warp's rows into shared memory, dims un-permuted.
        for mask in (1, 2):
            l_lo += xor_exchange(l_lo, mask, shuffle_scratch, tid)
            l_hi += xor_exchange(l_hi, mask, shuffle_scratch, tid)
        for half in range(RH):
            row = warp * R + g + 8 * half
            for nt in range(NT):
                for i in range(2):
                    merged_acc[row * RS + (2 * t + i) * NT + nt] = o[nt * 4 + 2 * half + i]
            if t == 0:
                merged_max[row] = m_lo if half == 0 else m_hi
                merged_sum[row] = l_lo if half == 0 else l_hi
        cuda.syncthreads()
        write_rows(merged_acc, merged_max, merged_sum, seq, kv_head, chunk, split, query_len, out,
                   part_acc, part_max, part_sum, counters, last_block, tid)

    return cuda.jit(**options)(attention_mma_kernel)

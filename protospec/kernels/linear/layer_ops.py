"""A decoder layer's elementwise chains as three Numba kernels, vLLM-style fused ops.

At batch 1 a forward's time follows its kernel count (a few microseconds of GPU time plus a gap
each), and torch runs these chains as many small kernels:
  add_rms_norm    residual += x; h = rms_norm(residual) * w      2 torch kernels -> 1
  rope_and_cache  RoPE on q and k, K/V stored at their slots      7 torch kernels -> 1
  silu_and_mul    silu(gate) * up                                 2 torch kernels -> 1
(attention/paged_attention.py has the fourth: attention straight from the paged cache.)

Activations are float16 or float32 (Numba has no bfloat16 arrays); every kernel computes in
float32 and rounds once, where torch rounds after each op: results agree to an ulp or so of the
activation dtype, not bit for bit (tests bound the difference).
"""
from __future__ import annotations

import functools
import math

import torch
from numba import float32, int64, uint32

from protospec.errors import KernelArgumentError
from protospec.kernels.launch import interop
from protospec.kernels.launch.interop import check_tensor, cuda
from protospec.kernels.primitives.divisions import divide32
from protospec.kernels.primitives.reductions import tree_sum
from protospec.kernels.primitives.word_loads import load_flat, pack_f16x4, store_flat, unpack_f16x4

ACTIVATION_DTYPES = (torch.float16, torch.float32)
# Threads per block (powers of two, for the tree reductions); the simulator runs a Python thread
# per CUDA thread, so it gets narrow blocks.
NORM_THREADS = 32 if interop.SIMULATOR else 256
ROPE_THREADS = 32 if interop.SIMULATOR else 256
ROPE_WORD_THREADS = 32 if interop.SIMULATOR else 128  # the word form: 4 entries a thread where the other takes 1
ELEMENTWISE_THREADS = 32 if interop.SIMULATOR else 256


# The norm and the RoPE issue all of a thread's loads before their first store. A kernel's outputs may
# alias its inputs as far as the compiler knows, so a load written after a store waits for that store:
# a loop that alternates them pays one memory latency per entry a thread, where loads issued together
# pay one.


@functools.lru_cache(maxsize=None)
def add_rms_norm_kernel(ENTRIES: int):  # noqa: N803 (Numba freezes it as a constant)
    """ENTRIES: a row's entries a thread, ceil(H / NORM_THREADS) (a local array's size)."""

    @cuda.jit
    def add_rms_norm_kernel(x, residual, weight, rows, out, eps, add):
        """
        x, residual [T, H] act      weight [H] act     rows [N] int64 (distinct)     out [N, H] act
        Block i handles token r = rows[i]: v = x[r] + residual[r] (stored back into residual[r]) when
        add, else v = x[r]; out[i] = weight * v / sqrt(mean(v^2) + eps), the mean in float32.
        Thread tid holds entries tid, tid + NORM_THREADS, ... and sums their squares in that order.
        """
        i = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        hidden = x.shape[1]
        partial = cuda.shared.array(NORM_THREADS, float32)
        vs = cuda.local.array(ENTRIES, float32)  # [ENTRIES] this thread's v, as stored when add
        ws = cuda.local.array(ENTRIES, float32)  # [ENTRIES] its weights
        for e in range(ENTRIES):  # clamped indices, no branch: every load in flight at once
            ws[e] = float32(weight[min(tid + e * NORM_THREADS, hidden - 1)])
        r = rows[i]
        for e in range(ENTRIES):
            j = min(tid + e * NORM_THREADS, hidden - 1)
            vs[e] = float32(x[r, j]) + float32(residual[r, j]) if add else float32(x[r, j])
        if add:  # the sum is rounded to act as it is stored; read back together, the rounded value
            for e in range(ENTRIES):
                if tid + e * NORM_THREADS < hidden:
                    residual[r, tid + e * NORM_THREADS] = vs[e]
            for e in range(ENTRIES):
                vs[e] = float32(residual[r, min(tid + e * NORM_THREADS, hidden - 1)])
        acc = float32(0.0)
        for e in range(ENTRIES):
            if tid + e * NORM_THREADS < hidden:
                acc += vs[e] * vs[e]
        partial[tid] = acc
        cuda.syncthreads()
        tree_sum(partial, tid, NORM_THREADS)
        inv_rms = float32(1.0) / math.sqrt(partial[0] / float32(hidden) + float32(eps))
        for e in range(ENTRIES):
            if tid + e * NORM_THREADS < hidden:
                out[i, tid + e * NORM_THREADS] = ws[e] * (vs[e] * inv_rms)

    return add_rms_norm_kernel


@functools.lru_cache(maxsize=None)
def rope_and_cache_kernel(PAIRS: int, VALUES: int):  # noqa: N803 (Numba freezes them as constants)
    """PAIRS: rotated (head, i) pairs a thread, ceil((h + kvh) * d / 2 / ROPE_THREADS); VALUES: v
    entries a thread, ceil(kvh * d / ROPE_THREADS) (local arrays' sizes)."""

    @cuda.jit
    def rope_and_cache_kernel(qkv, positions, cos_table, sin_table, kv_cache, slot_mapping, q_out, num_heads):
        """
        qkv [T, (h + 2 kvh) * d] act (q heads, then k heads, then v heads)   positions [T] int64
        cos_table, sin_table [P, d] act (the two halves share frequencies)   slot_mapping [T] int64, -1 = skip
        kv_cache [2, blocks, block_size, kvh, d] act                         q_out [T, h or h + kvh, d] act
        Block t: HF's rotate-half RoPE on token t's q and k heads; q goes to q_out (and the rotated k
        after it, where q_out has h + kvh heads), k and v to the cache slot (nothing is written for
        slot -1: padding rows of a CUDA graph).
        """
        t = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        head_dim = q_out.shape[2]
        half = head_dim // 2
        num_kv_heads = kv_cache.shape[3]
        pairs = (num_heads + num_kv_heads) * half
        key_width = num_kv_heads * head_dim
        v_start = (num_heads + num_kv_heads) * head_dim
        x1s = cuda.local.array(PAIRS, float32)   # [PAIRS] each pair's first-half entry
        x2s = cuda.local.array(PAIRS, float32)   # [PAIRS] and its second-half partner
        cs = cuda.local.array(PAIRS, float32)    # [PAIRS] cos and sin at its position
        ss = cuda.local.array(PAIRS, float32)
        vs = cuda.local.array(VALUES, float32)   # [VALUES] v entries (exact through float32)
        pos = positions[t]
        slot = slot_mapping[t]
        # Every load first, at clamped indices: q, k and v, then cos and sin (which wait for the position:
        # issued first, they would hold back the rest). A (head, i) pair's division is 32-bit: a 64-bit
        # division by a runtime value is a subroutine call on a GPU.
        for e in range(PAIRS):
            p = min(tid + e * ROPE_THREADS, pairs - 1)
            head = int64(uint32(p) // uint32(half))
            i = p - head * half
            x1s[e] = float32(qkv[t, head * head_dim + i])
            x2s[e] = float32(qkv[t, head * head_dim + i + half])
        for e in range(VALUES):
            vs[e] = float32(qkv[t, v_start + min(tid + e * ROPE_THREADS, key_width - 1)])
        for e in range(PAIRS):
            i = int64(uint32(min(tid + e * ROPE_THREADS, pairs - 1)) % uint32(half))
            cs[e] = float32(cos_table[pos, i])
            ss[e] = float32(sin_table[pos, i])
        # The cache is slot-major inside K and inside V (slot = block * block_size + offset): its stores
        # go to flat offsets, with no division by the block size.
        k_row = slot * key_width
        v_row = (kv_cache.shape[1] * kv_cache.shape[2] + slot) * key_width
        for e in range(PAIRS):
            p = tid + e * ROPE_THREADS
            if p < pairs:
                head = int64(uint32(p) // uint32(half))
                i = p - head * half
                y1 = x1s[e] * cs[e] - x2s[e] * ss[e]
                y2 = x2s[e] * cs[e] + x1s[e] * ss[e]
                if head < q_out.shape[1]:  # q heads, and k heads too where q_out has room for them
                    q_out[t, head, i] = y1
                    q_out[t, head, i + half] = y2
                if head >= num_heads and slot >= 0:
                    store_flat(kv_cache, k_row + (head - num_heads) * head_dim + i, y1)
                    store_flat(kv_cache, k_row + (head - num_heads) * head_dim + i + half, y2)
        if slot >= 0:
            for e in range(VALUES):
                if tid + e * ROPE_THREADS < key_width:
                    store_flat(kv_cache, v_row + tid + e * ROPE_THREADS, vs[e])

    return rope_and_cache_kernel


@functools.lru_cache(maxsize=None)
def rope_and_cache_words_kernel(PAIRS: int, VALUES: int):  # noqa: N803 (Numba freezes them as constants)
    """rope_and_cache_kernel over float16 as 8-byte words, for head sizes of whole words a half (d a
    multiple of 8): PAIRS: word pairs a thread, ceil((h + kvh) * d / 8 / ROPE_WORD_THREADS); VALUES: v
    words a thread, ceil(kvh * d / 4 / ROPE_WORD_THREADS). A thread rotates four (i, i + d / 2) pairs
    at a time, each as the entry kernel does it (the same bits), with a quarter of its memory instructions."""

    @cuda.jit
    def rope_and_cache_words_kernel(qkv, positions, cos_table, sin_table, kv_cache, slot_mapping, q_out, num_heads):
        """
        qkv [T, (h + 2 kvh) * d / 4], cos_table, sin_table [P, d / 4], kv_cache [2, blocks, block_size,
        kvh, d / 4], q_out [T, h or h + kvh, d / 4]: int64 words of the float16 tensors rope_and_cache_kernel takes;
        positions [T] int64, slot_mapping [T] int64 (-1 = skip). Block t: token t, as that kernel's.
        """
        t = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        head_words = q_out.shape[2]    # d / 4
        half = head_words // 2         # words a half: d / 8
        num_kv_heads = kv_cache.shape[3]
        pairs = (num_heads + num_kv_heads) * half
        key_words = num_kv_heads * head_words
        row = t * qkv.shape[1]
        v_start = row + (num_heads + num_kv_heads) * head_words
        x1s = cuda.local.array(PAIRS, int64)   # [PAIRS] a pair's first-half word
        x2s = cuda.local.array(PAIRS, int64)   # [PAIRS] and its second-half partner
        cs = cuda.local.array(PAIRS, int64)    # [PAIRS] the cos and sin words at its position
        ss = cuda.local.array(PAIRS, int64)
        vs = cuda.local.array(VALUES, int64)   # [VALUES] v words (copied as they are)
        pos = positions[t]
        slot = slot_mapping[t]
        for e in range(PAIRS):  # every load first, at clamped indices (the entry kernel's order)
            head, i = divide32(min(tid + e * ROPE_WORD_THREADS, pairs - 1), half)
            x1s[e] = load_flat(qkv, row + head * head_words + i)
            x2s[e] = load_flat(qkv, row + head * head_words + half + i)
        for e in range(VALUES):
            vs[e] = load_flat(qkv, v_start + min(tid + e * ROPE_WORD_THREADS, key_words - 1))
        for e in range(PAIRS):
            _, i = divide32(min(tid + e * ROPE_WORD_THREADS, pairs - 1), half)
            cs[e] = load_flat(cos_table, pos * head_words + i)
            ss[e] = load_flat(sin_table, pos * head_words + i)
        k_row = slot * key_words
        v_row = (kv_cache.shape[1] * kv_cache.shape[2] + slot) * key_words
        for e in range(PAIRS):
            p = tid + e * ROPE_WORD_THREADS
            if p < pairs:
                head, i = divide32(p, half)
                a0, a1, a2, a3 = unpack_f16x4(x1s[e])
                b0, b1, b2, b3 = unpack_f16x4(x2s[e])
                c0, c1, c2, c3 = unpack_f16x4(cs[e])
                s0, s1, s2, s3 = unpack_f16x4(ss[e])
                y1 = pack_f16x4(a0 * c0 - b0 * s0, a1 * c1 - b1 * s1, a2 * c2 - b2 * s2, a3 * c3 - b3 * s3)
                y2 = pack_f16x4(b0 * c0 + a0 * s0, b1 * c1 + a1 * s1, b2 * c2 + a2 * s2, b3 * c3 + a3 * s3)
                if head < q_out.shape[1]:
                    out = (t * q_out.shape[1] + head) * head_words + i
                    store_flat(q_out, out, y1)
                    store_flat(q_out, out + half, y2)
                if head >= num_heads and slot >= 0:
                    store_flat(kv_cache, k_row + (head - num_heads) * head_words + i, y1)
                    store_flat(kv_cache, k_row + (head - num_heads) * head_words + i + half, y2)
        if slot >= 0:
            for e in range(VALUES):
                if tid + e * ROPE_WORD_THREADS < key_words:
                    store_flat(kv_cache, v_row + tid + e * ROPE_WORD_THREADS, vs[e])

    return rope_and_cache_words_kernel


@cuda.jit
def silu_and_mul_kernel(gate_up, out):
    """gate_up [T, 2I] act (gate, then up)  ->  out [T, I] act = silu(gate) * up."""
    inter = out.shape[1]
    total = out.shape[0] * inter
    n = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    while n < total:  # grid-stride; not range, whose run-time step costs a 64-bit division
        t, i = divide32(n, inter)
        g = float32(gate_up[t, i])
        out[t, i] = g / (float32(1.0) + math.exp(-g)) * float32(gate_up[t, inter + i])
        n += cuda.gridDim.x * cuda.blockDim.x


@cuda.jit
def silu_and_mul_words_kernel(gate_up, out):
    """gate_up [T, 2I / 4] int64 (float16 gate, then up, as 8-byte words)  ->  out [T, I / 4] int64.
    Thread n takes out's word n: four outputs from a word of gate and one of up, each computed as the
    kernel above computes it and rounded once to float16 (so the same bits), in three memory
    instructions where 2-byte entries take twelve; a large call (a prefill's [T, I] at T in the
    thousands) is bound by them."""
    words = out.shape[1]
    n = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if n < out.shape[0] * words:
        t, w = divide32(n, words)
        g0, g1, g2, g3 = unpack_f16x4(load_flat(gate_up, 2 * t * words + w))
        u0, u1, u2, u3 = unpack_f16x4(load_flat(gate_up, (2 * t + 1) * words + w))
        one = float32(1.0)
        store_flat(out, n, pack_f16x4(g0 / (one + math.exp(-g0)) * u0, g1 / (one + math.exp(-g1)) * u1,
                                      g2 / (one + math.exp(-g2)) * u2, g3 / (one + math.exp(-g3)) * u3))


def _check_activation(name: str, t: torch.Tensor, ndim: int) -> None:
    if t.dtype not in ACTIVATION_DTYPES:
        raise KernelArgumentError(f"{name}: dtype {t.dtype}; the layer kernels take {ACTIVATION_DTYPES}")
    check_tensor(name, t, t.dtype, ndim)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
                 rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual) * weight for the tokens in `rows`, the new residual).
    x, residual [T, H]; weight [H]; rows [N] int64 -> out [N, H]. residual None: the residual is x
    itself (the first layer). The sum lands in `residual` in place (no new tensor)."""
    _check_activation("x", x, 2)
    add = residual is not None
    residual = residual if add else x
    for name, t in (("residual", residual), ("weight", weight)):
        _check_activation(name, t, t.dim())
        if t.dtype != x.dtype:
            raise KernelArgumentError(f"{name}: dtype {t.dtype} differs from x's {x.dtype}")
    check_tensor("rows", rows, torch.int64, 1)
    if residual.shape != x.shape or weight.shape != (x.shape[1],):
        raise KernelArgumentError(f"add_rms_norm: x {tuple(x.shape)}, residual {tuple(residual.shape)}, "
                                  f"weight {tuple(weight.shape)} do not fit [T, H], [T, H], [H]")
    out = torch.empty(rows.shape[0], x.shape[1], dtype=x.dtype, device=x.device)
    if rows.shape[0] == 0:  # e.g. a draft prefill that wants no logits (a grid of 0 blocks is invalid)
        return out, residual
    entries = -(-x.shape[1] // NORM_THREADS)
    interop.launch_tensors(add_rms_norm_kernel(entries), rows.shape[0], NORM_THREADS,
                           [x, residual, weight, rows, out, float(eps), int(add)])
    return out, residual


def rope_and_cache(qkv: torch.Tensor, positions: torch.Tensor, cos_table: torch.Tensor, sin_table: torch.Tensor,
                   kv_cache: torch.Tensor, slot_mapping: torch.Tensor, num_heads: int,
                   with_keys: bool = False) -> torch.Tensor:
    """Rotate q and k, store k and v in the paged cache. qkv [T, (h + 2 kvh) * d] -> q [T, h, d], or
    with_keys q and the rotated k [T, h + kvh, d] (a prefill's attention takes its keys from there
    instead of reading them back through the block tables)."""
    _check_activation("qkv", qkv, 2)
    for name, t in (("cos_table", cos_table), ("sin_table", sin_table), ("kv_cache", kv_cache)):
        check_tensor(name, t, qkv.dtype, t.dim())
    check_tensor("positions", positions, torch.int64, 1, rows=qkv.shape[0])
    check_tensor("slot_mapping", slot_mapping, torch.int64, 1, rows=qkv.shape[0])
    num_kv_heads, head_dim = kv_cache.shape[3], kv_cache.shape[4]
    if kv_cache.dim() != 5 or qkv.shape[1] != (num_heads + 2 * num_kv_heads) * head_dim or cos_table.shape[1] != head_dim:
        raise KernelArgumentError(f"rope_and_cache: qkv {tuple(qkv.shape)}, kv_cache {tuple(kv_cache.shape)}, "
                                  f"cos_table {tuple(cos_table.shape)} do not fit {num_heads} heads")
    q = torch.empty(qkv.shape[0], num_heads + num_kv_heads * with_keys, head_dim, dtype=qkv.dtype, device=qkv.device)
    tensors = (qkv, cos_table, sin_table, kv_cache)
    if qkv.dtype == torch.float16 and head_dim % 8 == 0 and all(t.data_ptr() % 8 == 0 for t in tensors):
        pairs = -(-(num_heads + num_kv_heads) * (head_dim // 8) // ROPE_WORD_THREADS)  # word pairs a thread
        values = -(-num_kv_heads * head_dim // 4 // ROPE_WORD_THREADS)
        words = [t.view(torch.int64) for t in tensors]
        interop.launch_tensors(rope_and_cache_words_kernel(pairs, values), qkv.shape[0], ROPE_WORD_THREADS,
                               [words[0], positions, words[1], words[2], words[3], slot_mapping,
                                q.view(torch.int64), num_heads])
        return q
    pairs = -(-(num_heads + num_kv_heads) * (head_dim // 2) // ROPE_THREADS)  # a thread's, rounded up
    values = -(-num_kv_heads * head_dim // ROPE_THREADS)
    interop.launch_tensors(rope_and_cache_kernel(pairs, values), qkv.shape[0], ROPE_THREADS,
                           [qkv, positions, cos_table, sin_table, kv_cache, slot_mapping, q, num_heads])
    return q


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[T, 2I] -> [T, I]: silu(gate) * up."""
    _check_activation("gate_up", gate_up, 2)
    tokens, inter = gate_up.shape[0], gate_up.shape[1] // 2
    if tokens * inter >= 2**32:  # the kernel splits its flat index in 32 bits
        raise KernelArgumentError(f"silu_and_mul: {tokens} x {inter} outputs, at most 2**32 - 1")
    out = torch.empty(tokens, inter, dtype=gate_up.dtype, device=gate_up.device)
    if gate_up.dtype == torch.float16 and inter % 4 == 0 and gate_up.data_ptr() % 8 == 0:  # whole 8-byte words
        words = tokens * inter // 4
        interop.launch_tensors(silu_and_mul_words_kernel, max(1, -(-words // ELEMENTWISE_THREADS)),
                               ELEMENTWISE_THREADS, [gate_up.view(torch.int64), out.view(torch.int64)])
        return out
    blocks = max(1, min(1024, math.ceil(tokens * inter / ELEMENTWISE_THREADS)))
    interop.launch_tensors(silu_and_mul_kernel, blocks, ELEMENTWISE_THREADS, [gate_up, out])
    return out

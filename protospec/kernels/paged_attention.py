"""Attention for decode-shaped forwards, read straight from the paged KV cache: one Numba kernel.

The torch path (attention.py) gathers every sequence's blocks into a dense copy, builds an additive
mask and calls SDPA: 3-4 kernels per layer plus ~7 per forward for the mask. Here one block per
(query token, head) walks the sequence's block table itself:
  1. scores: each thread takes keys j = tid, tid + THREADS, ...: dot(q, K[j]) * scale
  2. softmax over the scores (kept in shared memory, so a context holds at most MAX_KEYS keys)
  3. out = sum_j p_j V[j] / sum_j p_j, threads split over (key group, head dim)
A query at position pos sees keys 0..pos: causal inside a verify window, blind to stale slots past
the sequence's end, as the torch path's mask.

Only uniform layouts (every sequence feeds query_len tokens: decode, draft step 1, verify) take
this path; token t belongs to sequence t // query_len.
"""
from __future__ import annotations

import math

import torch
from numba import float32

from protospec.errors import KernelArgumentError
from protospec.kernels import interop
from protospec.kernels.interop import check_tensor, cuda

MAX_KEYS = 4096        # shared-memory scores per block: 16 KiB of float32
MAX_HEAD_DIM = 256
THREADS = 32 if interop.SIMULATOR else 128  # a power of two >= head_dim / ... (see phase 3)


@cuda.jit
def paged_attention_kernel(q, kv_cache, block_tables, positions, out, query_len, scale):
    """
    q [T, h, d] act          kv_cache [2, blocks, block_size, kvh, d] act    block_tables [S, W] int32
    positions [T] int64      out [T, h * d] act                               query_len, scale: scalars
    Grid: T * h blocks (token t = block // h, head = block % h); GQA: kv head = head // (h / kvh).
    """
    t = cuda.blockIdx.x // q.shape[1]
    head = cuda.blockIdx.x % q.shape[1]
    tid = cuda.threadIdx.x
    head_dim = q.shape[2]
    block_size = kv_cache.shape[2]
    kv_head = head // (q.shape[1] // kv_cache.shape[3])
    seq = t // query_len
    num_keys = min(positions[t] + 1, block_tables.shape[1] * block_size)  # padding rows stay in range

    q_scaled = cuda.shared.array(MAX_HEAD_DIM, float32)
    scores = cuda.shared.array(MAX_KEYS, float32)
    reduce = cuda.shared.array(THREADS, float32)
    for e in range(tid, head_dim, THREADS):
        q_scaled[e] = float32(q[t, head, e]) * float32(scale)
    cuda.syncthreads()

    # 1. scores, and this thread's max
    local_max = float32(-math.inf)
    for j in range(tid, num_keys, THREADS):
        block = block_tables[seq, j // block_size]
        offset = j % block_size
        dot = float32(0.0)
        for e in range(head_dim):
            dot += q_scaled[e] * float32(kv_cache[0, block, offset, kv_head, e])
        scores[j] = dot
        local_max = max(local_max, dot)
    reduce[tid] = local_max
    cuda.syncthreads()
    stride = THREADS // 2
    while stride > 0:
        if tid < stride:
            reduce[tid] = max(reduce[tid], reduce[tid + stride])
        cuda.syncthreads()
        stride //= 2
    top = reduce[0]
    cuda.syncthreads()

    # 2. exp(score - max) in place, and the sum
    local_sum = float32(0.0)
    for j in range(tid, num_keys, THREADS):
        p = math.exp(scores[j] - top)
        scores[j] = p
        local_sum += p
    reduce[tid] = local_sum
    cuda.syncthreads()
    stride = THREADS // 2
    while stride > 0:
        if tid < stride:
            reduce[tid] += reduce[tid + stride]
        cuda.syncthreads()
        stride //= 2
    total = reduce[0]
    cuda.syncthreads()

    # 3. weighted sum of V: `groups` groups of head_dim threads, group g takes keys g, g + groups, ...
    groups = THREADS // head_dim
    group = tid // head_dim
    e = tid % head_dim
    acc = float32(0.0)
    if group < groups:
        for j in range(group, num_keys, groups):
            block = block_tables[seq, j // block_size]
            acc += scores[j] * float32(kv_cache[1, block, j % block_size, kv_head, e])
    reduce[tid] = acc
    cuda.syncthreads()
    if group == 0:
        for g in range(1, groups):
            acc += reduce[g * head_dim + e]
        out[t, head * head_dim + e] = acc / total if total > float32(0.0) else float32(0.0)


def supports(num_heads: int, head_dim: int, max_keys: int) -> bool:
    """Whether this kernel can serve a layout (checked on the host; otherwise use the torch path)."""
    return head_dim <= min(THREADS, MAX_HEAD_DIM) and max_keys <= MAX_KEYS and num_heads >= 1


def paged_attention(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor, positions: torch.Tensor,
                    query_len: int, scale: float) -> torch.Tensor:
    """q [T, h, d] (K/V of these tokens already in the cache) -> [T, h * d]."""
    check_tensor("q", q, q.dtype, 3)
    check_tensor("kv_cache", kv_cache, q.dtype, 5)
    check_tensor("block_tables", block_tables, torch.int32, 2)
    check_tensor("positions", positions, torch.int64, 1, rows=q.shape[0])
    tokens, heads, head_dim = q.shape
    if not supports(heads, head_dim, block_tables.shape[1] * kv_cache.shape[2]):
        raise KernelArgumentError(f"paged_attention: head_dim {head_dim} (at most {min(THREADS, MAX_HEAD_DIM)}) or "
                                  f"{block_tables.shape[1]} blocks x {kv_cache.shape[2]} keys (at most {MAX_KEYS}) too large")
    if heads % kv_cache.shape[3] or tokens != block_tables.shape[0] * query_len:
        raise KernelArgumentError(f"paged_attention: {heads} heads over {kv_cache.shape[3]} kv heads, {tokens} tokens "
                                  f"for {block_tables.shape[0]} sequences x query_len {query_len}")
    out = torch.empty(tokens, heads * head_dim, dtype=q.dtype, device=q.device)
    interop.launch_tensors(paged_attention_kernel, tokens * heads, THREADS,
                           [q, kv_cache, block_tables, positions, out, int(query_len), float(scale)])
    return out

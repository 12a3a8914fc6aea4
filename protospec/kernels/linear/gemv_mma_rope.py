"""The tensor-core GEMV's qkv epilogue (linear/gemv_mma_kernel.py, ROPE_DIM): HF's rotate-half RoPE on q and
k and the paged cache store of k and v, for the (dim, dim + d/2) pair a lane holds."""
from __future__ import annotations

from numba import float32

from protospec.kernels.launch.interop import cuda
from protospec.kernels.primitives.word_loads import store_flat


@cuda.jit(device=True)
def rope_inputs(positions, cos, sin, slots, t, dim, tok0, tokens, angles, slot_of):
    """What the epilogue of lane (g, t) needs for its tokens tok0 + 2t + i (i = 0, 1; clamped to the
    block's `tokens` rows):
    angles [4] float32 <- cos, sin of each token's position at `dim`; slot_of [2] int64 <- their cache
    slots. Loaded early (before the products, or before the kernel's wait) so the epilogue's stores
    wait on no load: in the epilogue, position then cos / sin were two round trips in a row."""
    for i in range(2):
        tok = tok0 + min(2 * t + i, tokens - 1)
        pos = positions[tok]
        angles[2 * i] = float32(cos[pos, dim])
        angles[2 * i + 1] = float32(sin[pos, dim])
        slot_of[i] = slots[tok]


@cuda.jit(device=True)
def rope_and_store(lo, hi, tok, head, dim, half, c, s, slot, y, kv_cache):
    """Token tok's (dim, dim + half) pair of `head` in qkv's row order, with cos c and sin s of its
    position at dim and its cache slot (rope_inputs): q heads are rotated into y [T, h * d], k heads
    rotated and v heads as they are stored in the cache slot (layer_ops.rope_and_cache's arithmetic)."""
    head_dim = 2 * half
    q_heads, kv_heads = y.shape[1] // head_dim, kv_cache.shape[3]
    if head < q_heads + kv_heads:
        lo, hi = lo * c - hi * s, hi * c + lo * s
    if head < q_heads:
        y[tok, head * head_dim + dim] = lo
        y[tok, head * head_dim + dim + half] = hi
    elif slot >= 0:  # -1: a CUDA graph's padding row
        plane = 0 if head < q_heads + kv_heads else 1              # K, then V
        kv_head = head - q_heads - plane * kv_heads
        at = (plane * kv_cache.shape[1] * kv_cache.shape[2] + slot) * (kv_heads * head_dim) + kv_head * head_dim + dim
        store_flat(kv_cache, at, lo)
        store_flat(kv_cache, at + half, hi)

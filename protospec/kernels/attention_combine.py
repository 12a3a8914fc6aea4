"""Combining split-K attention partials: out = sum_c acc_c e^(m_c - M) / sum_c l_c e^(m_c - M).

One device function serves both ways of running it: as its own kernel after the attention kernel
(a block per (token, head) row), and folded into by_kv_head's attention kernel, where the last
split block of a row group to finish combines the group's rows (one launch per attention instead of
two). Both compile with the same flags, so both ways give the same bits.
"""
from __future__ import annotations

import math

from numba import float32

from protospec.kernels import interop
from protospec.kernels.interop import cuda

OPTIONS = {} if interop.SIMULATOR else {"fastmath": True}
NO_KEY = float32(-1e30)  # below every real max; finite, because fast-math assumes no infinities


@cuda.jit(device=True, **OPTIONS)
def combine_cell(part_acc, part_max, part_sum, row, e):
    """Output element e of `row` from its splits: part_acc [rows, C, d], part_max / part_sum [rows, C] f32.
    A split that saw no key has sum 0 and is skipped; a row with no key at all gives 0."""
    top = NO_KEY
    for c in range(part_max.shape[1]):
        top = max(top, part_max[row, c])
    acc, total = float32(0.0), float32(0.0)
    for c in range(part_max.shape[1]):
        if part_sum[row, c] > float32(0.0):
            w = math.exp(part_max[row, c] - top)
            acc += part_acc[row, c, e] * w
            total += part_sum[row, c] * w
    return acc / total if total > float32(0.0) else float32(0.0)


@cuda.jit(device=True)
def arrived_last(counters, index, arrivals, flag, tid):
    """Count this block's arrival at counters[index] (every thread of the block calls; flag is a
    1-element shared int32 array): True in the block that arrives last of `arrivals`, which also
    resets the counter for the next call or graph replay. The fences publish this block's writes
    before it counts, and order the last block's reads of the others' writes after."""
    cuda.threadfence()
    cuda.syncthreads()
    if tid == 0:
        arrived = cuda.atomic.add(counters, index, 1)
        flag[0] = 1 if arrived == arrivals - 1 else 0
        if arrived == arrivals - 1:
            counters[index] = 0
    cuda.syncthreads()
    cuda.threadfence()
    return flag[0] == 1


@cuda.jit(**OPTIONS)
def attention_combine_kernel(part_acc, part_max, part_sum, out):
    """part_acc [T * h, C, d], part_max, part_sum [T * h, C] f32 -> out [T, h * d] act.
    Block = row (t * h + head), thread = e."""
    row = cuda.blockIdx.x
    head_dim = part_acc.shape[2]
    num_heads = out.shape[1] // head_dim
    t = row // num_heads
    head = row % num_heads
    for e in range(cuda.threadIdx.x, head_dim, cuda.blockDim.x):
        out[t, head * head_dim + e] = combine_cell(part_acc, part_max, part_sum, row, e)

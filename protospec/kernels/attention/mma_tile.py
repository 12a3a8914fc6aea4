"""One 16-key tile of the tensor-core attention (attention/mma.py), as device functions: the lane's
K and V words of the tile, and a row's online-softmax step over the tile's scores."""
from __future__ import annotations

import functools
import math

from numba import float32, int64

from protospec.kernels.launch.interop import cuda
from protospec.kernels.primitives.reductions import xor_exchange
from protospec.kernels.primitives.word_loads import load_flat


@functools.cache
def tile_functions(KT: int, VW: int, NO_KEY):  # noqa: N803 (Numba freezes them as constants)
    """(load_tile, softmax_row) for KT 16-dim k-tiles of S = Q K^T and VW 8-byte V words per key per
    lane; NO_KEY: the finite score of a masked key (fast-math assumes no infinities)."""

    @cuda.jit(device=True)
    def load_tile(kv64, base, k_lane, v_lane, key_stride, key0, end, t, kb, vw):
        """This lane's K and V words of the 16 keys from key0, all in one cache block whose word `base`
        holds (key0, head 0, dim 0); V zero past `end` (K's scores there are masked, V meets P = 0 and
        must be finite). Flat loads: lane and tile offsets are added once, no index is checked."""
        for n in range(2):
            for kt in range(KT):
                kb[n * KT + kt] = load_flat(kv64, base + k_lane + 8 * n * key_stride + 4 * kt)
        for k in range(4):
            for w in range(VW):
                word = load_flat(kv64, base + v_lane + (k % 2 + 8 * (k // 2)) * key_stride + w)
                vw[k * VW + w] = word if key0 + 2 * t + k % 2 + 8 * (k // 2) < end else int64(0)

    @cuda.jit(device=True)
    def softmax_row(s, half, m, pos, key0, end, scratch, tid):
        """One row's step: its 4 scores of this lane, s[2 half + i] and s[4 + 2 half + i] (keys key0 + 2t + i and
        key0 + 8 + 2t + i, half 0: row g, 1: row g + 8), masked and turned in place into probabilities
        against the row's new max over the 16 keys (the row's 4 lanes agree through 2 shuffles).
        Returns (new max, the factor that rescales what the row summed before, this lane's sum of p)."""
        top = NO_KEY
        for i in range(4):
            at = 4 * (i // 2) + 2 * half + i % 2
            key = key0 + 8 * (i // 2) + i % 2
            s[at] = s[at] if key < end and key <= pos else NO_KEY
            top = max(top, s[at])
        top = max(top, xor_exchange(top, 1, scratch, tid))
        top = max(top, xor_exchange(top, 2, scratch, tid))
        top = max(top, m)
        alpha = math.exp(m - top)
        total = float32(0.0)
        for i in range(4):
            at = 4 * (i // 2) + 2 * half + i % 2
            e = math.exp(s[at] - top)  # then selected, not branched around: a masked key (while the
            p = e if s[at] > NO_KEY else float32(0.0)  # row has seen none, top is NO_KEY too) weighs 0
            s[at] = p
            total += p
        return top, alpha, total

    return load_tile, softmax_row

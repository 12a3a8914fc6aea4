"""The phases of a decode forward (one token per sequence) as device functions, built once per model
shape from kernels/persistent_phases.py's staging, GEMV and attention:

  qkv      rotated q into q; rotated k and v into the paged cache  (RMSNorm folded in; layer 0 reads
           the embedding rows and starts the residual from them)
  attend   a = softmax(q K^T s) V over the context                  (a block per (token, head))
  o        resid += a W_o^T
  gate_up  act = silu(h W_gate^T) * (h W_up^T), h = rmsnorm(resid)  (RMSNorm folded in)
  down     resid += act W_down^T
  lm       logits = rmsnorm(resid) W_lm^T (float32)                  (RMSNorm folded in)

Each phase walks its work items over the warps it is given (gwarp of gwarps), so the same function
serves one cooperative kernel that runs them all between grid syncs (kernels/persistent_decode.py)
and one ordinary kernel per phase (kernels/phase_kernels.py), where a kernel boundary is the sync.
Activations are float32 scratch rows between phases; weights and the cache are read as int64 words.
"""
from __future__ import annotations

import math
from typing import NamedTuple

from numba import float32

from protospec.kernels import interop
from protospec.kernels.interop import cuda
from protospec.kernels.persistent_phases import DEVICE, WARP, make_phases
from protospec.kernels.word_loads import store_flat


class DecodePhases(NamedTuple):
    qkv: object
    attend: object
    o: object
    gate_up: object
    down: object
    lm: object
    items: dict          # work items per phase (warps for the GEMV phases): an ordinary launch's grid
    word_regs: int       # int64 words per lane the GEMVs hold: the kernels' `words` array
    merge: int           # float32 accumulators of the attention's merge: the kernels' `part_acc` array
    scratch: int         # the simulator's warp exchanges (1 on a GPU)


def make_decode_phases(H: int, NH: int, KVH: int, D: int, I: int, V: int, HALF: bool, THREADS: int,  # noqa: N803, C901
                       LM: int, V_KEYS: int) -> DecodePhases:
    """The phases for one model shape; HALF: float16 weights and cache (else float32); LM: LM-head rows
    per warp item (1 to 4); V_KEYS: V rows the attention loads together."""
    if not 1 <= LM <= 4:
        raise ValueError(f"LM head rows per item = {LM}: 1 to 4 (a warp's sums hold 4)")
    stage, make_gemv, attention = make_phases(NH, KVH, D, HALF, THREADS, V_KEYS)
    qkv_load, qkv_dot, qkv_words = make_gemv(2, H)          # RoPE pairs (i, i + d/2), V pairs (c, c + 1)
    o_phase, o_words = _residual_phase(stage, make_gemv, NH * D, H)      # resid += a W_o^T
    gu_load, gu_dot, gu_words = make_gemv(4, H)            # (gate, up) for two consecutive rows
    down_phase, down_words = _residual_phase(stage, make_gemv, I, H)     # resid += act W_down^T
    lm_load, lm_dot, lm_words = make_gemv(LM, H)
    HALF_D = D // 2
    QKV = (NH + 2 * KVH) * D
    KVD = KVH * D
    QK_PAIRS = (NH + KVH) * HALF_D
    V_PAIRS = KVH * HALF_D

    @cuda.jit(**DEVICE)
    def qkv(layer, ids, positions, slots, embed, resid, norm1, w_qkv, cos, sin, q, kv, eps, tokens,
            inv, xs, words, sums, scratch, tid, gwarp, gwarps):
        lane = tid % WARP
        slots_per_layer = kv.shape[2] * kv.shape[3]  # cache slots of one layer's K (or V)
        if layer == 0:  # the embedding rows feed the first norm directly; the residual starts from them
            stage(embed, ids, True, tokens, H, True, norm1, 0, eps, inv, xs, scratch, tid)
            for item in range(cuda.blockIdx.x * THREADS + tid, tokens * H, cuda.gridDim.x * THREADS):
                resid[item // H, item % H] = float32(embed[ids[item // H], item % H])
        else:
            stage(resid, ids, False, tokens, H, True, norm1, layer, eps, inv, xs, scratch, tid)
        for item in range(gwarp, QK_PAIRS + V_PAIRS, gwarps):
            rope = item < QK_PAIRS
            head, i = item // HALF_D, item % HALF_D
            r0 = head * D + i if rope else (NH + KVH) * D + 2 * (item - QK_PAIRS)
            qkv_load(w_qkv, layer, r0, HALF_D if rope else 1, 0, QKV, words, lane)
            for t in range(tokens):
                qkv_dot(words, xs, t, sums, scratch, tid)
                slot = slots[t]
                # The cache [L, 2, blocks, block_size, KVH, D] is slot-major inside a layer's K or V
                # (slot = block * block_size + offset): a flat store needs no division by block_size.
                k_at = ((layer * 2 * slots_per_layer) + slot) * KVD
                if lane == 0 and rope:
                    p = min(positions[t], cos.shape[0] - 1)  # a padding row's position may run past the table
                    lo = sums[0] * float32(cos[p, i]) - sums[1] * float32(sin[p, i])
                    hi = sums[1] * float32(cos[p, i + HALF_D]) + sums[0] * float32(sin[p, i + HALF_D])
                    if head < NH:
                        q[t, r0] = lo
                        q[t, r0 + HALF_D] = hi
                    elif slot >= 0:
                        store_flat(kv, k_at + (head - NH) * D + i, lo)
                        store_flat(kv, k_at + (head - NH) * D + i + HALF_D, hi)
                elif lane == 0 and slot >= 0:
                    c = r0 - (NH + KVH) * D  # V's (KV head, dim) pair as one offset
                    store_flat(kv, k_at + slots_per_layer * KVD + c, sums[0])
                    store_flat(kv, k_at + slots_per_layer * KVD + c + 1, sums[1])

    @cuda.jit(**DEVICE)
    def gate_up(layer, ids, resid, norm2, w_gu, act, eps, tokens, inv, xs, words, sums, scratch, tid, gwarp, gwarps):
        lane = tid % WARP
        stage(resid, ids, False, tokens, H, True, norm2, layer, eps, inv, xs, scratch, tid)
        for item in range(gwarp, I // 2, gwarps):
            r0 = 2 * item
            gu_load(w_gu, layer, r0, I, 1, 2 * I, words, lane)
            for t in range(tokens):
                gu_dot(words, xs, t, sums, scratch, tid)
                if lane == 0:
                    act[t, r0] = sums[0] / (float32(1.0) + math.exp(-sums[0])) * sums[1]
                    act[t, r0 + 1] = sums[2] / (float32(1.0) + math.exp(-sums[2])) * sums[3]

    @cuda.jit(**DEVICE)
    def lm(ids, resid, norm_f, w_lm, logits, eps, tokens, inv, xs, words, sums, scratch, tid, gwarp, gwarps):
        lane = tid % WARP
        vocab = w_lm.shape[1]
        stage(resid, ids, False, tokens, H, True, norm_f, 0, eps, inv, xs, scratch, tid)
        for item in range(gwarp, (vocab + LM - 1) // LM, gwarps):
            r0 = LM * item
            lm_load(w_lm, 0, r0, 1, 2, vocab, words, lane)
            for t in range(tokens):
                lm_dot(words, xs, t, sums, scratch, tid)
                if lane == 0:
                    for n in range(LM):
                        if r0 + n < vocab:
                            logits[t, r0 + n] = sums[n]

    items = {"qkv": QK_PAIRS + V_PAIRS, "o": H, "gate_up": I // 2, "down": H, "lm": -(-V // LM)}
    return DecodePhases(qkv, attention, o_phase, gate_up, down_phase, lm, items,
                        word_regs=max(qkv_words, o_words, gu_words, down_words, lm_words),
                        merge=(THREADS // WARP) * D, scratch=4 * THREADS if interop.SIMULATOR else 1)


def _residual_phase(stage, make_gemv, COLS: int, H: int):  # noqa: N803
    """A phase that adds src W^T (W [L, H, COLS] as words) into the residual: a warp per output row
    (one writer per element); src staged as it is (no norm). Returns (phase, its word registers)."""
    load, dot, word_regs = make_gemv(1, COLS)

    @cuda.jit(**DEVICE)
    def phase(w, layer, src, ids, tokens, resid, unused_norm, inv, xs, words, sums, scratch, tid, gwarp, gwarps):
        lane = tid % WARP
        stage(src, ids, False, tokens, COLS, False, unused_norm, layer, 0.0, inv, xs, scratch, tid)
        for item in range(gwarp, H, gwarps):
            load(w, layer, item, 1, 2, H, words, lane)
            for t in range(tokens):
                dot(words, xs, t, sums, scratch, tid)
                if lane == 0:
                    resid[t, item] += sums[0]

    return phase, word_regs

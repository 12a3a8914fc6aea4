"""The sampling kernels' statistics and probabilities in one ordinary launch: every block reads its
whole row for the row's max, its index and its softmax sum, then writes its own slice's probabilities.

Why: the two-launch form (sampling.py) splits a row over 63 blocks that each reduce a 512-entry slice,
then a second kernel reads the combined statistics. At batch 1 each launch is a chain of waits
(the launch itself, the loads, the last block's combine) far longer than its 128 KB of logits take
to read, six times a spec step. Here a row spreads over a few wide slices (WHOLE_ROW_SLICE entries a
block: 8 blocks for a 32000-entry row) and each block reads the whole row itself, from L2, where the
LM head has just written it: ~128 KB a block in 16-byte loads, several in flight a thread, instead of
a kernel boundary and a last block's combine. The redundant reads cost L2 bandwidth, not DRAM's.

The arithmetic: each thread finds its entries' first max, the block the row's (ties to the lowest
index, torch.argmax's rule); then each thread sums exp((x - M) / T) over its entries, the block
their sum. Probabilities are the two-launch form's formula p = exp(x/T - M/T) / sum; only the sum's
order and rounding differ, so they agree to a few ulps,
and ids agree unless two race scores tie to that precision. The logits are read as 16-byte words, so
rows must be 16-byte aligned (a vocabulary of a multiple of 4, contiguous): `applies` says where.
"""
from __future__ import annotations

import functools
import math

import torch
from numba import float32, int32, int64

from protospec.kernels import interop
from protospec.kernels.dependent_launch import allow_dependent_launch, wait_after_issued_loads
from protospec.kernels.interop import cuda
from protospec.kernels.sampling_advance import finish_row, loads_for_advance
from protospec.kernels.sampling_slices import THREADS, block_argmax, block_sum, slice_winner  # noqa: F401
from protospec.kernels.word_loads import load_flat_pair, unpack_f32x2

# Vocabulary entries a block writes probabilities for (a row spreads over ceil(V / this) blocks, each
# reading the whole row): few blocks a row keep the redundant reads small; enough keep the writes spread.
# The simulator: small slices so its tests span several blocks.
WHOLE_ROW_SLICE = 128 if interop.SIMULATOR else 4096
SLICE_PER_THREAD = WHOLE_ROW_SLICE // THREADS  # a slice's entries a thread (its noise, loaded early)
# 16-byte words (4 logits) a thread loads before it reduces any: the loads in flight a thread.
WORDS_IN_FLIGHT = 8


def applies(logits: torch.Tensor) -> bool:
    """Rows of 16-byte words: a contiguous float32 [R, V] with V a multiple of 4, 16-byte aligned."""
    return logits.is_contiguous() and logits.shape[1] % 4 == 0 and logits.data_ptr() % 16 == 0


def slices_for(vocab: int) -> int:
    return -(-vocab // WHOLE_ROW_SLICE)


@cuda.jit(device=True)
def whole_row_stats(words, row, vocab, t, greedy, best_value, best_index, no_flags, tid):
    """Row `row` of the logits as int64 words (words [R, V / 2]): (M, its first index, sum of exp((x -
    M) / T); 0 on greedy rows), the same in every thread of the block. A row of -inf has index 0, sum 0.
    Two passes over the row: the max first (compares only), then the exponentials, each independent of
    the others (one pass with a running max would chain every exponential to the max before it)."""
    quads = vocab // 4  # 16-byte words in the row
    lo_words = cuda.local.array(WORDS_IN_FLIGHT, int64)
    hi_words = cuda.local.array(WORDS_IN_FLIGHT, int64)
    value, index = float32(-math.inf), int64(vocab)
    for base in range(0, quads, THREADS * WORDS_IN_FLIGHT):
        for u in range(WORDS_IN_FLIGHT):  # every load first, at clamped indices: no branch between them
            q = min(base + u * THREADS + tid, quads - 1)
            lo_words[u], hi_words[u] = load_flat_pair(words, row * (vocab // 2) + 2 * q)
        for u in range(WORDS_IN_FLIGHT):
            q = base + u * THREADS + tid
            x0, x1 = unpack_f32x2(lo_words[u])
            x2, x3 = unpack_f32x2(hi_words[u])
            if q < quads:  # increasing index, strictly greater: a tie keeps the first
                if x0 > value:
                    value, index = x0, int64(4 * q)
                if x1 > value:
                    value, index = x1, int64(4 * q + 1)
                if x2 > value:
                    value, index = x2, int64(4 * q + 2)
                if x3 > value:
                    value, index = x3, int64(4 * q + 3)
    top, top_index = block_argmax(value, index, best_value, best_index, no_flags, tid)
    total = float32(0.0)
    if not greedy and top > float32(-math.inf):  # (a row of -inf: e^(-inf + inf) would be NaN)
        inv_t = float32(1.0) / t
        for base in range(0, quads, THREADS * WORDS_IN_FLIGHT):  # the row again, from L1 or L2
            for u in range(WORDS_IN_FLIGHT):
                q = min(base + u * THREADS + tid, quads - 1)
                lo_words[u], hi_words[u] = load_flat_pair(words, row * (vocab // 2) + 2 * q)
            for u in range(WORDS_IN_FLIGHT):
                x0, x1 = unpack_f32x2(lo_words[u])
                x2, x3 = unpack_f32x2(hi_words[u])
                if base + u * THREADS + tid < quads:
                    total += (math.exp((x0 - top) * inv_t) + math.exp((x1 - top) * inv_t)) + (
                        math.exp((x2 - top) * inv_t) + math.exp((x3 - top) * inv_t))
    row_total = block_sum(total, best_value, tid)
    if top_index == vocab:  # every logit -inf
        top_index = int64(0)
    return top, top_index, row_total


@functools.lru_cache(maxsize=None)
def whole_row_kernel(DEPENDENT: bool):  # noqa: N803 (Numba freezes it as a constant)
    """The kernel; DEPENDENT: a programmatic dependent of the forward that wrote the logits, which
    loads its slice's noise and the advance's inputs (written long before that forward) before its
    wait, and the logits only after it."""

    @cuda.jit
    def probs_whole_row_kernel(logits, words, temperature, is_greedy, rows_per_seq, probs_out, out_step, do_sample,
                               noise, ids_out, mirror, use_mirror, part_max, part_index, counters, advance, num_queries,
                               block_size, input_ids, positions, seq_lens, slot_mapping, block_tables, error_row):
        """
        logits [R, V] f32 and words, the same memory as [R, V / 2] int64; the rest as
        sampling.probs_and_sample_kernel's, part_max / part_index [R, S] the slices' race winners
        (S = slices_for(V)).
        """
        slices = part_max.shape[1]
        row, piece = cuda.blockIdx.x // slices, cuda.blockIdx.x % slices
        tid = cuda.threadIdx.x
        vocab = logits.shape[1]
        seq = row // rows_per_seq
        greedy, t = is_greedy[seq], temperature[seq]
        lo, hi = piece * WHOLE_ROW_SLICE, min((piece + 1) * WHOLE_ROW_SLICE, vocab)
        ns = cuda.local.array(SLICE_PER_THREAD, float32)
        for j in range(SLICE_PER_THREAD):
            v = lo + tid + j * THREADS
            ns[j] = noise[row, out_step, v] if v < hi and do_sample and not greedy else float32(1.0)
        loaded = loads_for_advance(advance, row, num_queries, block_size, seq_lens, block_tables)
        if DEPENDENT:
            wait_after_issued_loads(slices)  # kept below the loads above in the machine code
            allow_dependent_launch()
        best_value = cuda.shared.array(THREADS, float32)
        best_index = cuda.shared.array(THREADS, int64)
        no_flags = cuda.shared.array(THREADS, int64)  # the argmax's OR slots (it writes them), unused here
        last = cuda.shared.array(1, int32)
        top, chosen, total = whole_row_stats(words, row, vocab, t, greedy, best_value, best_index, no_flags, tid)
        shift = top / t
        value, index = float32(-1.0), int64(vocab)
        for j in range(SLICE_PER_THREAD):
            v = lo + tid + j * THREADS
            if v < hi:
                if greedy:
                    p = float32(1.0) if v == chosen else float32(0.0)
                else:
                    p = math.exp(logits[row, v] / t - shift) / total
                probs_out[row, out_step, v] = p
                if do_sample and not greedy:
                    score = p / ns[j]
                    if score > value:
                        value, index = score, v
        if do_sample and slice_winner(row, piece, value, index, part_max, part_index, counters, best_value,
                                      best_index, no_flags, last, tid):
            finish_row(row, vocab, greedy, chosen, part_max, part_index, ids_out, out_step, mirror, use_mirror,
                       best_value, best_index, no_flags, tid, advance, loaded, block_size, input_ids, positions,
                       seq_lens, slot_mapping, error_row)

    return probs_whole_row_kernel

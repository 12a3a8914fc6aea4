"""The arithmetic of the sampling kernels over vocabulary slices, as device functions (sampling/softmax_sample.py: two
kernels, the row's statistics then its probabilities; sampling/verify_rejection.py and sampling/gumbel_sample.py reuse
them, so every form gives the same bits). Every thread of the block calls each function; shared arrays are [THREADS] scratch.
"""
from __future__ import annotations

import math

from numba import float32, int64

from protospec.kernels.launch import interop
from protospec.kernels.primitives.arrivals import arrived_last
from protospec.kernels.launch.interop import cuda
from protospec.kernels.primitives.reductions import better, block_argmax_or, block_sum_tree_order

# Threads per block (a power of two, for the tree reductions) and vocabulary entries per block: on a
# GPU 2 entries a thread, so a 32000-entry row spreads over 63 blocks (at 8 a thread its 16 blocks
# left most SMs idle); a block combines its row's slices (their statistics, the last block their
# winners) with all its threads. The simulator runs a Python thread per CUDA thread: a narrow block,
# and small slices so its tests span several blocks.
THREADS = 32 if interop.SIMULATOR else 256
VOCAB_PER_BLOCK = 128 if interop.SIMULATOR else 512
PER_THREAD = VOCAB_PER_BLOCK // THREADS  # a slice's entries a thread (the prefetched form's local arrays)


@cuda.jit(device=True)
def block_argmax(value, index, best_value, best_index, no_flags, tid):
    """The block's best (value, index) over its threads' (ties to the lower index), in every thread; the
    trailing barrier lets the caller reuse the scratch at once."""
    value, index, _ = block_argmax_or(value, index, int64(0), best_value, best_index, no_flags, tid, THREADS)
    cuda.syncthreads()
    return value, index


@cuda.jit(device=True)
def block_sum(value, scratch, tid):
    """The sum of the block's threads' values, in every thread (tree_sum's bits, fewer barriers); the
    trailing barrier lets the caller reuse the scratch at once."""
    total = block_sum_tree_order(value, scratch, tid, THREADS)
    cuda.syncthreads()
    return total


@cuda.jit(device=True)
def slice_stats(logits, row, piece, t, greedy, part_max, part_index, part_sum, best_value, best_index, no_flags,
                tid):
    """Slice `piece` of `row`: its max logit, that max's first index and its sum of exp(x/T - max/T)
    (0 on greedy rows) into part_max / part_index / part_sum [R, S] at [row, piece]."""
    vocab = logits.shape[1]
    lo, hi = piece * VOCAB_PER_BLOCK, min((piece + 1) * VOCAB_PER_BLOCK, vocab)
    cuda.syncthreads()  # the scratch may still be read from the block's previous slice
    value, index = float32(-math.inf), int64(vocab)
    for v in range(lo + tid, hi, THREADS):
        x = logits[row, v]
        if x > value:
            value, index = x, v
    top, top_index = block_argmax(value, index, best_value, best_index, no_flags, tid)
    total = float32(0.0)
    if not greedy and top > float32(-math.inf):  # a slice of -inf logits (masked) adds nothing
        for v in range(lo + tid, hi, THREADS):
            total += math.exp(logits[row, v] / t - top / t)
    total = block_sum(total, best_value, tid)
    if tid == 0:
        part_max[row, piece], part_index[row, piece], part_sum[row, piece] = top, top_index, total


@cuda.jit(device=True)
def combine_stats(row, vocab, t, part_max, part_index, part_sum, best_value, best_index, no_flags, tid):
    """The row's (max M, its index, sum over slices of sum_s * e^(m_s/T - M/T)) from its slices'
    partials, the same in every thread; index 0 when every logit is -inf (torch.argmax's answer)."""
    slices = part_max.shape[1]
    cuda.syncthreads()
    value, index = float32(-math.inf), int64(vocab)
    for s in range(tid, slices, THREADS):
        if better(part_max[row, s], part_index[row, s], value, index):
            value, index = part_max[row, s], part_index[row, s]
    value, index = block_argmax(value, index, best_value, best_index, no_flags, tid)
    total = float32(0.0)
    for s in range(tid, slices, THREADS):
        if part_sum[row, s] > float32(0.0):  # skips all -inf slices, whose e^(max - M) is NaN
            total += part_sum[row, s] * math.exp(part_max[row, s] / t - value / t)
    total = block_sum(total, best_value, tid)
    if index == vocab:  # no slice found a max
        index = int64(0)
    return value, index, total


@cuda.jit(device=True)
def slice_winner(row, piece, value, index, win_value, win_index, counters, best_value, best_index, no_flags, last,
                 tid):
    """The block's best (value, index) over its threads' as the slice's winner in win_value / win_index
    [R, S], counted at counters[row]; True in the row's last block to arrive."""
    value, index = block_argmax(value, index, best_value, best_index, no_flags, tid)
    if tid == 0:
        win_value[row, piece], win_index[row, piece] = value, index
    return arrived_last(counters, row, win_value.shape[1], last, tid)


@cuda.jit(device=True)
def slice_probs(logits, row, piece, t, greedy, row_max, chosen, total, probs_out, out_step, do_sample, noise,
                win_value, win_index, counters, best_value, best_index, no_flags, last, tid):
    """Slice `piece` of `row`: p = exp(x/T - M/T) / sum (greedy: one-hot at `chosen`, the row's max
    index) into probs_out[row, out_step]; with do_sample, the slice's winner of p / noise into
    win_value / win_index [R, S], counted at counters[row]. Returns (this block arrived last for the
    row, the winner so far): the last one then calls combine_winners."""
    vocab = logits.shape[1]
    lo, hi = piece * VOCAB_PER_BLOCK, min((piece + 1) * VOCAB_PER_BLOCK, vocab)
    shift = row_max / t
    cuda.syncthreads()
    value, index = float32(-1.0), int64(vocab)
    for v in range(lo + tid, hi, THREADS):
        if greedy:
            p = float32(1.0) if v == chosen else float32(0.0)
        else:
            p = math.exp(logits[row, v] / t - shift) / total
        probs_out[row, out_step, v] = p
        if do_sample and not greedy:
            score = p / noise[row, out_step, v]
            if score > value:
                value, index = score, v
    if not do_sample:
        return False
    return slice_winner(row, piece, value, index, win_value, win_index, counters, best_value, best_index, no_flags,
                        last, tid)


@cuda.jit(device=True)
def prefetch_slice(logits, row, piece, greedy, do_sample, noise, out_step, xs, ns, tid):
    """This thread's logits and noise of slice `piece` of `row` (entry lo + tid + j THREADS at xs[j],
    ns[j], [PER_THREAD] f32), read before a dependent's wait where no running kernel writes them;
    what slice_probs would read, and nothing it would not (no logits on a greedy row, no noise without
    sampling)."""
    lo, hi = piece * VOCAB_PER_BLOCK, min((piece + 1) * VOCAB_PER_BLOCK, logits.shape[1])
    for j in range(PER_THREAD):
        v = lo + tid + j * THREADS
        xs[j] = logits[row, v] if v < hi and not greedy else float32(0.0)
        ns[j] = noise[row, out_step, v] if v < hi and do_sample and not greedy else float32(1.0)


@cuda.jit(device=True)
def slice_probs_prefetched(row, piece, vocab, t, greedy, row_max, chosen, total, probs_out, out_step, do_sample,
                           xs, ns, win_value, win_index, counters, best_value, best_index, no_flags, last, tid):
    """slice_probs over prefetch_slice's xs, ns: the same arithmetic and order, so the same bits."""
    lo, hi = piece * VOCAB_PER_BLOCK, min((piece + 1) * VOCAB_PER_BLOCK, vocab)
    shift = row_max / t
    cuda.syncthreads()
    value, index = float32(-1.0), int64(vocab)
    for j in range(PER_THREAD):
        v = lo + tid + j * THREADS
        if v < hi:
            p = (float32(1.0) if v == chosen else float32(0.0)) if greedy else math.exp(xs[j] / t - shift) / total
            probs_out[row, out_step, v] = p
            if do_sample and not greedy:
                score = p / ns[j]
                if score > value:
                    value, index = score, v
    if not do_sample:
        return False
    return slice_winner(row, piece, value, index, win_value, win_index, counters, best_value, best_index, no_flags,
                        last, tid)


@cuda.jit(device=True)
def combine_winners(row, vocab, greedy, chosen, win_value, win_index, best_value, best_index, no_flags, tid):
    """The row's sample: the best of its slices' winners (greedy rows: `chosen`). Any score beats the
    start, -inf: the race's are >= 0, sampling/gumbel_sample.py's any float."""
    if greedy:
        return chosen
    slices = win_value.shape[1]
    cuda.syncthreads()
    value, index = float32(-math.inf), int64(vocab)
    for s in range(tid, slices, THREADS):
        if better(win_value[row, s], win_index[row, s], value, index):
            value, index = win_value[row, s], win_index[row, s]
    return block_argmax(value, index, best_value, best_index, no_flags, tid)[1]


@cuda.jit(device=True)
def write_sample(row, vocab, greedy, chosen, win_value, win_index, ids_out, out_step, mirror, use_mirror, best_value,
                 best_index, no_flags, tid):
    """The row's sample (combine_winners) into ids_out[row, out_step], and into mirror[row * use_mirror]
    where use_mirror (the mirror's stride) > 0; returned (in every thread)."""
    chosen = combine_winners(row, vocab, greedy, chosen, win_value, win_index, best_value, best_index, no_flags, tid)
    if tid == 0:
        ids_out[row, out_step] = chosen
        if use_mirror > 0:
            mirror[row * use_mirror] = chosen
    return chosen

"""The arithmetic of the sampling kernels over vocabulary slices, as device functions (sampling/softmax_sample.py: two
kernels, the row's statistics then its probabilities; sampling/gumbel_sample.py reuses them, so every
form gives the same bits). Every thread of the block calls each function; shared arrays are [THREADS] scratch.

A slice (VOCAB_PER_BLOCK entries) is the unit of the arithmetic: each slice's max and softmax sum are
reduced by the same tree whatever the launch, so the probabilities' bits do not depend on the batch.
A block takes a *span* of consecutive slices of one row (span_for): one slice a block at batch 1,
where the grid is small and each block's latency is the cost; up to MAX_SPAN at batch, where a block
a slice made tens of thousands of blocks that each paid the row's combine and a block reduction
for two entries a thread. The statistics kernel (sampling/stats.py) instead takes a warp a slice, its
lanes playing this block's threads, with the same bits.
"""
from __future__ import annotations

import math

from numba import float32, int64

from protospec.kernels.launch import interop
from protospec.kernels.primitives.arrivals import arrived_last
from protospec.kernels.launch.interop import cuda
from protospec.kernels.primitives.reductions import better, block_argmax_or, block_sum_tree_order

# Threads per block (a power of two, for the tree reductions) and vocabulary entries per slice: on a
# GPU 2 entries a thread, so a 32000-entry row spreads over 63 slices (at 8 a thread its 16 blocks
# left most SMs idle at batch 1); a block combines its row's slices (their statistics, the last block
# their winners) with all its threads. The simulator runs a Python thread per CUDA thread: a narrow
# block, and small slices so its tests span several blocks.
THREADS = 32 if interop.SIMULATOR else 256
VOCAB_PER_BLOCK = 128 if interop.SIMULATOR else 512
PER_THREAD = VOCAB_PER_BLOCK // THREADS  # a slice's entries a thread (the prefetched forms' local arrays)
MAX_SPAN = 8           # slices a block at most: 16 entries a thread in each of up to three local arrays
RESIDENT_BLOCKS = 8    # blocks of THREADS an SM holds at once (2048 threads)


def span_for(rows: int, vocab: int, sm_count: int) -> int:
    """Slices a block for `rows` rows of `vocab` entries on a GPU of `sm_count` SMs: doubled (up to
    MAX_SPAN) while the grid fills the resident blocks at least once (so at least half of them after
    the last doubling), so a small grid keeps a block a slice (its latency is the cost) and a large one
    stops paying a row combine and a block reduction per slice. (Doubling only while the grid filled
    them twice left batch 64's draft sampler at span 2, a fifth slower than at 4: NOTES.md.)"""
    slices = -(-vocab // VOCAB_PER_BLOCK)
    resident = RESIDENT_BLOCKS * sm_count
    span = 1
    while span < MAX_SPAN and rows * slices >= span * resident:
        span *= 2
    return span


def span_groups(vocab: int, span: int) -> int:
    """Blocks a row takes at `span` slices a block."""
    slices = -(-vocab // VOCAB_PER_BLOCK)
    return -(-slices // span)


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
def span_winner(row, group, value, index, win_value, win_index, counters, best_value, best_index, no_flags, last, tid):
    """The block's best (value, index) over its threads' as its span's winner in win_value / win_index
    [R, G] at [row, group], counted at counters[row]; True in the row's last block to arrive."""
    value, index = block_argmax(value, index, best_value, best_index, no_flags, tid)
    if tid == 0:
        win_value[row, group], win_index[row, group] = value, index
    return arrived_last(counters, row, win_value.shape[1], last, tid)


@cuda.jit(device=True)
def prefetch_span(logits, row, group, span, greedy, do_sample, noise, out_step, xs, ns, tid):
    """This thread's logits and noise of slices group * span .. of `row` (entry lo + tid + j THREADS at
    xs[j], ns[j], [span * PER_THREAD] f32), all loads first (before a dependent's wait, where no running
    kernel writes them); nothing span_probs does not use (no logits on a greedy row, no noise without
    sampling)."""
    vocab = logits.shape[1]
    lo = group * span * VOCAB_PER_BLOCK
    hi = min(lo + span * VOCAB_PER_BLOCK, vocab)
    for j in range(span * PER_THREAD):
        v = lo + tid + j * THREADS
        xs[j] = logits[row, v] if v < hi and not greedy else float32(0.0)
        ns[j] = noise[row, out_step, v] if v < hi and do_sample and not greedy else float32(1.0)


@cuda.jit(device=True)
def span_probs(row, group, span, vocab, t, greedy, row_max, chosen, total, probs_out, out_step, do_sample, xs, ns,
               win_value, win_index, counters, best_value, best_index, no_flags, last, tid):
    """Slices group * span .. of `row` from prefetch_span's xs, ns: p = exp(x/T - M/T) / sum (greedy:
    one-hot at `chosen`, the row's max index) into probs_out[row, out_step]; with do_sample, the span's
    winner of p / noise into win_value / win_index [R, G], counted at counters[row]. Returns whether
    this block arrived last for the row: that one then calls combine_winners."""
    lo = group * span * VOCAB_PER_BLOCK
    hi = min(lo + span * VOCAB_PER_BLOCK, vocab)
    shift = row_max / t
    cuda.syncthreads()
    value, index = float32(-1.0), int64(vocab)
    for j in range(span * PER_THREAD):
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
    return span_winner(row, group, value, index, win_value, win_index, counters, best_value, best_index, no_flags,
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

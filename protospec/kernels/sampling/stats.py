"""The sampling kernels' first launch: each vocabulary slice's softmax statistics of a row of logits.

Slice s of row r (slices.VOCAB_PER_BLOCK entries): its max logit, that max's first index and its sum of
exp(x/T - max/T). A block takes `span` consecutive slices of a row (slices.span_for), loads all their
entries first, then reduces slice by slice with the same tree, so the partials' bits do not depend on
the span. Every block of its successor combines its row's slices itself (slices.combine_stats): the
probabilities kernel (sampling/softmax_sample.py), or the verify's probabilities fused with the
rejection sampler (sampling/verify_rejection.py).
"""
from __future__ import annotations

import functools

from numba import float32, int64

from protospec.kernels.launch import interop
from protospec.kernels.launch.dependent_launch import allow_dependent_launch, grid_dependency_wait
from protospec.kernels.launch.interop import cuda
from protospec.kernels.primitives.divisions import block_row_and_part, divide32
from protospec.kernels.sampling.buffers import scratch
from protospec.kernels.sampling.slices import PER_THREAD, THREADS, load_span, slice_stats, span_for, span_groups


@functools.lru_cache(maxsize=None)
def stats_kernel(DEPENDENT: bool, SPAN: int = 1):  # noqa: N803 (Numba freezes them as constants)
    """DEPENDENT: launched as a programmatic dependent of the forward that wrote the logits. SPAN:
    slices a block."""
    ENTRIES = SPAN * PER_THREAD  # noqa: N806 (a local array's size: a constant)

    @cuda.jit
    def row_stats_kernel(logits, temperature, is_greedy, rows_per_seq, part_max, part_index, part_sum):
        """
        logits [R, V] f32; temperature [B] f32 (1.0 on greedy rows); is_greedy [B] bool; row r belongs to
        sequence r // rows_per_seq. Out: part_max, part_sum [R, S] f32, part_index [R, S] int64: each
        slice's max, its index, its sum of exp(x/T - max/T). Grid: R x ceil(S / SPAN) blocks.
        """
        if DEPENDENT:
            grid_dependency_wait()
            allow_dependent_launch()
        slices = part_max.shape[1]
        groups = (slices + SPAN - 1) // SPAN
        row, group = block_row_and_part(groups)
        tid = cuda.threadIdx.x
        seq, _ = divide32(row, rows_per_seq)
        best_value = cuda.shared.array(THREADS, float32)
        best_index = cuda.shared.array(THREADS, int64)
        no_flags = cuda.shared.array(THREADS, int64)  # the argmax's OR slots (it writes them), unused here
        xs = cuda.local.array(ENTRIES, float32)
        load_span(logits, row, group * SPAN, SPAN, xs, tid)
        t = temperature[seq]
        greedy = is_greedy[seq]
        for s in range(SPAN):
            if group * SPAN + s < slices:  # the same for the whole block (its barriers)
                slice_stats(xs, s, logits.shape[1], row, group * SPAN + s, t, greedy, part_max, part_index, part_sum,
                            best_value, best_index, no_flags, tid)

    return row_stats_kernel


def launch_stats(logits, st, rows_per_seq: int, space: str, dependent: bool, span: int | None = None) -> tuple:
    """The statistics kernel over logits [R, V] into the scratch named "stats" + space: its partials
    (part_max, part_index, part_sum) [R, S]. span: slices a block (None: slices.span_for)."""
    rows, vocab = logits.shape
    slices = span_groups(vocab, 1)
    span = span or span_for(rows, vocab, interop.sm_count(logits.device))
    part_max, part_index, part_sum = scratch(rows, slices, logits.device, "stats" + space)
    interop.launch_tensors(stats_kernel(bool(dependent), span), rows * -(-slices // span), THREADS,
                           [logits, st.temperature, st.is_greedy, int(rows_per_seq), part_max, part_index, part_sum],
                           dependent=dependent)
    return part_max, part_index, part_sum


def slice_statistics(logits, st, rows_per_seq: int, dependent: bool = False, span: int | None = None) -> tuple:
    """Each slice's (max, its index, sum of exp(x/T - max/T)) of logits [R, V]'s rows, [R, S] f32 / int64
    / f32, for a kernel that combines them itself (slices.combine_stats at T): one launch of
    the statistics kernel (dependent: as a programmatic dependent, where the step's kernels launch so)."""
    return launch_stats(logits, st, rows_per_seq, "", dependent, span)

"""The sampling kernels' first launch: each vocabulary slice's softmax statistics of a row of logits.

Block (r, s) takes slice s of row r (slices.VOCAB_PER_BLOCK entries): its max logit, that
max's first index and its sum of exp(x/T - max/T). Every block of its successor combines its row's
slices itself (slices.combine_stats): the probabilities kernel (sampling/softmax_sample.py), or the
verify's probabilities fused with the rejection sampler (sampling/verify_rejection.py).
"""
from __future__ import annotations

import functools

from numba import float32, int64

from protospec.kernels.launch import interop
from protospec.kernels.launch.dependent_launch import allow_dependent_launch, grid_dependency_wait
from protospec.kernels.launch.interop import cuda
from protospec.kernels.sampling.buffers import scratch
from protospec.kernels.sampling.slices import THREADS, VOCAB_PER_BLOCK, slice_stats


@functools.lru_cache(maxsize=None)
def stats_kernel(DEPENDENT: bool):  # noqa: N803 (Numba freezes it as a constant)
    """DEPENDENT: launched as a programmatic dependent of the forward that wrote the logits."""

    @cuda.jit
    def row_stats_kernel(logits, temperature, is_greedy, rows_per_seq, part_max, part_index, part_sum):
        """
        logits [R, V] f32; temperature [B] f32 (1.0 on greedy rows); is_greedy [B] bool; row r belongs to
        sequence r // rows_per_seq. Out: part_max, part_sum [R, S] f32, part_index [R, S] int64: each
        slice's max, its index, its sum of exp(x/T - max/T).
        """
        if DEPENDENT:
            grid_dependency_wait()
            allow_dependent_launch()
        slices = part_max.shape[1]
        row, piece = cuda.blockIdx.x // slices, cuda.blockIdx.x % slices
        tid = cuda.threadIdx.x
        seq = row // rows_per_seq
        best_value = cuda.shared.array(THREADS, float32)
        best_index = cuda.shared.array(THREADS, int64)
        no_flags = cuda.shared.array(THREADS, int64)  # the argmax's OR slots (it writes them), unused here
        t = temperature[seq]
        slice_stats(logits, row, piece, t, is_greedy[seq], part_max, part_index, part_sum, best_value, best_index,
                    no_flags, tid)

    return row_stats_kernel


def launch_stats(kernel, logits, st, rows_per_seq: int, slices: int, space: str, dependent: bool) -> tuple:
    """stats_kernel's launch over logits [R, V] into the scratch named "stats" + space: its partials
    (part_max, part_index, part_sum) [R, S]."""
    part_max, part_index, part_sum = scratch(logits.shape[0], slices, logits.device, "stats" + space)
    interop.launch_tensors(kernel, logits.shape[0] * slices, THREADS,
                           [logits, st.temperature, st.is_greedy, int(rows_per_seq), part_max, part_index, part_sum],
                           dependent=dependent)
    return part_max, part_index, part_sum


def slice_statistics(logits, st, rows_per_seq: int, dependent: bool = False) -> tuple:
    """Each slice's (max, its index, sum of exp(x/T - max/T)) of logits [R, V]'s rows, [R, S] f32 / int64
    / f32, for a kernel that combines them itself (slices.combine_stats at T): one launch of
    the statistics kernel (dependent: as a programmatic dependent, where the step's kernels launch so)."""
    slices = -(-logits.shape[1] // VOCAB_PER_BLOCK)
    return launch_stats(stats_kernel(dependent), logits, st, rows_per_seq, slices, "", dependent)

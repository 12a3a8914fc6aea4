"""The sampling kernels' first launch: each vocabulary slice's softmax statistics of a row of logits.

Block (r, s) takes slice s of row r (sampling_slices.VOCAB_PER_BLOCK entries): its max logit, that
max's first index and its sum of exp(x/T - max/T). Its successor combines the slices: the
probabilities kernel (sampling.py), or the verify's probabilities fused with the rejection sampler
(verify_rejection.py); with the "last_block" combine the row's last block to finish does it here.
"""
from __future__ import annotations

import functools

from numba import float32, int32, int64

from protospec.kernels import dependent_launch, interop, logit_stats
from protospec.kernels.attention_combine import arrived_last
from protospec.kernels.dependent_launch import allow_dependent_launch, grid_dependency_wait
from protospec.kernels.interop import cuda
from protospec.kernels.paged_attention import arrival_counters
from protospec.kernels.sampling_buffers import scratch
from protospec.kernels.sampling_slices import THREADS, VOCAB_PER_BLOCK, combine_stats, slice_stats


@functools.lru_cache(maxsize=None)
def stats_kernel(DEPENDENT: bool, EVERY_BLOCK: bool):  # noqa: N803 (Numba freezes them as constants)
    """DEPENDENT: launched as a programmatic dependent of the forward that wrote the logits; EVERY_BLOCK:
    the partials only (each block of the successor combines them), else the row's last block combines."""

    @cuda.jit
    def row_stats_kernel(logits, temperature, is_greedy, rows_per_seq, part_max, part_index, part_sum, row_max,
                         row_index, row_sum, counters):
        """
        logits [R, V] f32; temperature [B] f32 (1.0 on greedy rows); is_greedy [B] bool; row r belongs to
        sequence r // rows_per_seq. part_max, part_sum [R, S] f32, part_index [R, S] int64: each slice's
        max, its index, its sum of exp(x/T - max/T). Out: row_max, row_sum [R] f32, row_index [R] int64.
        counters [>= R] int32, zero between calls.
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
        last = cuda.shared.array(1, int32)
        t = temperature[seq]
        slice_stats(logits, row, piece, t, is_greedy[seq], part_max, part_index, part_sum, best_value, best_index,
                    no_flags, tid)
        if not EVERY_BLOCK and arrived_last(counters, row, slices, last, tid):  # the row's last block combines
            value, index, total = combine_stats(row, logits.shape[1], t, part_max, part_index, part_sum, best_value,
                                                best_index, no_flags, tid)
            if tid == 0:
                row_max[row], row_index[row], row_sum[row] = value, index, total

    return row_stats_kernel


def launch_stats(kernel, logits, st, rows_per_seq: int, slices: int, space: str, counters, dependent: bool) -> tuple:
    """stats_kernel's launch over logits [R, V] into the scratch named "stats" + space: its partials
    (part_max, part_index, part_sum) [R, S]."""
    part_max, part_index, part_sum, row_max, row_index, row_sum = scratch(logits.shape[0], slices, logits.device,
                                                                          "stats" + space)
    interop.launch_tensors(kernel, logits.shape[0] * slices, THREADS,
                           [logits, st.temperature, st.is_greedy, int(rows_per_seq), part_max, part_index, part_sum,
                            row_max, row_index, row_sum, counters], dependent=dependent)
    return part_max, part_index, part_sum


def slice_statistics(logits, st, rows_per_seq: int, dependent: bool = False) -> tuple:
    """Each slice's (max, its index, sum of exp(x/T - max/T)) of logits [R, V]'s rows, [R, S] f32 / int64
    / f32, for a kernel that combines them itself (sampling_slices.combine_stats at T), and whether a
    kernel was launched for them: the LM head's tiles' (16 rows a slice, T = 1) where it wrote them,
    else one launch of the statistics kernel (dependent: as a programmatic dependent, where the
    step's kernels launch so)."""
    tiles = logit_stats.attached(logits) if st.unit_temperature else None
    if tiles is not None:
        return tiles.tile_max, tiles.tile_index, tiles.tile_sum, False
    dependent = bool(dependent) and dependent_launch.STEP_KERNELS
    slices = -(-logits.shape[1] // VOCAB_PER_BLOCK)
    stats = launch_stats(stats_kernel(dependent, True), logits, st, rows_per_seq, slices, "",
                         arrival_counters(logits.device, logits.shape[0], "sampling"), dependent)
    return (*stats, True)

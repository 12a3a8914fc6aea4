"""The sampling kernels' first launch: each vocabulary slice's softmax statistics of a row of logits.

Slice s of row r (slices.VOCAB_PER_BLOCK entries): its max logit, that max's first index and its sum of
exp(x/T - max/T). Every block of its successor, the probabilities kernel (sampling/softmax_sample.py),
combines its row's slices itself (slices.combine_stats). Where no probabilities are written at all
(a spec step graph's rejection kernel reads p from the logits where it needs them), the row's last
block to finish combines them once instead (`finish`): the row's (max, its index, sum), the same bits.

A warp takes a slice, SLICE_WARPS slices a block, with no barrier: lane l plays threads l, l + 32, ...
of a slices.THREADS-thread block summing the slice by tree_sum's tree (each thread's entries in
ascending order), the tree's levels above a warp added in registers and the levels inside it as the
same pairs by xor shuffles; so the sums have that block's bits whatever the block size (a + b == b + a
bit for bit: every lane of the butterfly ends with them), and the argmax is order-free.
"""
from __future__ import annotations

import functools
import math

import torch
from numba import float32, int32, int64

from protospec.kernels.launch import interop
from protospec.kernels.launch.dependent_launch import allow_dependent_launch, grid_dependency_wait
from protospec.kernels.launch.interop import cuda, placeholder
from protospec.kernels.primitives.arrivals import arrival_counters, arrived_last
from protospec.kernels.primitives.divisions import block_row_and_part, divide32
from protospec.kernels.primitives.reductions import WARP, better, xor_exchange
from protospec.kernels.sampling.buffers import scratch
from protospec.kernels.sampling.slices import PER_THREAD, THREADS, VOCAB_PER_BLOCK, combine_stats, span_groups

VIRTUAL = THREADS // WARP     # the block's threads a lane plays (1 in the simulator, whose block is a warp)
ENTRIES = VIRTUAL * PER_THREAD  # a lane's entries of its slice
SLICE_WARPS = 1 if interop.SIMULATOR else 8  # slices a block (the simulator's blocks are one warp)
LEVELS = VIRTUAL.bit_length() - 1  # the block tree's levels above a warp: strides THREADS / 2 .. WARP
LANE_LEVELS = WARP.bit_length() - 1  # its levels inside a warp: strides 16 .. 1, as xor shuffles
SHUFFLES = WARP * SLICE_WARPS if interop.SIMULATOR else 1  # the simulator's exchanges go through shared memory


@functools.lru_cache(maxsize=None)
def stats_kernel(DEPENDENT: bool, FINISH: bool):  # noqa: N803 (Numba freezes them as constants)
    """DEPENDENT: launched as a programmatic dependent of the forward that wrote the logits. FINISH: the
    row's last block combines the partials into row_stats / row_index."""
    COMBINE = THREADS if FINISH else 1  # noqa: N806 (the combine's shared scratch: a constant size)

    @cuda.jit
    def row_stats_kernel(logits, temperature, is_greedy, rows_per_seq, part_max, part_index, part_sum, row_stats,
                         row_index, counters):
        """
        logits [R, V] f32; temperature [B] f32 (1.0 on greedy rows); is_greedy [B] bool; row r belongs to
        sequence r // rows_per_seq. Out: part_max, part_sum [R, S] f32, part_index [R, S] int64: each
        slice's max, its index, its sum of exp(x/T - max/T). Grid: R x ceil(S / SLICE_WARPS) blocks of
        SLICE_WARPS warps; warp w of block (r, g) takes slice g * SLICE_WARPS + w. FINISH: also
        row_stats [R, 2] f32 (max, sum) and row_index [R] int64 (slices.combine_stats'), counted at
        counters [>= R] int32 (zero between calls); else those three are placeholders.
        """
        if DEPENDENT:
            grid_dependency_wait()
            allow_dependent_launch()
        slices = part_max.shape[1]
        vocab = logits.shape[1]
        row, group = block_row_and_part((slices + SLICE_WARPS - 1) // SLICE_WARPS)
        tid = cuda.threadIdx.x
        lane = tid % WARP
        piece = group * SLICE_WARPS + tid // WARP   # past the row in a last block's spare warps
        lo = min(piece, slices - 1) * VOCAB_PER_BLOCK
        hi = min(lo + VOCAB_PER_BLOCK, vocab)
        value_scratch = cuda.shared.array(SHUFFLES, float32)  # the simulator's exchanges
        index_scratch = cuda.shared.array(SHUFFLES, int64)
        xs = cuda.local.array(ENTRIES, float32)   # [PER_THREAD, VIRTUAL]: entry lo + lane + 32 m + THREADS jj
        sums = cuda.local.array(VIRTUAL, float32)  # [VIRTUAL] the played threads' sums, then the tree's
        for jj in range(PER_THREAD):  # every load first
            for m in range(VIRTUAL):
                v = lo + lane + WARP * m + THREADS * jj
                xs[jj * VIRTUAL + m] = logits[row, v] if v < hi else float32(-math.inf)
        seq, _ = divide32(row, rows_per_seq)
        t = temperature[seq]
        greedy = is_greedy[seq]
        # The max and its first index: entries in ascending order (a strict > keeps the first), then
        # the lanes' winners by `better` (ties to the lower index); an all -inf slice keeps index V.
        value, index = float32(-math.inf), int64(vocab)
        for jj in range(PER_THREAD):
            for m in range(VIRTUAL):
                v = lo + lane + WARP * m + THREADS * jj
                if v < hi and xs[jj * VIRTUAL + m] > value:
                    value, index = xs[jj * VIRTUAL + m], v
        for level in range(LANE_LEVELS):
            mask = WARP >> (level + 1)
            other_value = xor_exchange(value, mask, value_scratch, tid)
            other_index = xor_exchange(index, mask, index_scratch, tid)
            if better(other_value, other_index, value, index):
                value, index = other_value, other_index
        # Each played thread's sum over its entries in ascending order.
        for m in range(VIRTUAL):
            sums[m] = float32(0.0)
        if not greedy and value > float32(-math.inf):  # a slice of -inf logits (masked) adds nothing
            for m in range(VIRTUAL):
                for jj in range(PER_THREAD):
                    if lo + lane + WARP * m + THREADS * jj < hi:
                        sums[m] += math.exp(xs[jj * VIRTUAL + m] / t - value / t)
        for level in range(LEVELS):  # the tree's strides above a warp: thread m adds thread m + width
            width = VIRTUAL >> (level + 1)
            for m in range(width):
                sums[m] += sums[m + width]
        total = sums[0]
        for level in range(LANE_LEVELS):  # strides 16 .. 1 inside the warp: the tree's pairs
            total += xor_exchange(total, WARP >> (level + 1), value_scratch, tid)
        if lane == 0 and piece < slices:
            part_max[row, piece], part_index[row, piece], part_sum[row, piece] = value, index, total
        best_value = cuda.shared.array(COMBINE, float32)  # the finish's combine
        best_index = cuda.shared.array(COMBINE, int64)
        no_flags = cuda.shared.array(COMBINE, int64)
        last = cuda.shared.array(1, int32)
        if FINISH and arrived_last(counters, row, (slices + SLICE_WARPS - 1) // SLICE_WARPS, last, tid):
            top, chosen, total = combine_stats(row, vocab, t, part_max, part_index, part_sum, best_value, best_index,
                                               no_flags, tid)
            if tid == 0:
                row_stats[row, 0], row_stats[row, 1], row_index[row] = top, total, chosen

    return row_stats_kernel


def launch_stats(logits, st, rows_per_seq: int, space: str, dependent: bool, finish: bool = False) -> tuple:
    """The statistics kernel over logits [R, V] into the scratch named "stats" + space: its partials
    (part_max, part_index, part_sum) [R, S]; finish: the rows' (row_stats [R, 2] f32: max and sum,
    row_index [R] int64) instead, new tensors (a captured graph keeps its own)."""
    rows, vocab = logits.shape
    slices = span_groups(vocab, 1)
    part_max, part_index, part_sum = scratch(rows, slices, logits.device, "stats" + space)
    if finish:
        row_stats = torch.empty(rows, 2, dtype=torch.float32, device=logits.device)  # [R, 2] max, sum
        row_index = torch.empty(rows, dtype=torch.int64, device=logits.device)       # [R]
        counters = arrival_counters(logits.device, rows, "stats" + space)
    else:
        row_stats, row_index, counters = (placeholder(dtype, ndim, logits.device)
                                          for dtype, ndim in ((torch.float32, 2), (torch.int64, 1), (torch.int32, 1)))
    interop.launch_tensors(stats_kernel(bool(dependent), finish), rows * -(-slices // SLICE_WARPS), WARP * SLICE_WARPS,
                           [logits, st.temperature, st.is_greedy, int(rows_per_seq), part_max, part_index, part_sum,
                            row_stats, row_index, counters], dependent=dependent)
    return (row_stats, row_index) if finish else (part_max, part_index, part_sum)

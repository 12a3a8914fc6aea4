"""The sampling kernels' two launches as one cooperative kernel: the slices' statistics, a grid-wide
sync, then every block combines its row's statistics itself and writes its slice's probabilities
and race winner; the row's last block combines the winners into the sample.

Why: at batch 1 each of the two launches costs several microseconds of fixed cost for ~128 KB of
logits, six times per spec step (five draft samples and the verify's probabilities). A grid sync
costs ~1.3 us at one block per SM (NOTES), less than a kernel boundary. The arithmetic is
sampling_slices.py's, the two-launch form's, so both give the same bits; the tests hold them equal.

A grid of at most one block per SM (all resident at once, as a cooperative launch requires) walks
the (row, slice) items in turn: batch 1's 63 slices take one pass, a verify of 6 rows three.
Why the grid sync ends: every block is resident (the driver refuses a cooperative grid that would not
be) and reaches the one sync; the last-block count after it waits on nothing (arrived_last).
"""
from __future__ import annotations

import torch
from numba import float32, int32, int64

from protospec.kernels import interop
from protospec.kernels.interop import cuda
from protospec.kernels.sampling_slices import THREADS, combine_stats, combine_winners, slice_probs, slice_stats


@cuda.jit
def sample_one_launch_kernel(logits, temperature, is_greedy, rows_per_seq, probs_out, out_step, do_sample, noise,
                             ids_out, mirror, use_mirror, part_max, part_index, part_sum, win_value, win_index,
                             counters):
    """Arguments as row_stats_kernel's and probs_and_sample_kernel's (sampling.py); win_value [R, S]
    f32 and win_index [R, S] int64 hold the slices' race winners apart from part_max / part_index,
    which other blocks still read after the grid sync."""
    slices = part_max.shape[1]
    items = logits.shape[0] * slices
    vocab = logits.shape[1]
    tid = cuda.threadIdx.x
    best_value = cuda.shared.array(THREADS, float32)
    best_index = cuda.shared.array(THREADS, int64)
    no_flags = cuda.shared.array(THREADS, int64)  # the argmax's OR slots (it writes them), unused here
    last = cuda.shared.array(1, int32)
    for item in range(cuda.blockIdx.x, items, cuda.gridDim.x):
        row, piece = item // slices, item % slices
        seq = row // rows_per_seq
        slice_stats(logits, row, piece, temperature[seq], is_greedy[seq], part_max, part_index, part_sum,
                    best_value, best_index, no_flags, tid)
    cuda.cg.this_grid().sync()
    for item in range(cuda.blockIdx.x, items, cuda.gridDim.x):
        row, piece = item // slices, item % slices
        seq = row // rows_per_seq
        t, greedy = temperature[seq], is_greedy[seq]
        top, chosen, total = combine_stats(row, vocab, t, part_max, part_index, part_sum, best_value, best_index,
                                           no_flags, tid)
        if slice_probs(logits, row, piece, t, greedy, top, chosen, total, probs_out, out_step, do_sample, noise,
                       win_value, win_index, counters, best_value, best_index, no_flags, last, tid):
            chosen = combine_winners(row, vocab, greedy, chosen, win_value, win_index, best_value, best_index,
                                     no_flags, tid)
            if tid == 0:
                ids_out[row, out_step] = chosen
                if use_mirror > 0:
                    mirror[row * use_mirror] = chosen


_grids: dict[tuple, int] = {}


def launch_one(args: list, rows: int, slices: int, device: torch.device) -> None:
    """args: sample_one_launch_kernel's, in order. The grid: one block per SM at most, fewer when
    fewer items or fewer resident blocks (looked up once per shape: the occupancy query is slow)."""
    key = (rows, slices, str(device))
    if key not in _grids:
        sm_count = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
        _grids[key] = max(1, min(rows * slices, sm_count,
                                 interop.max_cooperative_blocks(sample_one_launch_kernel, THREADS, args)))
    interop.launch_tensors(sample_one_launch_kernel, _grids[key], THREADS, args)

"""The sampler that advances: device functions with which the probabilities kernel's last block of a
row (sampling/softmax_sample.py), once it has picked the row's token, writes that row's next decode inputs as
advance_step would (token, position, length, slot), so no advance_step launch follows the sample.
What the advance reads is loaded at the kernel's start, so the row's last block ends on stores, not
on a chain of loads.
"""
from __future__ import annotations

from numba import int64

from protospec.kernels.inputs.advance_step import advance_loads, advance_stores
from protospec.kernels.launch.interop import cuda
from protospec.kernels.sampling.slices import write_sample
from protospec.layout import NULL_BLOCK


@cuda.jit(device=True)
def loads_for_advance(advance, row, num_queries, block_size, seq_lens, block_tables):
    """advance_step.advance_loads where the kernel advances (early in it: none of these is written by
    the kernels still running before it), else placeholders."""
    if advance:
        return advance_loads(row, num_queries, block_size, seq_lens, block_tables)
    return False, int64(0), int64(NULL_BLOCK)


@cuda.jit(device=True)
def finish_row(row, vocab, greedy, chosen, win_value, win_index, ids_out, out_step, mirror, use_mirror, best_value,
               best_index, no_flags, tid, advance, loaded, block_size, input_ids, positions, seq_lens, slot_mapping,
               error_row):
    """The row's last block: its sample written (write_sample), then, with `advance`, the row's next
    decode inputs from it and from `loaded` (loads_for_advance's), stores only."""
    chosen = write_sample(row, vocab, greedy, chosen, win_value, win_index, ids_out, out_step, mirror, use_mirror,
                          best_value, best_index, no_flags, tid)
    if advance and tid == 0:
        real, pos, block = loaded
        advance_stores(row, chosen, real, pos, block, block_size, input_ids, positions, seq_lens, slot_mapping,
                       error_row)

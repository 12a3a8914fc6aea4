"""The KV slot of a position, looked up in a row's block table on the device: the step shared by
the kernels that build forward inputs there (advance_step and the sampler that advances, first_draft_step,
verify_inputs)."""
from __future__ import annotations

from protospec.kernels.launch.interop import cuda
from protospec.kernels.primitives.divisions import divide32
from protospec.layout import NULL_BLOCK, PAD_SLOT_ID


@cuda.jit(device=True)
def slot_or_flag(block_tables, row, pos, width, block_size, error_row):
    """block_tables[row, pos // block_size] * block_size + pos % block_size, looking at the table's
    first `width` columns; a position past them, or on the null block, would write K/V where it does
    not belong: PAD_SLOT_ID (nothing is written) and error_row[0] = row + 1, for the host to raise on."""
    block_index, _ = divide32(pos, block_size)
    block = NULL_BLOCK
    if block_index < width:
        block = block_tables[row, block_index]
    return slot_in_block(block, row, pos, block_size, error_row)


@cuda.jit(device=True)
def slot_in_block(block, row, pos, block_size, error_row):
    """slot_or_flag's answer from the table entry already read (NULL_BLOCK: none)."""
    if block != NULL_BLOCK:
        return block * block_size + divide32(pos, block_size)[1]
    error_row[0] = row + 1
    return PAD_SLOT_ID

"""verify_inputs: the verify's inputs of a launched spec step, built on the device in one launch from
draft step 1's buffers (speculation/verify_inputs.py holds the layout).

One thread per verify token (row r, offset i in 0..k). For a real row (L' = first_seq_lens[r] > 0):

    input_ids[r(k+1)]     = t_{L'-1} (first_input_ids[2r + 1]): the draft steps' samples write d_1..d_k
    positions             = L' - 1 + i
    slot_mapping          = block_tables[r, pos // block_size] * block_size + pos % block_size
and thread i = 0 writes seq_lens[r] = L' + k and copies the row's first `width` table entries. A
padding row (L' = 0) gets first token 0, positions 0, slots -1 and seq_len 0. A position past `width`
or on the null block gets slot -1 and sets error_row to row + 1, as advance_step and first_draft_step
do. Writing no draft token, the kernel may run beside the draft steps.
"""
from __future__ import annotations

import torch

from protospec.layout import PAD_SLOT_ID
from protospec.errors import KernelArgumentError
from protospec.kernels.launch import interop
from protospec.kernels.launch.interop import check_tensor, cuda
from protospec.kernels.primitives.divisions import divide32
from protospec.kernels.inputs.slot_lookup import slot_or_flag


@cuda.jit
def verify_inputs_kernel(block_size, width, first_input_ids, first_seq_lens, first_block_tables, input_ids, positions,
                         slot_mapping, seq_lens, block_tables, error_row):
    """
    block_size          int64 scalar
    width               int64 scalar            table columns in use (<= both tables' widths)
    first_input_ids     [2 * rows] int64        draft step 1's tokens: t_{L'-2}, t_{L'-1} per row
    first_seq_lens      [rows] int32            L' per row, 0 on padding rows
    first_block_tables  [rows, max_blocks] int32
    input_ids           [rows * (k + 1)] int64  out
    positions           [rows * (k + 1)] int64  out
    slot_mapping        [rows * (k + 1)] int64  out, -1 = skip
    seq_lens            [rows] int32            out: L' + k
    block_tables        [rows, verify_blocks] int32   out: the first `width` columns
    error_row           [1] int32               out: row + 1 of a position the table cannot hold
    """
    t = cuda.grid(1)
    q, _ = divide32(input_ids.shape[0], seq_lens.shape[0])
    k = q - 1
    if t >= input_ids.shape[0]:
        return
    row, i = divide32(t, q)
    length = first_seq_lens[row]
    if length == 0:
        if i == 0:
            input_ids[t] = 0
        positions[t] = 0
        slot_mapping[t] = PAD_SLOT_ID
        if i == 0:
            seq_lens[row] = 0
        return
    if i == 0:
        input_ids[t] = first_input_ids[2 * row + 1]
    pos = length - 1 + i
    positions[t] = pos
    slot_mapping[t] = slot_or_flag(first_block_tables, row, pos, width, block_size, error_row)
    if i == 0:
        seq_lens[row] = length + k
    j = i  # the row's k + 1 threads share the table's copy (a load an entry); a while loop, as a
    while j < width:  # range with a run-time step divides for its trip count
        block_tables[row, j] = first_block_tables[row, j]
        j += q


def verify_inputs(block_size: int, width: int, first_input_ids, first_seq_lens, first_block_tables, draft_ids,
                  input_ids, positions, slot_mapping, seq_lens, block_tables, error_row) -> None:
    """Check the arguments (rows = first_seq_lens' length; draft_ids [rows, k] gives k), then one launch of
    rows * (k + 1) threads."""
    check_tensor("first_seq_lens", first_seq_lens, torch.int32, 1)
    rows = first_seq_lens.shape[0]
    check_tensor("draft_ids", draft_ids, torch.int64, 2, rows=rows)
    q = draft_ids.shape[1] + 1
    check_tensor("first_input_ids", first_input_ids, torch.int64, 1, rows=2 * rows)
    check_tensor("first_block_tables", first_block_tables, torch.int32, 2, rows=rows)
    for name, t in (("input_ids", input_ids), ("positions", positions), ("slot_mapping", slot_mapping)):
        check_tensor(name, t, torch.int64, 1, rows=rows * q)
    check_tensor("seq_lens", seq_lens, torch.int32, 1, rows=rows)
    check_tensor("block_tables", block_tables, torch.int32, 2, rows=rows)
    check_tensor("error_row", error_row, torch.int32, 1, rows=1)
    widest = min(first_block_tables.shape[1], block_tables.shape[1])
    if not 0 < width <= widest:
        raise KernelArgumentError(f"verify_inputs: width {width} outside 1..{widest} (the narrower of the two block tables)")
    grid, block = interop.launch_config(rows * q)
    interop.launch_tensors(verify_inputs_kernel, grid, block,
                           [block_size, width, first_input_ids, first_seq_lens, first_block_tables, input_ids,
                            positions, slot_mapping, seq_lens, block_tables, error_row])

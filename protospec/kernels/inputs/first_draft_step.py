"""first_draft_step: build the next spec step's first draft step on the device, from the rejection
sampler's output, so the host can launch it BEFORE it syncs to learn what was accepted.

In the CPU path the first draft step of a spec step is prepared after the commit's host sync: the
host needs the accepted count to know the new length L' and the last two tokens. Both are on the
device already. Per row r < batch (a real sequence), with L its length before the spec step, a
its accepted count and out[r] = [d_1 .. d_a, x, placeholders...] the rejection output:

    L'                  = L + a + 1
    input_ids[2r, 2r+1] = out[r, a - 1] (or t_{L-1} when a = 0),  out[r, a]    = t_{L'-2}, t_{L'-1}
    positions           = L' - 2, L' - 1
    slot_mapping        = block_tables[r, pos // block_size] * block_size + pos % block_size
    seq_lens[r]         = L'

The same two-token layout as the CPU's "first_draft_step" prepare (speculation/draft_loop.py). L, t_{L-1}
and the block tables (covering L + k + 1 positions, reserved by the host before the launch) come
in one staged int64 tensor: [batch * width table entries | batch lengths | batch last tokens];
the kernel also copies the tables into the persistent int32 buffer the forward reads. Padding rows
(batch <= r < rows) get token 0, position 0, slot -1. A position whose block is past the table or
is the null block gets slot -1 and is recorded in error_row (row + 1), as advance_step does.
"""
from __future__ import annotations

import torch

from protospec.layout import NULL_BLOCK, PAD_SLOT_ID
from protospec.errors import KernelArgumentError
from protospec.kernels.launch import interop
from protospec.kernels.launch.interop import check_tensor, cuda
from protospec.kernels.inputs.slot_lookup import slot_or_flag

# Threads per row: a block table of up to ~128 entries in a few loads a thread (the simulator runs a
# Python thread per CUDA thread: a few there, enough to stride).
TABLE_THREADS = 4 if interop.SIMULATOR else 32


@cuda.jit
def first_draft_step_kernel(batch, block_size, width, staged, output_ids, num_accepted, input_ids, positions,
                            slot_mapping, seq_lens, block_tables, error_row):
    """
    batch         int64 scalar       real sequences (rows past it are padding)
    block_size    int64 scalar
    width         int64 scalar       block-table entries per row in `staged`
    staged        [batch * width + 2 * batch] int64   tables, lengths L, last tokens t_{L-1}
    output_ids    [batch, k + 1] int64   rejection output of the spec step that just ran
    num_accepted  [batch] int64
    input_ids     [2 * rows] int64   out
    positions     [2 * rows] int64   out
    slot_mapping  [2 * rows] int64   out, -1 = skip
    seq_lens      [rows] int32       out: L'
    block_tables  [rows, max_blocks] int32   out (rows < batch): the staged tables, null-padded
    error_row     [1] int32          out: row + 1 of a position the table cannot hold
    A block per row: its threads copy the table (one thread walking it would wait out a load per
    entry, ~100 of them), then thread 0 writes the row's two tokens.
    """
    row, lane = cuda.blockIdx.x, cuda.threadIdx.x
    if row >= seq_lens.shape[0]:
        return
    if row >= batch:
        if lane == 0:
            for i in range(2):
                input_ids[2 * row + i] = 0
                positions[2 * row + i] = 0
                slot_mapping[2 * row + i] = PAD_SLOT_ID
            seq_lens[row] = 0
        return
    j = lane  # a while loop: range with a run-time step divides for its trip count
    while j < block_tables.shape[1]:
        block_tables[row, j] = staged[row * width + j] if j < width else NULL_BLOCK
        j += cuda.blockDim.x
    cuda.syncthreads()  # the slot lookup below reads the table just written
    if lane != 0:
        return
    length = staged[batch * width + row]
    accepted = num_accepted[row]
    new_length = length + accepted + 1
    last = output_ids[row, accepted]
    before_last = staged[batch * width + batch + row]
    if accepted > 0:
        before_last = output_ids[row, accepted - 1]
    for i in range(2):
        pos = new_length - 2 + i
        input_ids[2 * row + i] = before_last if i == 0 else last
        positions[2 * row + i] = pos
        slot_mapping[2 * row + i] = slot_or_flag(block_tables, row, pos, width, block_size, error_row)
    seq_lens[row] = new_length


def stage(block_tables: list[list[int]], lengths: list[int], last_tokens: list[int], width: int) -> list[int]:
    """The kernel's `staged` input as a flat list: tables null-padded to `width`, then L, then t_{L-1}."""
    if any(len(t) > width for t in block_tables):
        raise ValueError(f"a block table is wider than width={width}")
    flat = [b for t in block_tables for b in t + [NULL_BLOCK] * (width - len(t))]
    return flat + list(lengths) + list(last_tokens)


def first_draft_step_reference(block_size: int, block_tables: list[list[int]], lengths: list[int],
                               last_tokens: list[int], output_ids: list[list[int]], num_accepted: list[int]):
    """The kernel's twin on host lists (tests): per real row, (tokens, positions, slots, L')."""
    rows = []
    for table, length, prev, out, a in zip(block_tables, lengths, last_tokens, output_ids, num_accepted):
        new_length = length + a + 1
        tokens = [out[a - 1] if a > 0 else prev, out[a]]
        positions = [new_length - 2, new_length - 1]
        slots = [table[p // block_size] * block_size + p % block_size if p // block_size < len(table)
                 and table[p // block_size] != NULL_BLOCK else PAD_SLOT_ID for p in positions]
        rows.append((tokens, positions, slots, new_length))
    return rows


def first_draft_step(block_size: int, width: int, staged, output_ids, num_accepted, input_ids, positions, slot_mapping,
                     seq_lens, block_tables, error_row) -> None:
    """Check the arguments, then one launch over every buffer row (a block of TABLE_THREADS per row)."""
    batch = num_accepted.shape[0] if isinstance(num_accepted, torch.Tensor) else None
    rows = seq_lens.shape[0] if isinstance(seq_lens, torch.Tensor) else None
    check_tensor("staged", staged, torch.int64, 1)
    check_tensor("output_ids", output_ids, torch.int64, 2, rows=batch)
    check_tensor("num_accepted", num_accepted, torch.int64, 1)
    check_tensor("seq_lens", seq_lens, torch.int32, 1)
    for name, t in (("input_ids", input_ids), ("positions", positions), ("slot_mapping", slot_mapping)):
        check_tensor(name, t, torch.int64, 1, rows=2 * rows)
    check_tensor("block_tables", block_tables, torch.int32, 2, rows=rows)
    check_tensor("error_row", error_row, torch.int32, 1, rows=1)
    if batch > rows:
        raise KernelArgumentError(f"first_draft_step: batch {batch} exceeds the buffers' {rows} rows")
    if width > block_tables.shape[1]:
        raise KernelArgumentError(f"first_draft_step: width {width} exceeds the buffers' {block_tables.shape[1]} blocks")
    if staged.shape[0] != batch * width + 2 * batch:
        raise KernelArgumentError(f"staged: {staged.shape[0]} entries, expected batch * width + 2 * batch = "
                                  f"{batch * width + 2 * batch}")
    interop.launch_tensors(first_draft_step_kernel, rows, TABLE_THREADS,
                           [batch, block_size, width, staged, output_ids, num_accepted, input_ids, positions,
                            slot_mapping, seq_lens, block_tables, error_row])

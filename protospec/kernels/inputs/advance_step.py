"""advance_step: after a draft step has sampled one token per sequence, turn the decode inputs of
that step into the next step's, in place on the device (vLLM's advance_step, as a Numba kernel).

Per row r < num_queries (a real sequence):
    input_ids[r]    <- sampled_ids[r]
    positions[r]    <- seq_lens[r]                (the old length is the new token's position)
    seq_lens[r]     <- seq_lens[r] + 1
    slot_mapping[r] <- block_tables[r, pos // block_size] * block_size + pos % block_size
Per padding row (num_queries <= r < num_rows): token 0, position 0, seq_len 0, slot -1.

A position whose block-table entry is past the table or is the null block would write K/V where
it does not belong: the kernel writes slot -1 instead (nothing is written) and records the row in
error_row[0] (row + 1), which the host reads at its next sync and raises on.
"""
from __future__ import annotations

import functools

import torch
from numba import int64

from protospec.layout import NULL_BLOCK, PAD_SLOT_ID
from protospec.errors import KernelArgumentError
from protospec.kernels.launch import interop
from protospec.kernels.launch.dependent_launch import allow_dependent_launch, grid_dependency_wait
from protospec.kernels.launch.interop import cuda
from protospec.kernels.primitives.divisions import divide32
from protospec.kernels.inputs.slot_lookup import slot_in_block


@cuda.jit(device=True)
def advance_loads(row, num_queries, block_size, seq_lens, block_tables):
    """What a row's advance reads: (a real row, its new token's position, that position's block-table
    entry or NULL_BLOCK past the table). A kernel can issue these before it has the token."""
    real = row < num_queries[0]
    pos = int64(seq_lens[row])
    block = int64(NULL_BLOCK)
    if real:  # a padding row's length means nothing
        block_index, _ = divide32(pos, block_size)
        if block_index < block_tables.shape[1]:
            block = int64(block_tables[row, block_index])
    return real, pos, block


@cuda.jit(device=True)
def advance_stores(row, token, real, pos, block, block_size, input_ids, positions, seq_lens, slot_mapping, error_row):
    """A row's advance (the module's rules) from advance_loads' values and the sampled `token`."""
    if real:
        input_ids[row] = token
        positions[row] = pos
        seq_lens[row] = pos + 1
        slot_mapping[row] = slot_in_block(block, row, pos, block_size, error_row)
    else:
        input_ids[row] = 0
        positions[row] = 0
        seq_lens[row] = 0
        slot_mapping[row] = PAD_SLOT_ID


@functools.lru_cache(maxsize=None)
def _advance_kernel(DEPENDENT: bool):  # noqa: N803 (Numba freezes it as a constant)
    """The kernel; DEPENDENT: launched as a programmatic dependent of the sampling before it, it waits
    for that kernel, then lets the next forward's first kernel start (and load its weights)."""

    @cuda.jit
    def advance_step_kernel(num_queries, block_size, sampled_ids, input_ids, positions, seq_lens, slot_mapping,
                            block_tables, error_row):
        """
        num_queries   [1] int32          real sequences; rows past it are padding
        block_size    int64 scalar
        sampled_ids   [num_rows] int64   tokens the draft just sampled
        input_ids     [num_rows] int64   out: next step's input tokens
        positions     [num_rows] int64   out: next step's positions
        seq_lens      [num_rows] int32   in: context length so far; out: + 1
        slot_mapping  [num_rows] int64   out: flat KV slot of the new token, -1 = skip
        block_tables  [num_rows, max_blocks] int32
        error_row     [1] int32          out: row + 1 of a position the block table cannot hold
        """
        if DEPENDENT:
            grid_dependency_wait()
            allow_dependent_launch()
        row = cuda.grid(1)
        if row >= input_ids.shape[0]:
            return
        real, pos, block = advance_loads(row, num_queries, block_size, seq_lens, block_tables)
        advance_stores(row, sampled_ids[row], real, pos, block, block_size, input_ids, positions, seq_lens,
                       slot_mapping, error_row)

    return advance_step_kernel


advance_step_kernel = _advance_kernel(False)


def advance_step_reference(num_queries: int, block_size: int, sampled_ids, input_ids, positions, seq_lens,
                           slot_mapping, block_tables) -> int:
    """The kernel's twin in plain torch (any device), in place. Returns error_row (0 = none)."""
    rows = torch.arange(input_ids.shape[0], device=input_ids.device)
    real = rows < num_queries
    pos = seq_lens.long()
    block_index = pos // block_size
    in_table = block_index < block_tables.shape[1]
    block = block_tables.long().gather(1, block_index.clamp(max=block_tables.shape[1] - 1)[:, None])[:, 0]
    block = torch.where(in_table, block, NULL_BLOCK)
    ok = block != NULL_BLOCK
    bad_rows = (real & ~ok).nonzero()
    input_ids.copy_(torch.where(real, sampled_ids, 0))
    positions.copy_(torch.where(real, pos, 0))
    slot_mapping.copy_(torch.where(real & ok, block * block_size + pos % block_size, PAD_SLOT_ID))
    seq_lens.copy_(torch.where(real, pos + 1, 0).to(seq_lens.dtype))
    return int(bad_rows[-1, 0]) + 1 if len(bad_rows) else 0


def check_advance_args(num_queries, sampled_ids, input_ids, positions, seq_lens, slot_mapping, block_tables, error_row) -> None:
    rows = input_ids.shape[0] if isinstance(input_ids, torch.Tensor) else None
    interop.check_tensor("num_queries", num_queries, torch.int32, 1, rows=1)
    interop.check_tensor("sampled_ids", sampled_ids, torch.int64, 1, rows=rows)
    interop.check_tensor("input_ids", input_ids, torch.int64, 1)
    interop.check_tensor("positions", positions, torch.int64, 1, rows=rows)
    interop.check_tensor("seq_lens", seq_lens, torch.int32, 1, rows=rows)
    interop.check_tensor("slot_mapping", slot_mapping, torch.int64, 1, rows=rows)
    interop.check_tensor("block_tables", block_tables, torch.int32, 2, rows=rows)
    interop.check_tensor("error_row", error_row, torch.int32, 1, rows=1)
    devices = {t.device for t in (num_queries, sampled_ids, input_ids, positions, seq_lens, slot_mapping, block_tables, error_row)}
    if len(devices) > 1:
        raise KernelArgumentError(f"advance_step tensors are on different devices: {sorted(map(str, devices))}")


def advance_step(num_queries, block_size: int, sampled_ids, input_ids, positions, seq_lens, slot_mapping,
                 block_tables, error_row) -> None:
    """Check the arguments, then launch through Numba's ordinary dispatch (notebooks, tests).
    The engine uses AdvanceStepLauncher, which binds persistent buffers once."""
    check_advance_args(num_queries, sampled_ids, input_ids, positions, seq_lens, slot_mapping, block_tables, error_row)
    interop.launch(advance_step_kernel, input_ids.shape[0],
                   [num_queries, block_size, sampled_ids, input_ids, positions, seq_lens, slot_mapping, block_tables, error_row])


class AdvanceStepLauncher:
    """advance_step bound to one set of persistent buffers: checked once, marshalled once.

    On a GPU the launch is one cuLaunchKernel call (interop.BoundLaunch); in the simulator, or if
    binding fails, Numba's ordinary launch (`self.bound` says which).
    """

    def __init__(self, block_size: int, num_queries, sampled_ids, input_ids, positions, seq_lens, slot_mapping,
                 block_tables, error_row, bind: bool = True, dependent: bool = False):
        tensors = [num_queries, sampled_ids, input_ids, positions, seq_lens, slot_mapping, block_tables, error_row]
        check_advance_args(*tensors)
        self.args = [num_queries, block_size, sampled_ids, input_ids, positions, seq_lens, slot_mapping, block_tables, error_row]
        self.num_rows = input_ids.shape[0]
        # dependent: bound as a programmatic dependent (a GPU of sm_90 or later; the simulator has none)
        self.kernel = _advance_kernel(dependent)
        self.bound = None
        self.bind_error: str | None = None
        if bind and not interop.SIMULATOR:
            try:
                self.bound = interop.BoundLaunch(self.kernel, self.num_rows, self.args, dependent)
            except Exception as exc:  # keep working through the ordinary launch, and say why
                self.bind_error = f"{type(exc).__name__}: {exc}"

    @property
    def row_args(self) -> list:
        """What a sampling kernel needs to do this advance itself for the rows it samples
        (sampling/advance.py): the kernel's arguments but the sampled ids, which it has in hand."""
        return self.args[:2] + self.args[3:]

    def __call__(self) -> None:
        if self.bound is not None:
            self.bound()
        else:
            interop.launch(self.kernel, self.num_rows, self.args)

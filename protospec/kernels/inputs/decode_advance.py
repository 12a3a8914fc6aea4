"""decode_advance: after a target-only decode step has sampled one token per row, record it and turn
the step's inputs into the next step's, in place on the device, so several decode steps run in one
CUDA graph replay with no host work between them (engine/decode_graph.py).

Per row with tokens left to make (remaining[r] > 0), the sampled token t:
    out_tokens[r, step] <- t
    remaining[r]        <- remaining[r] - 1, or 0 where t is the row's stop id (its EOS)
    and while tokens are left, the next step's input:
    input_ids[r] <- t;  positions[r] <- positions[r] + 1;  seq_lens[r] <- positions[r] + 1
    slot_mapping[r] <- the new position's slot in the row's block table
    step_keys[r] <- the random key of the token after it (position_key)
A row with nothing left (finished: its budget spent, or it stopped; padding rows) records
PLACEHOLDER_TOKEN_ID and gets slot -1: the next forward runs over it and writes no K/V.
The host applies the same stop rules when it reads the tokens (Sequence.append_tokens), so a row
the device froze is one the host finishes.

A position past the row's block table writes slot -1 and flags error_row[0] = row + 1, like
advance_step. The kernel waits on nothing: one thread per row, no counter, no spin.
"""
from __future__ import annotations

import torch
from numba import int64, uint64

from protospec.kernels.launch import interop
from protospec.kernels.randoms.counter_randoms import MASK32, hash32, hash_torch
from protospec.kernels.launch.interop import check_tensor, cuda
from protospec.kernels.inputs.slot_lookup import slot_or_flag
from protospec.layout import PAD_SLOT_ID, PLACEHOLDER_TOKEN_ID

THREADS = 128


@cuda.jit
def decode_advance_kernel(step, block_size, sampled, stop_ids, remaining, base_keys, step_keys, out_tokens,
                          input_ids, positions, seq_lens, slot_mapping, block_tables, error_row):
    """
    step          int64 scalar          the step of the replay (out_tokens' column)
    block_size    int64 scalar
    sampled       [rows] int64          the tokens this step sampled
    stop_ids      [rows] int64          a token that ends the row (its EOS), -1 for none
    remaining     [rows] int64          tokens the row may still make; out: one fewer, 0 once stopped
    base_keys     [rows, 2] int64       each request's random key (low, high 32-bit halves)
    step_keys     [rows, 2] int64       out: the key of the next token's numbers
    out_tokens    [rows, steps] int64   out: column `step`
    input_ids, positions [rows] int64, seq_lens [rows] int32, slot_mapping [rows] int64: the next step's inputs
    block_tables  [rows, max_blocks] int32
    error_row     [1] int32             out: row + 1 of a position its block table cannot hold
    """
    row = cuda.grid(1)
    if row >= input_ids.shape[0]:
        return
    left = remaining[row]
    if left <= 0:
        out_tokens[row, step] = PLACEHOLDER_TOKEN_ID
        slot_mapping[row] = PAD_SLOT_ID
        return
    token = sampled[row]
    out_tokens[row, step] = token
    left -= 1
    if token == stop_ids[row]:
        left = 0
    remaining[row] = left
    if left == 0:
        slot_mapping[row] = PAD_SLOT_ID
        return
    pos = positions[row] + 1
    input_ids[row] = token
    positions[row] = pos
    seq_lens[row] = pos + 1
    slot_mapping[row] = slot_or_flag(block_tables, row, pos, block_tables.shape[1], block_size, error_row)
    # The token after this one sits at pos + 1: its numbers depend on the request's key and that position only.
    step_keys[row, 0] = int64(hash32(uint64(pos + 1), uint64(base_keys[row, 0]), uint64(base_keys[row, 1])))
    step_keys[row, 1] = base_keys[row, 1]


def position_keys(base_keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The random key of the token at each row's position: [rows, 2] int64 from base_keys [rows, 2]
    and positions [rows] int64. Depending on the position alone (not on the replay or the batch a
    token is made in), a seeded request gives the same tokens however its steps are grouped."""
    lo = hash_torch(positions.long(), base_keys[:, 0], base_keys[:, 1]) & MASK32
    return torch.stack([lo, base_keys[:, 1]], 1)


def decode_advance(step: int, block_size: int, sampled, stop_ids, remaining, base_keys, step_keys, out_tokens,
                   input_ids, positions, seq_lens, slot_mapping, block_tables, error_row) -> None:
    """Check the arguments and launch on torch's current stream (a CUDA graph captures it)."""
    rows = input_ids.shape[0]
    for name, t, dtype, ndim in (("sampled", sampled, torch.int64, 1), ("stop_ids", stop_ids, torch.int64, 1),
                                 ("remaining", remaining, torch.int64, 1), ("base_keys", base_keys, torch.int64, 2),
                                 ("step_keys", step_keys, torch.int64, 2), ("out_tokens", out_tokens, torch.int64, 2),
                                 ("input_ids", input_ids, torch.int64, 1), ("positions", positions, torch.int64, 1),
                                 ("seq_lens", seq_lens, torch.int32, 1), ("slot_mapping", slot_mapping, torch.int64, 1),
                                 ("block_tables", block_tables, torch.int32, 2)):
        check_tensor(name, t, dtype, ndim, rows=rows)
    check_tensor("error_row", error_row, torch.int32, 1, rows=1)
    if not 0 <= step < out_tokens.shape[1]:
        raise ValueError(f"step {step} outside out_tokens' {out_tokens.shape[1]} columns")
    threads = min(THREADS, rows) if interop.SIMULATOR else THREADS
    interop.launch_tensors(decode_advance_kernel, -(-rows // threads), threads,
                           [step, block_size, sampled, stop_ids, remaining, base_keys, step_keys, out_tokens,
                            input_ids, positions, seq_lens, slot_mapping, block_tables, error_row])

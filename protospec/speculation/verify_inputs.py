"""The verify's inputs built on the device from draft step 1's buffers and the k draft ids, so a
launched spec step can run its verify without the host knowing what the last step accepted.

Per real row r (seq_lens of the first step > 0), with L' = first.seq_lens[r] the sequence's length
and t_{L'-1} the last token draft step 1 fed (first.input_ids[2r + 1]):

    input_ids[r]  = t_{L'-1}, d_1 .. d_k          positions[r] = L' - 1 .. L' - 1 + k
    slot_mapping  = block_tables[r, pos // block_size] * block_size + pos % block_size
    seq_lens[r]   = L' + k                        block_tables[r] = the first step's row

the layout the CPU's "verify" prepare builds (speculation/step.py). Padding rows (seq_lens 0) get slot -1,
so a replay never writes K/V for them. A position past the table, or on the null block, gets slot -1
and sets error_row to row + 1 (the first_draft_step and advance_step kernels do the same): the host
reads it with the commit's copy.

Two ways to the same buffers: one Numba launch (kernels/inputs/verify_inputs.py), and its twin in torch ops
(about twenty small kernels, ~40 us of device time per step inside a graph); the tests hold both to
the CPU prepare.
"""
from __future__ import annotations

import torch

from protospec.kernels.launch.interop import KERNEL_DEVICE_TYPE
from protospec.kernels.inputs.verify_inputs import verify_inputs
from protospec.layout import NULL_BLOCK, PAD_SLOT_ID
from protospec.model.persistent_inputs import PersistentInputs


def build_verify_inputs(first: PersistentInputs, draft_ids: torch.Tensor, verify: PersistentInputs, rows: int,
                        width: int, error_row: torch.Tensor, use_kernel: bool | None = None,
                        tokens: bool = True) -> None:
    """first: draft step 1's buffers (query_len 2); draft_ids: [rows, k] int64; verify: buffers of
    query_len k + 1 with at least `rows` rows and `width` table columns; error_row: [1] int32.
    use_kernel: the Numba launch (None: where kernels run on the tensors' device) or the torch twin.
    tokens: False where the draft steps' samples write
    d_1..d_k into the verify's tokens themselves (only t_{L'-1} of the tokens is written here; draft_ids
    then only gives k, so these inputs may be built before the draft steps)."""
    q = draft_ids.shape[1] + 1
    if verify.query_len != q:
        raise ValueError(f"verify buffers hold {verify.query_len} tokens a row, the step needs k + 1 = {q}")
    if use_kernel is None:
        use_kernel = draft_ids.device.type == KERNEL_DEVICE_TYPE
    if not use_kernel:
        build_verify_inputs_torch(first, draft_ids, verify, rows, width, error_row, tokens)
        return
    verify_inputs(first.block_size, width, first.input_ids[: 2 * rows], first.seq_lens[:rows], first.block_tables[:rows],
                  draft_ids, verify.input_ids[: rows * q], verify.positions[: rows * q], verify.slot_mapping[: rows * q],
                  verify.seq_lens[:rows], verify.block_tables[:rows], error_row, tokens)


def build_verify_inputs_torch(first: PersistentInputs, draft_ids: torch.Tensor, verify: PersistentInputs, rows: int,
                              width: int, error_row: torch.Tensor, tokens: bool = True) -> None:
    """The same buffers from torch ops (the kernel's twin)."""
    k = draft_ids.shape[1]
    q = k + 1
    device = draft_ids.device
    length = first.seq_lens[:rows].long()                                      # [rows] L', 0 on padding rows
    real = length > 0                                                          # [rows] bool
    ids = verify.input_ids[: rows * q].view(rows, q)                           # [rows, k + 1]
    ids[:, 0] = torch.where(real, first.input_ids[: 2 * rows].view(rows, 2)[:, 1], 0)
    if tokens:
        ids[:, 1:] = torch.where(real[:, None], draft_ids, 0)
    offsets = torch.arange(q, device=device)                                   # [k + 1]
    pos = torch.where(real[:, None], length[:, None] - 1 + offsets, 0)        # [rows, k + 1]
    verify.positions[: rows * q].view(rows, q).copy_(pos)
    tables = first.block_tables[:rows, :width]                                 # [rows, width] int32
    verify.block_tables[:rows, :width].copy_(tables)
    index = torch.div(pos, first.block_size, rounding_mode="floor")            # [rows, k + 1]
    inside = index < width
    block = tables.long().gather(1, index.clamp(max=width - 1))                # [rows, k + 1]
    ok = inside & (block != NULL_BLOCK)
    slots = torch.where(ok & real[:, None], block * first.block_size + pos % first.block_size, PAD_SLOT_ID)
    verify.slot_mapping[: rows * q].view(rows, q).copy_(slots)
    verify.seq_lens[:rows].copy_(torch.where(real, length + k, 0))
    # The first bad row (+ 1), kept if a kernel flagged one earlier in the step.
    bad = (real & ~ok.all(1)).int() * torch.arange(1, rows + 1, device=device, dtype=torch.int32)
    flagged = torch.where(bad > 0, bad, rows + 1).min()
    torch.maximum(error_row, torch.where(flagged <= rows, flagged, 0).view(1), out=error_row)

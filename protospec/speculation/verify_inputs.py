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

The draft steps' samples write d_1..d_k into the verify's tokens themselves (in the step graph), so
these inputs write only t_{L'-1} of the tokens and may be built before the draft steps; draft_ids then
gives only k. One Numba launch (kernels/inputs/verify_inputs.py); the tests hold it to the CPU prepare.
"""
from __future__ import annotations

import torch

from protospec.kernels.inputs.verify_inputs import verify_inputs
from protospec.model.persistent_inputs import PersistentInputs


def build_verify_inputs(first: PersistentInputs, draft_ids: torch.Tensor, verify: PersistentInputs, rows: int,
                        width: int, error_row: torch.Tensor) -> None:
    """first: draft step 1's buffers (query_len 2); draft_ids: [rows, k] int64 (only its k is read);
    verify: buffers of query_len k + 1 with at least `rows` rows and `width` table columns; error_row:
    [1] int32."""
    q = draft_ids.shape[1] + 1
    if verify.query_len != q:
        raise ValueError(f"verify buffers hold {verify.query_len} tokens a row, the step needs k + 1 = {q}")
    verify_inputs(first.block_size, width, first.input_ids[: 2 * rows], first.seq_lens[:rows], first.block_tables[:rows],
                  draft_ids, verify.input_ids[: rows * q], verify.positions[: rows * q], verify.slot_mapping[: rows * q],
                  verify.seq_lens[:rows], verify.block_tables[:rows], error_row)

"""The draft's first-step inputs (two tokens per sequence), built on the device.

With the commit overlapped (commit.py), the next spec step's draft step 1 is launched before the
host has read what the rejection sampler accepted: the first_draft_step kernel writes its inputs
from the rejection output into these buffers. They never move, so a CUDA graph captures them
directly, as it does the decode buffers of steps 2..k.
"""
from __future__ import annotations

import torch

from protospec.kernels.inputs.first_draft_step import first_draft_step, stage
from protospec.model.inputs import ForwardInputs, host_to_device
from protospec.model.persistent_inputs import PersistentInputs
from protospec.layout import RejectionOutput

QUERY_LEN = 2  # t_{L'-2}, t_{L'-1}: the layout of the CPU's first_draft_step prepare


class FirstStepState:
    def __init__(self, name: str, max_num_seqs: int, max_blocks: int, block_size: int, device: torch.device,
                 error_row: torch.Tensor):
        self.buffers = PersistentInputs(name, max_num_seqs, QUERY_LEN, max_blocks, 1, block_size, device)
        self.error_row = error_row  # [1] int32, shared with the decode buffers: read at each commit

    def build(self, result: RejectionOutput, block_tables: list[list[int]], lengths: list[int],
              last_tokens: list[int]) -> ForwardInputs:
        """Inputs of the next first draft step from this spec step's rejection output (no sync).
        block_tables: the host's tables, covering every position the step may write; lengths: each
        sequence's L before this spec step; last_tokens: its t_{L-1}."""
        b = self.buffers
        batch, width = len(block_tables), max(len(t) for t in block_tables)
        b.check_fits(batch, width)
        staged = host_to_device(stage(block_tables, lengths, last_tokens, width), torch.int64, b.input_ids.device)
        first_draft_step(b.block_size, width, staged, result.output_token_ids, result.num_accepted, b.input_ids,
                         b.positions, b.slot_mapping, b.seq_lens, b.block_tables, self.error_row)
        b.num_seqs, b.width = batch, width
        return b.view()

"""The draft's decode inputs for steps 2..k, advanced in place on the device.

Draft step 1 (CPU-prepared after a verify or a prefill, or built on the device by the overlapped
commit) feeds 2 tokens per sequence; `seed` then copies its seq_lens and block tables into these
buffers (device to device), and `advance` runs the advance_step kernel for every later step. The
buffers never move, so the kernel's arguments are bound once and a CUDA graph replays them.
"""
from __future__ import annotations

import torch

from protospec.kernels.inputs.advance_step import AdvanceStepLauncher
from protospec.model.attention import AttentionMetadata
from protospec.model.inputs import ForwardInputs
from protospec.model.persistent_inputs import PersistentInputs


class DraftDecodeState:
    def __init__(self, name: str, max_num_seqs: int, max_blocks: int, block_size: int, device: torch.device,
                 error_row: torch.Tensor, dependent: bool = False):
        self.buffers = PersistentInputs(name, max_num_seqs, 1, max_blocks, 1, block_size, device)
        self.num_queries = torch.zeros(1, dtype=torch.int32, device=device)         # [1] real rows this spec step
        self.sampled_ids = torch.zeros(max_num_seqs, dtype=torch.int64, device=device)  # [n] the sampler writes here
        self.error_row = error_row  # [1] int32: row + 1 of a position past its block table, 0 = fine
        b = self.buffers
        # dependent: advance_step launched as a programmatic dependent of the sampling before it
        self.advance = AdvanceStepLauncher(block_size, self.num_queries, self.sampled_ids, b.input_ids, b.positions,
                                           b.seq_lens, b.slot_mapping, b.block_tables, self.error_row,
                                           dependent=dependent)

    @property
    def max_num_seqs(self) -> int:
        return self.buffers.max_rows

    def seed(self, meta: AttentionMetadata) -> None:
        """Take draft step 1's seq_lens and block tables. Device copies only: no sync."""
        num_seqs, width = meta.block_tables.shape
        b = self.buffers
        b.check_fits(num_seqs, width)
        b.seq_lens[:num_seqs].copy_(meta.seq_lens)
        b.block_tables[:num_seqs, :width].copy_(meta.block_tables)
        self.num_queries.fill_(num_seqs)
        b.num_seqs, b.width = num_seqs, width

    def inputs(self, rows: int | None = None, width: int | None = None) -> ForwardInputs:
        """The current batch, or `rows` x `width` for a CUDA graph (padding rows stay inert)."""
        return self.buffers.view(rows, width)

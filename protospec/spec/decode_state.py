"""Persistent decode inputs for the draft's steps 2..k, advanced in place on the device.

The first draft step of a spec step is CPU-prepared (it follows a verify or a prefill and may
feed 2 tokens per sequence); `seed` then copies its seq_lens and block tables into these buffers
(device to device), and `advance` runs the advance_step kernel for every later step. The buffers
never move, so the kernel's arguments are bound once (and a CUDA graph could replay them).
"""
from __future__ import annotations

import torch

from protospec.model.attention import PAD_SLOT_ID, AttentionMetadata
from protospec.model.inputs import ForwardInputs
from protospec.kernels.advance_step import AdvanceStepLauncher


class DraftDecodeState:
    def __init__(self, max_num_seqs: int, max_blocks: int, block_size: int, device: torch.device):
        n = max_num_seqs

        def zeros(*shape, dtype=torch.int64):
            return torch.zeros(*shape, dtype=dtype, device=device)

        self.block_size = block_size
        self.num_queries = zeros(1, dtype=torch.int32)   # [1] real rows this spec step
        self.sampled_ids = zeros(n)                      # [n] the sampler writes here
        self.input_ids = zeros(n)                        # [n]
        self.positions = zeros(n)                        # [n]
        self.seq_lens = zeros(n, dtype=torch.int32)      # [n]
        self.slot_mapping = torch.full((n,), PAD_SLOT_ID, dtype=torch.int64, device=device)
        self.block_tables = zeros(n, max_blocks, dtype=torch.int32)  # [n, max_blocks]
        self.error_row = zeros(1, dtype=torch.int32)     # [1] row + 1 of a bad position, 0 = fine
        rows = torch.arange(n + 1, device=device)
        # A decode step's layout never changes: token r belongs to sequence r.
        self._grid_index = rows[:n]
        self._query_start = rows.to(torch.int32)
        self.num_seqs = self.width = 0
        self._views: dict[tuple[int, int], ForwardInputs] = {}  # the buffers never move: build views once
        self.advance = AdvanceStepLauncher(block_size, self.num_queries, self.sampled_ids, self.input_ids,
                                           self.positions, self.seq_lens, self.slot_mapping, self.block_tables,
                                           self.error_row)

    @property
    def max_num_seqs(self) -> int:
        return self.input_ids.shape[0]

    def seed(self, meta: AttentionMetadata) -> None:
        """Take the first draft step's seq_lens and block tables. Device copies only: no sync."""
        num_seqs, width = meta.block_tables.shape
        if num_seqs > self.max_num_seqs or width > self.block_tables.shape[1]:
            raise ValueError(f"batch {num_seqs} x {width} blocks exceeds the decode buffers "
                             f"{self.max_num_seqs} x {self.block_tables.shape[1]}")
        self.seq_lens[:num_seqs].copy_(meta.seq_lens)
        self.block_tables[:num_seqs, :width].copy_(meta.block_tables)
        self.num_queries.fill_(num_seqs)
        self.num_seqs, self.width = num_seqs, width

    def inputs(self, rows: int | None = None, width: int | None = None) -> ForwardInputs:
        """Views of the buffers in the layout the model reads: the current batch, or `rows` x
        `width` for a CUDA graph (rows past the batch are padding rows the kernel keeps inert)."""
        b, w = rows or self.num_seqs, width or self.width
        if (b, w) in self._views:
            return self._views[b, w]
        meta = AttentionMetadata(
            slot_mapping=self.slot_mapping[:b],
            block_tables=self.block_tables[:b, :w],
            seq_lens=self.seq_lens[:b],
            query_start_loc=self._query_start[: b + 1],
            padded_token_index=self._grid_index[:b, None],
            token_grid_index=self._grid_index[:b],
            logits_indices=self._grid_index[:b],
            block_size=self.block_size,
            uniform_query_len=1,
        )
        self._views[b, w] = ForwardInputs(self.input_ids[:b], self.positions[:b], meta, query_len=1, logits_per_seq=1,
                                          decode_state=self)
        return self._views[b, w]

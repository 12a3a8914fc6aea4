"""Persistent inputs of the draft's first step (two tokens per sequence), built on the device.

With the commit overlapped (speculative.py), the next spec step's first draft step is launched
before the host has read what the rejection sampler accepted: the first_draft_step kernel writes
its inputs from the rejection output into these buffers. They never move, so a CUDA graph
captures them directly (cuda_graphs.GraphCache), as it does the decode buffers of steps 2..k.
"""
from __future__ import annotations

import torch

from protospec.model.attention import PAD_SLOT_ID, AttentionMetadata
from protospec.model.inputs import ForwardInputs, host_to_device
from protospec.kernels.first_draft_step import first_draft_step, stage
from protospec.spec.rejection import RejectionOutput

QUERY_LEN = 2  # t_{L'-2}, t_{L'-1}: the layout of the CPU's first_draft_step prepare


class FirstStepState:
    def __init__(self, max_num_seqs: int, max_blocks: int, block_size: int, error_row: torch.Tensor,
                 device: torch.device):
        n, q = max_num_seqs, QUERY_LEN
        self.block_size = block_size
        self.input_ids = torch.zeros(n * q, dtype=torch.int64, device=device)        # [2n]
        self.positions = torch.zeros(n * q, dtype=torch.int64, device=device)        # [2n]
        self.slot_mapping = torch.full((n * q,), PAD_SLOT_ID, dtype=torch.int64, device=device)  # [2n]
        self.seq_lens = torch.zeros(n, dtype=torch.int32, device=device)             # [n] L'
        self.block_tables = torch.zeros(n, max_blocks, dtype=torch.int32, device=device)  # [n, max_blocks]
        self.error_row = error_row  # [1] int32, shared with the decode buffers: read at each commit
        tokens = torch.arange(n * q, device=device)
        self._grid = tokens.view(n, q)                                               # [n, 2] token of (row, i)
        self._last_of_row = tokens[q - 1 :: q].contiguous()                          # [n] 1, 3, 5, ...
        self._query_start = torch.arange(0, n * q + 1, q, dtype=torch.int32, device=device)  # [n + 1]
        self.num_seqs = self.width = 0
        self._views: dict[tuple[int, int], ForwardInputs] = {}

    @property
    def max_num_seqs(self) -> int:
        return self.seq_lens.shape[0]

    def build(self, result: RejectionOutput, block_tables: list[list[int]], lengths: list[int],
              last_tokens: list[int]) -> ForwardInputs:
        """Inputs of the next first draft step from this spec step's rejection output (no sync).
        block_tables: the host's tables, covering every position the step may write; lengths: each
        sequence's L before this spec step; last_tokens: its t_{L-1}."""
        batch, width = len(block_tables), max(len(t) for t in block_tables)
        if batch > self.max_num_seqs or width > self.block_tables.shape[1]:
            raise ValueError(f"batch {batch} x {width} blocks exceeds the first-step buffers "
                             f"{self.max_num_seqs} x {self.block_tables.shape[1]}")
        staged = host_to_device(stage(block_tables, lengths, last_tokens, width), torch.int64, self.input_ids.device)
        first_draft_step(self.block_size, width, staged, result.output_token_ids, result.num_accepted,
                         self.input_ids, self.positions, self.slot_mapping, self.seq_lens, self.block_tables,
                         self.error_row)
        self.num_seqs, self.width = batch, width
        return self.inputs()

    def inputs(self, rows: int | None = None, width: int | None = None) -> ForwardInputs:
        """Views in the model's layout: the current batch, or `rows` x `width` for a CUDA graph."""
        b, w = rows or self.num_seqs, width or self.width
        if (b, w) not in self._views:
            meta = AttentionMetadata(
                slot_mapping=self.slot_mapping[: b * QUERY_LEN],
                block_tables=self.block_tables[:b, :w],
                seq_lens=self.seq_lens[:b],
                query_start_loc=self._query_start[: b + 1],
                padded_token_index=self._grid[:b],
                token_grid_index=self._grid[:b].reshape(-1),
                logits_indices=self._last_of_row[:b],
                block_size=self.block_size,
                uniform_query_len=QUERY_LEN,
            )
            self._views[b, w] = ForwardInputs(self.input_ids[: b * QUERY_LEN], self.positions[: b * QUERY_LEN], meta,
                                              query_len=QUERY_LEN, logits_per_seq=1, decode_state=self)
        return self._views[b, w]

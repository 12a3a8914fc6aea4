"""Persistent forward inputs: fixed device buffers for `max_rows` sequences x `query_len` tokens.

Three users share this one type: the draft's decode buffers (steps 2..k, advanced in place by the
advance_step kernel), the draft's first-step buffers (built by the first_draft_step kernel) and the
CUDA graphs' static batches (CPU-prepared inputs copied in). The buffers never move, so a kernel's
arguments are bound once and a captured graph reads them directly; `view(rows, width)` gives the
model's layout for the first `rows` sequences and `width` block-table columns.
"""
from __future__ import annotations

import torch

from protospec.model.attention import AttentionMetadata
from protospec.layout import PAD_SLOT_ID
from protospec.model.inputs import ForwardInputs


class PersistentInputs:
    def __init__(self, name: str, max_rows: int, query_len: int, max_blocks: int, logits_per_seq: int,
                 block_size: int, device: torch.device, whole_prompts: bool = False):
        n, q = max_rows, query_len
        self.name = name  # what a captured graph of these buffers is keyed by
        self.whole_prompts = whole_prompts  # AttentionMetadata's: only batches of whole prompts fill these
        self.query_len, self.logits_per_seq, self.block_size = q, logits_per_seq, block_size
        self.input_ids = torch.zeros(n * q, dtype=torch.int64, device=device)                   # [n * q]
        self.positions = torch.zeros(n * q, dtype=torch.int64, device=device)                   # [n * q]
        self.slot_mapping = torch.full((n * q,), PAD_SLOT_ID, dtype=torch.int64, device=device)  # [n * q]
        self.seq_lens = torch.zeros(n, dtype=torch.int32, device=device)                        # [n]
        self.block_tables = torch.zeros(n, max_blocks, dtype=torch.int32, device=device)        # [n, max_blocks]
        tokens = torch.arange(n * q, device=device)
        self.grid = tokens.view(n, q)                                                           # [n, q] token of (row, i)
        # The last logits_per_seq tokens of each row, row by row: a prefix serves any row count.
        self._logits_index = self.grid[:, q - logits_per_seq:].reshape(-1).contiguous()         # [n * logits_per_seq]
        self.num_seqs = self.width = 0  # the batch last written (by a kernel or fill)
        self._views: dict[tuple[int, int], ForwardInputs] = {}

    @property
    def max_rows(self) -> int:
        return self.seq_lens.shape[0]

    @property
    def max_blocks(self) -> int:
        return self.block_tables.shape[1]

    def check_fits(self, rows: int, width: int) -> None:
        if rows > self.max_rows or width > self.max_blocks:
            raise ValueError(f"batch {rows} x {width} blocks exceeds the {self.name} buffers "
                             f"{self.max_rows} x {self.max_blocks}")

    def view(self, rows: int | None = None, width: int | None = None) -> ForwardInputs:
        """The model's layout over the current batch, or `rows` x `width` for a CUDA graph (rows past
        the batch are padding rows: slot -1, never written)."""
        b, w = rows or self.num_seqs, width or self.width
        if (b, w) not in self._views:
            q, tokens = self.query_len, b * self.query_len
            meta = AttentionMetadata(
                slot_mapping=self.slot_mapping[:tokens],
                block_tables=self.block_tables[:b, :w],
                seq_lens=self.seq_lens[:b],
                padded_token_index=self.grid[:b],
                token_grid_index=self.grid[:b].reshape(-1),
                logits_indices=self._logits_index[: b * self.logits_per_seq],
                block_size=self.block_size,
                uniform_query_len=q,
                whole_prompts=self.whole_prompts,
            )
            self._views[b, w] = ForwardInputs(self.input_ids[:tokens], self.positions[:tokens], meta, query_len=q,
                                              logits_per_seq=self.logits_per_seq, persistent=self)
        return self._views[b, w]

    def fill(self, src: ForwardInputs) -> None:
        """Copy a CPU-prepared batch in (device to device). Padding rows get slot -1, so a replay never
        writes K/V for them (stale slots there could belong to another sequence by now). seq_lens is
        not copied: the forward does not read it (attention masks by position)."""
        tokens, (seqs, width) = src.input_ids.shape[0], src.meta.block_tables.shape
        self.check_fits(seqs, width)
        self.input_ids[:tokens].copy_(src.input_ids)
        self.positions[:tokens].copy_(src.positions)
        self.slot_mapping[:tokens].copy_(src.meta.slot_mapping)
        if tokens < self.slot_mapping.shape[0]:
            self.slot_mapping[tokens:].fill_(PAD_SLOT_ID)
        # Columns past `width` keep stale block ids: harmless, attention masks keys past each
        # query's position, and every position of this batch lies inside its first `width` blocks.
        self.block_tables[:seqs, :width].copy_(src.meta.block_tables)
        self.num_seqs, self.width = seqs, width

"""CPU prepare_inputs: the reference path (and the "main" baseline) that builds a forward's inputs
from Python lists every time, then copies them to the device.

One function serves every kind of forward, because each is "feed these new tokens of each
sequence, starting at this position, and give me logits for the last n of them":
  prefill  chunk = the prompt,               start = 0,      logits for 1
  decode   chunk = [last token],             start = L - 1,  logits for 1
  draft 1  chunk = tokens the draft lacks,   start = cached, logits for 1   (1 or 2 tokens)
  verify   chunk = [last token, d_1..d_k],   start = L - 1,  logits for k + 1
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from protospec.model.attention import AttentionMetadata
from protospec.layout import NULL_BLOCK

if TYPE_CHECKING:
    from protospec.model.persistent_inputs import PersistentInputs


@dataclass
class ForwardInputs:
    input_ids: torch.Tensor   # [T] int64
    positions: torch.Tensor   # [T] int64
    meta: AttentionMetadata
    # Host-side layout facts (no device read needed), used to pick a captured CUDA graph:
    # every sequence feeds `query_len` tokens and wants `logits_per_seq` logits; None = ragged.
    query_len: int | None = None
    logits_per_seq: int | None = None
    persistent: PersistentInputs | None = None  # set when these are views of persistent buffers


def host_to_device(values, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A Python list as a device tensor, without a host sync: pinned memory makes the copy async."""
    host = torch.tensor(values, dtype=dtype)
    if torch.device(device).type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


def prepare_inputs(
    token_chunks: list[list[int]],    # new tokens per sequence
    start_positions: list[int],       # logical position of each chunk's first token
    block_tables: list[list[int]],    # each must already cover start + len(chunk) slots
    block_size: int,
    num_logits: list[int] | int,      # logits wanted per sequence, from the chunk's end
    device: torch.device,
    max_blocks: int | None = None,    # block-table width; None = the widest table in the batch
) -> ForwardInputs:
    num_seqs = len(token_chunks)
    if isinstance(num_logits, int):
        num_logits = [num_logits] * num_seqs
    query_lens = [len(c) for c in token_chunks]
    max_q = max(query_lens)
    width = max(len(bt) for bt in block_tables)
    if max_blocks is not None:
        if width > max_blocks:
            raise ValueError(f"a block table has {width} blocks, more than max_blocks={max_blocks}")
        width = max_blocks

    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    padded_index = [[0] * max_q for _ in range(num_seqs)]
    grid_index: list[int] = []
    logits_indices: list[int] = []
    query_start = [0]
    seq_lens: list[int] = []
    for s, (chunk, start, table) in enumerate(zip(token_chunks, start_positions, block_tables)):
        end = start + len(chunk)
        if len(table) * block_size < end:
            raise ValueError(f"sequence {s}: block table of {len(table)} blocks cannot hold {end} tokens")
        base = len(input_ids)
        for i, tok in enumerate(chunk):
            pos = start + i
            input_ids.append(tok)
            positions.append(pos)
            slots.append(table[pos // block_size] * block_size + pos % block_size)
            padded_index[s][i] = base + i
            grid_index.append(s * max_q + i)
        logits_indices.extend(range(base + len(chunk) - num_logits[s], base + len(chunk)))
        query_start.append(len(input_ids))
        seq_lens.append(end)

    # Short rows are padded with the null block; attention masks those keys by position.
    tables = [table + [NULL_BLOCK] * (width - len(table)) for table in block_tables]
    # Every field travels in ONE pinned host-to-device copy (one int64 staging tensor), not one copy
    # per field: each copy costs the host tens of microseconds, and this is the CPU path's hot loop.
    fields = {  # name: (flat values, shape)
        "input_ids": (input_ids, (len(input_ids),)),
        "positions": (positions, (len(positions),)),
        "slot_mapping": (slots, (len(slots),)),
        "block_tables": ([b for row in tables for b in row], (num_seqs, width)),
        "seq_lens": (seq_lens, (num_seqs,)),
        "query_start_loc": (query_start, (num_seqs + 1,)),
        "padded_token_index": ([i for row in padded_index for i in row], (num_seqs, max_q)),
        "token_grid_index": (grid_index, (len(grid_index),)),
        "logits_indices": (logits_indices, (len(logits_indices),)),
    }
    staged = host_to_device([v for values, _ in fields.values() for v in values], torch.int64, device)
    views, offset = {}, 0
    for name, (values, shape) in fields.items():
        views[name] = staged[offset : offset + len(values)].view(shape)
        offset += len(values)
    int32 = {name: views[name].to(torch.int32) for name in ("block_tables", "seq_lens", "query_start_loc")}
    meta = AttentionMetadata(
        slot_mapping=views["slot_mapping"],
        block_tables=int32["block_tables"],
        seq_lens=int32["seq_lens"],
        query_start_loc=int32["query_start_loc"],
        padded_token_index=views["padded_token_index"],
        token_grid_index=views["token_grid_index"],
        logits_indices=views["logits_indices"],
        block_size=block_size,
        uniform_query_len=max_q if len(set(query_lens)) == 1 else None,
    )
    uniform = len(set(query_lens)) == 1 and len(set(num_logits)) == 1
    return ForwardInputs(views["input_ids"], views["positions"], meta,
                         query_len=max_q if uniform else None, logits_per_seq=num_logits[0] if uniform else None)

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

import itertools
from dataclasses import dataclass

import numpy as np
import torch

from protospec.model.attention import AttentionMetadata
from protospec.layout import NULL_BLOCK


@dataclass
class ForwardInputs:
    input_ids: torch.Tensor   # [T] int64
    positions: torch.Tensor   # [T] int64
    meta: AttentionMetadata
    # Host-side layout facts (no device read needed), used to pick a captured CUDA graph:
    # every sequence feeds `query_len` tokens and wants `logits_per_seq` logits; None = ragged.
    query_len: int | None = None
    logits_per_seq: int | None = None
    # The persistent_inputs.PersistentInputs these are views of (None: built for this forward alone);
    # typed loosely because that module builds on this one.
    persistent: object | None = None


# torch dtype -> numpy's: a list of Python ints becomes an array several times faster through numpy
# than through torch.tensor, and the engine stages a list like that (block tables, lengths) every step.
_NUMPY_DTYPES = {torch.int64: np.int64, torch.int32: np.int32, torch.float32: np.float32, torch.bool: np.bool_}


def host_to_device(values, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A Python list or numpy array as a device tensor, without a host sync: pinned memory makes the
    copy async."""
    if not isinstance(values, np.ndarray) and dtype in _NUMPY_DTYPES:
        values = np.asarray(values, dtype=_NUMPY_DTYPES[dtype])
    host = torch.from_numpy(values).to(dtype) if isinstance(values, np.ndarray) else torch.tensor(values, dtype=dtype)
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
    logits_per = [num_logits] * num_seqs if isinstance(num_logits, int) else list(num_logits)
    lens = [len(c) for c in token_chunks]
    for s, (n, start, table) in enumerate(zip(lens, start_positions, block_tables)):
        if len(table) * block_size < start + n:
            raise ValueError(f"sequence {s}: block table of {len(table)} blocks cannot hold {start + n} tokens")
    width = max(len(bt) for bt in block_tables)
    if max_blocks is not None:
        if width > max_blocks:
            raise ValueError(f"a block table has {width} blocks, more than max_blocks={max_blocks}")
        width = max_blocks
    max_q = max(lens)
    num_tokens = sum(lens)

    # Two ways to the same layout (tests/test_inputs.py pins both by hand and holds them equal): a
    # Python loop over tokens is cheapest for a decode step's few tokens; array operations win from a
    # few dozen tokens (a verify at batch 16, any prefill) and are an order of magnitude faster at
    # batch 64, where the loop cost the host more than the GPU's whole verify.
    by_token = num_tokens <= LOOP_MAX_TOKENS
    layout = _layout_by_token if by_token else _layout_by_arrays
    fields = layout(token_chunks, start_positions, lens, block_tables, block_size, logits_per, width, max_q)
    # Every field travels in ONE pinned host-to-device copy (one int64 staging tensor), not one copy
    # per field: each copy costs the host tens of microseconds, and this is the CPU path's hot loop.
    flat = [v for values, _ in fields.values() for v in values] if by_token else np.concatenate(
        [values for values, _ in fields.values()])
    staged = host_to_device(flat, torch.int64, device)
    views, offset = {}, 0
    for name, (values, shape) in fields.items():
        views[name] = staged[offset : offset + len(values)].view(shape)
        offset += len(values)
    int32 = {name: views[name].to(torch.int32) for name in ("block_tables", "seq_lens")}
    meta = AttentionMetadata(
        slot_mapping=views["slot_mapping"],
        block_tables=int32["block_tables"],
        seq_lens=int32["seq_lens"],
        padded_token_index=views["padded_token_index"],
        token_grid_index=views["token_grid_index"],
        logits_indices=views["logits_indices"],
        block_size=block_size,
        uniform_query_len=max_q if len(set(lens)) == 1 else None,
        whole_prompts=all(start == 0 for start in start_positions),
    )
    uniform = len(set(lens)) == 1 and len(set(logits_per)) == 1
    return ForwardInputs(views["input_ids"], views["positions"], meta,
                         query_len=max_q if uniform else None, logits_per_seq=logits_per[0] if uniform else None)


# Up to this many tokens a forward's layout is built token by token (see prepare_inputs).
LOOP_MAX_TOKENS = 32

Fields = dict  # name -> (flat int values, shape), in the order the staging copy packs them


def _layout_by_token(chunks, starts, lens, block_tables, block_size, logits_per, width, max_q) -> Fields:
    input_ids, positions, slots, grid_index, logits_indices, seq_lens = [], [], [], [], [], []
    padded_index = [0] * (len(chunks) * max_q)
    for s, (chunk, start, table) in enumerate(zip(chunks, starts, block_tables)):
        base = len(input_ids)
        for i, tok in enumerate(chunk):
            pos = start + i
            input_ids.append(tok)
            positions.append(pos)
            slots.append(table[pos // block_size] * block_size + pos % block_size)
            padded_index[s * max_q + i] = base + i
            grid_index.append(s * max_q + i)
        end = base + len(chunk)
        logits_indices.extend(range(end - logits_per[s], end))
        seq_lens.append(start + len(chunk))
    # Short rows are padded with the null block; attention masks those keys by position.
    tables = [b for table in block_tables for b in (*table, *[NULL_BLOCK] * (width - len(table)))]
    n, t = len(chunks), len(input_ids)
    return {"input_ids": (input_ids, (t,)), "positions": (positions, (t,)), "slot_mapping": (slots, (t,)),
            "block_tables": (tables, (n, width)), "seq_lens": (seq_lens, (n,)),
            "padded_token_index": (padded_index, (n, max_q)), "token_grid_index": (grid_index, (t,)),
            "logits_indices": (logits_indices, (len(logits_indices),))}


def _layout_by_arrays(chunks, starts, lens, block_tables, block_size, logits_per, width, max_q) -> Fields:
    num_seqs, num_tokens = len(chunks), sum(lens)
    lens, starts, logits_per = (np.asarray(v, dtype=np.int64) for v in (lens, starts, logits_per))   # [S] each
    tables = np.full((num_seqs, width), NULL_BLOCK, dtype=np.int64)                   # [S, width]
    for s, table in enumerate(block_tables):
        tables[s, : len(table)] = table
    query_start = np.zeros(num_seqs + 1, dtype=np.int64)                              # [S + 1]
    np.cumsum(lens, out=query_start[1:])
    seq_of = np.repeat(np.arange(num_seqs), lens)                                     # [T] token -> sequence
    within = np.arange(num_tokens) - query_start[seq_of]                              # [T] index in its chunk
    positions = starts[seq_of] + within                                               # [T]
    slots = tables[seq_of, positions // block_size] * block_size + positions % block_size
    padded_index = np.zeros((num_seqs, max_q), dtype=np.int64)                        # [S, max_q]
    padded_index[seq_of, within] = np.arange(num_tokens)
    seq_of_logit = np.repeat(np.arange(num_seqs), logits_per)                         # [sum(num_logits)]
    logit_start = np.zeros(num_seqs + 1, dtype=np.int64)
    np.cumsum(logits_per, out=logit_start[1:])
    logits_indices = ((query_start[1:] - logits_per)[seq_of_logit] + np.arange(len(seq_of_logit))
                      - logit_start[seq_of_logit])
    input_ids = np.fromiter(itertools.chain.from_iterable(chunks), np.int64, num_tokens)
    arrays = {"input_ids": input_ids, "positions": positions, "slot_mapping": slots, "block_tables": tables,
              "seq_lens": starts + lens, "padded_token_index": padded_index,
              "token_grid_index": seq_of * max_q + within, "logits_indices": logits_indices}
    return {name: (a.ravel(), a.shape) for name, a in arrays.items()}

"""Paged attention in plain torch: write K/V through a slot mapping, read it back through block tables.

KV cache layout, one tensor per layer:  [2, num_blocks, block_size, num_kv_heads, head_dim]
(index 0 = keys, 1 = values). A token at logical position `pos` of a sequence lives in
block `block_table[pos // block_size]` at offset `pos % block_size`; its flat slot is
`block * block_size + offset`.

Block 0 is the *null block*: the block manager never hands it out. Slot -1 ("skip this token")
is redirected to it, and short block-table rows are padded with it, so neither the write nor
the read needs a data-dependent branch (nothing here syncs with the host).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from protospec.layout import NULL_BLOCK



@dataclass
class AttentionMetadata:
    """What one forward needs to find each token's K/V. All tensors live on the model's device.

    Tokens of all sequences are flattened into one batch of T tokens, sequence by sequence. For
    attention the queries are scattered into a padded [num_seqs, max_query_len] grid and gathered back.
    """

    slot_mapping: torch.Tensor        # [T] int64, -1 = do not write this token's K/V
    block_tables: torch.Tensor        # [num_seqs, max_blocks] int32, padded with NULL_BLOCK
    seq_lens: torch.Tensor            # [num_seqs] int32, context length after this forward
    padded_token_index: torch.Tensor  # [num_seqs, max_query_len] int64, flat token per grid cell (pads -> 0)
    token_grid_index: torch.Tensor    # [T] int64, grid cell (s * max_query_len + i) of each flat token
    logits_indices: torch.Tensor      # [num_logits] int64, flat tokens whose logits the caller wants
    block_size: int
    # Host-side fact: every sequence feeds exactly this many tokens, so the flat batch IS the
    # [num_seqs, query_len] grid and attention can reshape instead of gathering. None = ragged.
    uniform_query_len: int | None = None
    # Host-side fact: every sequence's chunk is its whole context, from position 0 (a prompt's
    # prefill), so its keys are its own chunk's tokens and attention is causal over the chunk alone.
    whole_prompts: bool = False


@dataclass
class AttentionPlan:
    """What every layer's attention shares in one forward, computed once (not once per layer)."""

    safe_slots: torch.Tensor  # [T] int64, slot -1 redirected to the null block
    block_ids: torch.Tensor   # [num_seqs, max_blocks] int64
    mask: torch.Tensor        # [num_seqs, 1, max_query_len, max_blocks * block_size] additive: 0 or -inf


def plan_attention(positions: torch.Tensor, meta: AttentionMetadata, dtype: torch.dtype) -> AttentionPlan:
    # Skipped tokens (slot -1) land in the null block instead of being filtered: a boolean
    # filter would make the tensor's size data-dependent and force a host sync.
    safe_slots = torch.where(meta.slot_mapping >= 0, meta.slot_mapping, NULL_BLOCK * meta.block_size)
    if meta.uniform_query_len is not None:
        q_pos = positions.view(-1, meta.uniform_query_len)  # [S, Q]
    else:
        q_pos = positions[meta.padded_token_index]  # [S, Q]
    num_keys = meta.block_tables.shape[1] * meta.block_size
    key_pos = torch.arange(num_keys, device=positions.device)
    # A query sees every key at or before its own position. This is causal inside a verify
    # window, hides stale slots past the sequence's end, and hides null-block padding,
    # because block tables list blocks in logical order.
    visible = key_pos[None, None, :] <= q_pos[:, :, None]  # [S, Q, K] bool
    # Additive, in the model's dtype, made once: SDPA would convert a bool mask in every layer.
    mask = torch.zeros(visible.shape, dtype=dtype, device=positions.device).masked_fill_(~visible, float("-inf"))
    return AttentionPlan(safe_slots, meta.block_tables.long(), mask[:, None])


def write_kv(kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, safe_slots: torch.Tensor) -> None:
    """Store K/V of T tokens at their slots. key/value: [T, num_kv_heads, head_dim]."""
    num_blocks, block_size = kv_cache.shape[1], kv_cache.shape[2]
    flat = kv_cache.view(2, num_blocks * block_size, *kv_cache.shape[3:])  # [2, slots, kvh, d]
    flat[0].index_copy_(0, safe_slots, key.to(kv_cache.dtype))
    flat[1].index_copy_(0, safe_slots, value.to(kv_cache.dtype))


def gather_kv(kv_cache: torch.Tensor, block_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Read each sequence's K/V in logical order: two [num_seqs, max_blocks * block_size, kvh, d]."""
    blocks = kv_cache[:, block_ids.long()]  # [2, num_seqs, max_blocks, block_size, kvh, d]
    num_seqs, max_blocks, block_size = blocks.shape[1:4]
    blocks = blocks.reshape(2, num_seqs, max_blocks * block_size, *blocks.shape[4:])
    return blocks[0], blocks[1]


def paged_attention(
    query: torch.Tensor,      # [T, num_heads, head_dim]
    key: torch.Tensor,        # [T, num_kv_heads, head_dim]
    value: torch.Tensor,      # [T, num_kv_heads, head_dim]
    kv_cache: torch.Tensor,   # [2, num_blocks, block_size, num_kv_heads, head_dim]
    meta: AttentionMetadata,
    plan: AttentionPlan,
    scale: float,
) -> torch.Tensor:            # [T, num_heads, head_dim]
    write_kv(kv_cache, key, value, plan.safe_slots)
    keys, values = gather_kv(kv_cache, plan.block_ids)  # [S, K, kvh, d] each
    num_seqs, max_q = meta.padded_token_index.shape
    uniform = meta.uniform_query_len is not None
    q_grid = query.view(num_seqs, max_q, *query.shape[1:]) if uniform else query[meta.padded_token_index]  # [S, Q, h, d]
    out = F.scaled_dot_product_attention(
        q_grid.transpose(1, 2),                  # [S, h, Q, d]
        keys.transpose(1, 2).to(query.dtype),    # [S, kvh, K, d]
        values.transpose(1, 2).to(query.dtype),
        attn_mask=plan.mask,                     # [S, 1, Q, K]
        scale=scale,
        enable_gqa=keys.shape[2] != query.shape[1],
    )  # [S, h, Q, d]
    out = out.transpose(1, 2).reshape(num_seqs * max_q, *query.shape[1:])  # [S*Q, h, d]
    return out if uniform else out[meta.token_grid_index]


def prompt_attention(
    query: torch.Tensor,  # [S * L, num_heads, head_dim], L = query_len (a view may skip entries between rows)
    key: torch.Tensor,    # [S * L, num_kv_heads, head_dim], rotated: the keys these tokens stored
    value: torch.Tensor,  # [S * L, num_kv_heads, head_dim]
    query_len: int,
    scale: float,
) -> torch.Tensor:        # [S * L, num_heads * head_dim]
    """Attention of whole prompts (AttentionMetadata.whole_prompts: every sequence's chunk is its whole
    context, L tokens from position 0): causal SDPA over each sequence's own L keys, which are this
    forward's own K/V, so nothing is read back from the cache. SDPA takes its fused causal kernel, where
    a decode-shaped kernel walks the keys again for every chunk of 16 queries."""
    seqs, heads, head_dim = query.shape[0] // query_len, query.shape[1], query.shape[2]
    q, k, v = (t.view(seqs, query_len, t.shape[1], head_dim).transpose(1, 2) for t in (query, key, value))  # [S, heads, L, d]
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                         enable_gqa=key.shape[1] != heads)  # [S, h, L, d]
    return out.transpose(1, 2).reshape(seqs * query_len, -1)

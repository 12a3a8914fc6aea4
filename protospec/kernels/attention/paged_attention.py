"""Attention for decode-shaped forwards, read straight from the paged KV cache (Numba kernels).

Two work decompositions, each combining its own split-K partials:
  mma         (attention/mma.py)        by_kv_head's blocks with the products on tensor cores (warp
              mma, fp16): chosen for fp16 wherever its tile fits the cache blocks.
  by_kv_head  (attention/by_kv_head.py) a block per (sequence, KV head, row chunk, split), holding
              every query row that shares the KV head in registers, so a verify window reads each
              K/V row once instead of once per query token. Where mma does not apply (fp32, small blocks).
  combine     out = sum_c acc_c e^(m_c - M) / sum_c l_c e^(m_c - M) over the splits (attention/combine.py),
              by the last split block of each row group (one launch).
A head size neither takes (not 8 x a power of two, nor a multiple of 32 in float16) keeps the torch path.

No block-per-(query token, head, chunk of keys) path: it measured 1.5-7x slower than by_kv_head at
every shape timed (320 keys: data/results/2026-12-01_nvidia-h200_attention_cost_8f11270.json), since
its grid follows the block table's width, not the context, and each query token re-reads the keys.
No tiled by_kv_head without tensor cores either: 2.6-4.7x slower than by_kv_head at every shape
timed (data/results/README.md, "Attention by tiles").

Only uniform layouts (every sequence feeds query_len tokens: decode, draft step 1, verify) take
this path; token t belongs to sequence t // query_len.
"""
from __future__ import annotations

import functools

import torch
from numba import float32

from protospec.errors import KernelArgumentError
from protospec.kernels.attention import by_kv_head, mma as by_mma
from protospec.kernels.launch import dependent_launch as dependents, interop
from protospec.kernels.primitives.arrivals import arrival_counters
from protospec.kernels.launch.interop import check_tensor, cuda

PATHS = ("by_kv_head", "mma")
# by_kv_head's split-K (mma has its own, mma.BLOCKS_PER_SM) spreads a grid that does not fill the GPU until BLOCKS_PER_SM blocks per SM.
BLOCKS_PER_SM = 2


def supports(num_heads: int, head_dim: int, max_keys: int, dtype: torch.dtype, block_size: int,
             device: torch.device | None = None) -> bool:
    """Whether the kernels can serve a layout (checked on the host; otherwise use the torch path)."""
    return choose_path(head_dim, dtype, block_size, device) is not None and num_heads >= 1 and max_keys >= 1


@functools.cache
def _has_tensor_cores(device: torch.device) -> bool:
    """mma.m16n8k16 with fp16 operands: sm_80 and later (the simulator runs its Python twin)."""
    return interop.SIMULATOR or torch.cuda.get_device_capability(device) >= (8, 0)


def choose_path(head_dim: int, dtype: torch.dtype | None = None, block_size: int | None = None,
                device: torch.device | None = None) -> str | None:
    """mma for fp16 it can hold (block size a multiple of its 16-key tile, tensor cores), even for a single
    row: at 320 keys it measured faster than by_kv_head at every batch timed, 6 rows and 1 alike
    (tools/attention_cost.py; at one row the product uses 1 of its 16 rows, but the kernel spends its time
    on address arithmetic and loads, not on the product). by_kv_head wherever it holds the head size
    (fp32, or cache blocks of fewer than 16 keys); None for a head size neither holds."""
    if (dtype == torch.float16 and block_size is not None and by_mma.supports(head_dim, block_size)
            and (device is None or _has_tensor_cores(device))):
        return "mma"
    return "by_kv_head" if by_kv_head.supports(head_dim) else None


def choose_splits(groups: int, max_keys: int, step_keys: int, device: torch.device, blocks_per_sm: int | None = None,
                  min_keys: int = 0, max_splits: int | None = None) -> int:
    """The split-K factor of by_kv_head and mma: 1 where `groups` blocks already fill the GPU or the table
    is narrower than min_keys, else as many splits as keep the grid within blocks_per_sm (None:
    BLOCKS_PER_SM) blocks per SM, at most one per block-step (step_keys) of the widest possible context
    and at most max_splits. Within, not past: blocks past the target wait for a second wave, which
    cost more than the split saved wherever tools/attention_cost.py timed it (data/results/README.md)."""
    target = (blocks_per_sm or BLOCKS_PER_SM) * interop.sm_count(device)
    if groups >= target or max_keys < min_keys:
        return 1
    return max(1, min(target // groups, -(-max_keys // step_keys), max_splits or target))


def paged_attention(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor, positions: torch.Tensor,
                    query_len: int, scale: float, path: str | None = None, splits: int | None = None,
                    dependent_launch: bool = False) -> torch.Tensor:
    """q [T, h, d] (K/V of these tokens already in the cache) -> [T, h * d].
    path: one of PATHS; None chooses by shape (choose_path).
    splits: the split-K factor (None: choose_splits).
    dependent_launch: mma's kernel launched as a programmatic dependent (launch/dependent_launch.py)."""
    check_tensor("q", q, q.dtype, 3)
    check_tensor("kv_cache", kv_cache, q.dtype, 5)
    check_tensor("block_tables", block_tables, torch.int32, 2)
    check_tensor("positions", positions, torch.int64, 1, rows=q.shape[0])
    tokens, heads, head_dim = q.shape
    kv_heads, num_seqs = kv_cache.shape[3], block_tables.shape[0]
    max_keys = block_tables.shape[1] * kv_cache.shape[2]
    if not supports(heads, head_dim, max_keys, q.dtype, kv_cache.shape[2], q.device):
        raise KernelArgumentError(f"paged_attention: head_dim {head_dim} is not served (8 x a power of two up to "
                                  f"{by_kv_head.MAX_HEAD_DIM}, or in float16 a multiple of 32 up to {by_mma.MAX_HEAD_DIM})")
    if kv_cache.shape[4] != head_dim or heads % kv_heads or tokens != num_seqs * query_len:
        raise KernelArgumentError(f"paged_attention: {heads} heads of {head_dim} over {kv_heads} kv heads of "
                                  f"{kv_cache.shape[4]}, {tokens} tokens for {num_seqs} sequences x query_len {query_len}")
    if path is None:
        path = choose_path(head_dim, q.dtype, kv_cache.shape[2], q.device)
    elif path not in PATHS:
        raise KernelArgumentError(f"paged_attention: path must be one of {PATHS}, got {path!r}")
    elif path == "by_kv_head" and not by_kv_head.supports(head_dim):
        raise KernelArgumentError(f"paged_attention: by_kv_head takes head_dim = 8 x a power of two up to "
                                  f"{by_kv_head.MAX_HEAD_DIM}, got {head_dim}")
    elif path == "mma" and (q.dtype != torch.float16 or not by_mma.supports(head_dim, kv_cache.shape[2])):
        raise KernelArgumentError(f"paged_attention: mma takes float16 with head_dim a multiple of 32 up to "
                                  f"{by_mma.MAX_HEAD_DIM} and blocks of a multiple of {by_mma.TILE} keys, got {q.dtype}, "
                                  f"head_dim {head_dim}, block size {kv_cache.shape[2]}")
    elif path == "mma" and not _has_tensor_cores(q.device):
        raise KernelArgumentError(f"paged_attention: mma needs tensor cores of compute capability 8.0 or later, "
                                  f"{q.device} has {torch.cuda.get_device_capability(q.device)}")
    if dependent_launch and not dependents.supported(q.device):
        raise KernelArgumentError(f"paged_attention: dependent_launch needs compute capability 9.0 or later ({q.device})")
    if splits is not None and splits < 1:
        raise KernelArgumentError(f"paged_attention: splits must be >= 1, got {splits}")
    dev = q.device
    out = torch.empty(tokens, heads * head_dim, dtype=q.dtype, device=dev)
    group_rows = query_len * (heads // kv_heads)
    block_size = kv_cache.shape[2]
    if path == "by_kv_head":
        rows = by_kv_head.rows_per_block(group_rows, num_seqs * kv_heads, interop.sm_count(dev))
        groups = num_seqs * kv_heads * -(-group_rows // rows)
        parts = splits or choose_splits(groups, max_keys, by_kv_head.keys_in_flight(head_dim, rows, block_size), dev)
        kernel, grid = by_kv_head.attention_kernel(rows, head_dim, block_size, heads // kv_heads), groups * parts
        threads = by_kv_head.threads_per_block(head_dim)
    else:
        groups = num_seqs * kv_heads * -(-group_rows // by_mma.rows_per_chunk(group_rows))
        warps = (by_mma.SIMULATOR_WARPS if interop.SIMULATOR
                 else by_mma.warps_per_block(groups, interop.sm_count(dev), group_rows, head_dim))
        parts = splits or choose_splits(groups, max_keys, by_mma.keys_per_split(warps), dev, by_mma.BLOCKS_PER_SM,
                                        by_mma.MIN_SPLIT_KEYS, by_mma.MAX_SPLITS)
        kernel, grid, threads = (by_mma.attention_kernel(group_rows, head_dim, warps, heads // kv_heads, dependent_launch),
                                 groups * parts, 32 * warps)
    if parts == 1:  # writes out itself; placeholders of the right rank, separate
        # tensors (the simulator copies each array argument back after the kernel)
        part_acc = torch.empty(1, 1, 1, dtype=torch.float32, device=dev)
        part_max, part_sum = (torch.empty(1, 1, dtype=torch.float32, device=dev) for _ in range(2))
    else:
        part_acc = torch.empty(tokens * heads, parts, head_dim, dtype=torch.float32, device=dev)
        part_max, part_sum = (torch.empty(tokens * heads, parts, dtype=torch.float32, device=dev) for _ in range(2))
    counters = arrival_counters(dev, groups)  # the row groups' arrivals, read only with split-K
    # mma reads fp16 as 8-byte words (4 dims of a query or key per load)
    words = (q.view(torch.int64), kv_cache.view(torch.int64)) if path == "mma" else (q, kv_cache)
    args = [*words, block_tables, positions, int(query_len), float(scale), out, part_acc, part_max, part_sum, counters]
    interop.launch_tensors(kernel, grid, threads, args, dependent=dependent_launch and path == "mma")
    return out

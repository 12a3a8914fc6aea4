"""Paged attention on tensor cores: by_kv_head's blocks, with the products as warp matrix multiplies.

Why: by_kv_head holds each query row and its output in every lane's registers and sums each score
over 8 lanes by shuffles, so a 6-query verify window at batch 16 or 64 runs at the register cap,
spills, and spends its time on shuffles, exponentials and rescales per (row, key), far from the
bytes it reads. Here a warp takes 16 keys at a time and two `mma.m16n8k16` products per 8 keys and
16 dims (primitives/warp_mma.py) do the multiply-adds: S = Q K^T with the rows as M (up to 16 query rows of
the group: query tokens x heads sharing the KV head) and the keys as N, then O += P V with the
keys as K. The scores land in the very registers the second product takes P from (the C fragment of
S is the A fragment of P), so nothing moves between the two but a conversion to fp16 pairs.

The loads follow the fragments, with the head's dims permuted (any fixed permutation of the summed
dims leaves Q K^T unchanged, and the output's permutation is undone on the way out): a lane loads
8-byte words of K (4 consecutive dims of one key; the 4 lanes of a key read 32 contiguous bytes)
and of V (NT consecutive dims of 4 keys, NT = head_dim / 8), and packs V's halves into the (key,
key + 1) pairs the B operand wants. fp16 only (the operands), head_dim a multiple of 32 up to 128,
cache blocks a multiple of 16 keys (a 16-key tile never straddles two blocks). Softmax in fp32, per row
over the 4 lanes that hold it (2 shuffles), P rounded to fp16 for the second product.

A block is 2-8 warps (warps_per_block: by the grid's size) on interleaved 16-key tiles of its split;
the tail (warps' merge, split-K partials, the last split block's combine) is by_kv_head's (attention/combine.py).
Why the loads have no branch, and what was timed and dropped: data/results/README.md.
"""
from __future__ import annotations

import functools

from protospec.kernels.launch import interop
from protospec.kernels.attention.mma_kernel import TILE, make_mma_kernel

MAX_WARPS = 8             # warps a block (each walks its own 16-key tiles): 8 x 32 threads, two blocks per SM
WARPS_PER_SM = 12
SIMULATOR_WARPS = 2       # the simulator runs an OS thread per lane: the merge across warps with few of them
FASTMATH = True
# Split-K spreads a grid of fewer blocks than SMs up to this many blocks per SM (paged_attention.choose_splits),
# with at least TILES_PER_SPLIT steps of the block's keys per split (keys_per_split), and only for block
# tables at least MIN_SPLIT_KEYS wide: in a narrower one a split's partials and their combine cost more
# than the walk they save (tools/attention_cost.py times the split factors by context); at most MAX_SPLITS,
# the most timed to pay.
BLOCKS_PER_SM = 1
TILES_PER_SPLIT = 2
MIN_SPLIT_KEYS = 1024
MAX_SPLITS = 4
MAX_HEAD_DIM = 128        # a lane holds ~head_dim * 1.5 words of Q, K, V and O: beyond 128 they would spill
# The warps' merged rows live in static shared memory (48 KB at most per block): keep them under this.
MERGE_BYTES = 40 * 1024


def supports(head_dim: int, block_size: int) -> bool:
    """head_dim: a multiple of 32 (whole 8-byte words of V per lane) up to MAX_HEAD_DIM; cache blocks
    of a multiple of 16 keys (a tile never straddles two)."""
    return head_dim % 32 == 0 and 32 <= head_dim <= MAX_HEAD_DIM and block_size % TILE == 0


def rows_per_chunk(group_rows: int) -> int:
    """8 rows (the A operand's upper half left zero, its softmax skipped) or 16."""
    return 8 if group_rows <= 8 else 16


def warps_per_block(groups: int, sm_count: int, group_rows: int = 1, head_dim: int = 64) -> int:
    """About WARPS_PER_SM warps on each SM over the grid's `groups` blocks, a power of two in
    [2, MAX_WARPS]: a warp walks its tiles one after another (each waits out its loads), so a small
    grid wants more warps per block, a large one more blocks per SM. At a 6-query verify of the seed
    target this gives 8 at batch 1 and 16, 2 at batch 64 (at ~100 registers a thread two blocks of 8
    warps fit on an SM).
    Fewer where the warps' merged rows (rows x (head_dim + 1) floats each) would pass MERGE_BYTES."""
    fit = MERGE_BYTES // (rows_per_chunk(group_rows) * (head_dim + 1) * 4)
    want = min(WARPS_PER_SM * sm_count // max(1, groups), MAX_WARPS, fit)
    warps = 2
    while warps * 2 <= want:
        warps *= 2
    return warps


def keys_in_flight(warps: int) -> int:
    return TILE * warps


def keys_per_split(warps: int) -> int:
    """The fewest keys (of the widest context the block table allows) worth a split of their own:
    TILES_PER_SPLIT steps of the block (in tables at least MIN_SPLIT_KEYS wide)."""
    return keys_in_flight(warps) * TILES_PER_SPLIT


def attention_kernel(group_rows: int, head_dim: int, warps: int, group: int, dependent: bool = False):
    """The kernel for a row group of `group_rows` (query tokens x `group` heads sharing a KV head),
    compiled on first use; dependent: it issues the loads no kernel of this forward writes, waits for
    the kernel before it, then lets the next one launch (a programmatic dependent launch:
    launch/dependent_launch.py). No launch bounds: the compiler chooses the registers (bounds of 4-5 blocks
    per SM spilled and ran slower: data/results/README.md)."""
    return _compiled(rows_per_chunk(group_rows), head_dim, warps, group, dependent)


@functools.cache
def _compiled(rows: int, head_dim: int, warps: int, group: int, dependent: bool):
    options = {} if interop.SIMULATOR else {"fastmath": FASTMATH}
    return make_mma_kernel(rows // 8, head_dim, warps, group, options, dependent)

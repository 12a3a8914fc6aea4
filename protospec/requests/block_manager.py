"""A fixed pool of KV blocks shared by target and draft.

Both models' caches have the same number of blocks and every sequence has ONE block table that
indexes both, as in vLLM: token i of a sequence lives in the same (block, offset) in the target's
cache and in the draft's.
"""
from __future__ import annotations

from protospec.layout import NULL_BLOCK
from protospec.errors import OutOfKVBlocksError


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 2:
            raise OutOfKVBlocksError(f"a KV pool needs at least 2 blocks (one is the null block), got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # Block 0 is the null block (attention.py): never handed out.
        self._free: list[int] = [b for b in range(num_blocks - 1, -1, -1) if b != NULL_BLOCK]

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    def ensure_capacity(self, block_table: list[int], num_tokens: int) -> None:
        """Grow `block_table` in place until it holds `num_tokens` slots. All or nothing."""
        needed = blocks_for(num_tokens, self.block_size) - len(block_table)
        if needed <= 0:
            return
        if needed > len(self._free):
            raise OutOfKVBlocksError(
                f"out of KV blocks: need {needed} more blocks of {self.block_size} tokens for "
                f"{num_tokens} tokens, {len(self._free)} free of {self.num_usable_blocks}"
            )
        for _ in range(needed):
            block_table.append(self._free.pop())

    def shrink(self, block_table: list[int], num_tokens: int) -> None:
        """Free the tail blocks that `num_tokens` slots do not need (unused lookahead)."""
        keep = blocks_for(num_tokens, self.block_size)
        while len(block_table) > keep:
            self._free.append(block_table.pop())

    def free(self, block_table: list[int]) -> None:
        self.shrink(block_table, 0)

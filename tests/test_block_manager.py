import pytest

from protospec import OutOfKVBlocksError
from protospec.layout import NULL_BLOCK
from protospec.requests.block_manager import BlockManager, blocks_for


def test_allocate_grow_shrink_free_and_never_hand_out_the_null_block():
    bm = BlockManager(num_blocks=9, block_size=4)
    assert bm.num_free_blocks == 8
    table = []
    bm.ensure_capacity(table, 5)           # 2 blocks
    assert len(table) == 2 and NULL_BLOCK not in table
    bm.ensure_capacity(table, 5 + 6)       # lookahead for k = 5 -> 11 slots, 3 blocks
    assert len(table) == 3
    bm.shrink(table, 8)                    # 8 tokens kept -> 2 blocks
    assert len(table) == 2 and bm.num_free_blocks == 6
    bm.free(table)
    assert table == [] and bm.num_free_blocks == 8


def test_out_of_blocks_is_a_clear_error_and_changes_nothing():
    bm = BlockManager(num_blocks=4, block_size=4)
    a = []
    bm.ensure_capacity(a, 8)
    b = [ ]
    with pytest.raises(OutOfKVBlocksError, match="need 2 more blocks.*1 free"):
        bm.ensure_capacity(b, 8)
    assert b == [] and bm.num_free_blocks == 1 and len(a) == 2
    bm.ensure_capacity(b, 4)  # still usable
    assert len(set(a) | set(b)) == 3


def test_blocks_for():
    assert [blocks_for(n, 16) for n in (0, 1, 16, 17, 32)] == [0, 1, 1, 2, 2]

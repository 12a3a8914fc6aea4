import torch

from protospec.layout import NULL_BLOCK
from protospec.model.inputs import prepare_inputs


def test_prepare_inputs_ragged_batch_across_block_boundaries():
    block_size = 4
    tables = [[7, 3], [5, 9, 2]]
    # seq 0: two new tokens at positions 3, 4 (crossing from block 7 into block 3)
    # seq 1: one new token at position 9 (block 2, offset 1)
    inp = prepare_inputs([[11, 12], [13]], [3, 9], tables, block_size, [2, 1], torch.device("cpu"))
    m = inp.meta
    assert inp.input_ids.tolist() == [11, 12, 13]
    assert inp.positions.tolist() == [3, 4, 9]
    assert m.slot_mapping.tolist() == [7 * 4 + 3, 3 * 4 + 0, 2 * 4 + 1]
    assert m.seq_lens.tolist() == [5, 10]
    assert m.query_start_loc.tolist() == [0, 2, 3]
    assert m.block_tables.tolist() == [[7, 3, NULL_BLOCK], [5, 9, 2]]
    assert m.padded_token_index.tolist() == [[0, 1], [2, 0]]
    assert m.token_grid_index.tolist() == [0, 1, 2]
    assert m.logits_indices.tolist() == [0, 1, 2]
    assert m.block_tables.dtype == torch.int32 and m.slot_mapping.dtype == torch.int64


def test_prepare_inputs_refuses_a_table_too_short():
    import pytest

    with pytest.raises(ValueError, match="cannot hold"):
        prepare_inputs([[1, 2]], [3], [[4]], 4, 1, torch.device("cpu"))

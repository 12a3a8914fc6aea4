import pytest
import torch

from protospec.layout import NULL_BLOCK
from protospec.model.inputs import prepare_inputs


@pytest.mark.parametrize("loop_max_tokens", [10**9, 0], ids=["by_token", "by_arrays"])
def test_prepare_inputs_ragged_batch_across_block_boundaries(monkeypatch, loop_max_tokens):
    from protospec.model import inputs

    monkeypatch.setattr(inputs, "LOOP_MAX_TOKENS", loop_max_tokens)
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
    assert m.block_tables.tolist() == [[7, 3, NULL_BLOCK], [5, 9, 2]]
    assert m.padded_token_index.tolist() == [[0, 1], [2, 0]]
    assert m.token_grid_index.tolist() == [0, 1, 2]
    assert m.logits_indices.tolist() == [0, 1, 2]
    assert m.block_tables.dtype == torch.int32 and m.slot_mapping.dtype == torch.int64


def test_prepare_inputs_refuses_a_table_too_short():
    import pytest

    with pytest.raises(ValueError, match="cannot hold"):
        prepare_inputs([[1, 2]], [3], [[4]], 4, 1, torch.device("cpu"))


def _fields(inputs) -> dict:
    m = inputs.meta
    return {"input_ids": inputs.input_ids, "positions": inputs.positions, "slot_mapping": m.slot_mapping,
            "token_grid_index": m.token_grid_index, "logits_indices": m.logits_indices,
            "padded_token_index": m.padded_token_index, 
            "seq_lens": m.seq_lens, "block_tables": m.block_tables}


def test_both_ways_to_the_layout_agree_on_random_ragged_batches(monkeypatch):
    """The token loop (pinned by hand above, for both ways) and the array operations give the same
    fields, shapes and dtypes for any batch; each is forced in turn through the size threshold."""
    import random

    from protospec.model import inputs

    rng = random.Random(0)
    for trial in range(40):
        block_size = rng.choice([1, 4, 16])
        num_seqs = rng.randint(1, 9)
        chunks = [[rng.randrange(1000) for _ in range(rng.randint(1, 12))] for _ in range(num_seqs)]
        starts = [rng.randint(0, 40) for _ in range(num_seqs)]
        tables = [rng.sample(range(1, 500), -(-(st + len(c)) // block_size) + rng.randint(0, 2))
                  for c, st in zip(chunks, starts)]
        logits = [rng.randint(1, len(c)) for c in chunks]
        width = max(len(t) for t in tables) + trial % 3
        built = []
        for threshold in (10**9, 0):  # by token, then by arrays
            monkeypatch.setattr(inputs, "LOOP_MAX_TOKENS", threshold)
            built.append(prepare_inputs(chunks, starts, tables, block_size, logits, torch.device("cpu"), max_blocks=width))
        by_token, by_arrays = (_fields(b) for b in built)
        for name, tensor in by_token.items():
            assert tensor.dtype == by_arrays[name].dtype and torch.equal(tensor, by_arrays[name]), (trial, name)
        uniform = len({len(c) for c in chunks}) == 1
        for b in built:
            assert b.meta.uniform_query_len == (len(chunks[0]) if uniform else None)
            assert b.query_len == (len(chunks[0]) if uniform and len(set(logits)) == 1 else None)


def test_prepare_inputs_names_the_sequence_whose_table_is_short_and_the_width_overflow():
    import pytest

    with pytest.raises(ValueError, match="sequence 1: block table of 1 blocks cannot hold 6 tokens"):
        prepare_inputs([[1], [2, 3]], [0, 4], [[4], [5]], 4, 1, torch.device("cpu"))
    with pytest.raises(ValueError, match="more than max_blocks=1"):
        prepare_inputs([[1]], [0], [[4, 5]], 4, 1, torch.device("cpu"), max_blocks=1)

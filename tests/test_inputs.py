import pytest
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


def _per_token_reference(chunks, starts, tables, block_size, num_logits, width):
    """The layout's definition, one token at a time (prepare_inputs computes it in array operations)."""
    out = {k: [] for k in ("input_ids", "positions", "slot_mapping", "token_grid_index", "logits_indices")}
    max_q = max(len(c) for c in chunks)
    padded = [[0] * max_q for _ in chunks]
    query_start, seq_lens = [0], []
    for s, (chunk, start, table) in enumerate(zip(chunks, starts, tables)):
        base = len(out["input_ids"])
        for i, tok in enumerate(chunk):
            pos = start + i
            out["input_ids"].append(tok)
            out["positions"].append(pos)
            out["slot_mapping"].append(table[pos // block_size] * block_size + pos % block_size)
            out["token_grid_index"].append(s * max_q + i)
            padded[s][i] = base + i
        out["logits_indices"].extend(range(base + len(chunk) - num_logits[s], base + len(chunk)))
        query_start.append(len(out["input_ids"]))
        seq_lens.append(start + len(chunk))
    out.update(padded_token_index=padded, query_start_loc=query_start, seq_lens=seq_lens,
               block_tables=[t + [NULL_BLOCK] * (width - len(t)) for t in tables])
    return out


@pytest.mark.parametrize("loop_max_tokens", [0, 10**9], ids=["by_arrays", "by_token"])
def test_prepare_inputs_matches_its_per_token_definition_on_random_ragged_batches(monkeypatch, loop_max_tokens):
    import random

    from protospec.model import inputs

    monkeypatch.setattr(inputs, "LOOP_MAX_TOKENS", loop_max_tokens)  # each way to the layout in turn
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
        got = prepare_inputs(chunks, starts, tables, block_size, logits, torch.device("cpu"), max_blocks=width)
        want = _per_token_reference(chunks, starts, tables, block_size, logits, width)
        m = got.meta
        fields = {"input_ids": got.input_ids, "positions": got.positions, "slot_mapping": m.slot_mapping,
                  "token_grid_index": m.token_grid_index, "logits_indices": m.logits_indices,
                  "padded_token_index": m.padded_token_index, "query_start_loc": m.query_start_loc,
                  "seq_lens": m.seq_lens, "block_tables": m.block_tables}
        for name, tensor in fields.items():
            assert tensor.tolist() == want[name], (trial, name)
        uniform = len({len(c) for c in chunks}) == 1
        assert m.uniform_query_len == (len(chunks[0]) if uniform else None)
        assert got.query_len == (len(chunks[0]) if uniform and len(set(logits)) == 1 else None)


def test_prepare_inputs_names_the_sequence_whose_table_is_short_and_the_width_overflow():
    import pytest

    with pytest.raises(ValueError, match="sequence 1: block table of 1 blocks cannot hold 6 tokens"):
        prepare_inputs([[1], [2, 3]], [0, 4], [[4], [5]], 4, 1, torch.device("cpu"))
    with pytest.raises(ValueError, match="more than max_blocks=1"):
        prepare_inputs([[1]], [0], [[4, 5]], 4, 1, torch.device("cpu"), max_blocks=1)

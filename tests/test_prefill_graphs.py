"""Prefills replayed as CUDA graphs: which layouts get one, and on a GPU the same tokens as the eager
prefill."""
import pytest
import torch
from tiny import random_prompts, tiny_llm

from protospec import SamplingParams
from protospec.layout import NULL_BLOCK
from protospec.model import graphs
from protospec.model.graphs import GraphCache
from protospec.model.inputs import prepare_inputs


def _prefill(lengths, block_size=4):
    """A CPU-prepared prefill of one prompt per length (block tables just long enough)."""
    tables, start = [], 1
    for n in lengths:
        blocks = -(-n // block_size)
        tables.append(list(range(start, start + blocks)))
        start += blocks
    return prepare_inputs([[5] * n for n in lengths], [0] * len(lengths), tables, block_size, 1, torch.device("cpu"))


def test_a_prefill_layout_gets_a_graph_when_it_repeats_and_while_there_is_room(monkeypatch):
    monkeypatch.setattr(graphs, "MAX_PREFILL_GRAPHS", 2)
    cache = GraphCache(None, [], 4, max_rows=4, max_blocks=64)
    assert [cache.take_prefill(_prefill([32])) for _ in range(3)] == [False, True, True]  # from the second on
    assert not cache.take_prefill(_prefill([20, 20]))       # another layout: eager the first time
    assert not cache.take_prefill(_prefill([24, 24, 24]))   # a third layout (its rows bucket to 4)
    assert cache.take_prefill(_prefill([20, 20]))           # repeated: the second and last graph
    assert not cache.take_prefill(_prefill([24, 24, 24]))   # full: a repeat stays eager
    assert cache.take_prefill(_prefill([32])) and len(cache.prefill_keys) == 2
    assert _prefill([5, 7]).query_len is None  # ragged prompts have no uniform layout to replay


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_prefill_graphs_give_the_eager_tokens(tiny_target, tiny_draft, temperature):
    prompts = random_prompts(2, lengths=(24,), seed=3)  # one length: a uniform prefill layout
    params = SamplingParams(temperature=temperature, max_tokens=20, ignore_eos=True, seed=4)
    calls = 5
    llm = tiny_llm(tiny_target, tiny_draft, k=3, device="cuda", draft_loop="graph")
    outs = [[o.token_ids for o in llm.generate(prompts, params)] for _ in range(calls)]
    # The first call's prefill runs eager (a layout seen once); the second captures it, the rest replay:
    # each replayed or captured prefill gives the eager call's tokens (seeded sampling).
    assert all(out == outs[0] for out in outs[1:])
    replays = calls - 1
    assert llm.counters["target"]["forward:graph_prefill"] == replays == llm.counters["draft"]["forward:graph_prefill"]


@pytest.mark.parametrize("prompts", [1, 3], ids=["one_row", "padded_to_four_rows"])
def test_a_prefill_through_the_static_buffers_gives_the_eager_logits(tiny_target, tiny_draft, prompts):
    """What a prefill graph captures, run eagerly on the CPU: the batch copied into its layout's
    fixed buffers (rows padded to a power of two; the block table's width to a bucket) gives the eager
    forward's logits. A padding row left from a fuller batch of the same layout writes no K/V a
    sequence can read (its slots are reset to -1, which lands in the null block)."""
    llm = tiny_llm(tiny_target, tiny_draft, k=3)
    runner = llm.engine.target
    cache = GraphCache(runner.model, runner.kv_caches, runner.block_size, max_rows=4, max_blocks=64)
    blocks = -(-19 // runner.block_size)
    tables = [list(range(1 + i * blocks, 1 + (i + 1) * blocks)) for i in range(4)]
    chunks = [torch.randint(3, 200, (19,), generator=torch.Generator().manual_seed(i)).tolist() for i in range(4)]
    if prompts > 1:  # the layout's buffers last held four real rows
        cache.static_inputs(runner.prepare("prefill", chunks, [0] * 4, tables, 1))
    inputs = runner.prepare("prefill", chunks[:prompts], [0] * prompts, tables[:prompts], 1)
    eager = runner.model(inputs.input_ids, inputs.positions, runner.kv_caches, inputs.meta)  # [prompts, V]
    written = torch.stack([c.clone() for c in runner.kv_caches])
    key, static = cache.static_inputs(inputs)
    assert key[1] == (1 if prompts == 1 else 4) and static.meta.block_tables.shape[1] == 8
    replayed = runner.model(static.input_ids, static.positions, runner.kv_caches, static.meta)[:prompts]
    torch.testing.assert_close(replayed, eager, rtol=1e-5, atol=1e-5)
    real = slice(NULL_BLOCK + 1, None)  # every block but the null block: the fourth row's stay empty
    assert torch.equal(torch.stack(runner.kv_caches)[:, :, real], written[:, :, real])

"""Prefills replayed as CUDA graphs (graphs.PREFILL_GRAPHS): which layouts get one, and on a GPU
the same tokens as the eager prefill."""
import pytest
import torch
from tiny import random_prompts, tiny_llm

from protospec import SamplingParams
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
def test_prefill_graphs_give_the_eager_tokens(tiny_target, tiny_draft, temperature, monkeypatch):
    prompts = random_prompts(2, lengths=(24,), seed=3)  # one length: a uniform prefill layout
    params = SamplingParams(temperature=temperature, max_tokens=20, ignore_eos=True, seed=4)
    outs, counters = {}, {}
    for on in (False, True):
        monkeypatch.setattr(graphs, "PREFILL_GRAPHS", on)
        llm = tiny_llm(tiny_target, tiny_draft, k=3, device="cuda", draft_loop="graph")
        outs[on] = [[o.token_ids for o in llm.generate(prompts, params)] for _ in range(3)]
        counters[on] = llm.counters
    assert outs[True] == outs[False]
    assert counters[True]["target"]["forward:graph_prefill"] == 2 == counters[True]["draft"]["forward:graph_prefill"]
    assert "forward:graph_prefill" not in counters[False]["target"]

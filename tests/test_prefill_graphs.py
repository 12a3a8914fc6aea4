"""Prefills replayed as CUDA graphs (EngineConfig.prefill_graphs): which layouts get one, and on a GPU
the same tokens as the eager prefill; the draft's prefill beside the target's (draft_prefill_side)."""
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
    outs, counters, calls = {}, {}, 5
    for on in (False, True):
        llm = tiny_llm(tiny_target, tiny_draft, k=3, device="cuda", draft_loop="graph", prefill_graphs=on)
        outs[on] = [[o.token_ids for o in llm.generate(prompts, params)] for _ in range(calls)]
        counters[on] = llm.counters
    assert outs[True] == outs[False]
    # The first call's prefill runs eager (a layout seen once); the second captures it, the rest replay.
    replays = calls - 1
    assert counters[True]["target"]["forward:graph_prefill"] == replays == counters[True]["draft"]["forward:graph_prefill"]
    assert "forward:graph_prefill" not in counters[False]["target"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_draft_prefill_beside_the_target_gives_the_same_tokens(tiny_target, tiny_draft, temperature):
    """Eager the first time, captured the second, replayed the third: on its own stream each time, and
    draft step 1 must see the draft's whole cache (a missing wait shows as other draft tokens)."""
    prompts = random_prompts(2, lengths=(24,), seed=5)
    params = SamplingParams(temperature=temperature, max_tokens=20, ignore_eos=True, seed=6)
    outs = {}
    for side in (False, True):
        llm = tiny_llm(tiny_target, tiny_draft, k=3, device="cuda", draft_loop="graph", draft_prefill_side=side)
        outs[side] = [[o.token_ids for o in llm.generate(prompts, params)] for _ in range(5)]
        assert (llm.engine.prefill._stream is not None) is side
    assert outs[True] == outs[False]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_draft_prefill_graphs_are_captured_on_a_stream_of_their_own(tiny_target, tiny_draft):
    """Replayed beside the target's, the draft's prefill graphs must not be captured on the stream the
    target's were (cuBLAS's workspace goes by stream: graphs.CapturedForward): they get a
    high-priority stream, apart from the low-priority ones torch captures on; decode graphs do not.
    (The tokens tests above show a shared workspace only now and then.)"""
    prompts = random_prompts(2, lengths=(24,), seed=5)
    llm = tiny_llm(tiny_target, tiny_draft, k=3, device="cuda", draft_loop="graph", draft_prefill_side=True)
    for _ in range(2):  # the second captures both prefill graphs
        llm.generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True))
    draft, target = llm.engine.draft, llm.engine.target
    assert draft.counters["forward:graph_prefill"] == 1 == target.counters["forward:graph_prefill"]
    capture = draft.graphs.prefill_capture_stream
    assert capture is not None and capture.priority < 0 and torch.cuda.Stream().priority == 0
    assert capture != llm.engine.prefill._stream and target.graphs.prefill_capture_stream is None


def test_only_prefill_graphs_take_the_prefill_capture_stream(monkeypatch):
    """GraphCache.run captures a prefill layout on prefill_capture_stream and any other on torch's."""
    captured = []

    class Recorded:  # CapturedForward's stand-in: notes the stream, replays nothing
        def __init__(self, model, kv_caches, inputs, stream=None):
            captured.append(stream)

        def replay(self):
            return torch.zeros(4, 8)

    monkeypatch.setattr(graphs, "CapturedForward", Recorded)
    cache = GraphCache(None, [], 4, max_rows=4, max_blocks=64)
    cache.prefill_capture_stream = stream = object()  # any stream: only passed along
    prefill = _prefill([32])
    cache.prefill_keys.add(cache._key(prefill))
    cache.run(prefill)
    cache.run(_prefill([3]))  # another layout (not a prefill graph's): torch's capture stream
    assert captured == [stream, None]


def test_the_draft_prefill_stays_on_the_current_stream_off_a_gpu(tiny_target, tiny_draft):
    llm = tiny_llm(tiny_target, tiny_draft, k=3, draft_prefill_side=True)
    assert llm.engine.config.draft_prefill_side and not llm.engine.prefill.side
    out = llm.generate(random_prompts(1, lengths=(9,), seed=2), SamplingParams(max_tokens=4, ignore_eos=True))
    assert len(out[0].token_ids) == 4 and llm.engine.prefill._stream is None


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

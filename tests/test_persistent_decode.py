"""The persistent decode kernel (one cooperative launch per forward) against the model's torch
forward: logits, and the K/V it writes into the paged cache, for a batch of decode tokens of a GQA
model with contexts across block boundaries (the simulator runs it as one block of one warp)."""
import pytest
import torch
from tiny import TARGET_CFG

from protospec.errors import KernelArgumentError
from protospec.kernels import persistent_decode
from protospec.kernels.interop import KERNEL_DEVICE_TYPE
from protospec.model.config import LlamaArchConfig
from protospec.model.inputs import prepare_inputs
from protospec.model.llama import LlamaForCausalLM
from protospec.model.persistent_forward import PersistentDecodeForward

DEV = KERNEL_DEVICE_TYPE


def test_one_persistent_launch_gives_the_torch_forwards_logits_and_cache(monkeypatch):
    # 2 layers (the stacked weights indexed by layer), 4 heads over 2 KV heads of 8; small sizes: the
    # simulator runs every (token, row) of every GEMV as its own warp step. 37 keys: its one warp takes
    # two 32-key chunks of attention (the online softmax across chunks), the last one partly masked
    cfg = LlamaArchConfig.from_dict(dict(TARGET_CFG, hidden_size=32, intermediate_size=64, vocab_size=64))
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).place(DEV, torch.float32)
    block_size, num_blocks, lengths = 4, 14, [37, 6]
    gen = torch.Generator().manual_seed(3)
    free = torch.randperm(num_blocks - 1, generator=gen).add(1).tolist()  # block 0: the null block
    tables = [[free.pop() for _ in range(-(-n // block_size))] for n in lengths]
    inputs = prepare_inputs([[7], [11]], [n - 1 for n in lengths], tables, block_size, 1, torch.device(DEV))
    kv = torch.randn(cfg.num_hidden_layers, 2, num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim,
                     generator=gen).to(DEV)
    before, expected_kv = kv.clone(), kv.clone()
    expected = model(inputs.input_ids, inputs.positions, list(expected_kv.unbind(0)), inputs.meta)
    meta = inputs.meta
    # Through the model's own forward: a decode batch whose caches are views of the stack it was given
    # takes the persistent kernel (another cache, or several tokens per sequence, keeps the torch path).
    model.enable_persistent_decode(kv)
    got = model(inputs.input_ids, inputs.positions, list(kv.unbind(0)), meta)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(kv, expected_kv, atol=1e-5, rtol=1e-5)  # the new tokens' K/V, nothing else touched
    calls = []
    monkeypatch.setattr(PersistentDecodeForward, "forward", lambda *a: calls.append(a) or expected)
    model(inputs.input_ids, inputs.positions, list(expected_kv.unbind(0)), meta)   # another cache: torch path
    assert calls == []
    model(inputs.input_ids, inputs.positions, list(kv.unbind(0)), meta)            # the stack's views: the kernel
    assert len(calls) == 1 and calls[0][-1] is kv
    flat = kv.view(cfg.num_hidden_layers, 2, -1, cfg.num_key_value_heads, cfg.head_dim)
    assert not torch.equal(flat[:, :, meta.slot_mapping], before.view_as(flat)[:, :, meta.slot_mapping])  # written


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="a grid of many blocks and float16 at a real head size")
def test_a_float16_model_decodes_through_a_grid_of_many_blocks(monkeypatch):
    """GQA (4 heads over 2 KV heads of 80), widths that leave a masked tail in every GEMV step (320, 544),
    and the launch captured in a CUDA graph and replayed."""
    cfg = LlamaArchConfig.from_dict(dict(TARGET_CFG, hidden_size=320, intermediate_size=544, num_attention_heads=4,
                                         num_key_value_heads=2, vocab_size=1000, max_position_embeddings=512))
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).place(DEV, torch.float16)
    block_size, lengths = 16, [100, 37, 1]
    num_blocks = sum(-(-n // block_size) for n in lengths) + 1
    tables = [list(range(1 + sum(-(-m // block_size) for m in lengths[:i]), 1 + sum(-(-m // block_size) for m in lengths[:i + 1])))
              for i in range(len(lengths))]
    inputs = prepare_inputs([[5], [6], [7]], [n - 1 for n in lengths], tables, block_size, 1, torch.device(DEV))
    kv = (torch.randn(cfg.num_hidden_layers, 2, num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim,
                      device=DEV) * 0.5).half()
    expected_kv = kv.clone()
    expected = model(inputs.input_ids, inputs.positions, list(expected_kv.unbind(0)), inputs.meta)
    forward, tables = PersistentDecodeForward(model), inputs.meta.block_tables.contiguous()
    got = forward.forward(inputs.input_ids, inputs.positions, inputs.meta.slot_mapping, tables, kv)
    # float32 inside the kernel against a torch path that rounds to float16 after every op
    torch.testing.assert_close(got, expected, atol=5e-2, rtol=5e-2)
    torch.testing.assert_close(kv, expected_kv, atol=1e-2, rtol=1e-2)
    graph, outputs = torch.cuda.CUDAGraph(), []
    with torch.cuda.graph(graph):
        outputs.append(forward.forward(inputs.input_ids, inputs.positions, inputs.meta.slot_mapping, tables, kv))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(outputs[0], got, atol=1e-3, rtol=1e-3)
    # more tokens than one launch takes: launches in order, the same logits
    monkeypatch.setattr(forward, "tokens_per_launch", 2)
    chunked = forward.forward(inputs.input_ids, inputs.positions, inputs.meta.slot_mapping, tables, kv.clone())
    torch.testing.assert_close(chunked, got, atol=1e-3, rtol=1e-3)
    monkeypatch.undo()
    # one ordinary kernel per phase over grids sized to each phase's work: the same logits
    per_phase = PersistentDecodeForward(model, launches="per_phase")
    torch.testing.assert_close(per_phase.forward(inputs.input_ids, inputs.positions, inputs.meta.slot_mapping, tables,
                                                 kv.clone()), got, atol=1e-3, rtol=1e-3)
    # the clock-stamping build: the same logits, a stamp after every phase, in order
    timed = PersistentDecodeForward(model, timeline=True)
    torch.testing.assert_close(timed.forward(inputs.input_ids, inputs.positions, inputs.meta.slot_mapping, tables,
                                             kv.clone()), got, atol=1e-3, rtol=1e-3)
    stamps = timed.timeline.cpu()
    assert stamps.numel() == persistent_decode.stamps(cfg.num_hidden_layers) and (stamps.diff() >= 0).all()
    assert stamps[-1] > stamps[0]


def test_a_row_whose_position_runs_past_its_table_reads_inside_it():
    """A padding row (slot -1) whose position lies past its block table, as a sequence the host is
    about to stop can leave it: the kernel reads no block id past the table (the simulator raises
    IndexError on a read past an array's end), writes nothing for that row (a write at slot -1 would
    land in the cache's last block: numpy wraps negative indices), and the real row beside it is
    unchanged."""
    cfg = LlamaArchConfig.from_dict(dict(TARGET_CFG, hidden_size=32, intermediate_size=32, vocab_size=32,
                                         num_hidden_layers=1))
    torch.manual_seed(1)
    model = LlamaForCausalLM(cfg).place(DEV, torch.float32)
    inputs = prepare_inputs([[3], [4]], [5, 2], [[1, 2], [3]], 4, 1, torch.device(DEV), 2)
    kv = torch.randn(1, 2, 4, 4, cfg.num_key_value_heads, cfg.head_dim, generator=torch.Generator().manual_seed(2)).to(DEV)
    meta, forward = inputs.meta, PersistentDecodeForward(model)
    alone_kv = kv.clone()
    alone = forward.forward(inputs.input_ids, inputs.positions, meta.slot_mapping, meta.block_tables, alone_kv)
    positions, slots = inputs.positions.clone(), meta.slot_mapping.clone()
    positions[1], slots[1] = 2 * 4 + 3, -1  # past the 2-block table
    padded_kv = kv.clone()
    got = forward.forward(inputs.input_ids, positions, slots, meta.block_tables, padded_kv)
    torch.testing.assert_close(got[0], alone[0])
    assert torch.isfinite(got[1]).all()
    expected_kv = kv.clone().view(1, 2, -1, cfg.num_key_value_heads, cfg.head_dim)
    expected_kv[:, :, slots[0]] = alone_kv.view_as(expected_kv)[:, :, slots[0]]  # row 0's K/V, nothing else
    torch.testing.assert_close(padded_kv.view_as(expected_kv), expected_kv, atol=0, rtol=0)


def test_one_ordinary_kernel_per_phase_gives_the_torch_forwards_logits_and_cache():
    """launches="per_phase": the same phases as separate launches (a kernel boundary for each grid
    sync) over a grid of several blocks, two layers (the second reads the residual the first left)."""
    cfg = LlamaArchConfig.from_dict(dict(TARGET_CFG, hidden_size=32, intermediate_size=32, vocab_size=32))
    torch.manual_seed(2)
    model = LlamaForCausalLM(cfg).place(DEV, torch.float32)
    inputs = prepare_inputs([[3], [4]], [5, 2], [[1, 2], [3]], 4, 1, torch.device(DEV), 2)
    kv = torch.randn(cfg.num_hidden_layers, 2, 4, 4, cfg.num_key_value_heads, cfg.head_dim,
                     generator=torch.Generator().manual_seed(5)).to(DEV)
    expected_kv = kv.clone()
    expected = model(inputs.input_ids, inputs.positions, list(expected_kv.unbind(0)), inputs.meta)
    forward = PersistentDecodeForward(model, launches="per_phase")
    got = forward.forward(inputs.input_ids, inputs.positions, inputs.meta.slot_mapping, inputs.meta.block_tables, kv)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(kv, expected_kv, atol=1e-5, rtol=1e-5)
    with pytest.raises(KernelArgumentError, match="launches"):
        PersistentDecodeForward(model, timeline=True, launches="per_phase")


def test_the_engine_hands_each_model_its_runners_cache_stack(tiny_target, tiny_draft):
    from tiny import tiny_llm

    from protospec.errors import ConfigError

    llm = tiny_llm(tiny_target, tiny_draft, device=DEV, persistent_decode=True)
    draft, target = llm.engine.draft, llm.engine.target
    assert draft.model.persistent_decode is not None and draft.model._kv_stack is draft.kv_stack
    assert all(view.data_ptr() == draft.kv_stack[i].data_ptr() for i, view in enumerate(draft.kv_caches))
    assert target.model.persistent_decode is None  # its weights are not copied: the draft's decode is the hot path
    alone = tiny_llm(tiny_target, device=DEV, persistent_decode=True).engine.target  # target-only: its decode
    assert alone.model.persistent_decode is not None and alone.model._kv_stack is alone.kv_stack
    assert tiny_llm(tiny_target, tiny_draft, device=DEV).engine.draft.model.persistent_decode is None  # off by default
    per_phase = tiny_llm(tiny_target, tiny_draft, device=DEV, persistent_decode="per_phase").engine.draft.model
    assert per_phase.persistent_decode.launches == "per_phase" and draft.model.persistent_decode.launches == "one"
    with pytest.raises(ConfigError, match="persistent_decode must be"):
        tiny_llm(tiny_target, device=DEV, persistent_decode="two")
    from protospec.bench.args import build_parser  # the bench's flag: alone, with a value, absent

    assert [build_parser().parse_args(a).persistent_decode for a in (["--persistent-decode"],
            ["--persistent-decode", "per_phase"], [])] == ["one", "per_phase", False]
    with pytest.raises(ConfigError, match=r"persistent_decode \(one\): the kernels take float16 / float32"):
        tiny_llm(tiny_target, device=DEV, dtype="bfloat16", persistent_decode=True)

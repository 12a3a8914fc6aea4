"""Our paged-KV Llama forward against transformers.LlamaForCausalLM on the same random weights."""
import pytest
import torch
from transformers import LlamaConfig
from transformers import LlamaForCausalLM as HFLlama

from protospec.requests.block_manager import BlockManager
from protospec.model.loader import load_model
from protospec.model.runner import ModelRunner

BLOCK = 4  # small blocks: prompts and decode steps cross many block boundaries


def relative_error(out, ref):
    return ((out - ref).norm() / ref.norm()).item()


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def hf_pair(request, tmp_path_factory):
    torch.manual_seed(1234)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=8,
                      num_key_value_heads=2, vocab_size=300, max_position_embeddings=128, rope_theta=500.0,
                      rms_norm_eps=1e-5, tie_word_embeddings=request.param, initializer_range=0.1)
    hf = HFLlama(cfg).eval()
    path = tmp_path_factory.mktemp("hf_llama")
    hf.save_pretrained(path)
    ours = load_model(str(path), dtype=torch.float32)
    return hf, ours


def test_weights_really_loaded(hf_pair):
    hf, ours = hf_pair
    assert torch.equal(ours.model.layers[1].self_attn.k_proj.weight, hf.model.layers[1].self_attn.k_proj.weight)
    assert torch.equal(ours.lm_head.weight, hf.lm_head.weight)


def test_fused_projections_share_storage_and_keep_hf_names(hf_pair):
    """The fused [q;k;v] / [gate;up] weights are what the forward reads; the HF-named parameters are
    views of them (a copy would double the weights' memory and let the two drift apart)."""
    hf, ours = hf_pair
    layer, hf_layer = ours.model.layers[2], hf.model.layers[2]
    attn, mlp = hf_layer.self_attn, hf_layer.mlp
    assert torch.equal(layer.qkv_weight, torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
    assert torch.equal(layer.gate_up_weight, torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
    assert layer.self_attn.v_proj.weight.untyped_storage().data_ptr() == layer.qkv_weight.untyped_storage().data_ptr()
    assert layer.mlp.up_proj.weight.untyped_storage().data_ptr() == layer.gate_up_weight.untyped_storage().data_ptr()
    assert set(ours.state_dict()) - {"lm_head.weight"} == set(hf.state_dict()) - {"lm_head.weight"}


def test_prefill_then_decode_steps_match_hf(hf_pair):
    hf, ours = hf_pair
    runner = ModelRunner(ours, num_blocks=64, block_size=BLOCK)
    blocks = BlockManager(64, BLOCK)
    gen = torch.Generator().manual_seed(0)
    prompt_lens = [11, 3, 7]  # a ragged batch
    full = [torch.randint(0, 300, (n + 6,), generator=gen) for n in prompt_lens]  # prompt + 6 decode tokens
    with torch.no_grad():
        ref = [hf(seq[None]).logits[0] for seq in full]  # [len, V] each, no cache

    tables = [[] for _ in full]
    for table, seq in zip(tables, full):
        blocks.ensure_capacity(table, len(seq))
    prompts = [seq[:n].tolist() for seq, n in zip(full, prompt_lens)]
    logits = runner.execute(runner.prepare("prefill", prompts, [0] * 3, tables, num_logits=[n for n in prompt_lens]))
    expected = torch.cat([r[:n] for r, n in zip(ref, prompt_lens)])
    assert relative_error(logits, expected) < 1e-4

    for step in range(6):
        chunks = [[seq[n + step].item()] for seq, n in zip(full, prompt_lens)]
        starts = [n + step for n in prompt_lens]
        logits = runner.execute(runner.prepare("decode", chunks, starts, tables, num_logits=1))
        expected = torch.stack([r[n + step] for r, n in zip(ref, prompt_lens)])
        assert relative_error(logits, expected) < 1e-4, f"decode step {step}"


def test_verify_window_is_causal_and_matches_hf(hf_pair):
    """k+1 query tokens per sequence after a prefill: each sees only itself and what came before."""
    hf, ours = hf_pair
    runner = ModelRunner(ours, num_blocks=64, block_size=BLOCK)
    blocks = BlockManager(64, BLOCK)
    gen = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 300, (n,), generator=gen) for n in (9, 14)]
    with torch.no_grad():
        ref = [hf(s[None]).logits[0] for s in seqs]
    tables = [[], []]
    for t, s in zip(tables, seqs):
        blocks.ensure_capacity(t, len(s))
    window = 6  # k = 5
    runner.execute(runner.prepare("prefill", [s[:-window].tolist() for s in seqs], [0, 0], tables, num_logits=0))
    logits = runner.execute(runner.prepare("prefill", [s[-window:].tolist() for s in seqs],
                                           [len(s) - window for s in seqs], tables, num_logits=window))
    assert relative_error(logits, torch.cat([r[-window:] for r in ref])) < 1e-4

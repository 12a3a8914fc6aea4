"""Tiny Llama configs and helpers shared by the tests (GQA target, MQA draft, same vocab)."""
import json

import torch

TINY_VOCAB = 256

TARGET_CFG = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=TINY_VOCAB, max_position_embeddings=256,
                  rope_theta=10000.0, rms_norm_eps=1e-6, initializer_range=0.1,
                  bos_token_id=0, eos_token_id=2, tie_word_embeddings=False, model_type="llama")
DRAFT_CFG = dict(TARGET_CFG, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_key_value_heads=1)
# Widths the tensor-core GEMV takes (K a multiple of 192, two warps' worth so K can split) and head dims
# its attention takes (64): a float16 engine of these on a GPU runs the fused forward
# (layer_kernels.LayerKernelForward._fused_forward).
MMA_TARGET_CFG = dict(TARGET_CFG, hidden_size=384, intermediate_size=768, num_attention_heads=6, num_key_value_heads=2)
MMA_DRAFT_CFG = dict(MMA_TARGET_CFG, num_hidden_layers=1)


def write_config(path, cfg):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    return str(path)


def tiny_llm(target, draft=None, k=3, **kwargs):
    from protospec import LLM

    kwargs.setdefault("dtype", "float32")
    kwargs.setdefault("device", "cpu")
    kwargs.setdefault("load_format", "dummy")
    return LLM(target, speculative_model=draft, num_speculative_tokens=k, **kwargs)


def random_prompts(n, lengths=(5, 17, 9, 30), seed=0, vocab=TINY_VOCAB):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (lengths[i % len(lengths)],), generator=gen).tolist() for i in range(n)]

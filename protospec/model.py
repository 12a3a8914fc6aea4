"""A Llama forward over a paged KV cache, reading top-down like nanoGPT.

Parameter names match Hugging Face's LlamaForCausalLM, so a checkpoint's state dict loads as is.
Tokens come flattened: one batch of T tokens from all sequences, found in the cache through
AttentionMetadata (see attention.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from protospec.attention import AttentionMetadata, paged_attention
from protospec.model_config import LlamaArchConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 as HF does, then cast back before the weight.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Plain RoPE, HF's "rotate half" layout (first half of head_dim pairs with the second half)."""

    def __init__(self, head_dim: int, max_positions: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)  # [P, d/2]
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # x: [T, heads, d]; positions: [T] int64
        cos = self.cos[positions][:, None, :]  # [T, 1, d/2] float32
        sin = self.sin[positions][:, None, :]
        x1, x2 = x.float().chunk(2, dim=-1)
        rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        return rotated.to(x.dtype)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: LlamaArchConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, cfg.hidden_size, bias=False)
        self.scale = self.head_dim ** -0.5

    def forward(self, x, positions, kv_cache, meta: AttentionMetadata, rope: RotaryEmbedding):
        num_tokens = x.shape[0]
        q = rope(self.q_proj(x).view(num_tokens, self.num_heads, self.head_dim), positions)
        k = rope(self.k_proj(x).view(num_tokens, self.num_kv_heads, self.head_dim), positions)
        v = self.v_proj(x).view(num_tokens, self.num_kv_heads, self.head_dim)
        out = paged_attention(q, k, v, positions, kv_cache, meta, self.scale)  # [T, h, d]
        return self.o_proj(out.reshape(num_tokens, -1))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: LlamaArchConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaArchConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg)

    def forward(self, x, positions, kv_cache, meta, rope):
        x = x + self.self_attn(self.input_layernorm(x), positions, kv_cache, meta, rope)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaBody(nn.Module):
    """HF's `model.` prefix: embeddings, layers, final norm."""

    def __init__(self, cfg: LlamaArchConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: LlamaArchConfig, max_positions: int | None = None):
        super().__init__()
        self.config = cfg
        self.model = LlamaBody(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # Speculation may write a few lookahead positions past max_position_embeddings near the
        # end of a request (those tokens are then dropped), so the caller may ask for more.
        self.max_positions = max_positions or cfg.max_position_embeddings
        self.rope = RotaryEmbedding(cfg.head_dim, self.max_positions, cfg.rope_theta)

    def place(self, device: torch.device | str, dtype: torch.dtype) -> "LlamaForCausalLM":
        """Move weights to device/dtype, keeping the RoPE tables in float32 (as HF computes them)."""
        self.to(device=device, dtype=dtype)
        self.rope = RotaryEmbedding(self.config.head_dim, self.max_positions, self.config.rope_theta).to(device)
        return self.eval()

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,          # [T] int64
        positions: torch.Tensor,          # [T] int64
        kv_caches: list[torch.Tensor],    # per layer [2, num_blocks, block_size, kvh, d]
        meta: AttentionMetadata,
    ) -> torch.Tensor:                    # [num_logits, vocab] float32
        x = self.model.embed_tokens(input_ids)  # [T, hidden]
        for layer, kv_cache in zip(self.model.layers, kv_caches):
            x = layer(x, positions, kv_cache, meta, self.rope)
        x = self.model.norm(x[meta.logits_indices])  # norm is per token: only where logits are wanted
        return self.lm_head(x).float()

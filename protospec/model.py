"""A Llama forward over a paged KV cache, reading top-down like nanoGPT.

Parameter names match Hugging Face's LlamaForCausalLM, so a checkpoint's state dict loads as is.
Tokens come flattened: one batch of T tokens from all sequences, found in the cache through
AttentionMetadata (see attention.py).

Each layer is  [pre-attention] -> paged attention -> [post-attention], the bracketed parts pure
functions of tensors. They carry the long chains of small elementwise ops (norms, RoPE, SiLU);
`enable_compile()` hands them to torch.compile, which fuses each chain into a few kernels. The
paged attention (it writes the KV cache in place) always stays eager.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from protospec.attention import AttentionMetadata, paged_attention, plan_attention
from protospec.model_config import LlamaArchConfig


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Normalise in float32 as HF does, then cast back before the weight.
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF's "rotate half" RoPE. x: [T, heads, d]; cos, sin: [T, 1, d] float32."""
    x32 = x.float()
    x1, x2 = x32.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return (x32 * cos + rotated * sin).to(x.dtype)


def pre_attention(x, residual, norm_w, eps: float, wq, wk, wv, cos, sin, num_heads: int, num_kv_heads: int):
    """residual += x; h = norm(residual); q, k, v = projections of h, RoPE on q and k.
    x, residual: [T, hidden] (residual None in layer 0) -> q [T, h, d], k, v [T, kvh, d], residual."""
    residual = x if residual is None else x + residual
    h = rms_norm(residual, norm_w, eps)
    num_tokens, head_dim = h.shape[0], wq.shape[0] // num_heads
    q = F.linear(h, wq).view(num_tokens, num_heads, head_dim)
    k = F.linear(h, wk).view(num_tokens, num_kv_heads, head_dim)
    v = F.linear(h, wv).view(num_tokens, num_kv_heads, head_dim)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, residual


def post_attention(attn, residual, wo, norm_w, eps: float, w_gate, w_up, w_down):
    """residual += o_proj(attn); MLP(norm(residual)). attn [T, h*d] -> (mlp out, residual) [T, hidden]."""
    residual = residual + F.linear(attn, wo)
    h = rms_norm(residual, norm_w, eps)
    return F.linear(F.silu(F.linear(h, w_gate)) * F.linear(h, w_up), w_down), residual


def lm_head_logits(x, residual, logits_indices, norm_w, eps: float, lm_w):
    """Last residual add, final norm and LM head, only for the tokens whose logits are wanted
    (the norm is per token). -> [num_logits, vocab] float32."""
    h = (x + residual)[logits_indices]
    return F.linear(rms_norm(h, norm_w, eps), lm_w).float()


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for every position, float32; looked up once per forward for all layers."""

    def __init__(self, head_dim: int, max_positions: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)  # [P, d/2]
        angles = torch.cat((angles, angles), dim=-1)  # [P, d]: the two halves share frequencies
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos[positions][:, None, :], self.sin[positions][:, None, :]  # [T, 1, d] each


class LlamaAttention(nn.Module):
    def __init__(self, cfg: LlamaArchConfig):
        super().__init__()
        heads, kv_heads, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, heads * d, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, kv_heads * d, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, kv_heads * d, bias=False)
        self.o_proj = nn.Linear(heads * d, cfg.hidden_size, bias=False)


class LlamaMLP(nn.Module):
    def __init__(self, cfg: LlamaArchConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaArchConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg)
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.scale = cfg.head_dim ** -0.5

    def forward(self, x, residual, rope, kv_cache, meta, plan, blocks):
        """blocks: (pre_attention, post_attention), plain or compiled."""
        pre, post = blocks
        attn, mlp = self.self_attn, self.mlp
        q, k, v, residual = pre(x, residual, self.input_layernorm.weight, self.input_layernorm.eps,
                                attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight, *rope,
                                self.num_heads, self.num_kv_heads)
        out = paged_attention(q, k, v, kv_cache, meta, plan, self.scale)  # [T, h, d]
        return post(out.flatten(1), residual, attn.o_proj.weight, self.post_attention_layernorm.weight,
                    self.post_attention_layernorm.eps, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)


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
        self.blocks = (pre_attention, post_attention)
        self.head = lm_head_logits

    def place(self, device: torch.device | str, dtype: torch.dtype) -> "LlamaForCausalLM":
        """Move weights to device/dtype, keeping the RoPE tables in float32 (as HF computes them)."""
        self.to(device=device, dtype=dtype)
        self.rope = RotaryEmbedding(self.config.head_dim, self.max_positions, self.config.rope_theta).to(device)
        return self.eval()

    def enable_compile(self) -> None:
        """Fuse the pre/post-attention op chains with torch.compile (CUDA). One compiled graph
        serves every layer (weights are inputs); each new token count compiles once."""
        import torch._dynamo

        for name in ("cache_size_limit", "recompile_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 256))
        self.blocks = (torch.compile(pre_attention, dynamic=False), torch.compile(post_attention, dynamic=False))
        self.head = torch.compile(lm_head_logits, dynamic=False)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,          # [T] int64
        positions: torch.Tensor,          # [T] int64
        kv_caches: list[torch.Tensor],    # per layer [2, num_blocks, block_size, kvh, d]
        meta: AttentionMetadata,
    ) -> torch.Tensor:                    # [num_logits, vocab] float32
        x = self.model.embed_tokens(input_ids)  # [T, hidden]
        rope = self.rope(positions)
        plan = plan_attention(positions, meta, x.dtype)
        residual = None
        for layer, kv_cache in zip(self.model.layers, kv_caches):
            x, residual = layer(x, residual, rope, kv_cache, meta, plan, self.blocks)
        norm = self.model.norm
        return self.head(x, residual, meta.logits_indices, norm.weight, norm.eps, self.lm_head.weight)

"""A Llama forward over a paged KV cache, reading top-down like nanoGPT.

Parameter names match Hugging Face's LlamaForCausalLM, so a checkpoint's state dict loads as is.
Tokens come flattened: one batch of T tokens from all sequences, found in the cache through
AttentionMetadata (see attention.py).

Each layer is  [pre-attention] -> paged attention -> [post-attention], the bracketed parts pure
functions of tensors carrying the chains of small elementwise ops (norms, RoPE, SiLU). Decode-shaped
forwards on a GPU run the Numba layer kernels instead (layer_kernels.py), which fuse those chains.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from protospec.model.attention import AttentionMetadata, paged_attention, plan_attention
from protospec.model.config import LlamaArchConfig


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # torch's rms_norm normalises in float32 and casts back before the weight, as HF does; on CUDA
    # it is one fused kernel instead of a chain of seven.
    return F.rms_norm(x, weight.shape, weight, eps)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF's "rotate half" RoPE, in x's dtype as HF computes it. x: [T, heads, d]; cos, sin: [T, 1, d]."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def pre_attention(x, residual, norm_w, eps: float, w_qkv, cos, sin, num_heads: int, num_kv_heads: int):
    """residual += x; h = norm(residual); q, k, v from one fused projection, RoPE on q and k together.
    x, residual: [T, hidden] (residual None in layer 0) -> q [T, h, d], k, v [T, kvh, d], residual."""
    residual = x if residual is None else x + residual
    h = rms_norm(residual, norm_w, eps)
    num_tokens, head_dim = h.shape[0], w_qkv.shape[0] // (num_heads + 2 * num_kv_heads)
    qkv = F.linear(h, w_qkv).view(num_tokens, num_heads + 2 * num_kv_heads, head_dim)  # [T, h + 2 kvh, d]
    qk = apply_rope(qkv[:, : num_heads + num_kv_heads], cos, sin)  # q and k rotate alike: one pass
    return qk[:, :num_heads], qk[:, num_heads:], qkv[:, num_heads + num_kv_heads :], residual


def post_attention(attn, residual, wo, norm_w, eps: float, w_gate_up, w_down):
    """residual += o_proj(attn); MLP(norm(residual)), gate and up as one fused projection.
    attn [T, h*d] -> (mlp out, residual) [T, hidden]."""
    residual = residual + F.linear(attn, wo)
    h = rms_norm(residual, norm_w, eps)
    gate, up = F.linear(h, w_gate_up).chunk(2, dim=-1)  # [T, inter] each
    return F.linear(F.silu(gate) * up, w_down), residual


def logits_float32(h: torch.Tensor, lm_w: torch.Tensor) -> torch.Tensor:
    """The LM head, h [T, hidden] @ lm_w [vocab, hidden].T -> [T, vocab] float32 straight from the
    float32 accumulator. Half-precision logits would be rounded first: a float16 step near 2.0 is
    0.002, so two top logits closer than that become equal and greedy then takes the lower token id
    instead of the model's choice (the fused tensor-core head writes float32 too, so both linear
    kernels decide such near ties alike)."""
    if h.dtype not in (torch.float16, torch.bfloat16):
        return F.linear(h, lm_w).float()
    if h.is_cuda:
        return torch.mm(h, lm_w.t(), out_dtype=torch.float32)  # cuBLAS: half inputs, float32 output
    return F.linear(h.float(), lm_w.float())  # CPU kernels have no half-in, float-out matmul


def lm_head_logits(x, residual, logits_indices, norm_w, eps: float, lm_w):
    """Last residual add, final norm and LM head, only for the tokens whose logits are wanted
    (the norm is per token). -> [num_logits, vocab] float32."""
    h = (x + residual)[logits_indices]
    return logits_float32(rms_norm(h, norm_w, eps), lm_w)


def forward_prologue(positions, cos_table, sin_table, meta: AttentionMetadata, dtype: torch.dtype):
    """What every layer of one forward shares: the RoPE rows of the positions ([T, 1, d] each, in
    the activations' dtype, as HF casts them) and the attention plan (mask, slots)."""
    cos = cos_table[positions][:, None, :].to(dtype)
    sin = sin_table[positions][:, None, :].to(dtype)
    return (cos, sin), plan_attention(positions, meta, dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for every position, float32; looked up once per forward for all layers
    (forward_prologue)."""

    def __init__(self, head_dim: int, max_positions: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)  # [P, d/2]
        angles = torch.cat((angles, angles), dim=-1)  # [P, d]: the two halves share frequencies
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)



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

    def fuse_projections(self) -> None:
        """One [q; k; v] and one [gate; up] weight, so a layer runs 2 matmuls where it ran 5 (at batch 1
        a forward's time follows its kernel count). The per-projection parameters become views of the
        fused weights: the state dict keeps HF's names and nothing is stored twice. Call after the
        weights are loaded and placed (a later .to() would copy the views apart)."""
        attn, mlp = self.self_attn, self.mlp
        for fused_name, modules in (("qkv_weight", (attn.q_proj, attn.k_proj, attn.v_proj)),
                                    ("gate_up_weight", (mlp.gate_proj, mlp.up_proj))):
            fused = torch.cat([m.weight.detach() for m in modules])  # [sum of out features, in]
            self.register_buffer(fused_name, fused, persistent=False)
            start = 0
            for m in modules:
                rows = m.weight.shape[0]
                m.weight = nn.Parameter(fused[start : start + rows], requires_grad=False)
                start += rows

    def forward(self, x, residual, rope, kv_cache, meta, plan):
        norm1, norm2 = self.input_layernorm, self.post_attention_layernorm
        q, k, v, residual = pre_attention(x, residual, norm1.weight, norm1.eps, self.qkv_weight, *rope, self.num_heads,
                                          self.num_kv_heads)
        out = paged_attention(q, k, v, kv_cache, meta, plan, self.scale)  # [T, h, d]
        return post_attention(out.flatten(1), residual, self.self_attn.o_proj.weight, norm2.weight, norm2.eps,
                              self.gate_up_weight, self.mlp.down_proj.weight)


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
        self.layer_kernels = None  # set by layer_kernels.enable_layer_kernels: decode-shaped forwards on the Numba kernels

    def place(self, device: torch.device | str, dtype: torch.dtype) -> "LlamaForCausalLM":
        """Move weights to device/dtype (the RoPE tables stay float32, as HF computes them), then fuse
        each layer's projections."""
        self.to(device=device, dtype=dtype)
        self.rope = RotaryEmbedding(self.config.head_dim, self.max_positions, self.config.rope_theta).to(device)
        for layer in self.model.layers:
            layer.fuse_projections()
        return self.eval()

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,          # [T] int64
        positions: torch.Tensor,          # [T] int64
        kv_caches: list[torch.Tensor],    # per layer [2, num_blocks, block_size, kvh, d]
        meta: AttentionMetadata,
    ) -> torch.Tensor:                    # [num_logits, vocab] float32
        if self.layer_kernels is not None and self.layer_kernels.applies(meta):
            return self.layer_kernels.forward(self, input_ids, positions, kv_caches, meta)
        x = self.model.embed_tokens(input_ids)  # [T, hidden]
        rope, plan = forward_prologue(positions, self.rope.cos, self.rope.sin, meta, x.dtype)
        residual = None
        for layer, kv_cache in zip(self.model.layers, kv_caches):
            x, residual = layer(x, residual, rope, kv_cache, meta, plan)
        norm = self.model.norm
        return lm_head_logits(x, residual, meta.logits_indices, norm.weight, norm.eps, self.lm_head.weight)

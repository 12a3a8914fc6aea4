"""Decode-shaped forwards with Numba layer kernels: 9 kernels per layer where torch runs ~20.

    embed -> per layer: add_rms_norm, qkv matmul, rope_and_cache, paged_attention, o matmul,
             add_rms_norm, gate_up matmul, silu_and_mul, down matmul
          -> add_rms_norm on the logits rows, LM head
    linear="mma_fused" (float16, <= TENSOR_CORE_MAX_ROWS tokens, widths the tensor-core GEMV takes): 5 per layer, the norms
             and residual adds folded into the qkv and gate/up GEMVs, RoPE and the cache store into qkv's
             epilogue, SiLU x up into gate/up's; the embedding into the first GEMV; the final norm split
             between the last down projection (its output's sums of squares) and the LM head (its
             weight times the norm's, its rows scaled by 1 / rms; past LM_HEAD_MAX_ROWS rows the
             separate norm and cuBLAS); past MLP_FUSED_MAX_ROWS rows the MLP as the separate norm,
             cuBLAS, SiLU x up and cuBLAS, qkv and o still fused (7 per layer)

The draft loop, the verify and the target's decode feed a few tokens per sequence; at batch 1 such
a forward costs its kernel count (a few microseconds each on the GPU, plus a gap between kernels
even inside a CUDA graph), not its FLOPs. vLLM's forward has this shape (fused_add_rms_norm, rotary_embedding,
reshape_and_cache, paged_attention, silu_and_mul); protospec's torch path has ~20 kernels per layer
plus ~17 per forward. Prefill and ragged batches keep the torch path (its SDPA suits long queries).

Same weights, same cache layout: the two paths are interchangeable forward by forward, and agree
to rounding (tests compare their logits).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from protospec.errors import ConfigError
from protospec.layout import LINEAR_KERNELS
from protospec.model.attention import AttentionMetadata, prompt_attention
from protospec.kernels.launch import dependent_launch
from protospec.kernels.linear import gemv_mma
from protospec.kernels.attention import paged_attention as attention_kernel
from protospec.kernels.linear.gemv_mma_twin import RopeCache
from protospec.kernels.linear.layer_ops import ACTIVATION_DTYPES, add_rms_norm, rope_and_cache, silu_and_mul
from protospec.model.llama import logits_float32

MAX_QUERY_LEN = 16  # longer uniform chunks (a prefill at batch 1) keep the torch path, unless long_chunks
MAX_ROWS = 65536    # tokens a forward at most (64 prompts of 1,024)
# Token rows up to which the tensor-core GEMV (the fused forward where the shapes fuse) serves a forward:
# past it cuBLAS's GEMM tiles, reusing the weights across many rows in shared memory, win
# (tools/gemv_cost.py times both by rows; data/results/README.md has the crossovers). The LM head
# crosses over sooner than the layers' linears (the same table), so past LM_HEAD_MAX_ROWS rows it
# takes the separate norm and cuBLAS even inside the fused forward.
TENSOR_CORE_MAX_ROWS = 64
LM_HEAD_MAX_ROWS = 8
# Inside the fused forward, the MLP's linears cross over sooner than qkv and o: past MLP_FUSED_MAX_ROWS
# rows gate/up takes the separate norm, cuBLAS and SiLU x up, and down takes cuBLAS (qkv keeps its
# fused RoPE and cache store, o its early launch), from the same table.
MLP_FUSED_MAX_ROWS = 32


def check_linear_kernel(linear: str, layer_kernels_on: bool) -> None:
    """EngineConfig.linear_kernel: the tensor-core GEMV runs inside the layer kernels' forward (None chooses)."""
    if linear not in (None, "cublas") and not layer_kernels_on:
        raise ConfigError(f"linear_kernel={linear!r} needs the layer kernels (layer_kernels is off here)")


def resolve_dependent_launch(setting: bool | None, linear: str, layer_kernels_on: bool, device: torch.device) -> bool:
    """EngineConfig.dependent_launch: only the tensor-core GEMVs launch as dependents, on sm_90 or later.
    None: wherever that holds on a CUDA device; True where it does not is an error naming why."""
    tensor_core_linears = layer_kernels_on and linear != "cublas"
    if setting is None:
        return tensor_core_linears and device.type == "cuda" and dependent_launch.supported(device)
    if not setting:
        return False
    if not tensor_core_linears:
        raise ConfigError(f"dependent_launch=True needs the tensor-core linears (layer kernels on, linear_kernel "
                          f"mma_fused; here layer kernels {'on' if layer_kernels_on else 'off'}, {linear!r})")
    if not dependent_launch.supported(device):
        raise ConfigError(f"dependent_launch=True needs compute capability {dependent_launch.MIN_CAPABILITY} or "
                          f"later; {device} has {torch.cuda.get_device_capability(device)}")
    return True


def enable_layer_kernels(model, linear: str = "cublas", dependent_launch: bool = False,
                         long_chunks: bool = False) -> None:
    """Run `model`'s decode-shaped forwards (a few tokens per sequence) on the Numba layer kernels,
    5-9 kernels per layer instead of ~20; prefill keeps the torch path. linear: one of layout.LINEAR_KERNELS;
    dependent_launch: the tensor-core GEMVs start while the kernel before them ends
    (kernels/launch/dependent_launch.py); long_chunks: a prefill at batch 1 on the layer kernels too
    (LayerKernelForward.applies). Call after model.place()."""
    model.layer_kernels = LayerKernelForward(model, linear, dependent_launch, long_chunks)


class LayerKernelForward:
    """The kernel path of one LlamaForCausalLM (holds its RoPE tables in the activations' dtype)."""

    def __init__(self, model, linear: str = "cublas", dependent: bool = False, long_chunks: bool = False):
        cfg = model.config
        self.dtype = model.model.embed_tokens.weight.dtype
        if self.dtype not in ACTIVATION_DTYPES:
            raise ValueError(f"layer kernels take {ACTIVATION_DTYPES} activations, the model is {self.dtype}")
        # HF casts the RoPE rows to the activations' dtype before rotating: keep the cast tables.
        self.cos = model.rope.cos.to(self.dtype).contiguous()  # [P, d]
        self.sin = model.rope.sin.to(self.dtype).contiguous()
        self.num_heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        # [0, 1, ...]: "every row" for add_rms_norm; its length caps the tokens a forward on these kernels
        # takes (a batch of prompts prefilled in one uniform chunk included), past which the torch path runs.
        self._row_ids = torch.arange(MAX_ROWS, device=self.cos.device)
        if linear not in LINEAR_KERNELS:
            raise ConfigError(f"linear must be one of {LINEAR_KERNELS}, got {linear!r}")
        self.linear = linear  # "mma_fused": the tensor-core GEMV (kernels/linear/gemv_mma.py) where it applies
        self.dependent = dependent  # the tensor-core GEMVs as programmatic dependents (kernels/launch/dependent_launch.py)
        # Uniform chunks longer than MAX_QUERY_LEN (a prefill at batch 1) on the 9-kernel path too (cuBLAS
        # for the linears, the Numba norms, RoPE with the cache store, attention and SiLU x up between them)
        # where their tokens fit `_row_ids`: half the torch path's ~20 kernels a layer, the same logits to
        # rounding (KernelPlan.prefill_kernels: on a GPU; in the simulator a prompt's every token through
        # simulated kernels would take minutes).
        self.long_chunks = long_chunks
        self._folded_head = None  # (the weights it was made from, the LM head times the final norm's weight)
        self._served: dict[int, bool] = {}  # cache block size -> whether a paged-attention kernel holds this model
        # Where the fused forms do not take the model's shapes, its linears still take the tensor-core GEMV
        # one by one (_linear), with the separate norms and RoPE between them.
        self.fuses = (linear == "mma_fused" and self.dtype == torch.float16 and self.head_dim % 16 == 0
                      and gemv_mma.supports(cfg.hidden_size) and gemv_mma.supports(cfg.intermediate_size))

    def folded_head(self, model) -> torch.Tensor:
        """The LM head's weight times the final norm's, [V, hidden] float16 (the fused forward's head): made
        on first use, which must not be inside a CUDA graph capture (a warm-up forward runs first)."""
        head, norm = model.lm_head.weight, model.model.norm.weight
        if self._folded_head is None or self._folded_head[0] != (head.data_ptr(), head._version, norm._version):
            if head.is_cuda and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("the folded LM head is made outside a graph capture; "
                                   "run a forward first")
            self._folded_head = ((head.data_ptr(), head._version, norm._version), (head * norm).contiguous())
        return self._folded_head[1]

    def _tensor_cores(self, x: torch.Tensor) -> bool:
        return (self.linear != "cublas" and x.dtype == torch.float16 and x.shape[0] <= TENSOR_CORE_MAX_ROWS
                and gemv_mma.supports(x.shape[1]))

    def _linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # [T, K] @ [N, K].T -> [T, N]
        if self._tensor_cores(x):
            return gemv_mma.gemv_mma(x if x.is_contiguous() else x.contiguous(), weight, dependent_launch=self.dependent)
        return F.linear(x, weight)

    def applies(self, meta: AttentionMetadata) -> bool:
        """A host-side decision (no device read): a uniform layout of a few tokens per sequence
        whose context fits the attention kernel."""
        q = meta.uniform_query_len
        keys = meta.block_tables.shape[1] * meta.block_size
        if q is None or not (q <= MAX_QUERY_LEN or self.long_chunks) or meta.slot_mapping.shape[0] > self._row_ids.shape[0]:
            return False
        served = self._served.get(meta.block_size)  # the same answer every forward: asked once a block size
        if served is None:
            served = self._served[meta.block_size] = attention_kernel.supports(
                self.num_heads, self.head_dim, 1, self.dtype, meta.block_size, self.cos.device)
        return served and keys >= 1

    def forward(self, model, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                meta: AttentionMetadata) -> torch.Tensor:  # [num_logits, vocab] float32
        tables = meta.block_tables if meta.block_tables.is_contiguous() else meta.block_tables.contiguous()
        wanted = meta.logits_indices if meta.logits_indices.is_contiguous() else meta.logits_indices.contiguous()
        if self.fuses and input_ids.shape[0] <= TENSOR_CORE_MAX_ROWS:
            return self._fused_forward(model, input_ids, positions, kv_caches, meta, tables, wanted)
        x = model.model.embed_tokens(input_ids)  # [T, hidden]
        rows = self._row_ids[: x.shape[0]]
        residual = None
        for layer, kv_cache in zip(model.model.layers, kv_caches):
            norm1, norm2 = layer.input_layernorm, layer.post_attention_layernorm
            h, residual = add_rms_norm(x, residual, norm1.weight, norm1.eps, rows)
            qkv = self._linear(h, layer.qkv_weight)
            q = rope_and_cache(qkv, positions, self.cos, self.sin, kv_cache, meta.slot_mapping,
                               self.num_heads, meta.whole_prompts)  # [T, h (+ kvh), d]; K/V now in the cache
            if meta.whole_prompts:  # a prefill: the fused causal attention over each prompt's own keys
                kv_heads, head_dim = kv_cache.shape[3], kv_cache.shape[4]
                value = qkv[:, (self.num_heads + kv_heads) * head_dim:].view(-1, kv_heads, head_dim)
                attn = prompt_attention(q[:, : self.num_heads], q[:, self.num_heads:], value,
                                        meta.uniform_query_len, layer.scale)
            else:
                attn = attention_kernel.paged_attention(q, kv_cache, tables, positions, meta.uniform_query_len,
                                                        layer.scale)
            o = self._linear(attn, layer.self_attn.o_proj.weight)
            h, residual = add_rms_norm(o, residual, norm2.weight, norm2.eps, rows)
            act = silu_and_mul(self._linear(h, layer.gate_up_weight))
            x = self._linear(act, layer.mlp.down_proj.weight)
        norm = model.model.norm
        if wanted.shape[0] == 0:  # a prefill that wants no logits (the draft's): no head, no empty launch
            return torch.empty(0, model.lm_head.weight.shape[0], dtype=torch.float32, device=x.device)
        h, _ = add_rms_norm(x, residual, norm.weight, norm.eps, wanted)  # only the rows whose logits are wanted
        return self._head(model, h)

    def _head(self, model, h: torch.Tensor) -> torch.Tensor:  # [N, hidden] normed -> [N, vocab] float32
        if h.shape[0] <= LM_HEAD_MAX_ROWS and self._tensor_cores(h):
            return gemv_mma.gemv_mma(h if h.is_contiguous() else h.contiguous(), model.lm_head.weight,
                                     out_dtype=torch.float32, dependent_launch=self.dependent)
        return logits_float32(h, model.lm_head.weight)

    def _fused_forward(self, model, input_ids, positions, kv_caches, meta, tables, wanted) -> torch.Tensor:
        """linear="mma_fused": 5 kernels a layer (qkv with the norm, RoPE and the cache store; attention;
        o; gate/up with the norm and SiLU x up; down) and the LM head (float32): the embedding rows are
        gathered by the first qkv projection; up to LM_HEAD_MAX_ROWS logits rows the last down
        projection adds the residual and writes its tiles' sums of squares, from which the LM head, its
        weight times the final norm's, scales its rows by 1 / rms (no norm in its ~2000 blocks'
        prologue; the logits to float16 rounding of the separate norm's). The o, gate/up and down projections let the next kernel launch before their
        wait (its loads before its own wait are weights); qkv does not: the attention after it loads
        cached keys before its wait."""
        x, x_rows, residual = model.model.embed_tokens.weight, input_ids, None  # [V, hidden]: rows by token id
        dep, norm = self.dependent, model.model.norm
        mlp_fused = input_ids.shape[0] <= MLP_FUSED_MAX_ROWS
        # Past it: the final norm with the residual, then the head (the GEMV up to LM_HEAD_MAX_ROWS, else cuBLAS).
        head_fused = wanted.shape[0] <= LM_HEAD_MAX_ROWS and mlp_fused
        for layer, kv_cache in zip(model.model.layers, kv_caches):
            norm1, norm2 = layer.input_layernorm, layer.post_attention_layernorm
            rope = RopeCache(positions, self.cos, self.sin, kv_cache, meta.slot_mapping, self.num_heads,
                             inputs_before_wait=x_rows is None)  # the first layer's come from the kernel before
            q, residual = gemv_mma.gemv_mma(x, layer.qkv_weight, norm1.weight, residual, norm1.eps, x_rows=x_rows,
                                            rope=rope, dependent_launch=dep)  # [T, h, d]; K/V now in the cache
            attn = attention_kernel.paged_attention(q, kv_cache, tables, positions, meta.uniform_query_len, layer.scale,
                                                    dependent_launch=dep)
            o = gemv_mma.gemv_mma(attn, layer.self_attn.o_proj.weight, dependent_launch=dep, allow_early=True)
            if mlp_fused:
                act, residual = gemv_mma.gemv_mma(o, layer.gate_up_weight, norm2.weight, residual, norm2.eps,
                                                  glu=True, dependent_launch=dep, allow_early=True)
                last = layer is model.model.layers[-1]
                x = gemv_mma.gemv_mma(act, layer.mlp.down_proj.weight, dependent_launch=dep, allow_early=True,
                                      residual_squares=residual if last and head_fused else None)  # or (stream, squares)
            else:  # the separate norm, cuBLAS, SiLU x up, cuBLAS
                h, residual = add_rms_norm(o, residual, norm2.weight, norm2.eps, self._row_ids[: o.shape[0]])
                x = F.linear(silu_and_mul(F.linear(h, layer.gate_up_weight)), layer.mlp.down_proj.weight)
            x_rows = None
        if not head_fused:
            h, _ = add_rms_norm(x, residual, norm.weight, norm.eps, wanted)
            return self._head(model, h)
        stream, squares = x  # [T, hidden] float16, [T, hidden / 16] float32
        return gemv_mma.gemv_mma(stream, self.folded_head(model), eps=norm.eps, x_rows=wanted, row_squares=squares,
                                 out_dtype=torch.float32, dependent_launch=dep)

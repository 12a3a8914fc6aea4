"""A LlamaForCausalLM's decode forward as one persistent kernel (kernels/persistent_decode.py).

Holds the model's weights stacked by layer once (the kernel takes one array per kind of weight, not a
list), so it doubles the memory of the weights it serves: meant for the draft model, whose forward
is the most launch-bound (or the target when it decodes alone). The KV cache must be one [layers, 2, blocks, block_size, kv_heads, d]
tensor (ModelRunner's per-layer caches are its views). EngineConfig.persistent_decode routes the
decode forwards of both models here (enable_for_runners); tests check it against the model's torch
forward (logits and the K/V it writes) and check the routing.
"""
from __future__ import annotations

import torch

from protospec.errors import ConfigError, KernelArgumentError
from protospec.kernels import interop, persistent_decode
from protospec.kernels.interop import KERNEL_DEVICE_TYPE, check_tensor


class PersistentDecodeForward:
    """One token per sequence through every layer, the LM head included, in one cooperative launch."""

    def __init__(self, model):
        cfg, layers = model.config, model.model.layers
        if not persistent_decode.supports(cfg.head_dim):
            raise KernelArgumentError(f"persistent decode: head_dim {cfg.head_dim} does not fit its attention merge")
        self.dtype = model.model.embed_tokens.weight.dtype
        stack = lambda ws: torch.stack([w.detach() for w in ws]).contiguous()  # noqa: E731  [L, ...]
        self.weights = [
            model.model.embed_tokens.weight.detach(),                    # [V, H]
            stack([layer.input_layernorm.weight for layer in layers]),     # [L, H]
            stack([layer.post_attention_layernorm.weight for layer in layers]),
            model.model.norm.weight.detach()[None],                        # [1, H]
            stack([layer.qkv_weight for layer in layers]),                 # [L, (h + 2 kvh) d, H]
            stack([layer.self_attn.o_proj.weight for layer in layers]),    # [L, H, h d]
            stack([layer.gate_up_weight for layer in layers]),             # [L, 2 I, H]
            stack([layer.mlp.down_proj.weight for layer in layers]),       # [L, H, I]
            model.lm_head.weight.detach()[None],                           # [1, V, H]
            model.rope.cos.to(self.dtype).contiguous(),                    # [P, d], rounded as HF rotates
            model.rope.sin.to(self.dtype).contiguous(),
        ]
        self.eps, self.scale = float(cfg.rms_norm_eps), float(layers[0].scale)
        self.sizes = (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                      cfg.intermediate_size, cfg.num_hidden_layers)
        self.kernel = persistent_decode.decode_kernel(*self.sizes)
        self._blocks: int | None = None  # the cooperative grid, sized once (it depends on the kernel only)
        self._scratch: dict[int, list[torch.Tensor]] = {}  # float32 activations per token count, reused

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
                block_tables: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """input_ids, positions, slot_mapping [T] int64, block_tables [T, W] int32 (each token's sequence's),
        kv [L, 2, blocks, block_size, kvh, d] -> logits [T, V] float32; K/V of the tokens written into kv."""
        hidden, heads, kv_heads, head_dim, intermediate, layers = self.sizes
        tokens = input_ids.shape[0]
        for name, t in (("input_ids", input_ids), ("positions", positions), ("slot_mapping", slot_mapping)):
            check_tensor(name, t, torch.int64, 1, rows=tokens)
        check_tensor("block_tables", block_tables, torch.int32, 2, rows=tokens)
        check_tensor("kv", kv, self.dtype, 6)
        if kv.shape[0] != layers or kv.shape[4:] != (kv_heads, head_dim):
            raise KernelArgumentError(f"kv: shape {tuple(kv.shape)}, expected [{layers}, 2, blocks, block_size, "
                                      f"{kv_heads}, {head_dim}]")
        if tokens not in self._scratch:  # resid, h [T, H]; qkv; q, a [T, h d]; act [T, I]
            widths = (hidden, hidden, (heads + 2 * kv_heads) * head_dim, heads * head_dim, heads * head_dim, intermediate)
            self._scratch[tokens] = [torch.empty(tokens, n, dtype=torch.float32, device=input_ids.device) for n in widths]
        logits = torch.empty(tokens, self.weights[0].shape[0], dtype=torch.float32, device=input_ids.device)
        args = [input_ids, positions, slot_mapping, block_tables, *self.weights, kv, self.eps, self.scale,
                *self._scratch[tokens], logits]
        if self._blocks is None:
            self._blocks = persistent_decode.grid_blocks(self.kernel, args)
            if self._blocks < 1:
                raise KernelArgumentError("persistent decode: not one block of the kernel fits an SM (registers or shared memory)")
        interop.launch_tensors(self.kernel, self._blocks, persistent_decode.THREADS, args)
        return logits


def enable_for_runners(runners: list, device: torch.device) -> None:
    """EngineConfig.persistent_decode: the decode forwards of the model whose decode is the hot path (the
    draft when there is one, else the target: runners lists target then draft) through one persistent
    kernel, checked first (a device the kernels run on, float16 / float32, a head size its merge
    holds). One model only: its weights are stacked by layer, a second copy of them."""
    runners = runners[-1:]
    if device.type != KERNEL_DEVICE_TYPE:
        raise ConfigError(f"persistent_decode=True on device {device}: the Numba kernels run on {KERNEL_DEVICE_TYPE} "
                          "tensors here")
    for runner in runners:
        cfg = runner.model.config
        if runner.dtype not in (torch.float16, torch.float32) or not persistent_decode.supports(cfg.head_dim):
            raise ConfigError(f"persistent_decode=True: the kernel takes float16 / float32 and head sizes up to "
                              f"{persistent_decode.MERGE_BYTES // (4 * persistent_decode.THREADS)}, got {runner.dtype} "
                              f"and head_dim {cfg.head_dim}")
    for runner in runners:
        runner.model.enable_persistent_decode(runner.kv_stack)

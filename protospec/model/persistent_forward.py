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

    def __init__(self, model, timeline: bool = False, threads: int | None = None):
        cfg, layers = model.config, model.model.layers
        self.sizes = (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                      cfg.intermediate_size, cfg.num_hidden_layers)
        why = persistent_decode.unsupported(*self.sizes[:5])
        if why:
            raise KernelArgumentError(f"persistent decode: {why}")
        self.dtype = model.model.embed_tokens.weight.dtype
        if self.dtype not in (torch.float16, torch.float32):
            raise KernelArgumentError(f"persistent decode: float16 or float32 weights, got {self.dtype}")
        stack = lambda ws: torch.stack([w.detach() for w in ws]).contiguous()  # noqa: E731  [L, ...]
        words = lambda w: w.view(torch.int64)  # noqa: E731  [..., cols / (4 or 2)]: 8-byte loads
        self.weights = [
            model.model.embed_tokens.weight.detach(),                           # [V, H]
            stack([layer.input_layernorm.weight for layer in layers]),            # [L, H]
            stack([layer.post_attention_layernorm.weight for layer in layers]),
            model.model.norm.weight.detach()[None],                               # [1, H]
            words(stack([layer.qkv_weight for layer in layers])),                 # [L, (h + 2 kvh) d, H]
            words(stack([layer.self_attn.o_proj.weight for layer in layers])),    # [L, H, h d]
            words(stack([layer.gate_up_weight for layer in layers])),             # [L, 2 I, H]
            words(stack([layer.mlp.down_proj.weight for layer in layers])),       # [L, H, I]
            words(model.lm_head.weight.detach()[None].contiguous()),              # [1, V, H]
            model.rope.cos.to(self.dtype).contiguous(),                           # [P, d], rounded as HF rotates
            model.rope.sin.to(self.dtype).contiguous(),
        ]
        self.eps, self.scale = float(cfg.rms_norm_eps), float(layers[0].scale)
        half = self.dtype == torch.float16
        self.threads = threads or persistent_decode.THREADS
        self.kernel = persistent_decode.decode_kernel(*self.sizes, half=half, timeline=timeline, threads=self.threads)
        self.timeline = torch.zeros(persistent_decode.stamps(cfg.num_hidden_layers) if timeline else 1,
                                    dtype=torch.int64, device=self.weights[0].device)
        self.tokens_per_launch = persistent_decode.tokens_per_launch(cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim,
                                                                     cfg.intermediate_size)
        self.blocks: int | None = None  # the cooperative grid, sized at the first launch (it depends on the kernel only)
        self._scratch: dict[int, list[torch.Tensor]] = {}  # float32 activations per token count, reused

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
                block_tables: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """input_ids, positions, slot_mapping [T] int64, block_tables [T, W] int32 (each token's sequence's),
        kv [L, 2, blocks, block_size, kvh, d] -> logits [T, V] float32; K/V of the tokens written into kv.
        More than tokens_per_launch tokens run as several launches, in order (a token's K/V is in the cache
        before a later launch's tokens attend)."""
        hidden, heads, kv_heads, head_dim, intermediate, layers = self.sizes
        tokens = input_ids.shape[0]
        for name, t in (("input_ids", input_ids), ("positions", positions), ("slot_mapping", slot_mapping)):
            check_tensor(name, t, torch.int64, 1, rows=tokens)
        check_tensor("block_tables", block_tables, torch.int32, 2, rows=tokens)
        check_tensor("kv", kv, self.dtype, 6)
        if kv.shape[0] != layers or kv.shape[4:] != (kv_heads, head_dim):
            raise KernelArgumentError(f"kv: shape {tuple(kv.shape)}, expected [{layers}, 2, blocks, block_size, "
                                      f"{kv_heads}, {head_dim}]")
        logits = torch.empty(tokens, self.weights[0].shape[0], dtype=torch.float32, device=input_ids.device)
        for lo in range(0, tokens, self.tokens_per_launch):
            hi = min(lo + self.tokens_per_launch, tokens)
            self._launch(input_ids[lo:hi], positions[lo:hi], slot_mapping[lo:hi], block_tables[lo:hi], kv, logits[lo:hi])
        return logits

    def _launch(self, input_ids, positions, slot_mapping, block_tables, kv, logits) -> None:
        hidden, heads, kv_heads, head_dim, intermediate, layers = self.sizes
        tokens = input_ids.shape[0]
        if tokens not in self._scratch:  # resid [T, H]; q, a [T, h d]; act [T, I]
            widths = (hidden, heads * head_dim, heads * head_dim, intermediate)
            self._scratch[tokens] = [torch.empty(tokens, n, dtype=torch.float32, device=input_ids.device) for n in widths]
        args = [input_ids, positions, slot_mapping, block_tables, *self.weights, kv, kv.view(torch.int64), self.eps, self.scale,
                *self._scratch[tokens], logits, self.timeline]
        if self.blocks is None:
            sms = torch.cuda.get_device_properties(kv.device).multi_processor_count if kv.is_cuda else 1
            self.blocks = persistent_decode.grid_blocks(self.kernel, self.threads, args, sms)
            if self.blocks < 1:
                raise KernelArgumentError("persistent decode: not one block of the kernel fits an SM (registers or shared memory)")
        interop.launch_tensors(self.kernel, self.blocks, self.threads, args)


def enable_for_runners(runners: list, device: torch.device) -> None:
    """EngineConfig.persistent_decode: the decode forwards of the model whose decode is the hot path (the
    draft when there is one, else the target: runners lists target then draft) through one persistent
    kernel, checked first (a device the kernels run on, float16 / float32, a shape the kernel
    takes: persistent_decode.unsupported). One model only: its weights are stacked by layer, a second copy of them."""
    runners = runners[-1:]
    if device.type != KERNEL_DEVICE_TYPE:
        raise ConfigError(f"persistent_decode=True on device {device}: the Numba kernels run on {KERNEL_DEVICE_TYPE} "
                          "tensors here")
    for runner in runners:
        cfg = runner.model.config
        why = persistent_decode.unsupported(cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                                            cfg.head_dim, cfg.intermediate_size)
        if runner.dtype not in (torch.float16, torch.float32):
            raise ConfigError(f"persistent_decode=True: the kernel takes float16 / float32 weights, got {runner.dtype}")
        if why:
            raise ConfigError(f"persistent_decode=True: {why}")
    for runner in runners:
        runner.model.enable_persistent_decode(runner.kv_stack)

"""A LlamaForCausalLM's decode forward as one persistent kernel (kernels/persistent_decode.py), or its
phases as one ordinary kernel each (kernels/phase_kernels.py, launches="per_phase").

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
from protospec.kernels import interop, persistent_decode, persistent_phases, phase_kernels
from protospec.kernels.interop import KERNEL_DEVICE_TYPE, check_tensor


class PersistentDecodeForward:
    """One token per sequence through every layer, the LM head included: one cooperative launch, or
    five launches a layer and one for the head (launches="per_phase")."""

    def __init__(self, model, timeline: bool = False, threads: int | None = None, launches: str = "one"):
        cfg, layers = model.config, model.model.layers
        self.sizes = (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                      cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size)
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
        if launches not in ("one", "per_phase") or (timeline and launches != "one"):
            raise KernelArgumentError(f"persistent decode: launches 'one' (a cooperative kernel, timeline allowed) or "
                                      f"'per_phase' (an ordinary kernel per phase), got {launches!r}")
        self.launches = launches
        self.kernel = persistent_decode.decode_kernel(*self.sizes, half=half, timeline=timeline, threads=self.threads)
        self.phases = phase_kernels.phase_kernels(*self.sizes[:5], self.sizes[6], half, self.threads,
                                                  persistent_decode.LM_HEAD_ROWS, persistent_phases.V_KEYS_PER_LOAD) \
            if launches == "per_phase" else None
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
        hidden, heads, kv_heads, head_dim, intermediate, layers, vocab = self.sizes
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
        hidden, heads, kv_heads, head_dim, intermediate, layers, vocab = self.sizes
        tokens = input_ids.shape[0]
        if tokens not in self._scratch:  # resid [T, H]; q, a [T, h d]; act [T, I]
            widths = (hidden, heads * head_dim, heads * head_dim, intermediate)
            self._scratch[tokens] = [torch.empty(tokens, n, dtype=torch.float32, device=input_ids.device) for n in widths]
        if self.phases is not None:
            self._launch_per_phase(input_ids, positions, slot_mapping, block_tables, kv, logits, self._scratch[tokens])
            return
        args = [input_ids, positions, slot_mapping, block_tables, *self.weights, kv, kv.view(torch.int64), self.eps, self.scale,
                *self._scratch[tokens], logits, self.timeline]
        if self.blocks is None:
            sms = torch.cuda.get_device_properties(kv.device).multi_processor_count if kv.is_cuda else 1
            self.blocks = persistent_decode.grid_blocks(self.kernel, self.threads, args, sms)
            if self.blocks < 1:
                raise KernelArgumentError("persistent decode: not one block of the kernel fits an SM (registers or shared memory)")
        interop.launch_tensors(self.kernel, self.blocks, self.threads, args)


    def _launch_per_phase(self, ids, positions, slots, tables, kv, logits, scratch) -> None:
        """The same phases as ordinary kernels, one launch each (kernels/phase_kernels.py)."""
        embed, norm1, norm2, norm_f, w_qkv, w_o, w_gu, w_down, w_lm, cos, sin = self.weights
        resid, q, a, act = scratch
        kernels, threads, kv_words = self.phases, self.threads, kv.view(torch.int64)
        launch = lambda name, args, blocks=None: interop.launch_tensors(  # noqa: E731
            kernels[name][0], kernels[name][1] if blocks is None else blocks, threads, args)
        for layer in range(self.sizes[5]):
            launch("qkv", [layer, ids, positions, slots, embed, resid, norm1, w_qkv, cos, sin, q, kv, self.eps])
            launch("attend", [layer, q, kv_words, tables, positions, self.scale, a], ids.shape[0] * self.sizes[1])
            launch("o", [layer, w_o, a, ids, resid, norm1])
            launch("gate_up", [layer, ids, resid, norm2, w_gu, act, self.eps])
            launch("down", [layer, w_down, act, ids, resid, norm1])
        launch("lm", [ids, resid, norm_f, w_lm, logits, self.eps])


def enable_for_runners(runners: list, device: torch.device, launches: str = "one") -> None:
    """EngineConfig.persistent_decode: the decode forwards of the model whose decode is the hot path (the
    draft when there is one, else the target: runners lists target then draft) through one persistent
    kernel, checked first (a device the kernels run on, float16 / float32, a shape the kernel
    takes: persistent_decode.unsupported). One model only: its weights are stacked by layer, a second copy of them."""
    runners = runners[-1:]
    if device.type != KERNEL_DEVICE_TYPE:
        raise ConfigError(f"persistent_decode ({launches}) on device {device}: the Numba kernels run on {KERNEL_DEVICE_TYPE} "
                          "tensors here")
    for runner in runners:
        cfg = runner.model.config
        why = persistent_decode.unsupported(cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                                            cfg.head_dim, cfg.intermediate_size)
        if runner.dtype not in (torch.float16, torch.float32):
            raise ConfigError(f"persistent_decode ({launches}): the kernels take float16 / float32 weights, got {runner.dtype}")
        if why:
            raise ConfigError(f"persistent_decode ({launches}): {why}")
    for runner in runners:
        runner.model.enable_persistent_decode(runner.kv_stack, launches)

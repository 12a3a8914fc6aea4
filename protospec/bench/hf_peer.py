"""The same-run peers from Hugging Face transformers: assisted generation (speculative decoding with
an assistant model and a constant k, or prompt lookup decoding for the n-gram proposer), plain
target-only generate(), and transformers' fast path (a static KV cache, with which generate()
compiles the forward with torch.compile on CUDA), on protospec's own weights."""
from __future__ import annotations

import torch

from protospec.model.llama import LlamaForCausalLM


def to_hf(model: LlamaForCausalLM):
    """A transformers LlamaForCausalLM holding exactly our weights (same names, same dtype/device)."""
    from transformers import LlamaConfig
    from transformers import LlamaForCausalLM as HFLlama

    cfg = model.config
    hf_cfg = LlamaConfig(
        hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
        vocab_size=cfg.vocab_size, max_position_embeddings=cfg.max_position_embeddings, rms_norm_eps=cfg.rms_norm_eps,
        rope_theta=cfg.rope_theta, tie_word_embeddings=cfg.tie_word_embeddings, bos_token_id=cfg.bos_token_id,
        eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id,
    )
    param = next(model.parameters())
    with torch.device(param.device):
        hf = HFLlama(hf_cfg).to(param.dtype)
    missing, unexpected = hf.load_state_dict(model.state_dict(), strict=False)
    if [m for m in missing if m != "lm_head.weight" or not cfg.tie_word_embeddings] or unexpected:
        raise RuntimeError(f"weights did not map onto transformers' Llama: missing {missing}, unexpected {unexpected}")
    return hf.eval()


class HFGenerate:
    """A callable that runs one transformers generate() over a batch of prompts, exactly
    `output_len` new tokens, sampling like protospec's bench (temperature, no top-k/top-p).
    compile=False keeps a static cache uncompiled. On the H200, after generate() had compiled the
    forward in a process (transformers' default: mode reduce-overhead, CUDA graphs), a later
    torch.cuda.graph capture of a matmul in that process failed (CUBLAS_STATUS_EXECUTION_FAILED), so a
    process that captures graphs afterwards (a test session) compiles in a child process instead."""

    def __init__(self, target, prompts: list[list[int]], output_len: int, temperature: float,
                 assistant=None, num_assistant_tokens: int = 5, seed: int = 0, prompt_lookup_max: int | None = None,
                 static_cache: bool = False, compile: bool = True):
        if (assistant is not None or prompt_lookup_max) and len(prompts) != 1:
            raise ValueError("transformers' assisted generation supports batch size 1 only")
        device = next(target.parameters()).device
        self.target, self.seed = target, seed
        self.input_ids = torch.tensor(prompts, device=device)
        self.kwargs = dict(attention_mask=torch.ones_like(self.input_ids), max_new_tokens=output_len,
                           min_new_tokens=output_len, do_sample=temperature > 0, pad_token_id=target.config.pad_token_id)
        if temperature > 0:
            self.kwargs.update(temperature=temperature, top_k=0, top_p=1.0)
        if assistant is not None:
            # A constant k, as protospec uses: no schedule, no early stop on low draft confidence.
            self.kwargs.update(assistant_model=assistant, num_assistant_tokens=num_assistant_tokens,
                               num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0)
        elif prompt_lookup_max:  # transformers' prompt lookup decoding: its n-gram proposer
            self.kwargs.update(prompt_lookup_num_tokens=num_assistant_tokens, max_matching_ngram_size=prompt_lookup_max)
        if static_cache:
            # A fixed-shape cache is what lets generate() compile the decode forward (on CUDA; a CPU run
            # gets the static cache without compilation): the first call compiles, so time after warm-up.
            if assistant is not None or prompt_lookup_max:
                raise ValueError("the static-cache peer decodes the target alone")
            self.kwargs.update(cache_implementation="static", disable_compile=not compile)

    @torch.inference_mode()
    def __call__(self) -> torch.Tensor:
        torch.manual_seed(self.seed)
        return self.target.generate(self.input_ids, **self.kwargs)


def compiled_graph_count() -> int:
    """Graphs torch.compile has produced in this process (0: nothing was compiled)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class HFStaticLoop:
    """Fast target-only decoding as a PyTorch user writes it (gpt-fast's pattern on transformers' Llama):
    a StaticCache, the one-token forward compiled with torch.compile(mode="reduce-overhead") (CUDA graphs),
    and a hand-written loop that samples on the device (argmax, or the exponential race at temperature T)
    and never reads a token back until the end. The prefill runs eagerly. compile=False (a CPU) keeps the
    loop without compilation."""

    def __init__(self, target, prompts: list[list[int]], output_len: int, temperature: float, seed: int = 0,
                 compile: bool = True):
        from transformers import StaticCache

        self.target, self.output_len, self.temperature, self.seed = target, output_len, temperature, seed
        self.device = next(target.parameters()).device
        self.input_ids = torch.tensor(prompts, device=self.device)                # [B, P]
        batch, prompt_len = self.input_ids.shape
        self.cache = StaticCache(config=target.config, max_cache_len=prompt_len + output_len)
        self.prompt_positions = torch.arange(prompt_len, device=self.device)     # [P]
        self.decode_one = torch.compile(self._forward, mode="reduce-overhead", fullgraph=True) if compile else self._forward
        self.compiled = compile

    def _forward(self, ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        """ids [B, T] -> the last position's logits [B, V] float32."""
        out = self.target(input_ids=ids, cache_position=cache_position, past_key_values=self.cache, use_cache=True)
        return out.logits[:, -1].float()

    def _sample(self, logits: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """[B, V] -> [B, 1] int64 on the device, no host sync."""
        if self.temperature <= 0:
            return logits.argmax(-1, keepdim=True)
        probs = torch.softmax(logits / self.temperature, -1)
        noise = torch.empty_like(probs).exponential_(generator=generator)
        return (probs / noise).argmax(-1, keepdim=True)

    @torch.inference_mode()
    def __call__(self) -> torch.Tensor:
        generator = torch.Generator(self.device).manual_seed(self.seed)
        self.cache.reset()
        token = self._sample(self._forward(self.input_ids, self.prompt_positions), generator)  # [B, 1]
        tokens = [token]
        position = torch.tensor([self.input_ids.shape[1]], device=self.device)                # [1]
        for _ in range(self.output_len - 1):
            if self.compiled:
                torch.compiler.cudagraph_mark_step_begin()  # the last replay's outputs are read already
            token = self._sample(self.decode_one(token, position), generator)
            tokens.append(token)
            position = position + 1
        return torch.cat([self.input_ids, *tokens], 1)  # [B, P + output_len], as generate() returns

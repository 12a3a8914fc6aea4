"""ModelRunner: one model, its paged KV cache, and the counters of which input path ran."""
from __future__ import annotations

from collections import Counter

import torch

from protospec.model.graphs import GraphCache
from protospec.model.inputs import ForwardInputs, prepare_inputs
from protospec.model.llama import LlamaForCausalLM


class ModelRunner:
    """Counters (see `counters`): every CPU prepare is counted under `cpu_prepare` and under
    `cpu_prepare:<why>` (prefill, first_draft_step, verify, decode); a draft step 2..k that could
    have been advanced on the GPU but was CPU-prepared counts as `fallback:<reason>`. The draft
    loops count their device-built inputs here too: `gpu_advance` per advance_step launch,
    `gpu_first_step` per draft step 1 built on the device (speculation/device_draft_loops.py)."""

    def __init__(self, model: LlamaForCausalLM, num_blocks: int, block_size: int):
        cfg = model.config
        param = next(model.parameters())
        self.model = model
        self.block_size = block_size
        self.device, self.dtype = param.device, param.dtype
        self.vocab_size = cfg.vocab_size
        # Every layer's cache in one allocation, [layers, 2 (K, V), num_blocks, block_size, num_kv_heads,
        # head_dim]; the forwards take its per-layer views.
        kv_stack = torch.zeros(cfg.num_hidden_layers, 2, num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim,
                                    dtype=self.dtype, device=self.device)
        self.kv_caches = list(kv_stack.unbind(0))
        self.counters: Counter[str] = Counter()
        self.graphs: GraphCache | None = None
        self.max_graph_query_len = 0

    def enable_cuda_graphs(self, max_rows: int, max_blocks: int, max_query_len: int) -> None:
        """Replay forwards of up to max_query_len tokens per sequence as CUDA graphs, and the longer
        uniform prefills whose layout repeats (GraphCache.take_prefill)."""
        self.graphs = GraphCache(self.model, self.kv_caches, self.block_size, max_rows, max_blocks)
        self.max_graph_query_len = max_query_len

    @property
    def launches_dependents(self) -> bool:
        """Whether this model's decode-shaped forwards launch their kernels as programmatic dependents
        (EngineConfig.dependent_launch): the kernels that read their logits (sampling) then may too."""
        forward = self.model.layer_kernels
        return forward is not None and forward.dependent

    @staticmethod
    def kv_bytes_per_block(model: LlamaForCausalLM, block_size: int, dtype: torch.dtype) -> int:
        cfg = model.config
        per_token = 2 * cfg.num_key_value_heads * cfg.head_dim * torch.tensor([], dtype=dtype).element_size()
        return cfg.num_hidden_layers * block_size * per_token

    def prepare(self, why: str, token_chunks, start_positions, block_tables, num_logits, max_blocks=None) -> ForwardInputs:
        """The CPU reference path: build every input from Python lists, copy to the device.
        why: a counter label (prefill, first_draft_step, verify, decode, or fallback:<reason>)."""
        self.counters["cpu_prepare"] += 1
        self.counters[why if why.startswith("fallback:") else f"cpu_prepare:{why}"] += 1
        return prepare_inputs(token_chunks, start_positions, block_tables, self.block_size, num_logits, self.device, max_blocks)

    def execute(self, inputs: ForwardInputs) -> torch.Tensor:
        """Forward; returns logits [num_logits, vocab] float32 on the device."""
        if self.graphs is not None and inputs.query_len is not None:
            if inputs.query_len <= self.max_graph_query_len:
                self.counters["forward:graph"] += 1
                return self.graphs.run(inputs)
            if self.graphs.take_prefill(inputs):
                self.counters["forward:graph_prefill"] += 1
                return self.graphs.run(inputs)
        self.counters["forward:eager"] += 1
        return self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta)

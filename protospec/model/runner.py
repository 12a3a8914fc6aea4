"""ModelRunner: one model, its paged KV cache, and the counters of which input path ran."""
from __future__ import annotations

from collections import Counter

import torch

from protospec.model.graphs import GraphCache
from protospec.spec.decode_state import DraftDecodeState
from protospec.spec.first_step_state import FirstStepState
from protospec.model.inputs import ForwardInputs, prepare_inputs
from protospec.model.llama import LlamaForCausalLM


class ModelRunner:
    """Counters (see `counters`): every CPU prepare is counted under `cpu_prepare` and under
    `cpu_prepare:<why>` (prefill, first_draft_step, verify, decode); a draft step 2..k that could
    have been advanced on the GPU but was CPU-prepared counts as `fallback:<reason>`; each
    advance_step launch counts as `gpu_advance`, each first draft step built on the device (the
    overlapped commit) as `gpu_first_step`."""

    def __init__(self, model: LlamaForCausalLM, num_blocks: int, block_size: int):
        cfg = model.config
        param = next(model.parameters())
        self.model = model
        self.block_size = block_size
        self.device, self.dtype = param.device, param.dtype
        self.vocab_size = cfg.vocab_size
        # One cache tensor per layer: [2 (K, V), num_blocks, block_size, num_kv_heads, head_dim].
        self.kv_caches = [
            torch.zeros(2, num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim, dtype=self.dtype, device=self.device)
            for _ in range(cfg.num_hidden_layers)
        ]
        self.counters: Counter[str] = Counter()
        self.decode_state: DraftDecodeState | None = None
        self.first_step: FirstStepState | None = None
        self.graphs: GraphCache | None = None
        self.max_graph_query_len = 0

    def enable_cuda_graphs(self, max_rows: int, max_blocks: int, max_query_len: int) -> None:
        """Replay forwards of up to max_query_len tokens per sequence as CUDA graphs (never prefill)."""
        self.graphs = GraphCache(self.model, self.kv_caches, self.block_size, max_rows, max_blocks)
        self.max_graph_query_len = max_query_len

    def enable_gpu_advance(self, max_num_seqs: int, max_blocks: int) -> None:
        """Allocate the persistent decode buffers (steps 2..k, and the first step when it is built on
        the device) and bind the advance_step kernel to them."""
        self.decode_state = DraftDecodeState(max_num_seqs, max_blocks, self.block_size, self.device)
        self.first_step = FirstStepState(max_num_seqs, max_blocks, self.block_size, self.decode_state.error_row, self.device)

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

    def advance(self) -> ForwardInputs:
        """The GPU path: advance the decode buffers in place with the advance_step kernel."""
        self.counters["gpu_advance"] += 1
        self.decode_state.advance()
        return self.decode_state.inputs()

    def first_step_on_device(self, result, block_tables, lengths, last_tokens) -> ForwardInputs:
        """The next first draft step's inputs, built on the device from a rejection output."""
        self.counters["gpu_first_step"] += 1
        return self.first_step.build(result, block_tables, lengths, last_tokens)

    def execute(self, inputs: ForwardInputs) -> torch.Tensor:
        """Forward; returns logits [num_logits, vocab] float32 on the device."""
        if self.graphs is not None and inputs.query_len is not None and inputs.query_len <= self.max_graph_query_len:
            self.counters["forward:graph"] += 1
            return self.graphs.run(inputs)
        self.counters["forward:eager"] += 1
        return self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta)

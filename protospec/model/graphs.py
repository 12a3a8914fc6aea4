"""CUDA graphs for the forwards whose shape repeats: draft decode steps (1 token per sequence),
the draft's first step (2 tokens) and the target's verify (k+1 tokens).

An eager 12-layer forward is CPU-launch-bound (~800 kernel launches); replayed as a graph it costs
one launch. vLLM captured its decode forward the same way in the study we reproduce, so the draft
loop's input preparation is what is left to compare. A graph reads fixed addresses, so each
layout gets persistent buffers (PersistentInputs): CPU-prepared inputs are copied in (device to
device), while device-built inputs (the draft's decode buffers, advanced by advance_step, and its
first-step buffers, built by first_draft_step) are captured themselves (no copies).
Batches are padded up to a power-of-two row count and block tables to a power-of-two width.

A prefill is eager the first time its layout runs (a new prompt length would cost a capture); a
uniform prefill layout (every prompt of the batch one length) seen before is captured and replayed,
at most MAX_PREFILL_GRAPHS layouts a model. Its eager form is launch-bound too (~20 torch kernels a
layer); a benchmark's repeated prompts, or a server's common lengths, repeat.
"""
from __future__ import annotations

import contextlib
from collections import Counter

import torch

from protospec.model.inputs import ForwardInputs
from protospec.model.persistent_inputs import PersistentInputs


# The most prefill layouts a model keeps graphs of: each holds its own static inputs and graph pool.
MAX_PREFILL_GRAPHS = 4


def bucket(n: int, cap: int, smallest: int = 1) -> int:
    """The power of two >= n (at least `smallest`), or cap where that is larger than cap."""
    size = smallest
    while size < n:
        size *= 2
    return min(size, cap)


@contextlib.contextmanager
def sync_allowed():
    """Capture synchronises once; lift a sync-debug guard around it (setup, not steady state)."""
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode(0)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


class CapturedForward:
    """model.forward over fixed input tensors, captured once and replayed.

    Capture must happen while the tensors hold this step's real inputs: the warm-up forwards
    write this step's K/V (the replay then writes the same values again).
    cuBLAS keeps a workspace per stream and a captured GEMM keeps its address, so every graph
    captured on torch's capture stream shares one workspace. That is safe only because the engine
    replays its graphs one after another on one stream; replayed side by side on two streams,
    they would write each other's partial sums (prefill.py says what that did once)."""

    def __init__(self, model, kv_caches, inputs: ForwardInputs):
        def forward():
            return model(inputs.input_ids, inputs.positions, kv_caches, inputs.meta)

        with sync_allowed():
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up: lazy inits (cuBLAS handles) stay out of the graph
                forward()
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.logits = forward()  # [rows * logits_per_seq, V] float32, overwritten by each replay

    def replay(self) -> torch.Tensor:
        self.graph.replay()
        return self.logits


class GraphCache:
    """The captured forwards of one ModelRunner, keyed by layout bucket, made on first use."""

    def __init__(self, model, kv_caches, block_size: int, max_rows: int, max_blocks: int):
        self.model, self.kv_caches, self.block_size = model, kv_caches, block_size
        self.max_rows, self.max_blocks = max_rows, max_blocks
        self.static: dict[tuple, PersistentInputs] = {}
        self.graphs: dict[tuple, CapturedForward] = {}
        self.prefills_seen: Counter[tuple] = Counter()  # uniform prefill layouts -> times run
        self.prefill_keys: set[tuple] = set()           # those captured

    def _key(self, inputs: ForwardInputs) -> tuple:
        seqs, width = inputs.meta.block_tables.shape
        rows = bucket(seqs, self.max_rows)
        width = bucket(width, self.max_blocks, smallest=8)
        if inputs.persistent is not None:
            return inputs.persistent.name, rows, width
        prompts = "_prompts" if inputs.meta.whole_prompts else ""  # their attention differs (AttentionMetadata)
        return f"static_q{inputs.query_len}_l{inputs.logits_per_seq}{prompts}", rows, width

    def take_prefill(self, inputs: ForwardInputs) -> bool:
        """Whether this uniform prefill replays a graph: its layout ran before (a one-off length stays
        eager) and there is room for it among the prefill graphs, or it has one already."""
        key = self._key(inputs)
        if key in self.prefill_keys:
            return True
        if len(self.prefill_keys) >= MAX_PREFILL_GRAPHS:  # full: nothing new is counted or captured
            return False
        self.prefills_seen[key] += 1
        if self.prefills_seen[key] < 2:
            return False
        self.prefill_keys.add(key)
        return True

    def static_inputs(self, inputs: ForwardInputs) -> tuple[tuple, ForwardInputs]:
        """The layout's key and the fixed buffers a graph of it reads, holding this batch: device-built
        inputs are their own buffers; CPU-prepared ones are copied into the layout's static buffers
        (padding rows: slot -1)."""
        key = self._key(inputs)
        _, rows, width = key
        if inputs.persistent is not None:
            return key, inputs.persistent.view(rows, width)
        if key not in self.static:
            self.static[key] = PersistentInputs(key[0], rows, inputs.query_len, width, inputs.logits_per_seq,
                                                self.block_size, inputs.input_ids.device, inputs.meta.whole_prompts)
        self.static[key].fill(inputs)
        return key, self.static[key].view(rows, width)

    def run(self, inputs: ForwardInputs) -> torch.Tensor:
        seqs = inputs.meta.block_tables.shape[0]
        key, static_inputs = self.static_inputs(inputs)
        if key not in self.graphs:
            self.graphs[key] = CapturedForward(self.model, self.kv_caches, static_inputs)
        return self.graphs[key].replay()[: seqs * inputs.logits_per_seq]

"""Both models' prefill of newly admitted prompts: the draft's forward fills its KV cache (no
logits), the target's fills its own and returns the logits of each prompt's last token.

The two forwards run one after the other on the current stream. They share nothing but their
inputs' token ids, so they could run side by side on two streams, and did once: at batch 1 that
saved about half a microsecond a spec step, and under an offline batch of thousands of prompts it
hung the GPU. Two cuBLAS GEMMs of one shape running at once, one on each stream, both waited
forever (NOTES.md, 2026-12-04): split-K GEMMs whose blocks wait on each other through a workspace
the two launches shared. Nothing in the engine runs a cuBLAS call beside another one now.
"""
from __future__ import annotations

import torch

from protospec.model.runner import ModelRunner


class Prefill:
    def __init__(self, target: ModelRunner, draft: ModelRunner | None):
        self.target, self.draft = target, draft

    def __call__(self, prompts: list[list[int]], tables: list[list[int]]) -> torch.Tensor:
        """Logits [len(prompts), V] of each prompt's last token; both caches hold the prompts."""
        starts = [0] * len(prompts)
        if self.draft is not None:
            self.draft.execute(self.draft.prepare("prefill", prompts, starts, tables, num_logits=0))
        return self.target.execute(self.target.prepare("prefill", prompts, starts, tables, num_logits=1))

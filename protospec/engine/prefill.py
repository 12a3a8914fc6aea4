"""Both models' prefill of newly admitted prompts: the draft's forward fills its KV cache (no
logits), the target's fills its own and returns the logits of each prompt's last token.

The two forwards share nothing but their inputs' token ids, so with `side` (EngineConfig.
draft_prefill_side) on a CUDA device the draft's runs on a stream of its own, beside the target's:
at batch 1 a prefill's kernels are small and the two forwards' kernels fit the GPU together. The
current stream waits for the draft's before anything after the prefill (draft step 1 reads its KV).
The side stream waits for the current one before the target's forward, so the draft's forward sees
every input copy queued so far; the target's logits come from the current stream as before. The
draft's kernels count their blocks' arrivals (split-K attention) in counters of their own
(paged_attention.counter_space): shared, the two forwards' blocks would count in the same slots.
Likewise its prefill graphs are captured on a stream of their own (prefill_capture_stream), not on
torch's capture stream: replayed side by side, two graphs captured on one stream share cuBLAS's
workspace.
"""
from __future__ import annotations

import torch

from protospec.kernels.paged_attention import counter_space
from protospec.model.runner import ModelRunner


def prefill_capture_stream(device: torch.device) -> torch.cuda.Stream:
    """Where the draft's prefill graphs are captured: high priority, so never one of the
    low-priority streams torch hands out (its own capture stream, where the target's graphs are
    captured, and every plain torch.cuda.Stream()). cuBLAS's workspace goes by the capture stream
    (graphs.CapturedForward), and the two models' prefill graphs replay at the same time."""
    return torch.cuda.Stream(device, priority=-1)


class Prefill:
    def __init__(self, target: ModelRunner, draft: ModelRunner | None, side: bool, device: torch.device):
        self.target, self.draft = target, draft
        self.side = side and draft is not None and device.type == "cuda"
        self._stream: torch.cuda.Stream | None = None

    def __call__(self, prompts: list[list[int]], tables: list[list[int]]) -> torch.Tensor:
        """Logits [len(prompts), V] of each prompt's last token; both caches hold the prompts."""
        starts = [0] * len(prompts)
        # Both forwards' inputs first (host work and host-to-device copies on the current stream): the
        # target's prepared after the draft's launch would leave the draft's forward alone on the GPU.
        draft_inputs = None
        if self.draft is not None:
            draft_inputs = self.draft.prepare("prefill", prompts, starts, tables, num_logits=0)
        target_inputs = self.target.prepare("prefill", prompts, starts, tables, num_logits=1)
        if not self.side:
            if draft_inputs is not None:
                self.draft.execute(draft_inputs)
            return self.target.execute(target_inputs)
        # The target's first: the host's launches of the draft's forward then overlap the target's
        # kernels instead of running ahead of them (the draft's forward alone on the GPU again).
        if self._stream is None:
            self._stream = torch.cuda.Stream(target_inputs.input_ids.device)
            if self.draft.graphs is not None:  # its prefill graphs replay beside the target's
                self.draft.graphs.prefill_capture_stream = prefill_capture_stream(target_inputs.input_ids.device)
        self._stream.wait_stream(torch.cuda.current_stream())
        logits = self.target.execute(target_inputs)
        with torch.cuda.stream(self._stream), counter_space(":draft_prefill"):  # its own arrival counters
            self.draft.execute(draft_inputs)
        # The draft's inputs were allocated on the current stream and are freed once this returns:
        # the wait also keeps their memory from being reused before the draft's forward read them.
        torch.cuda.current_stream().wait_stream(self._stream)
        return logits

"""The draft's probabilities off the draft loop's chain of kernels.

A draft step's next forward needs its token only; its probabilities q (a [V] row per sequence) are
read first by the rejection sampler, after the verify. With SAMPLE_FIRST, a captured draft loop
(draft_graph.py) samples each step's token in one launch (kernels/gumbel_sample.py) and computes
that step's probabilities with sampling.py's kernels on a stream of its own, forked after the LM head
wrote the logits: they run beside the next draft forward, not between the forwards. The branch is
joined before anything reads the probabilities (the end of the draft loop, or, in a spec step graph,
just before the rejection sampler), and holds each step's logits until then, so no later step's
allocation reuses their memory while the branch may still read them.
"""
from __future__ import annotations

import torch

# The captured draft loops' token in one Gumbel-max launch, the probabilities on a branch. Same
# probabilities; the same tokens as the race unless two candidates tie to float32 rounding. Set
# before any graph is captured (bench and kernel_census: --draft-sample-first).
SAMPLE_FIRST = False


class ProbsBranch:
    def __init__(self, device: torch.device):
        # Off a GPU (the simulator's CPU tensors) there are no streams: the branch's work runs in place.
        self.stream = torch.cuda.Stream(device) if torch.device(device).type == "cuda" else None
        self.held: list[torch.Tensor] = []  # the logits the branch reads, until the join

    def launch(self, logits: torch.Tensor, work) -> None:
        """Run work() (which reads logits) on the branch, after everything queued so far."""
        if self.stream is None:
            work()
            return
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            work()
        self.held.append(logits)

    def join(self) -> None:
        """The current stream waits for the branch's work (nothing to wait for: nothing queued)."""
        if self.stream is not None and self.held:
            torch.cuda.current_stream().wait_stream(self.stream)
        self.held.clear()

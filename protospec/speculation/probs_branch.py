"""The draft's probabilities off the draft loop's chain of kernels.

A draft step's next forward needs its token only; its probabilities q (a [V] row per sequence) are
read first by the rejection sampler, after the verify. A captured draft loop that starts at draft
step 1 (draft_graph.py) samples each step's token in one launch
(kernels/sampling/gumbel_sample.py), which leaves a copy of the step's logits where its probabilities go;
after the k-th step, sampling/softmax_sample.py's two kernels turn all k rows of logits into probabilities in
place (the same arithmetic, so the same bits as sampling each step with them), on a stream of their
own, forked there: in a spec step graph they run beside the verify's forward, joined just before the
rejection sampler reads them. In all, two launches beside the verify for 2k launches between the
draft forwards. Where the rejection kernel forms q from the logits itself (step_graph.py), the branch
leaves the logits and launches the statistics kernel alone (`statistics`).
"""
from __future__ import annotations

import torch

from protospec.speculation.sampler import SamplingTensors


class ProbsBranch:
    def __init__(self, device: torch.device):
        # Off a GPU (the simulator's CPU tensors) there are no streams: the branch's work runs in place.
        self.stream = torch.cuda.Stream(device) if torch.device(device).type == "cuda" else None
        self.pending = False  # work queued on the branch and not yet joined
        self.rows: tuple | None = None  # the last `statistics` call's finished rows

    def probabilities(self, draft_probs: torch.Tensor, st: SamplingTensors, statistics: bool = False) -> None:
        """draft_probs [rows, k, V] f32 holding each step's logits -> their probabilities, in place,
        after everything queued so far on the current stream (st: the rows' settings). statistics:
        the logits stay; each row's finished statistics go to self.rows (stats.launch_stats')."""
        from protospec.kernels.sampling.softmax_sample import probs_into
        from protospec.kernels.sampling.stats import launch_stats

        rows, k, vocab = draft_probs.shape
        flat = draft_probs.view(rows * k, vocab)  # row b k + j: sequence b's step j

        def work():
            if statistics:
                self.rows = launch_stats(flat, st, k, "_branch", False, finish=True)
            else:
                probs_into(flat, st, flat, k, space="_branch")
        if self.stream is None:
            work()
            return
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            work()
        self.pending = True

    def join(self) -> None:
        """The current stream waits for the branch's work (nothing to wait for: nothing queued)."""
        if self.stream is not None and self.pending:
            torch.cuda.current_stream().wait_stream(self.stream)
        self.pending = False

"""The device ways of the draft loop: inputs advanced in place by the advance_step kernel (gpu),
and the same with steps 2..k replayed as one CUDA graph (graph); in the graph way, a draft step 1
the overlapped commit built on the device joins that replay (steps 1..k, one launch).

Each owns its persistent buffers (DraftDecodeState for steps 2..k, FirstStepState for a draft
step 1 built on the device by the overlapped commit), so the kernels' arguments are bound once and
captured graphs read them directly. At k = 1 there is no step 2 to advance: only draft step 1's
buffers are used.
"""
from __future__ import annotations

import torch

from protospec.requests.sequence import Sequence
from protospec.model.graphs import bucket
from protospec.model.inputs import ForwardInputs
from protospec.model.runner import ModelRunner
from protospec import registry
from protospec.speculation.decode_state import DraftDecodeState
from protospec.speculation.draft_graph import DraftLoopGraph
from protospec.speculation.draft_loop import DraftLoop, DrawRandoms
from protospec.speculation.first_step_state import FirstStepState
from protospec.speculation.lookahead import Lookahead
from protospec.layout import RejectionOutput
from protospec.speculation.sampler import SamplingTensors
from protospec.speculation.step_state import StepState


class DeviceAdvanceLoop(DraftLoop):
    kind = registry.DRAFT_LOOPS[registry.GPU]

    def __init__(self, draft: ModelRunner, look: Lookahead, max_num_seqs: int, max_blocks: int,
                 fused_sampling: bool, fallback_reason: str, wait_s: float):
        super().__init__(draft, look, fused_sampling, fallback_reason, wait_s)
        self.advances = look.k > 1  # k = 1 has no step 2 to advance
        error_row = torch.zeros(1, dtype=torch.int32, device=self.device)  # [1] shared: read at each commit
        args = (max_num_seqs, max_blocks, draft.block_size, self.device, error_row)
        # advance_step follows the draft step's sampling: a dependent where the forward's kernels are
        self.decode = DraftDecodeState(f"{self.name}_decode", *args, dependent=draft.launches_dependents)
        self.first_step = FirstStepState(f"{self.name}_first_step", *args)

    def first_inputs(self, s: StepState) -> ForwardInputs:
        inputs = super().first_inputs(s)
        if self.advances:
            self.decode.seed(inputs.meta)
        return inputs

    def build_first_inputs(self, result: RejectionOutput, seqs: list[Sequence], committed: bool = False) -> ForwardInputs:
        self.draft.counters["gpu_first_step"] += 1
        back = 1 if committed else 0  # the result re-emits the committed last token: L and t_{L-1} one back
        inputs = self.first_step.build(result, [seq.block_table for seq in seqs], [seq.num_tokens - back for seq in seqs],
                                       [seq.tokens(-1 - back)[0] for seq in seqs])
        if self.advances:
            self.decode.seed(inputs.meta)
        return inputs

    def next_inputs(self, s: StepState) -> ForwardInputs:
        self.draft.counters["gpu_advance"] += 1
        self.decode.advance()
        return self.decode.inputs()

    def error_flag(self) -> torch.Tensor:
        return self.decode.error_row

    def sample_mirror(self, batch: int) -> torch.Tensor | None:
        return self.decode.sampled_ids[:batch] if self.advances else None  # read by advance_step


class DeviceGraphLoop(DeviceAdvanceLoop):
    """Steps 2..k (advance, forward, sampling) as one replay, so the CPU's cost no longer grows with k."""

    kind = registry.DRAFT_LOOPS[registry.GRAPH]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.graphs: dict[tuple, DraftLoopGraph] = {}

    def _graph(self, batch: int, width: int, st: SamplingTensors, from_first_step: bool = False) -> DraftLoopGraph:
        """The steps 2..k graph, or (from_first_step) the steps 1..k graph over the first-step buffers;
        both write the same output buffers."""
        rows = bucket(batch, self.decode.max_num_seqs)
        width = bucket(width, self.decode.buffers.max_blocks, smallest=8)
        key = DraftLoopGraph.key(rows, width, st, from_first_step)
        if key not in self.graphs:
            args = (self.draft, self.decode, self.look.k, rows, width, st, self.fused_sampling)
            if from_first_step:
                self.graphs[key] = DraftLoopGraph(*args, first=self.first_step.buffers,
                                                  share=self._graph(batch, width, st))
            else:
                self.graphs[key] = DraftLoopGraph(*args)
        return self.graphs[key]

    def first_step_graph(self, batch: int, max_blocks: int, st: SamplingTensors) -> DraftLoopGraph:
        """The steps 1..k graph over the first-step buffers (a spec step graph records its steps)."""
        return self._graph(batch, max_blocks, st, from_first_step=True)

    def _outputs(self, batch: int, max_blocks: int, st: SamplingTensors) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.advances:
            return super()._outputs(batch, max_blocks, st)
        graph = self._graph(batch, max_blocks, st)  # step 1 writes into the graph's output buffers too
        return graph.draft_ids[:batch], graph.draft_probs[:batch]

    def draft_step(self, s: StepState, draw_randoms: DrawRandoms) -> ForwardInputs | None:
        if not self.advances or s.step > 1:
            return super().draft_step(s, draw_randoms)
        # Draft step 1 built on the device (a launched step): steps 1..k in one replay.
        from_first_step = s.step == 0 and s.first_inputs is not None and s.first_inputs.persistent is self.first_step.buffers
        if s.step == 0 and not from_first_step:
            return super().draft_step(s, draw_randoms)
        if s.randoms is None:
            s.randoms = draw_randoms(s)
        with self.timer.phase("draft_loop_graph"):
            self._graph(len(s.seqs), s.max_blocks, s.st, from_first_step).run(s.st, s.randoms.draft_noise, len(s.seqs))
        self.draft.counters["gpu_advance"] += self.look.k - 1  # inside the replay
        self.draft.counters["draft_loop_graph"] += 1
        if from_first_step:
            self.draft.counters["draft_loop_graph:from_first_step"] += 1
        s.step = self.look.k
        return None

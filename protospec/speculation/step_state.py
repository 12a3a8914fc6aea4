"""What one spec step carries between its stages (speculation/step.py), whichever draft loop made it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from protospec.requests.sequence import Sequence
from protospec.model.inputs import ForwardInputs
from protospec.speculation.randoms import SpecStepRandoms
from protospec.layout import RejectionOutput
from protospec.speculation.sampler import SamplingTensors


@dataclass
class StepState:
    seqs: list[Sequence]
    st: SamplingTensors
    max_blocks: int                           # block-table width of this step (lookahead included)
    draft_ids: torch.Tensor                   # [B, k] int64, filled step by step
    draft_probs: torch.Tensor                 # [B, k, V] float32
    host_draft_ids: list[list[int]] | None = None  # the draft ids on the host, where a loop copies them every step
    num_proposed: torch.Tensor | None = None  # [B] int64, where a proposer may offer fewer than k (n-gram)
    randoms: SpecStepRandoms | None = None    # drawn in draft step 1, after its forward is queued
    first_inputs: ForwardInputs | None = None  # draft step 1's inputs when built ahead (the overlapped commit)
    step: int = 0                             # draft steps done
    target_probs: torch.Tensor | None = None  # [B, k+1, V] after verify
    # (draft, target) probabilities made on request, where a step graph's replay wrote none (the lab's)
    probs_on_request: Callable[[], tuple[torch.Tensor, torch.Tensor]] | None = None
    result: RejectionOutput | None = None     # after reject
    commit_row: torch.Tensor | None = None  # int64 [rows * (k + 3) + 1]: the commit's row, where a step graph made it
    commit_copy: tuple[torch.Tensor, torch.cuda.Event | None] | None = None  # (host int64 copy, its event): what commit reads
    # The settings of the rows still running, where requests ended after this step was launched (its
    # rows are still theirs: the commit skips them); the next step is built for those rows alone.
    live_st: SamplingTensors | None = None

"""The draft loop's ways by name (registry.py holds the names): make_draft_loop builds one."""
from __future__ import annotations

from protospec.model.runner import ModelRunner
from protospec import registry
from protospec.speculation.device_draft_loops import DeviceAdvanceLoop, DeviceGraphLoop
from protospec.speculation.draft_loop import CpuPrepareLoop, CpuPrepareSyncedLoop, DraftLoop
from protospec.speculation.lookahead import Lookahead

DRAFT_LOOP_CLASSES: dict[str, type[DraftLoop]] = {cls.kind.name: cls for cls in (
    CpuPrepareSyncedLoop, CpuPrepareLoop, DeviceAdvanceLoop, DeviceGraphLoop)}
assert DRAFT_LOOP_CLASSES.keys() == registry.DRAFT_LOOPS.keys(), "every named way has a class"


def make_draft_loop(name: str, draft: ModelRunner, look: Lookahead, max_num_seqs: int, max_blocks: int,
                    fused_sampling: bool, fallback_reason: str, wait_s: float) -> DraftLoop:
    cls = DRAFT_LOOP_CLASSES[name]
    if cls.kind.on_device:  # the device ways allocate their persistent buffers up front
        return cls(draft, look, max_num_seqs, max_blocks, fused_sampling, fallback_reason, wait_s)
    return cls(draft, look, fused_sampling, fallback_reason, wait_s)

"""The draft loop's ways, the commit policies and the bench's arms: named here, and only here.

Config, engine, bench, report and debugger read these tables; the classes that implement each way
are in speculation/draft_loops.py and speculation/device_draft_loops.py (DRAFT_LOOP_CLASSES maps a name to its class).
This module imports nothing heavy, so the config can check a name before anything is loaded.
"""
from __future__ import annotations

from dataclasses import dataclass

AUTO = "auto"
MAIN, SAMPLER, GPU, GRAPH = "main", "sampler", "gpu", "graph"
SYNCED, OVERLAPPED = "synced", "overlapped"
REJECTION, TYPICAL = "rejection", "typical"
DRAFT, NGRAM = "draft", "ngram"
NGRAM_MODEL = "[ngram]"  # speculative_model that selects the n-gram proposer (vLLM's spelling)


@dataclass(frozen=True)
class DraftLoopKind:
    name: str
    doc: str                    # one line for --help and docstrings
    on_device: bool             # inputs built by Numba kernels (the simulator on a CPU)
    needs_cuda_graphs: bool     # replays steps 2..k as a CUDA graph
    host_sync_per_step: bool    # copies each draft step's ids to the host


DRAFT_LOOPS: dict[str, DraftLoopKind] = {kind.name: kind for kind in (
    DraftLoopKind(MAIN, "CPU prepare_inputs every draft step; the draft ids are copied to the host every step (a sync)",
                  on_device=False, needs_cuda_graphs=False, host_sync_per_step=True),
    DraftLoopKind(SAMPLER, "CPU prepare_inputs every draft step; the draft ids stay on the device (no per-step sync)",
                  on_device=False, needs_cuda_graphs=False, host_sync_per_step=False),
    DraftLoopKind(GPU, "the advance_step kernel for steps 2..k, no sync; with the overlapped commit, draft step 1 is "
                  "built on the device by the first_draft_step kernel and launched before the commit's host sync "
                  "(synced: draft step 1 CPU-prepared after the sync, as vLLM's change did)",
                  on_device=True, needs_cuda_graphs=False, host_sync_per_step=False),
    DraftLoopKind(GRAPH, "as gpu, with steps 2..k (advance, forward, sampling) replayed as one CUDA graph",
                  on_device=True, needs_cuda_graphs=True, host_sync_per_step=False),
)}
AUTO_DOC = ("graph on CUDA with cuda_graphs on, gpu on CUDA without them, main on a CPU (where the kernels would "
            "only run in Numba's simulator)")
DRAFT_LOOP_NAMES = (AUTO, *DRAFT_LOOPS)

# Proposers other than a draft model. The n-gram proposer's matching runs on the device where a device
# way is chosen (draft_loop gpu / graph / auto on CUDA), on the host otherwise.
PROPOSER_KINDS: dict[str, DraftLoopKind] = {NGRAM: DraftLoopKind(
    NGRAM, "prompt lookup: the k tokens that followed the most recent earlier occurrence of the last n tokens",
    on_device=False, needs_cuda_graphs=False, host_sync_per_step=False)}
PROPOSER_DOC = {DRAFT: "a draft model proposes k tokens one step at a time", NGRAM: PROPOSER_KINDS[NGRAM].doc}

ACCEPTANCE_DOC = {
    REJECTION: "lossless rejection sampling: the output follows the target exactly",
    TYPICAL: "typical acceptance (Medusa): keep d_i while p_i(d_i) > min(threshold, alpha * exp(-entropy)); lossy",
}


def resolve(name: str, device_type: str, cuda_graphs: bool) -> tuple[str, str]:
    """(draft loop, fallback reason): `auto` picks the fastest way the device allows; the reason labels
    the CPU-prepared steps 2..k in the counters (why the device path did not run)."""
    if name == AUTO:
        if device_type != "cuda":
            return MAIN, "no_cuda_device"
        return (GRAPH if cuda_graphs else GPU), ""
    return name, "disabled_by_user"


def commit_policy_for(kind: DraftLoopKind, overlap_commit: bool) -> str:
    """The overlapped commit needs draft step 1 built on the device: only the device loops have it."""
    return OVERLAPPED if overlap_commit and kind.on_device else SYNCED


@dataclass(frozen=True)
class Arm:
    """One arm of the bench's ablation: a draft loop and a commit policy, under one name."""
    name: str
    draft_loop: str
    commit: str


# In the order of the ablation's table: each arm removes one more host cost than the one before.
ARMS: dict[str, Arm] = {arm.name: arm for arm in (
    Arm(MAIN, MAIN, SYNCED),
    Arm(SAMPLER, SAMPLER, SYNCED),
    Arm(f"{GPU}_sync_commit", GPU, SYNCED),    # vLLM's change as it was
    Arm(GPU, GPU, OVERLAPPED),
    Arm(GRAPH, GRAPH, OVERLAPPED),
)}

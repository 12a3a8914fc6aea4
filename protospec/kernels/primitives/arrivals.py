"""Split-K's last-block combine without a wait: the blocks of a row group count their arrivals in a
device counter and the last to arrive combines the others' partials (attention, sampling and the
rejection samplers all use it). arrival_counters holds the counters, one buffer per kernel family."""
from __future__ import annotations

import torch

from protospec.kernels.launch.interop import cuda


_COUNTERS: dict[tuple, list[torch.Tensor]] = {}


def arrival_counters(dev: torch.device, groups: int, user: str = "attention") -> torch.Tensor:
    """At least [groups] int32, zero between calls (the whole buffer: no view is made per call): the
    split blocks of a row group count their arrivals here and the last one resets its counter, so one
    buffer serves every call and every graph replay. A larger need allocates a larger buffer; the old
    ones stay alive (captured graphs point at them). One buffer per user (a kernel family; a kernel
    that may run beside its own family on another stream names a user of its own), so two kernels
    that may run at once never count in the same counter."""
    kept = _COUNTERS.setdefault((dev, user), [])
    if not kept or kept[-1].numel() < groups:
        kept.append(torch.zeros(max(groups, 4096, 2 * kept[-1].numel() if kept else 0), dtype=torch.int32, device=dev))
    return kept[-1]


@cuda.jit(device=True)
def arrived_last(counters, index, arrivals, flag, tid):
    """Count this block's arrival at counters[index] (every thread of the block calls; flag is a
    1-element shared int32 array): True in the block that arrives last of `arrivals`, which also
    resets the counter for the next call or graph replay. The fences publish this block's writes
    before it counts, and order the last block's reads of the others' writes after.

    Why it cannot hang: no block waits for another. Each counts once and goes on (or returns); the
    one that counts last does the combine with what the others have already written. The only
    barriers are this block's own syncthreads, which every thread of the block reaches. The hazard
    is a counter that is not zero on entry (another launch counting in it at the same time): the
    combine then runs early or not at all, wrong outputs, never a wait. Hence one counter buffer per
    kernel family (arrival_counters), and the engine's launches on one stream."""
    cuda.threadfence()
    cuda.syncthreads()
    if tid == 0:
        arrived = cuda.atomic.add(counters, index, 1)
        flag[0] = 1 if arrived == arrivals - 1 else 0
        if arrived == arrivals - 1:
            counters[index] = 0
    cuda.syncthreads()
    cuda.threadfence()
    return flag[0] == 1

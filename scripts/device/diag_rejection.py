"""Where the host time of gpu mode's rejection phase goes (a diagnostic): wall time of the
fused rejection call, of its cuLaunchKernel, and of what follows, per mode, no CUDA events."""
import time
from collections import defaultdict

import torch

from protospec.bench.ablation import BenchSetup
from protospec.kernels import interop
from protospec.kernels import rejection as rej

times = defaultdict(list)
real_launch, real_fused = interop._cu_launch, rej.rejection_sample_fused


def timed_launch(*a, **k):
    t = time.perf_counter()
    real_launch(*a, **k)
    times[("cu_launch", a[0].value, a[2])].append(time.perf_counter() - t)


def timed_fused(*a, **k):
    t = time.perf_counter()
    out = real_fused(*a, **k)
    times["rejection_sample_fused"].append(time.perf_counter() - t)
    return out


interop._cu_launch = timed_launch
setup = BenchSetup("JackFram/llama-160m", "JackFram/llama-68m", 5, 256, 128, 1, 3, 5, load_format="dummy")
llm = setup.llm()
for mode in ("main", "gpu", "graph"):
    llm.engine.set_draft_loop(mode)
    llm.engine.spec_step.rejection_sample = timed_fused
    for _ in range(3):
        llm.generate(setup.prompts(llm.engine.vocab_size), setup.params())
    times.clear()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(5):
        llm.generate(setup.prompts(llm.engine.vocab_size), setup.params())
    wall = (time.perf_counter() - start) / 5
    summary = {str(k): f"{1e6 * sum(v) / len(v):.0f} us x {len(v) / 5:.0f}" for k, v in times.items()}
    print(mode, f"wall {wall * 1e3:.1f} ms", summary, flush=True)

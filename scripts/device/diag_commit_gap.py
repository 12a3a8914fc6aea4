"""How long the GPU idles around each spec step's host sync (a diagnostic of the commit's host sync), no profiler.

The spec step's phase observer (SpeculativeStep.timer) records, per spec step, event A when the host
enters a commit phase (the device reaches it once the rejection kernel is done) and event B when the
host reaches the next draft forward. With the device idle in between (only the commit's small
copies run), B - A is the post-sync gap a pipelined draft step 1 could hide. Also the host time of
each phase, per mode. With the commit overlapped (gpu, graph) A comes after the next draft step 1
is queued, so there B - A is not that gap: read it for main and gpu_sync_commit only.
"""
import contextlib
import time
from collections import defaultdict

import torch

from protospec.bench.ablation import BenchSetup, apply_mode
from protospec.speculation.phase_timer import NULL_TIMER


class GapObserver:
    def __init__(self):
        self.marks: list = []                 # ("A" | "B", CUDA event)
        self.host = defaultdict(float)        # host seconds per phase
        self.counts = defaultdict(int)
        self.after_commit = False

    def _mark(self, tag):
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self.marks.append((tag, event))

    @contextlib.contextmanager
    def phase(self, name):
        if name == "commit":
            self._mark("A")
            self.after_commit = True
        elif name == "draft_forward" and self.after_commit:
            self._mark("B")
            self.after_commit = False
        start = time.perf_counter()
        yield
        self.host[name] += time.perf_counter() - start
        self.counts[name] += 1


setup = BenchSetup("JackFram/llama-160m", "JackFram/llama-68m", 5, 256, 128, 1, 3, 5, load_format="dummy")
llm = setup.llm()
engine = llm.engine


def run(n):
    for _ in range(n):
        llm.generate(setup.prompts(engine.vocab_size), setup.params())


for mode in ("main", "gpu_sync_commit", "gpu", "graph"):
    apply_mode(engine, mode)
    run(3)
    observer = GapObserver()
    engine.spec_step.timer = observer
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    n = 5
    run(n)
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / n
    engine.spec_step.timer = NULL_TIMER
    marks = observer.marks
    gaps = [a.elapsed_time(b) for (ta, a), (tb, b) in zip(marks, marks[1:]) if ta == "A" and tb == "B"]
    print(f"{mode}: wall {wall * 1e3:.1f} ms/call, post-sync gap {sum(gaps) / n:.2f} ms/call "
          f"({1e3 * sum(gaps) / max(1, len(gaps)):.0f} us each, n={len(gaps)}); host us per phase call: "
          + ", ".join(f"{k} {1e6 * v / max(1, observer.counts[k]):.0f}" for k, v in observer.host.items()), flush=True)

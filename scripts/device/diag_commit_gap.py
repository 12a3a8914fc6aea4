"""How long the GPU idles around each spec step's host sync (a diagnostic of the commit's host sync), no profiler.

Per spec step: event A when the host enters commit (the device reaches it once the rejection
kernel is done), event B when the host launches the next spec step's first draft forward. With the
device idle in between (only the commit's small copies run), B - A is the post-sync gap a pipelined
draft step 1 could hide. Also host times of commit, begin and step-1 prepare, per mode. With the
commit overlapped (gpu, graph) A comes after the next draft step 1 is queued, so there B - A is not
that gap: read it for main and gpu_sync_commit only.
"""
import time
from collections import defaultdict

import torch

from protospec.bench.ablation import MODE_SETTINGS, BenchSetup
from protospec.spec.step import SpeculativeStep

setup = BenchSetup("JackFram/llama-160m", "JackFram/llama-68m", 5, 256, 128, 1, 3, 5, load_format="dummy")
llm = setup.llm()
engine = llm.engine
marks: list = []            # ("A"|"B", event)
host = defaultdict(float)   # host seconds per stage
counts = defaultdict(int)


def wrap(cls_or_obj, name, label, before=None):
    real = getattr(cls_or_obj, name)

    def timed(*a, **k):
        if before:
            before(a)
        t = time.perf_counter()
        out = real(*a, **k)
        host[label] += time.perf_counter() - t
        counts[label] += 1
        return out
    setattr(cls_or_obj, name, timed)


def mark(tag):
    e = torch.cuda.Event(enable_timing=True)
    e.record()
    marks.append((tag, e))


state = {"after_commit": False}
wrap(SpeculativeStep, "commit", "commit", before=lambda a: (mark("A"), state.update(after_commit=True)))
wrap(SpeculativeStep, "begin", "begin")
wrap(SpeculativeStep, "_draft_inputs", "draft_inputs")  # every draft step's input path (CPU prepare or advance)


def run(n):
    for _ in range(n):
        llm.generate(setup.prompts(engine.vocab_size), setup.params())


for mode in ("main", "gpu_sync_commit", "gpu", "graph"):
    engine.set_draft_loop(*MODE_SETTINGS[mode])
    draft_exec = engine.draft.execute

    def exec_marked(inputs, _real=draft_exec):
        if state["after_commit"]:
            mark("B")
            state["after_commit"] = False
        return _real(inputs)
    engine.draft.execute = exec_marked
    run(3)
    marks.clear(); host.clear(); counts.clear()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    n = 5
    run(n)
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / n
    gaps = [a.elapsed_time(b) for (ta, a), (tb, b) in zip(marks, marks[1:]) if ta == "A" and tb == "B"]
    engine.draft.execute = draft_exec
    steps = counts["commit"] / n
    print(f"{mode}: wall {wall * 1e3:.1f} ms/call, spec steps {steps:.0f}/call, post-sync gap "
          f"{sum(gaps) / n:.2f} ms/call ({1e3 * sum(gaps) / max(1, len(gaps)):.0f} us each, n={len(gaps)}); host us/step: "
          + ", ".join(f"{k} {1e6 * v / max(1, counts[k]):.0f}" for k, v in host.items()), flush=True)

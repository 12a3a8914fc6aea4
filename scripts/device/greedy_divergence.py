"""Where greedy tokens part between the linears' forms: the seed configuration's pair (dummy float16)
decodes greedily in the captured draft loop with cuBLAS and the separate kernels, then with the fused
tensor-core linears in each same-bits form named below; prints, per call and request, the first
position whose token differs from cuBLAS's (or "same") and whether the replayed calls agree with the
first. A form whose tokens part from another same-bits form's has a bits bug; forms that part from
cuBLAS together point at the fused arithmetic itself (a near-tie flips: summation order).
    python3 scripts/device/greedy_divergence.py [--calls 3] [--temperature 0]
"""
import argparse
import importlib

from protospec.bench.ablation import BenchSetup

FORMS = {  # name -> (linear kernel, {(module, attribute): value})
    "cublas": ("cublas", {}),
    "fused_defaults": ("mma_fused", {}),
    "fused_head_norm_fused": ("mma_fused", {("protospec.model.layer_kernels", "HEAD_NORM"): "fused"}),
    "fused_unpinned_no_early": ("mma_fused", {("protospec.kernels.gemv_mma", "PIN_WEIGHT_LOADS"): False,
                                              ("protospec.kernels.gemv_mma", "EARLY_ALLOW"): frozenset()}),
}


def first_difference(a: list[int], b: list[int]) -> str:
    return next((str(i) for i, (x, y) in enumerate(zip(a, b)) if x != y), "same" if a == b else "length")


p = argparse.ArgumentParser()
p.add_argument("--calls", type=int, default=3)
p.add_argument("--temperature", type=float, default=0.0)
args = p.parse_args()
runs = {}
for name, (linear, settings) in FORMS.items():
    saved = {key: getattr(importlib.import_module(key[0]), key[1]) for key in settings}
    for (module, attribute), value in settings.items():
        setattr(importlib.import_module(module), attribute, value)
    setup = BenchSetup("JackFram/llama-160m", "JackFram/llama-68m", 5, 256, 128, 1, 0, 1, load_format="dummy",
                       temperature=args.temperature, linear_kernel=linear, dependent_launch=linear == "mma_fused")
    llm = setup.llm(draft_loop="graph")
    prompts = setup.prompts(llm.engine.vocab_size)
    runs[name] = [[o.token_ids for o in llm.generate(prompts, setup.params())] for _ in range(args.calls)]
    del llm
    for (module, attribute), value in saved.items():
        setattr(importlib.import_module(module), attribute, value)
    calls = runs[name]
    replays = all(c == calls[0] for c in calls[1:])
    against = [[first_difference(a, b) for a, b in zip(call, runs["cublas"][0])] for call in calls]
    print(f"{name:26s} replays agree: {replays}  first difference from cublas per call and request: {against}",
          flush=True)
names = list(runs)
for i, a in enumerate(names[1:], 1):
    for b in names[i + 1:]:
        pairs = [first_difference(x, y) for x, y in zip(runs[a][0], runs[b][0])]
        print(f"{a} against {b}: first difference per request {pairs}")

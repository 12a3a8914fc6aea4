"""Where the host's time goes in one generate() of the seed configuration (dummy weights, graph mode):
cProfile of a timed call after warm-ups, functions by their own time and by cumulative time. At
batch 64 the GPU idles about half of a call, waiting for the host; this says on what.
python3 scripts/device/host_profile.py [--batch-size 64] [--top 35] [--fused-sampling auto|on|off] [--linear-kernel cublas]"""
import argparse
import cProfile
import pstats
import time

import torch

from protospec.bench.ablation import BenchSetup
from protospec.bench.engine_flags import ON_OFF
from protospec.layout import LINEAR_KERNELS

p = argparse.ArgumentParser()
p.add_argument("--batch-size", type=int, default=64)
p.add_argument("--top", type=int, default=35)
p.add_argument("--fused-sampling", choices=list(ON_OFF), default="auto",
               help="the sampling kernels or torch's ops (auto: the engine's choice)")
p.add_argument("--linear-kernel", default=None, choices=LINEAR_KERNELS, help="EngineConfig.linear_kernel (default: the engine's choice)")
args = p.parse_args()
setup = BenchSetup("JackFram/llama-160m", "JackFram/llama-68m", 5, 256, 128, args.batch_size, 3, 1,
                   load_format="dummy", temperature=1.0, fused_sampling=ON_OFF[args.fused_sampling],
                   linear_kernel=args.linear_kernel)
llm = setup.llm(draft_loop="graph")
prompts, params = setup.prompts(llm.engine.vocab_size), setup.params()
for _ in range(3):
    llm.generate(prompts, params)
torch.cuda.synchronize()
start = time.perf_counter()
llm.generate(prompts, params)
torch.cuda.synchronize()
print(f"batch {args.batch_size}: one call {1e3 * (time.perf_counter() - start):.1f} ms unprofiled")
prof = cProfile.Profile()
prof.enable()
llm.generate(prompts, params)
torch.cuda.synchronize()
prof.disable()
stats = pstats.Stats(prof)
stats.sort_stats("tottime").print_stats(args.top)
stats.sort_stats("cumulative").print_stats(args.top)

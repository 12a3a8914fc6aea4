"""The engine's kernel and graph settings as flags, declared once for every CLI that builds an engine
(the bench and the kernel census), and their values as BenchSetup (and EngineConfig) take them."""
from __future__ import annotations

import argparse

from protospec.layout import LINEAR_KERNELS

ON_OFF = {"auto": None, "on": True, "off": False}  # a three-way engine setting as EngineConfig takes it


def add_engine_flags(p) -> None:
    """p: a parser or an argument group."""
    p.add_argument("--layer-kernels", default="auto", choices=list(ON_OFF),
                   help="decode-shaped forwards on the Numba layer kernels (5-9 kernels a layer instead of ~20); "
                        "auto = on CUDA for float16/float32")
    p.add_argument("--linear-kernel", default="auto", choices=["auto", *LINEAR_KERNELS],
                   help="cublas (torch's linears, no fusion) or mma_fused (the tensor-core GEMV with the norms, "
                        "RoPE and SiLU folded in; auto)")
    p.add_argument("--fused-sampling", default="auto", choices=list(ON_OFF),
                   help="each draft step's softmax and sample (and the verify's softmax) as Numba kernels over "
                        "vocabulary slices instead of torch's ops (auto: on a GPU with the layer kernels)")
    p.add_argument("--prefill-kernels", default="auto", choices=list(ON_OFF),
                   help="a batch-1 prefill on the layer kernels, not the torch path (auto: on a GPU)")
    p.add_argument("--dependent-launch", default="auto", choices=list(ON_OFF),
                   help="the tensor-core GEMVs start while the kernel before them ends (auto: on sm_90 and later)")
    p.add_argument("--spec-step-graph", default="auto", choices=list(ON_OFF),
                   help="a launched spec step whole as one CUDA graph (auto: wherever it applies; off: each "
                        "phase's kernels apart)")


def engine_switches(args: argparse.Namespace) -> dict:
    """The settings the flags chose, as BenchSetup's keywords."""
    return dict(layer_kernels=ON_OFF[args.layer_kernels],
                linear_kernel=None if args.linear_kernel == "auto" else args.linear_kernel,  # None: the engine's choice
                fused_sampling=ON_OFF[args.fused_sampling], prefill_kernels=ON_OFF[args.prefill_kernels],
                dependent_launch=ON_OFF[args.dependent_launch], spec_step_graph=ON_OFF[args.spec_step_graph])

"""The engine settings the bench and the kernel census share as flags (EngineConfig's prefill_kernels,
prefill_graphs and first_step_at_begin), and their values as BenchSetup takes them."""
from __future__ import annotations

import argparse

ON_OFF_CHOICES = ["on", "off"]


def add_engine_flags(p) -> None:
    """p: a parser or an argument group."""
    p.add_argument("--prefill-kernels", default="auto", choices=["auto", *ON_OFF_CHOICES],
                   help="a batch-1 prefill on the layer kernels, not the torch path (auto: on a GPU)")
    p.add_argument("--prefill-graphs", default="on", choices=ON_OFF_CHOICES,
                   help="replay a uniform prefill layout seen before as a CUDA graph (default: %(default)s)")
    p.add_argument("--first-step-at-begin", default="on", choices=ON_OFF_CHOICES,
                   help="draft step 1 built on the device where no spec step was launched ahead (off: on the CPU)")


def engine_switches(args: argparse.Namespace) -> dict:
    """The settings the flags chose, as BenchSetup (and EngineConfig) take them."""
    return dict(first_step_at_begin=args.first_step_at_begin == "on", prefill_graphs=args.prefill_graphs == "on",
                prefill_kernels={"auto": None, "on": True, "off": False}[args.prefill_kernels])

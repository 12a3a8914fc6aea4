"""The engine setting the bench and the kernel census share as a flag (EngineConfig.prefill_kernels),
and its value as BenchSetup takes it."""
from __future__ import annotations

import argparse

ON_OFF_CHOICES = ["on", "off"]


def add_engine_flags(p) -> None:
    """p: a parser or an argument group."""
    p.add_argument("--prefill-kernels", default="auto", choices=["auto", *ON_OFF_CHOICES],
                   help="a batch-1 prefill on the layer kernels, not the torch path (auto: on a GPU)")


def engine_switches(args: argparse.Namespace) -> dict:
    """The settings the flags chose, as BenchSetup (and EngineConfig) take them."""
    return dict(prefill_kernels={"auto": None, "on": True, "off": False}[args.prefill_kernels])

"""Registers, spills and shared memory a thread of each Numba kernel, from ptxas, without a GPU.

    NUMBA_ENABLE_CUDASIM=0 python -m tools.gpu_registers [--match gemv_mma_k768] [--ptx-dir DIR]

Why: how many blocks an SM holds at once (occupancy) is set by registers a thread and shared memory
a block, and a launch of more blocks than the GPU holds runs in waves; spills turn registers into
local-memory traffic. Both come from ptxas, which needs the CUDA toolkit (libNVVM and ptxas), not a
GPU. The kernels are reached as tools/gpu_typecheck.py reaches them (the same shapes, every compile-time
variant), compiled to PTX for sm_90 with their own options (fastmath, max_registers) and assembled.
--ptx-dir writes each one's PTX there too: what the instructions are (64-bit integer arithmetic where
32 bits would do, a division that became a subroutine call) shows there, before any GPU time is spent.

Numba finds its NVVM library through NVRTC's search, and asks NVRTC which architectures it supports:
a toolkit without NVRTC (libNVVM and ptxas alone) is told sm_90 directly here.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile

from protospec.command_line import CommandParser, run_command

ARCH = "sm_90"  # gpu_typecheck.COMPUTE_CAPABILITY's

_USAGE = re.compile(r"Used (\d+) registers[^\n]*?(?:(\d+) bytes smem)?$", re.MULTILINE)  # no smem: none
_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def parse_ptxas(report: str) -> dict:
    """ptxas -v's lines for one kernel -> registers, spill store / load bytes and static shared bytes."""
    usage, spills = _USAGE.search(report), _SPILLS.search(report)
    if usage is None or spills is None:
        raise ValueError(f"no register report in ptxas's output: {report.strip()[-400:]!r}")
    return dict(registers=int(usage.group(1)), shared_bytes=int(usage.group(2) or 0), spill_stores=int(spills.group(1)),
                spill_loads=int(spills.group(2)))


def toolkit_without_nvrtc() -> None:
    """Lets NVVM make PTX on a machine with the CUDA toolkit's libNVVM but no NVRTC (only ptxas is run)."""
    from numba.cuda import cuda_paths
    from numba.cuda.cudadrv import nvrtc

    nvrtc.find_closest_arch = lambda cc: cc
    cuda_paths._get_nvrtc_path = lambda: None


def kernel_ptx(py_func, signature: tuple, options: dict) -> str:
    """The kernel's PTX for sm_90 (NVVM; no ptxas)."""
    from numba import cuda

    ptx, _ = cuda.compile_ptx(py_func, signature, device=False, cc=(int(ARCH[3]), int(ARCH[4])),
                              fastmath=options.get("fastmath", False))
    return ptx


def assemble_ptx(ptx: str, options: dict, workdir: str) -> tuple[str, str]:
    """The PTX through ptxas -v: (ptxas's report, the cubin's path)."""
    path, cubin = os.path.join(workdir, "kernel.ptx"), os.path.join(workdir, "kernel.cubin")
    with open(path, "w") as f:
        f.write(ptx)
    cap = ["--maxrregcount", str(options["max_registers"])] if options.get("max_registers") else []
    command = ["ptxas", f"-arch={ARCH}", "-v", *cap, path, "-o", cubin]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"ptxas failed on the kernel's PTX: {done.stderr.strip()}")
    return done.stderr, cubin


PARTS = ("attention", "layers", "sampling", "draft_inputs", "forwards")  # gpu_typecheck's groups of kernels


def reached_kernels(parts: tuple[str, ...] = PARTS) -> list[tuple[str, tuple, object]]:
    """(name, signature, kernel) of every kernel variant gpu_typecheck builds in `parts`, by name
    (NUMBA_ENABLE_CUDASIM=0; the CUDA toolkit's libNVVM, no NVRTC needed)."""
    from tools import gpu_typecheck  # refuses to run in the simulator: NUMBA_ENABLE_CUDASIM=0

    toolkit_without_nvrtc()
    seen: dict[tuple, object] = {}
    build = gpu_typecheck.build

    def recording_build(kernel, args_):
        # Only the signature: the caller compiles what it wants (gpu_typecheck's own run builds them all).
        signature = tuple(gpu_typecheck._argument_type(a) for a in args_)
        seen.setdefault((kernel.py_func.__name__, signature, id(kernel)), kernel)  # variants share a name
        return None

    gpu_typecheck.build = recording_build  # install()'s launchers look `build` up when they run
    try:
        gpu_typecheck.install()
        groups = dict(zip(PARTS, (gpu_typecheck._attention, gpu_typecheck._layers_and_gemv,
                                  gpu_typecheck._sampling_and_rejection, gpu_typecheck._draft_inputs,
                                  gpu_typecheck._forwards)))
        for part in parts:
            groups[part]()
    finally:
        gpu_typecheck.build = build
    return [(name, signature, kernel) for (name, signature, _), kernel in sorted(seen.items(), key=lambda item: item[0][0])]


def main(argv: list[str] | None = None) -> int:
    p = CommandParser(prog=f"python -m {__spec__.name if __spec__ else __name__}", description=__doc__.split("\n\n")[0])
    p.add_argument("--match", default="", help="only kernels whose name contains this")
    p.add_argument("--ptx-dir", default=None, help="also write each kernel's PTX here, as <name>_<n>.ptx")
    args = p.parse_args(argv)
    if shutil.which("ptxas") is None:
        raise SystemExit("gpu_registers needs ptxas (the CUDA toolkit) on the PATH")
    with tempfile.TemporaryDirectory() as workdir:
        for n, (name, signature, kernel) in enumerate(reached_kernels()):
            if args.match not in name:
                continue
            ptx = kernel_ptx(kernel.py_func, signature, kernel.targetoptions)
            if args.ptx_dir:
                os.makedirs(args.ptx_dir, exist_ok=True)
                with open(os.path.join(args.ptx_dir, f"{name}_{n}.ptx"), "w") as f:
                    f.write(ptx)
            u = parse_ptxas(assemble_ptx(ptx, kernel.targetoptions, workdir)[0])
            print(f"{u['registers']:4d} registers  {u['spill_stores']:4d}/{u['spill_loads']:<4d} bytes spilled "
                  f"(stores/loads)  {u['shared_bytes']:>6} bytes shared  {name}")
    return 0


if __name__ == "__main__":
    run_command(main)

"""Where ptxas put each dependent kernel's `griddepcontrol.wait` among its global loads, without a GPU.

    NUMBA_ENABLE_CUDASIM=0 python -m tools.gpu_wait_order [--match gemv_mma]

Why: a programmatic dependent (launch/dependent_launch.py) issues the loads no earlier kernel writes (the
weights) before its wait, so they stream while the kernel before it ends. The order in the Python
source and in the PTX is not the order that runs: ptxas schedules the machine code, and it hoists
an unconditional `griddepcontrol.wait` above loads that do not depend on it (the tensor-core GEMV's
dependent forms had it above all 24 weight loads of a lane). This tool compiles every kernel variant
gpu_typecheck reaches for sm_90 (gpu_registers.assemble: ptxas from the CUDA toolkit), reads the machine
code's opcodes from the cubin and prints, per kernel that waits, how many global loads (LDG) come
before its first wait and how many after, and where it lets dependents launch.

Beside the machine code's count, the PTX's: the loads the compiler issued before the wait. ptxas may
merge adjacent loads (fewer LDGs) or sink them below the wait (the hoisted wait above), but a kernel
whose machine code has more loads before its wait than its PTX moved loads from after the wait to
before it, and those may read what the kernel before it is still writing: such a line is marked
HOISTED. (The head-norm kernel once loaded its norm weight before a branch-pinned wait; LLVM sank
those read-only loads below it, ptxas put 12 others above, and the engine decoded other tokens.)

The opcodes come from the instruction words' low 12 bits (sm_90: LDG 0x981, the wait 0x82e,
launch_dependents 0x82d), the values ptxas gives to one-instruction PTX kernels; `opcodes_of` is the
reader, `wait_order` the count.
"""
from __future__ import annotations

import shutil
import struct
import tempfile

from protospec.command_line import CommandParser, run_command

LDG, WAIT, LAUNCH = 0x981, 0x82E, 0x82D
PTX_WAIT = "griddepcontrol.wait"


def opcodes_of(cubin: bytes) -> list[int]:
    """The opcode (low 12 bits) of every 16-byte instruction in the cubin's first .text section."""
    shoff = struct.unpack_from("<Q", cubin, 0x28)[0]
    entry_size, count, names_index = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * entry_size) for i in range(count)]
    names_at = headers[names_index][4]
    for name_offset, _, _, _, offset, size, *_ in headers:
        name = cubin[names_at + name_offset: cubin.index(b"\0", names_at + name_offset)].decode()
        if name.startswith(".text."):
            return [struct.unpack_from("<H", cubin, offset + i)[0] & 0xFFF for i in range(0, size, 16)]
    raise ValueError("no .text section in the cubin")


def wait_order(opcodes: list[int]) -> dict | None:
    """Global loads before / after the first wait, and the launch_dependents positions relative to it
    ("before" / "after" the wait); None for a kernel that never waits."""
    if WAIT not in opcodes:
        return None
    at = opcodes.index(WAIT)
    launches = ["before" if i < at else "after" for i, op in enumerate(opcodes) if op == LAUNCH]
    return dict(loads_before=opcodes[:at].count(LDG), loads_after=opcodes[at:].count(LDG), launches=launches)


def ptx_loads_before_wait(ptx: str) -> int | None:
    """Global loads (`ld.global...`, predicated or not) the PTX issues before its first
    `griddepcontrol.wait`; None for PTX that never waits."""
    loads = 0
    for line in ptx.splitlines():
        instruction = line.strip().split(" ", 1)[-1] if line.strip().startswith("@") else line.strip()
        if instruction.startswith(PTX_WAIT):
            return loads
        loads += instruction.startswith("ld.global")
    return None


def sass_opcodes(py_func, signature: tuple, options: dict, workdir: str) -> tuple[list[int] | None, str]:
    """(the machine code's opcodes, the PTX they were assembled from); opcodes None for a kernel whose
    PTX never waits (ptxas is the slow half, and such a kernel has no order to read)."""
    from tools.gpu_registers import kernel_ptx

    ptx = kernel_ptx(py_func, signature, options)
    return machine_opcodes(ptx, options, workdir), ptx


def machine_opcodes(ptx: str, options: dict, workdir: str) -> list[int] | None:
    """The opcodes of the machine code ptxas makes of this PTX; None where the PTX never waits."""
    from tools.gpu_registers import assemble_ptx

    if PTX_WAIT not in ptx:
        return None
    _, cubin = assemble_ptx(ptx, options, workdir)
    with open(cubin, "rb") as f:
        return opcodes_of(f.read())


def built_kernel_ptx(compiled) -> str:
    """The PTX of a kernel gpu_typecheck built (its compile result, typed and lowered once), as
    compile_ptx makes it: the kernel's entry fixed up, then NVVM."""
    from numba.cuda.compiler import kernel_fixup

    from tools.gpu_typecheck import COMPUTE_CAPABILITY

    library, entry = compiled.library, compiled.fndesc.llvm_func_name
    kernel_fixup(library.get_function(entry), False)
    library._entry_name = entry
    return library.get_asm_str(cc=COMPUTE_CAPABILITY)


def print_orders(name: str, opcodes: list[int] | None, ptx: str) -> None:
    """One line for a kernel that waits: its loads on each side of the wait, HOISTED where ptxas moved
    some above it; nothing for one that does not."""
    order, issued = (None if opcodes is None else wait_order(opcodes)), ptx_loads_before_wait(ptx)
    if order is not None:
        hoisted = " HOISTED" if order["loads_before"] > (issued or 0) else ""
        print(f"{order['loads_before']:3d} loads before the wait, {order['loads_after']:3d} after "
              f"(the PTX issues {issued} before it{hoisted}); "
              f"launch_dependents {'/'.join(order['launches']) or 'never'}: {name}")


def print_orders_of_built(groups: tuple[str, ...] = ("_attention", "_layers_and_gemv", "_sampling_and_rejection")) -> None:
    """print_orders for the kernels gpu_typecheck.main() built in these groups (run it first, in this
    process): their PTX from the build's own results, so nothing is typed or lowered twice."""
    from tools import gpu_typecheck
    from tools.gpu_registers import toolkit_without_nvrtc

    toolkit_without_nvrtc()
    with tempfile.TemporaryDirectory() as workdir:
        for key, compiled in gpu_typecheck.built.items():
            group, kernel = gpu_typecheck.parts[key]
            if group in groups:
                ptx = built_kernel_ptx(compiled)
                print_orders(kernel.py_func.__name__, machine_opcodes(ptx, kernel.targetoptions, workdir), ptx)


def main(argv: list[str] | None = None) -> int:
    p = CommandParser(prog=f"python -m {__spec__.name if __spec__ else __name__}", description=__doc__.split("\n\n")[0])
    p.add_argument("--match", default="", help="only kernels whose name contains this")
    p.add_argument("--parts", nargs="+", default=None, help="gpu_typecheck's groups to build (default: all)")
    args = p.parse_args(argv)
    if shutil.which("ptxas") is None:
        raise SystemExit("gpu_wait_order needs ptxas (the CUDA toolkit) on the PATH")
    from tools.gpu_registers import PARTS, reached_kernels

    with tempfile.TemporaryDirectory() as workdir:
        for name, signature, kernel in reached_kernels(tuple(args.parts or PARTS)):
            if args.match not in name:
                continue
            print_orders(name, *sass_opcodes(kernel.py_func, signature, kernel.targetoptions, workdir))
    return 0


if __name__ == "__main__":
    run_command(main)

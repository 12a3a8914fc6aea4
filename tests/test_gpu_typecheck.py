"""Every kernel builds for a GPU, checked on any machine (tools/gpu_typecheck.py, beside the package):
the simulator runs a kernel's Python, so only Numba's CUDA compiler sees a shared array sized by an
expression or a type the GPU target does not unify. Runs in a child process: the GPU target must be
chosen before numba is imported, and this process has the simulator."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the checkout: tools/ is not part of the installed package
sys.path.insert(0, str(ROOT))
ENV = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=ENV, capture_output=True, text=True,
                          timeout=600, cwd=ROOT)


def test_every_kernel_builds_for_sm90_and_each_dependent_keeps_its_loads_around_its_wait():
    """One child process types and lowers every kernel signature the wrappers launch for sm_90, then
    (where the CUDA toolkit's ptxas is on the PATH) reads the machine code of the dependents among them
    from those very builds (each kernel compiled once: the two checks took minutes each apart)."""
    import shutil

    wait_orders = shutil.which("ptxas") is not None
    done = _run("from tools import gpu_typecheck, gpu_wait_order\n"
                "code = gpu_typecheck.main(['--divisions'])\n"
                + ("gpu_wait_order.print_orders_of_built()\n" if wait_orders else "")
                + "raise SystemExit(code)")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    built = {line.split("(")[0].split()[-1] for line in lines if line.startswith("built")}
    # the kernels the wrappers reach, among them each attention path, the tensor-core GEMV and the
    # samplers: a wrapper that stopped reaching its kernel would drop it from this set
    for name in ("attention_mma_kernel", "attention_group_kernel", "gemv_mma_k768_w16",
                 "row_stats_kernel", "probs_and_sample_kernel", "rejection_sample_kernel", "add_rms_norm_kernel", "rope_and_cache_kernel", "fill_randoms_kernel",
                 "advance_step_kernel", "first_draft_step_kernel", "gumbel_sample_kernel"):
        assert any(b.endswith("." + name) for b in built), (name, sorted(built))
    assert [line for line in lines if " kernel signatures built for " in line][0].endswith(", 0 failed")
    # A 64-bit division by a run-time value is a subroutine call on a GPU (one per tile made the
    # tensor-core attention instruction-bound; one per block, ahead of its weight loads, came back into
    # the GEMV with its token tiles): no kernel keeps one (primitives/divisions.py divides in 32 bits).
    counts = [line for line in lines if line.startswith("built")]
    assert len(counts) > 40 and all("runtime 64-bit divisions]" in line for line in counts)
    assert [line for line in counts if "[0 runtime" not in line] == []
    if wait_orders:
        _check_wait_orders(lines)


def test_a_kernel_the_gpu_compiler_rejects_is_reported():
    # a shared array sized by an expression: the simulator runs it, the GPU typer refuses it
    done = _run('''
        import json, torch
        from numba import cuda, float32
        from tools import gpu_typecheck

        @cuda.jit
        def sized_by_an_expression(out):
            n = 4
            scratch = cuda.shared.array(n * 2, float32)
            scratch[0] = 1.0
            out[0] = scratch[0]

        @cuda.jit
        def sized_by_a_constant(out):
            scratch = cuda.shared.array(8, float32)
            scratch[0] = 1.0
            out[0] = scratch[0]

        print(json.dumps([gpu_typecheck.build(k, [torch.zeros(4)]) for k in (sized_by_an_expression, sized_by_a_constant)]))
    ''')
    assert done.returncode == 0, done.stderr[-3000:]
    bad, good = json.loads(done.stdout.splitlines()[-1])
    assert bad is not None and bad.startswith("TypingError") and good is None


def test_ptxas_reports_are_read_for_registers_spills_and_shared_memory():
    """tools/gpu_registers.py reads ptxas -v's report (it needs the CUDA toolkit, which CI lacks; the
    reading is checked here on a report as ptxas 13 prints it, and a report without figures is refused)."""
    import pytest

    from tools.gpu_registers import parse_ptxas

    report = textwrap.dedent("""\
        ptxas info    : 96 bytes gmem
        ptxas info    : Compiling entry function '_ZN8gemv_mma' for 'sm_90'
        ptxas info    : Function properties for _ZN8gemv_mma
            136 bytes stack frame, 136 bytes spill stores, 140 bytes spill loads
        ptxas info    : Used 128 registers, used 1 barriers, 136 bytes cumulative stack size, 2176 bytes smem
        """)
    assert parse_ptxas(report) == dict(registers=128, shared_bytes=2176, spill_stores=136, spill_loads=140)
    no_shared = report.replace(", 136 bytes cumulative stack size, 2176 bytes smem", "").replace("136 bytes spill stores", "0 bytes spill stores")
    assert parse_ptxas(no_shared) == dict(registers=128, shared_bytes=0, spill_stores=0, spill_loads=140)
    with pytest.raises(ValueError, match="no register report"):
        parse_ptxas("ptxas info    : 96 bytes gmem\n")


def test_the_wait_order_reader_counts_loads_on_each_side_of_the_first_wait():
    """tools/gpu_wait_order.py: loads before and after the first griddepcontrol.wait, and where
    launch_dependents sits; a kernel without a wait has no order."""
    from tools.gpu_wait_order import LAUNCH, LDG, WAIT, wait_order

    other = 0x7
    assert wait_order([LDG, other, LDG, LAUNCH, WAIT, LDG, LAUNCH]) == dict(loads_before=2, loads_after=1,
                                                                             launches=["before", "after"])
    assert wait_order([WAIT, LDG, LDG, WAIT, LDG]) == dict(loads_before=0, loads_after=3, launches=[])
    assert wait_order([LDG, LAUNCH]) is None


def test_the_ptx_reader_counts_the_loads_issued_before_the_first_wait():
    """gpu_wait_order.ptx_loads_before_wait: plain and predicated global loads before the first wait,
    not shared or parameter loads, nothing after it; PTX without a wait has no count."""
    from tools.gpu_wait_order import ptx_loads_before_wait

    ptx = """
        ld.param.u64 	%rd1, [param_0];
        ld.global.nc.u64 	%rd2, [%rd1];
        @%p1 ld.global.u32 	%r1, [%rd1+8];
        ld.shared.f32 	%f1, [%rd3];
        @%p3 bra 	$L__BB0_2;
        griddepcontrol.wait;
        ld.global.u64 	%rd4, [%rd1+16];
        griddepcontrol.wait;
    """
    assert ptx_loads_before_wait(ptx) == 2
    assert ptx_loads_before_wait(ptx.replace("griddepcontrol.wait;", "")) is None
    assert ptx_loads_before_wait("griddepcontrol.wait;\nld.global.u64 %rd4, [%rd1];") == 0


def _check_wait_orders(lines: list[str]) -> None:
    """gpu_wait_order's lines for the attention, GEMV and sampling kernels (machine code from ptxas).
    Each dependent tensor-core GEMV form (its wait pinned, or an early allow) has every weight word of a
    lane (24 with 8-byte loads; 12 with 16-byte ones, 36 for gate/up with the norm weight's) loaded
    before its wait. ptxas hoists a plain wait above them all, so a dropped pin shows here as 0 loads
    before the wait. And in no dependent kernel (attention, GEMVs, sampling: the kernels that issue
    loads before their wait) did ptxas move a load from after the wait to before it."""
    orders = {line.rsplit(": ", 1)[1]: int(line.split()[0]) for line in lines if "loads before the wait" in line}
    # ptxas moved no load from after a wait to before it (where the kernel before may still be writing)
    assert not [line for line in lines if "HOISTED" in line], "\n".join(lines)
    dependents = {name: loads for name, loads in orders.items() if name.startswith("gemv_mma") and "_dep_" in name}
    narrow = {name: loads for name, loads in dependents.items() if "_w16" not in name}  # 8-byte loads (unaligned)
    wide = {name: loads for name, loads in dependents.items() if "_w16" in name}
    assert narrow["gemv_mma_k768_dep_pin"] >= 24 and min(narrow.values()) >= 24, narrow
    assert wide["gemv_mma_k768_dep_pin_w16"] >= 12 and wide["gemv_mma_k768_norm_residual_glu_dep_early_w16"] >= 36
    assert len(wide) >= 6 and min(wide.values()) >= 12, wide

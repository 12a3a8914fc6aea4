"""Every kernel builds for a GPU, checked on any machine (kernels/gpu_typecheck.py): the simulator
runs a kernel's Python, so only Numba's CUDA compiler sees a shared array sized by an expression or a
type the GPU target does not unify. Runs in a child process: the GPU target must be chosen before
numba is imported, and this process has the simulator."""
import json
import os
import subprocess
import sys
import textwrap

ENV = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=ENV, capture_output=True, text=True,
                          timeout=600)


def test_every_kernel_signature_the_wrappers_launch_builds_for_sm90():
    done = _run("from protospec.kernels import gpu_typecheck; raise SystemExit(gpu_typecheck.main(['--divisions']))")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    built = {line.split("(")[0].split()[-1] for line in lines if line.startswith("built")}
    # the kernels the wrappers reach, among them each attention path, the GEMVs, the samplers and
    # both persistent forms: a wrapper that stopped reaching its kernel would drop it from this set
    for name in ("attention_mma_kernel", "attention_group_kernel", "attention_combine_kernel", "gemv", "gemv_words",
                 "row_stats_kernel", "probs_and_sample_kernel", "rejection_sample_kernel", "decode_forward",
                 "qkv_kernel", "lm_kernel", "add_rms_norm_kernel", "rope_and_cache_kernel", "fill_randoms_kernel",
                 "advance_step_kernel", "first_draft_step_kernel"):
        assert any(b.endswith("." + name) for b in built), (name, sorted(built))
    assert lines[-1].endswith(", 0 failed")
    # The attention kernels' key loops divide nothing at run time (a 64-bit division is a subroutine
    # call on a GPU; one per tile made the tensor-core kernel instruction-bound): at most the split-K
    # combine's one, outside the loop.
    for line in lines:
        if "attention_mma_kernel" in line or "attention_group_kernel" in line:
            count = int(line.rsplit("[", 1)[1].split()[0])
            assert count <= 1, line


def test_a_kernel_the_gpu_compiler_rejects_is_reported():
    # a shared array sized by an expression: the simulator runs it, the GPU typer refuses it
    done = _run('''
        import json, torch
        from numba import cuda, float32
        from protospec.kernels import gpu_typecheck

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

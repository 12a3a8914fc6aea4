"""Compile every Numba kernel for a GPU up to LLVM IR, on any machine: no GPU, no CUDA toolkit.

    NUMBA_ENABLE_CUDASIM=0 python -m tools.gpu_typecheck

Why: the CUDA simulator runs a kernel's Python, not Numba's GPU compiler, so a kernel can pass every
simulator test and still fail to build for a GPU: a shared array sized by an expression, types the
CUDA target does not unify, an intrinsic's code generation. Each such slip used to cost a GPU run.
Here the kernels' wrappers are called with small CPU tensors while the launchers, instead of
launching, run Numba's CUDA pipeline (typing, then lowering to LLVM IR for sm_90; only the last step
to PTX needs NVVM) on the kernel with the argument types the launch would have had. The shapes are
chosen to reach each kernel's compile-time variants (tensor-core and register attention, split-K,
GQA, float16 and float32, GEMV widths, the sliced samplers, advance_step, first_draft_step, verify_inputs).

Prints one line per (kernel, signature) and exits 1 if any failed to compile. With --divisions (or
--divisions-of NAME[,NAME..]: the kernels whose name holds one of them), each line also counts the
64-bit divisions and remainders by runtime values left after LLVM's -O3 (on the host's target): on a
GPU each is a call to a division routine (~25-100 instructions), the costliest thing Numba's integer
arithmetic emits and a proxy for instruction count that needs no GPU.
"""
from __future__ import annotations

import os
import re

if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") != "0":
    raise SystemExit("gpu_typecheck builds for the GPU target: run it with NUMBA_ENABLE_CUDASIM=0")
os.environ["NUMBA_ENABLE_CUDASIM"] = "0"

import numba  # noqa: E402
import torch  # noqa: E402
from numba import types  # noqa: E402
from numba.cuda import compiler, dispatcher as cuda_dispatcher  # noqa: E402

from protospec.command_line import CommandParser  # noqa: E402
from protospec.kernels.launch import interop  # noqa: E402

COMPUTE_CAPABILITY = (9, 0)
SM_COUNT = 132
results: dict[tuple, str | None] = {}  # (kernel name, argument types) -> None (built) or the error
built: dict[tuple, object] = {}        # the same keys -> Numba's compile result, for --divisions
parts: dict[tuple, tuple] = {}         # the same keys -> (the group of kernels that built it, the dispatcher)
_building = ""                          # main()'s group running now


def _argument_type(value):
    """The type Numba's launch infers: a C-contiguous array of the tensor's dtype and rank, int64 for
    an int, float64 for a float."""
    return numba.typeof(value.detach().numpy()) if isinstance(value, torch.Tensor) else numba.typeof(value)


def build(kernel, args: list) -> str | None:
    """Type and lower `kernel` (a cuda.jit dispatcher) for these arguments; None, or the error's first line."""
    signature = tuple(_argument_type(a) for a in args)
    name = kernel.py_func.__qualname__.replace(".<locals>", "")
    key = (f"{kernel.py_func.__module__}.{name}", signature, id(kernel))
    if key not in results:
        try:
            fastmath = kernel.targetoptions.get("fastmath", False)  # NVVM's options as compile_ptx's (gpu_wait_order)
            built[key] = compiler.compile_cuda(kernel.py_func, types.void, signature, cc=COMPUTE_CAPABILITY,
                                               fastmath=fastmath, nvvm_options={"fastmath": fastmath, "opt": 3})
            results[key] = None
            parts[key] = (_building, kernel)
        except Exception as exc:  # any failure to build is the finding
            results[key] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    return results[key]


class _TargetDevice:
    compute_capability = COMPUTE_CAPABILITY


class _BuildOnly:
    """Stands in for interop.BoundLaunch: builds the kernel, launches nothing."""

    def __init__(self, kernel, num_threads: int, args: list, dependent: bool = False):  # noqa: ARG002
        build(kernel, args)

    def __call__(self) -> None:
        pass


def install() -> None:
    """Route every launch of the package's kernels to `build` and let CPU tensors pass the checks."""
    from protospec.kernels.attention import paged_attention

    # A device function is compiled for the current device's compute capability when a kernel calls
    # it; with no driver there is no current device, so name the target's.
    cuda_dispatcher.get_current_device = lambda: _TargetDevice()
    interop.KERNEL_DEVICE_TYPE = "cpu"
    interop.launch_tensors = lambda kernel, grid, block, args, dependent=False: build(kernel, args)
    interop.launch = lambda kernel, num_threads, args: build(kernel, args)
    interop.BoundLaunch = _BuildOnly
    interop.sm_count = lambda device: SM_COUNT
    paged_attention._has_tensor_cores = lambda device: True
    from protospec.kernels.linear import gemv_mma
    gemv_mma.dependents_supported = lambda device: True  # the target is sm_90
    paged_attention.dependents.supported = lambda device: True


def _attention() -> None:
    from protospec.kernels.attention.paged_attention import paged_attention

    block_size, head_dim, blocks = 16, 64, 8
    tables = torch.tensor([[1, 2, 3, 0], [4, 5, 0, 0]], dtype=torch.int32)
    for dtype, heads, kv_heads, query_len, path, splits in [
            (torch.float16, 4, 4, 6, "mma", None),     # verify window, MHA
            (torch.float16, 8, 2, 1, "mma", None),     # decode, GQA rows on tensor cores
            (torch.float16, 4, 4, 6, "mma", 2),        # split-K, combined in the kernel
            (torch.float16, 4, 2, 1, "by_kv_head", None),
            (torch.float32, 4, 2, 6, "by_kv_head", 2),
            (torch.float32, 4, 4, 1, "by_kv_head", 2)]:  # split-K, one row a block
        q = torch.zeros(2 * query_len, heads, head_dim, dtype=dtype)
        kv = torch.zeros(2, blocks, block_size, kv_heads, head_dim, dtype=dtype)
        positions = torch.arange(2 * query_len, dtype=torch.int64) + 20
        paged_attention(q, kv, tables, positions, query_len, 0.125, path=path, splits=splits)
        if path == "mma":  # the forward's form: a programmatic dependent, its early loads before the wait
            paged_attention(q, kv, tables, positions, query_len, 0.125, path=path, splits=splits, dependent_launch=True)


def _layers_and_gemv() -> None:
    from protospec.kernels.linear.layer_ops import add_rms_norm, rope_and_cache, silu_and_mul

    for dtype in (torch.float16, torch.float32):
        x = torch.zeros(3, 64, dtype=dtype)
        add_rms_norm(x, None, torch.ones(64, dtype=dtype), 1e-6, torch.arange(3))
        add_rms_norm(x, x.clone(), torch.ones(64, dtype=dtype), 1e-6, torch.arange(3))
        kv = torch.zeros(2, 4, 16, 2, 16, dtype=dtype)
        rope_and_cache(torch.zeros(3, (4 + 2 * 2) * 16, dtype=dtype), torch.arange(3), torch.zeros(32, 16, dtype=dtype),
                       torch.zeros(32, 16, dtype=dtype), kv, torch.arange(3), 4)
        silu_and_mul(torch.zeros(3, 128, dtype=dtype))
    from tools.gpu_typecheck_gemv_mma import tensor_core_gemv_forms
    tensor_core_gemv_forms()


def _sampling_and_rejection() -> None:
    from tools.gpu_typecheck_sampling import sampling_and_rejection_forms
    sampling_and_rejection_forms()


def _draft_inputs() -> None:
    """The kernels that advance the draft's inputs on the device: advance_step (Numba's launch and the
    bound launcher), first_draft_step and the launched step's verify_inputs."""
    from protospec.kernels.inputs.advance_step import AdvanceStepLauncher, advance_step
    from protospec.kernels.inputs.first_draft_step import first_draft_step
    from protospec.kernels.inputs.verify_inputs import verify_inputs

    rows, width, block_size = 4, 3, 16
    int32, int64 = torch.int32, torch.int64
    args = [torch.ones(1, dtype=int32), torch.zeros(rows, dtype=int64), torch.zeros(rows, dtype=int64),
            torch.zeros(rows, dtype=int64), torch.ones(rows, dtype=int32), torch.zeros(rows, dtype=int64),
            torch.zeros(rows, width, dtype=int32), torch.zeros(1, dtype=int32)]
    advance_step(args[0], block_size, *args[1:])
    AdvanceStepLauncher(block_size, *args)()
    AdvanceStepLauncher(block_size, *args, dependent=True)()  # the form that waits for the sampling first
    batch = 2
    first_draft_step(block_size, width, torch.zeros(batch * width + 2 * batch, dtype=int64),
                     torch.zeros(batch, 6, dtype=int64), torch.zeros(batch, dtype=int64), torch.zeros(2 * rows, dtype=int64),
                     torch.zeros(2 * rows, dtype=int64), torch.zeros(2 * rows, dtype=int64), torch.ones(rows, dtype=int32),
                     torch.zeros(rows, width, dtype=int32), torch.zeros(1, dtype=int32))
    k = 5
    verify_inputs(block_size, width, torch.zeros(2 * rows, dtype=int64), torch.ones(rows, dtype=int32),
                  torch.zeros(rows, width, dtype=int32), torch.zeros(rows, k, dtype=int64),
                  *[torch.zeros(rows * (k + 1), dtype=int64) for _ in range(3)], torch.zeros(rows, dtype=int32),
                  torch.zeros(rows, width, dtype=int32), torch.zeros(1, dtype=int32))


def _forwards() -> None:
    """A tiny GQA model's forwards through the layer kernels, for decode and verify batches."""
    from protospec.model.config import LlamaArchConfig
    from protospec.model.inputs import prepare_inputs
    from protospec.model.layer_kernels import enable_layer_kernels
    from protospec.model.llama import LlamaForCausalLM

    cfg = LlamaArchConfig.from_dict(dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, vocab_size=512, max_position_embeddings=256,
                                         rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                                         model_type="llama"))
    block_size, blocks = 16, 8
    for dtype in (torch.float16, torch.float32):
        model = LlamaForCausalLM(cfg).place("cpu", dtype)
        kv = torch.zeros(cfg.num_hidden_layers, 2, blocks, block_size, cfg.num_key_value_heads, cfg.head_dim, dtype=dtype)
        enable_layer_kernels(model)
        for tokens in ([[5], [6]], [[5] * 6, [6] * 6]):
            inputs = prepare_inputs(tokens, [20, 30], [[1, 2, 3], [4, 5, 6]], block_size, len(tokens[0]), torch.device("cpu"))
            model(inputs.input_ids, inputs.positions, list(kv.unbind(0)), inputs.meta)


def runtime_divisions(compiled) -> int:
    """64-bit div / rem instructions whose divisor is not a constant, in the kernel's LLVM IR (its
    device functions linked in) after -O3 with the host's target."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    modules = [llvm.parse_assembly(str(m)) for m in compiled.library.modules]
    for other in modules[1:]:
        modules[0].link_in(other)
    builder = llvm.create_pass_builder(llvm.Target.from_default_triple().create_target_machine(),
                                       llvm.create_pipeline_tuning_options(3))
    builder.getModulePassManager().run(modules[0], builder)
    return len(re.findall(r"= [su](?:div|rem) (?:exact )?i64 [^,\n]+, %", str(modules[0])))


def main(argv: list[str] | None = None) -> int:
    p = CommandParser(prog="python -m tools.gpu_typecheck", description=__doc__.split("\n\n")[0])
    p.add_argument("--divisions", action="store_true", help="count every kernel's runtime 64-bit divisions")
    p.add_argument("--divisions-of", default="", metavar="NAME[,NAME..]",
                   help="count them in the kernels whose name holds one of these")
    args = p.parse_args(argv)
    counted = [name for name in args.divisions_of.split(",") if name]
    divisions = args.divisions
    global _building
    install()
    for part in (_attention, _layers_and_gemv, _sampling_and_rejection, _draft_inputs, _forwards):
        _building = part.__name__
        part()
    failed = 0
    for key, error in results.items():
        name, signature, _ = key
        count = divisions or any(part in name for part in counted)  # (an -O3 pass over each counted kernel)
        extra = f"  [{runtime_divisions(built[key])} runtime 64-bit divisions]" if count and not error else ""
        print(f"{'FAILED' if error else 'built '} {name}{tuple(str(t) for t in signature)}" + (f": {error}" if error else extra))
        failed += error is not None
    print(f"{len(results) - failed} kernel signatures built for sm_{COMPUTE_CAPABILITY[0]}{COMPUTE_CAPABILITY[1]}, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    from protospec.command_line import run_command

    run_command(main)

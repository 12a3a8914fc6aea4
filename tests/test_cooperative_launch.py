"""Kernels that sync their whole grid (cuda.cg.this_grid().sync()) through protospec's launchers: the
driver call must be the cooperative one, or the blocks of a phase would race ahead of the others.
In the simulator a cooperative grid is one block (its grid sync is a block barrier); on a GPU the
grid spans every SM, and a CUDA graph captures the launch."""
import pytest
import torch
from numba import float32

from protospec.kernels import interop
from protospec.kernels.interop import KERNEL_DEVICE_TYPE, SIMULATOR, cuda

DEV = KERNEL_DEVICE_TYPE


@cuda.jit
def _reverse_of_doubled(x, y, out):
    """Phase 1: y = 2 x over a grid-stride loop; grid sync; phase 2: out[i] = y[n - 1 - i], an
    element another block wrote (wrong without the sync, or with a non-cooperative launch)."""
    grid = cuda.cg.this_grid()
    n = x.shape[0]
    start = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    stride = cuda.gridDim.x * cuda.blockDim.x
    for i in range(start, n, stride):
        y[i] = x[i] * float32(2.0)
    grid.sync()
    for i in range(start, n, stride):
        out[i] = y[n - 1 - i]


def _run(n: int, threads: int = 64):
    x = torch.arange(n, dtype=torch.float32, device=DEV)
    y, out = torch.zeros_like(x), torch.zeros_like(x)
    args = [x, y, out]
    blocks = interop.max_cooperative_blocks(_reverse_of_doubled, threads, args)
    return args, blocks, threads


def test_a_grid_syncing_kernel_phases_through_the_tensor_launcher():
    args, blocks, threads = _run(4000 if not SIMULATOR else 200)
    assert blocks >= 1 and (blocks == 1) == SIMULATOR
    interop.launch_tensors(_reverse_of_doubled, blocks, threads, args)
    x, _, out = args
    torch.testing.assert_close(out, torch.flip(x, [0]) * 2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="cooperative grids of many blocks and graph capture need a GPU")
def test_a_grid_syncing_kernel_is_launched_cooperatively_bound_and_in_a_graph():
    args, blocks, threads = _run(1 << 20, threads=128)  # BoundLaunch's blocks are of 128 threads
    x, y, out = args
    assert interop.TensorLaunch(_reverse_of_doubled)._compile(args)[2]  # Numba marks it cooperative
    bound = interop.BoundLaunch(_reverse_of_doubled, blocks * threads, args)
    assert (bound.grid, bound.block) == (blocks, threads)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        bound()
    for _ in range(2):
        out.zero_()
        y.zero_()
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, torch.flip(x, [0]) * 2)
    with pytest.raises(RuntimeError, match="cuLaunchCooperativeKernel failed"):  # more blocks than can be resident
        interop.launch_tensors(_reverse_of_doubled, blocks * 4, threads, args)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="times GPU grid syncs")
def test_the_grid_sync_benchmark_runs_every_sync_and_reports_a_cost():
    from protospec.bench import grid_sync_cost

    report = grid_sync_cost.main(["--threads", "128", "--blocks-per-sm", "1", "--syncs", "50"])
    (case,) = report["cases"]
    assert 1 <= case["blocks"] <= case["resident_blocks"] and case["many_syncs_us"] > case["one_sync_us"] > 0

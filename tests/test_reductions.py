"""The block-wide reductions by warp shuffles (kernels/primitives/reductions.py): block_argmax_or gives every thread
the block's best value, its lowest index on ties, and the OR of the flags, across warps;
block_sum_tree_order gives tree_sum's very bits (the simulator and the GPU alike). In the simulator each
test runs the shuffles (SHUFFLE_LANES = 32) and the slots-only form the simulator uses by default."""
import pytest
import torch
from numba import float32, int64

from protospec.kernels.launch import interop
from protospec.kernels.primitives import reductions
from protospec.kernels.launch.interop import KERNEL_DEVICE_TYPE, cuda
from protospec.kernels.primitives.reductions import block_argmax_or, block_sum_tree_order, tree_sum

DEV = KERNEL_DEVICE_TYPE
WIDTH = 64  # two warps: the merge across warps runs even in the simulator
LANES = [pytest.param(32, id="shuffles"), pytest.param(1, id="slots_only")]


@cuda.jit
def _reduce_twice(values, indices, flags, out_values, out_indices, out_flags):
    """Each thread's answer, twice in a row through the same slots (the second must not see the first's)."""
    tid = cuda.threadIdx.x
    value_slots = cuda.shared.array(WIDTH, float32)
    index_slots = cuda.shared.array(WIDTH, int64)
    flag_slots = cuda.shared.array(WIDTH, int64)
    for rep in range(2):
        value, index, flag = block_argmax_or(values[rep, tid], indices[rep, tid], flags[rep, tid], value_slots,
                                             index_slots, flag_slots, tid, WIDTH)
        out_values[rep, tid], out_indices[rep, tid], out_flags[rep, tid] = value, index, flag


def _run(values, indices, flags):
    out = (torch.empty(2, WIDTH, device=DEV), torch.empty(2, WIDTH, dtype=torch.int64, device=DEV),
           torch.empty(2, WIDTH, dtype=torch.int64, device=DEV))
    interop.launch_tensors(_reduce_twice, 1, WIDTH, [values.to(DEV), indices.to(DEV), flags.to(DEV), *out])
    return [t.cpu() for t in out]


@pytest.mark.parametrize("lanes", LANES)
@pytest.mark.parametrize("seed", [0, 1])
def test_every_thread_gets_the_best_lowest_index_and_the_or(seed, lanes, monkeypatch):
    monkeypatch.setattr(reductions, "SHUFFLE_LANES", lanes)
    gen = torch.Generator().manual_seed(seed)
    values = torch.randint(0, 5, (2, WIDTH), generator=gen).float()  # few distinct values: many ties
    indices = torch.randperm(2 * WIDTH, generator=gen)[: 2 * WIDTH].view(2, WIDTH)
    flags = torch.zeros(2, WIDTH, dtype=torch.int64)
    values[0, 40], indices[0, 40] = 9.0, 70       # the best sits in the second warp ...
    values[0, 3], indices[0, 3] = 9.0, 71         # ... tied with one in the first at a higher index
    values[1, [10, 12, 50]] = 7.0                 # second pass: ties inside a warp and across warps,
    indices[1, [10, 12, 50]] = torch.tensor([6, 4, 5])  # the lowest index wins
    flags[0, 63] = 1                              # only the last thread's flag: the OR must reach it
    got_values, got_indices, got_flags = _run(values, indices, flags.clone())
    assert (got_values[0] == 9.0).all() and (got_indices[0] == 70).all() and (got_flags[0] == 1).all()
    assert (got_values[1] == 7.0).all() and (got_indices[1] == 4).all() and (got_flags[1] == 0).all()


SUM_WIDTH = 128  # four warps: two of the tree's levels cross warps before the shuffles


@cuda.jit
def _sums(values, width, by_shuffles, by_tree):
    """Every thread's block_sum_tree_order result, and tree_sum's, over the first `width` threads."""
    tid = cuda.threadIdx.x
    scratch = cuda.shared.array(SUM_WIDTH, float32)
    by_shuffles[tid] = block_sum_tree_order(values[tid], scratch, tid, width)
    cuda.syncthreads()
    scratch[tid] = values[tid]
    cuda.syncthreads()
    tree_sum(scratch, tid, width)
    by_tree[0] = scratch[0]


@pytest.mark.parametrize("lanes", LANES)
@pytest.mark.parametrize("width", [32, 128])
def test_the_shuffle_sum_has_the_trees_bits(width, lanes, monkeypatch):
    monkeypatch.setattr(reductions, "SHUFFLE_LANES", lanes)
    # Normal values of one scale: their float32 sum's last bits depend on the order of the additions
    # (these seeds' do: the same shuffles in ascending lane order give other bits)
    values = torch.randn(width, generator=torch.Generator().manual_seed(1))
    by_shuffles, by_tree = torch.empty(width, device=DEV), torch.empty(1, device=DEV)
    interop.launch_tensors(_sums, 1, width, [values.to(DEV), width, by_shuffles, by_tree])
    by_shuffles, by_tree = by_shuffles.cpu(), by_tree.cpu()
    assert (by_shuffles.view(torch.int32) == by_tree.view(torch.int32)).all()  # bit for bit, in every thread

"""The packed argmax (kernels/sampling/packed_argmax.py): keys folded with a 64-bit atomic max give the best value and,
of equal values, the lowest index (reductions.better's order), for negative values, zeros of either sign,
infinities and ties; the slot left EMPTY by the exchange that reads it."""
import math

import torch

from protospec.kernels.launch import interop
from protospec.kernels.launch.interop import KERNEL_DEVICE_TYPE, cuda
from protospec.kernels.sampling.packed_argmax import EMPTY, argmax_key, key_index

DEV = KERNEL_DEVICE_TYPE


@cuda.jit
def _fold(values, indices, groups, slots, out):
    """Thread i folds (values[i], indices[i]) into slots[groups[i]]; then thread g < len(out) reads and
    empties slot g."""
    i = cuda.grid(1)
    if i < values.shape[0]:
        cuda.atomic.max(slots, groups[i], argmax_key(values[i], indices[i]))
    cuda.syncthreads()
    if i < out.shape[0]:
        out[i] = key_index(cuda.atomic.exch(slots, i, EMPTY))


def _expected(values, indices, groups, count):
    best = []
    for g in range(count):
        pairs = [(v, i) for v, i, gg in zip(values, indices, groups) if gg == g]
        top = max(v for v, _ in pairs)  # -0.0 == 0.0 here, as in better()
        best.append(min(i for v, i in pairs if v == top))
    return best


def test_the_fold_picks_the_best_value_and_its_lowest_index():
    gen = torch.Generator().manual_seed(0)
    values = (torch.randn(60, generator=gen) * 3).tolist()
    values[:4] = [-0.0, 0.0, -1.5, -1.5]                                   # group 0: zeros of both signs tie
    values[4:12] = [-3.0, -2.5, -7.0, -2.5, -math.inf, -2.5, -9.0, -4.0]  # group 1: all negative, tied
    values[12], values[13] = math.inf, -math.inf                          # in groups 2 and 3
    groups = [0] * 4 + [1] * 8 + [g % 3 + 2 for g in range(48)]
    indices = torch.randperm(1000, generator=gen)[:60].tolist()
    count = 5
    slots = torch.full((count,), EMPTY, dtype=torch.int64, device=DEV)
    out = torch.empty(count, dtype=torch.int64, device=DEV)
    interop.launch_tensors(_fold, 1, 64, [torch.tensor(values, dtype=torch.float32, device=DEV),
                                          torch.tensor(indices, dtype=torch.int64, device=DEV),
                                          torch.tensor(groups, dtype=torch.int64, device=DEV), slots, out])
    assert out.tolist() == _expected(values, indices, groups, count)
    assert slots.tolist() == [EMPTY] * count  # ready for the next call

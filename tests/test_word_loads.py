"""Weights read as int64 words and split into float32 values in a kernel (kernels/primitives/word_loads.py):
every value of a float16 tensor comes back, in memory order, through its word view (the
simulator and the GPU alike)."""
import pytest
import torch

from protospec.kernels.launch import interop
from protospec.kernels.launch.interop import KERNEL_DEVICE_TYPE, cuda
from protospec.kernels.primitives.word_loads import load_flat, store_flat, unpack_f16x4

DEV = KERNEL_DEVICE_TYPE


@cuda.jit
def _unpack_halves(words, out):
    i = cuda.grid(1)
    if i < words.shape[0]:
        out[4 * i], out[4 * i + 1], out[4 * i + 2], out[4 * i + 3] = unpack_f16x4(words[i])


@cuda.jit
def _gather_flat(array, indices, out):
    i = cuda.grid(1)
    if i < indices.shape[0]:
        out[i] = load_flat(array, indices[i])


@cuda.jit
def _scatter_flat(values, indices, array):
    i = cuda.grid(1)
    if i < indices.shape[0]:
        store_flat(array, indices[i], values[i])


def test_every_value_comes_back_in_memory_order():
    # signs, subnormal float16s, infinities and NaN among ordinary values: a wrong shift, an arithmetic
    # (sign-extending) shift or a swapped half would move or change some of them
    special = torch.tensor([0.0, -0.0, 1.0, -2.5, 6e-8, -6e-5, 65504.0, float("inf"), float("-inf"), 3.1416, -1e-3, 7.0])
    values = torch.cat([special, torch.randn(52, generator=torch.Generator().manual_seed(0)) * 100]).half().to(DEV)
    words = values.view(torch.int64)
    out = torch.full((values.numel(),), float("nan"), dtype=torch.float32, device=DEV)
    interop.launch_tensors(_unpack_halves, 1, 32, [words, out])
    torch.testing.assert_close(out, values.float(), rtol=0, atol=0, equal_nan=True)
    nan = values.clone()
    nan[5] = float("nan")
    interop.launch_tensors(_unpack_halves, 1, 32, [nan.view(torch.int64), out])
    assert torch.isnan(out[5]) and torch.equal(out[:5], values[:5].float())


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_load_flat_reads_any_element_in_c_order(index_dtype):
    # a 4-D array read by flat index: a wrong stride, a dropped dimension or a sign-extended offset
    # would return another element (the first, last and a spread of elements in between)
    torch.manual_seed(0)
    array = torch.randint(-2**62, 2**62, (2, 3, 5, 7), dtype=torch.int64, device=DEV)
    indices = torch.tensor([0, 1, 7, 34, 104, 209, 105, 63], dtype=index_dtype, device=DEV)
    out = torch.zeros(indices.shape[0], dtype=torch.int64, device=DEV)
    interop.launch_tensors(_gather_flat, 1, 32, [array, indices, out])
    assert torch.equal(out, array.reshape(-1)[indices.long()])


def test_store_flat_writes_exactly_the_indexed_elements_in_c_order():
    # float16 values written into a 4-D float16 array through float32 arguments: each lands at its
    # flat index, converted, and nothing else changes
    array = torch.zeros(2, 3, 4, 5, dtype=torch.float16, device=DEV)
    indices = torch.tensor([0, 7, 59, 60, 119], dtype=torch.int64, device=DEV)
    values = torch.tensor([1.5, -2.0, 3.25, 65504.0, -0.5], dtype=torch.float32, device=DEV)
    interop.launch_tensors(_scatter_flat, 1, 32, [values, indices, array])
    expected = torch.zeros(120, dtype=torch.float16, device=DEV)
    expected[indices] = values.half()
    assert torch.equal(array.reshape(-1), expected)

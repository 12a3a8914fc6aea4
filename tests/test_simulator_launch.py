"""Launches in the CUDA simulator (kernels/simulator.py, interop.py): the block's threads switch often
while a kernel runs, and the interpreter's own switch interval comes back after it, also when the
kernel raises."""
import sys

import pytest
import torch
from numba import cuda

from protospec.kernels import interop
from protospec.kernels.simulator import SIMULATOR_SWITCH_INTERVAL_S

pytestmark = pytest.mark.skipif(not interop.SIMULATOR, reason="the simulator's launch path")

seen: list[float] = []  # what each simulated thread read (the simulator runs a kernel's Python)


@cuda.jit
def _record_switch_interval(out):
    seen.append(sys.getswitchinterval())
    cuda.syncthreads()
    out[cuda.threadIdx.x] = 1.0


@cuda.jit
def _fail(out):
    out[len(out)] = 1.0  # past the end: the simulator raises IndexError


@pytest.mark.parametrize("launch", ["launch_tensors", "launch"])
def test_a_simulated_launch_switches_threads_often_and_gives_the_interval_back(launch):
    seen.clear()
    before = sys.getswitchinterval()
    assert before != SIMULATOR_SWITCH_INTERVAL_S
    out = torch.zeros(4)
    if launch == "launch_tensors":
        interop.launch_tensors(_record_switch_interval, 1, 4, [out])
    else:
        interop.launch(_record_switch_interval, 4, [out])
    assert seen == [pytest.approx(SIMULATOR_SWITCH_INTERVAL_S)] * 4 and out.tolist() == [1.0] * 4
    assert sys.getswitchinterval() == before


def test_a_kernel_that_raises_still_gives_the_interval_back():
    before = sys.getswitchinterval()
    with pytest.raises(IndexError):
        interop.launch_tensors(_fail, 1, 1, [torch.zeros(2)])
    assert sys.getswitchinterval() == before

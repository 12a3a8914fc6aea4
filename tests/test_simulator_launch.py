"""Launches in the CUDA simulator (kernels/launch/simulator.py, launch/interop.py): the block's threads switch often
while a kernel runs, the interpreter's own switch interval comes back after it (also when the kernel
raises), and a block's threads still share one shared array however often they switch."""
import sys
import time

import numpy as np
import pytest
import torch
from numba import cuda, int32

from protospec.kernels.launch import interop, simulator
from protospec.kernels.launch.simulator import SIMULATOR_SWITCH_INTERVAL_S

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


def test_overlapping_launches_give_the_interval_back_when_the_last_one_ends():
    """Two launches in progress at once (from two threads): the first to end leaves the short interval
    to the other, the second puts the interpreter's back."""
    before = sys.getswitchinterval()
    first, second = simulator.short_thread_switches(), simulator.short_thread_switches()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert sys.getswitchinterval() == pytest.approx(SIMULATOR_SWITCH_INTERVAL_S)
    second.__exit__(None, None, None)
    assert sys.getswitchinterval() == before


THREADS = 128


@cuda.jit
def _read_the_next_threads_write(out):
    ids = cuda.shared.array(THREADS, int32)  # every thread asks for it at once, on one line
    tid = cuda.threadIdx.x
    ids[tid] = tid + 1
    cuda.syncthreads()
    out[tid] = ids[(tid + 1) % THREADS]


class _SlowAllocations:
    """numpy whose empty() sleeps first: the thread that makes a shared array switches away right
    there, the moment a second thread may ask for the same array."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def empty(*args, **kwargs):
        time.sleep(0.002)
        return np.empty(*args, **kwargs)


def test_a_blocks_threads_share_one_shared_array_when_they_switch_while_it_is_made(monkeypatch):
    """numba-cuda's simulator makes a shared array on the first request from its line; without a lock,
    two threads switching between its look-up and its store each got an array of their own and read
    garbage for their neighbours' writes (here every allocation switches threads, as a short switch
    interval makes happen now and then)."""
    from numba.cuda.simulator import kernelapi

    monkeypatch.setattr(kernelapi, "np", _SlowAllocations())
    monkeypatch.setattr(simulator, "np", _SlowAllocations())
    expected = [(tid + 1) % THREADS + 1 for tid in range(THREADS)]
    out = torch.zeros(THREADS, dtype=torch.int32)
    interop.launch_tensors(_read_the_next_threads_write, 1, THREADS, [out])
    assert out.tolist() == expected

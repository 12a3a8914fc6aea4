"""Block-wide reductions shared by the kernels (device functions): a tree in shared memory, and
argmax / min / sum forms that combine inside each warp by shuffles before one merge of the warps.

`width` is the number of threads taking part, a power of two; every thread of the block must call
(they synchronise).
"""
from __future__ import annotations

from protospec.kernels.launch import interop
from protospec.kernels.launch.interop import cuda


@cuda.jit(device=True)
def tree_sum(values, tid, width):
    """values[0] = the sum of values[:width]."""
    stride = width // 2
    while stride > 0:
        if tid < stride:
            values[tid] += values[tid + stride]
        cuda.syncthreads()
        stride //= 2


# Warp-level exchange: on a GPU a register shuffle; the simulator has no shuffles, so there every
# thread of the block swaps through shared memory between two barriers (every thread must call).
if interop.SIMULATOR:
    @cuda.jit(device=True)
    def xor_exchange(value, lane_mask, scratch, tid):
        """The `value` held by thread tid ^ lane_mask (lane_mask < 32: inside the warp)."""
        cuda.syncthreads()
        scratch[tid] = value
        cuda.syncthreads()
        return scratch[tid ^ lane_mask]
else:
    @cuda.jit(device=True)
    def xor_exchange(value, lane_mask, scratch, tid):
        """The `value` held by thread tid ^ lane_mask (lane_mask < 32: inside the warp)."""
        return cuda.shfl_xor_sync(0xFFFFFFFF, value, lane_mask)



WARP = 32
# Lanes that combine by shuffles before the slots' merge. The simulator emulates each shuffle with two
# block barriers (one OS thread per lane), so there every thread writes its own slot and each merges
# them all: the same results (argmax and min are order-free; block_sum_tree_order keeps the tree's
# order at any width) at simulator speed. Tests set it to WARP to run the shuffles in the simulator.
SHUFFLE_LANES = 1 if interop.SIMULATOR else WARP


@cuda.jit(device=True)
def better(value, index, best_value, best_index):
    """value at index beats the best so far: larger, or equal at a lower index (torch.argmax's rule)."""
    return value > best_value or (value == best_value and index < best_index)


@cuda.jit(device=True)
def block_argmax_or(value, index, flag, value_slots, index_slots, flag_slots, tid, width):
    """The best (value, index) over the block's `width` threads (ties to the lowest index) and the OR
    of their flags, returned in every thread. Shuffles inside each warp, then every thread merges the
    warps' winners from shared slots: two barriers where a shared-memory tree needs log2(width). The slots
    (shared, [width] each) may be reused once every thread has returned; the leading barrier guards
    the previous call's reads."""
    cuda.syncthreads()
    lanes = min(width, SHUFFLE_LANES)
    lane_mask = lanes // 2
    while lane_mask > 0:
        other_value = xor_exchange(value, lane_mask, value_slots, tid)
        other_index = xor_exchange(index, lane_mask, index_slots, tid)
        flag = flag | xor_exchange(flag, lane_mask, flag_slots, tid)
        if better(other_value, other_index, value, index):
            value, index = other_value, other_index
        lane_mask //= 2
    cuda.syncthreads()  # the simulator's exchanges read the slots
    if tid % lanes == 0:
        value_slots[tid // lanes], index_slots[tid // lanes], flag_slots[tid // lanes] = value, index, flag
    cuda.syncthreads()
    value, index, flag = value_slots[0], index_slots[0], flag_slots[0]
    for w in range(1, width // lanes):
        if better(value_slots[w], index_slots[w], value, index):
            value, index = value_slots[w], index_slots[w]
        flag = flag | flag_slots[w]
    return value, index, flag


@cuda.jit(device=True)
def block_min_and_sum(low, total, low_slots, total_slots, tid, width):
    """The smallest `low` and the sum of `total` (int64s) over the block's `width` threads, in every
    thread: as block_argmax_or, shuffles inside each warp, then one merge of the warps' from the slots."""
    cuda.syncthreads()
    lanes = min(width, SHUFFLE_LANES)
    lane_mask = lanes // 2
    while lane_mask > 0:
        low = min(low, xor_exchange(low, lane_mask, low_slots, tid))
        total += xor_exchange(total, lane_mask, total_slots, tid)
        lane_mask //= 2
    cuda.syncthreads()  # the simulator's exchanges read the slots
    if tid % lanes == 0:
        low_slots[tid // lanes], total_slots[tid // lanes] = low, total
    cuda.syncthreads()
    low, total = low_slots[0], total_slots[0]
    for w in range(1, width // lanes):
        low, total = min(low, low_slots[w]), total + total_slots[w]
    return low, total


@cuda.jit(device=True)
def block_sum_tree_order(value, scratch, tid, width):
    """The sum of the block's `width` threads' values, in every thread, with tree_sum's exact bits: the
    tree's levels across warps in shared memory, then its levels inside warp 0 as xor shuffles (at
    stride s lane t < s adds lane t ^ s = t + s, the tree's very pair; a + b == b + a bit for bit), so
    log2(32) of its barriers go. scratch: shared, [width]."""
    scratch[tid] = value
    cuda.syncthreads()
    lanes = min(width, SHUFFLE_LANES)
    stride = width // 2
    while stride >= lanes and stride > 0:
        if tid < stride:
            scratch[tid] += scratch[tid + stride]
        cuda.syncthreads()
        stride //= 2
    value = scratch[tid]
    lane_mask = lanes // 2
    while lane_mask > 0:  # every thread takes part (the simulator's exchange is block-wide); warp 0 counts
        value += xor_exchange(value, lane_mask, scratch, tid)
        lane_mask //= 2
    cuda.syncthreads()  # the simulator's exchanges read the scratch
    if tid == 0:
        scratch[0] = value
    cuda.syncthreads()
    return scratch[0]

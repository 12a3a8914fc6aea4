"""Softmax statistics of each 16-row vocabulary tile, written by the LM head as it writes the logits,
so the sampling kernels need not read the logits once more to find each row's max and sum.

Per token row r and tile j (vocabulary rows 16j .. 16j + 15): tile_max[r, j] = the tile's largest
logit x, tile_index[r, j] = its first vocabulary row (torch.argmax's tie rule), tile_sum[r, j] = the sum
of exp(x - tile_max) over the tile: the temperature-1 form of the sampling kernels' per-slice
partials, which their combine (sampling_slices.combine_stats) merges into the row's max, its index
and sum_j tile_sum_j * e^(tile_max_j - M). Only rows sampled at T = 1 (or greedily: the max and its
index do not depend on T) can use them; e^(x/T - m/T) does not follow from e^(x - m).

The LM head (gemv_mma with logit_stats=True) hands them over as an attribute of the logits tensor it
returns (`attached(logits)`): a logits tensor made any other way (a slice, a copy, the torch path)
has none, and the sampler then computes the statistics itself.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from numba import float32, int64

from protospec.kernels.interop import cuda
from protospec.kernels.reductions import better, xor_exchange

TILE_ROWS = 16   # gemv_mma_kernel.TILE_ROWS: vocabulary rows a tile (a block of the LM head)
_ATTRIBUTE = "protospec_logit_stats"


@dataclass
class LogitStats:
    tile_max: torch.Tensor    # [R, S] float32, S = ceil(V / 16)
    tile_index: torch.Tensor  # [R, S] int64
    tile_sum: torch.Tensor    # [R, S] float32

    @classmethod
    def empty(cls, rows: int, vocab: int, device) -> "LogitStats":
        tiles = -(-vocab // TILE_ROWS)
        return cls(torch.empty(rows, tiles, dtype=torch.float32, device=device),
                   torch.empty(rows, tiles, dtype=torch.int64, device=device),
                   torch.empty(rows, tiles, dtype=torch.float32, device=device))


def attach(logits: torch.Tensor, stats: LogitStats) -> None:
    setattr(logits, _ATTRIBUTE, stats)


def tile_stats_reference(logits: torch.Tensor) -> LogitStats:
    """The statistics of logits [R, V] float32 in torch (the kernel's twin; an all -inf tile sums to 0)."""
    rows, vocab = logits.shape
    tiles = -(-vocab // TILE_ROWS)
    padded = torch.full((rows, tiles * TILE_ROWS), -float("inf"), device=logits.device)
    padded[:, :vocab] = logits
    padded = padded.view(rows, tiles, TILE_ROWS)
    top = padded.max(-1).values                                                      # [R, S]
    first = padded.argmax(-1) + torch.arange(tiles, device=logits.device) * TILE_ROWS  # torch.argmax: the first max
    total = (padded - top[..., None]).exp().sum(-1).nan_to_num(0.0)
    return LogitStats(top.contiguous(), first.contiguous(), total.contiguous())


def attached(logits: torch.Tensor) -> LogitStats | None:
    """The statistics written with these logits, if the tensor is the LM head's own output."""
    stats = getattr(logits, _ATTRIBUTE, None)
    if stats is None or stats.tile_max.shape != (logits.shape[0], -(-logits.shape[1] // TILE_ROWS)):
        return None
    return stats


@cuda.jit(device=True)
def tile_stats(sums, holder, g, t, n0, n_rows, tokens, tile_max, tile_index, tile_sum, scratch, index_scratch, tid):
    """The tile at vocabulary row n0, from the LM head's epilogue: the warp with `holder` true holds
    the tile's stored logits, lane (g, t) rows n0 + g (sums[0], sums[1]) and n0 + g + 8 (sums[2],
    sums[3]) of tokens 2t and 2t + 1. Per token: the max and its row over g by xor exchanges (lane bits
    2 to 4), then the sum of exp(x - max) the same way; lanes g = 0 of the holder write them. Every
    thread of the block calls (the simulator's exchanges are block barriers); scratch [threads] float32
    and index_scratch [threads] int64 are the simulator's."""
    tile = n0 // TILE_ROWS
    for parity in range(2):
        lo_ok = holder and n0 + g < n_rows
        hi_ok = holder and n0 + g + 8 < n_rows
        value, index = float32(-math.inf), int64(n0 + g)
        if lo_ok:
            value = sums[parity]
        if hi_ok and sums[2 + parity] > value:  # a tie keeps the lower row
            value, index = sums[2 + parity], int64(n0 + g + 8)
        for lane_mask in (4, 8, 16):
            other_value = xor_exchange(value, lane_mask, scratch, tid)
            other_index = xor_exchange(index, lane_mask, index_scratch, tid)
            if better(other_value, other_index, value, index):
                value, index = other_value, other_index
        total = float32(0.0)
        if value > float32(-math.inf):  # an all -inf tile adds nothing (e^(-inf + inf) is NaN)
            if lo_ok:
                total += math.exp(sums[parity] - value)
            if hi_ok:
                total += math.exp(sums[2 + parity] - value)
        for lane_mask in (4, 8, 16):
            total += xor_exchange(total, lane_mask, scratch, tid)
        token = 2 * t + parity
        if holder and g == 0 and token < tokens:
            tile_max[token, tile] = value
            tile_index[token, tile] = index
            tile_sum[token, tile] = total

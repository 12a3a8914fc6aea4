"""The sampling kernels' buffers that are not the caller's: the slices' statistics and race winners
(written and read within a call, one set per shape), and the arguments of a launch that advances
nothing (interop.placeholder's); and RowSettings, what they read of the
batch's sampling settings.
"""
from __future__ import annotations

from typing import Protocol

import torch

from protospec.errors import KernelArgumentError
from protospec.kernels.launch.interop import check_tensor, placeholder


class RowSettings(Protocol):
    """The batch's sampling settings a sampling kernel reads (speculation/sampler.py's SamplingTensors
    carries them; named here so the kernels need nothing above them)."""
    temperature: torch.Tensor  # [B] float32 (1.0 for greedy rows)
    is_greedy: torch.Tensor    # [B] bool
    all_greedy: bool           # host-side facts
    needs_filter: bool         # some row has top-k / top-p: these kernels do not apply


def no_advance(device: torch.device) -> list:
    """advance_step_kernel's row arguments where the kernel advances nothing (never written)."""
    i32, i64 = (placeholder(dtype, 1, device) for dtype in (torch.int32, torch.int64))
    return [i32, 0, i64, i64, i32, i64, placeholder(torch.int32, 2, device), i32]


_scratches: dict[tuple, tuple] = {}


def scratch(rows: int, slices: int, device: torch.device, what: str = "stats") -> tuple:
    """The slices' statistics ("stats...": max [R, S] f32, its index [R, S] int64, sum [R, S] f32) or
    race winners ("winners...": value [R, S] f32, index [R, S] int64), written and read within a call:
    one set per shape and name (work on two streams at once takes two names: softmax_sample._launch's `space`)."""
    key = (rows, slices, str(device), what)
    if key not in _scratches:
        f32 = dict(dtype=torch.float32, device=device)
        i64 = dict(dtype=torch.int64, device=device)
        if what.startswith("winners"):
            _scratches[key] = (torch.empty(rows, slices, **f32), torch.empty(rows, slices, **i64))
        else:
            _scratches[key] = (torch.empty(rows, slices, **f32), torch.empty(rows, slices, **i64),
                               torch.empty(rows, slices, **f32))
    return _scratches[key]


def mirror_span(mirror: torch.Tensor | None, rows: int, device: torch.device) -> tuple[torch.Tensor, int]:
    """The kernels' mirror and its stride: mirror [>= rows] int64 of any stride (a buffer of its own, or
    a column of a larger one: the verify's draft tokens) as the contiguous span from its first row to
    its last, the kernels writing row r at r * stride; (a placeholder, 0) where there is none."""
    if mirror is None:
        return placeholder(torch.int64, 1, device), 0
    if mirror.dim() != 1 or mirror.shape[0] < rows:
        raise KernelArgumentError(f"mirror: expected [>= {rows}] ids, got shape {tuple(mirror.shape)}")
    stride = mirror.stride(0) if rows > 1 else 1
    span = mirror.as_strided(((rows - 1) * stride + 1,), (1,))
    check_tensor("mirror", span, torch.int64, 1)
    return span, stride

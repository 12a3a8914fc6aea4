"""The sampling kernels' buffers that are not the caller's: the slices' partials and the rows'
statistics (written and read within a call, one set per shape), and placeholders for the arguments a
launch does not use (never an alias of a real argument, never written).
"""
from __future__ import annotations

import torch


def no_advance(device: torch.device) -> list:
    """advance_row's arguments where the kernel advances nothing (never written)."""
    i32, i64 = (placeholder(dtype, 1, device) for dtype in (torch.int32, torch.int64))
    return [i32, 0, i64, i64, i32, i64, placeholder(torch.int32, 2, device), i32]


_scratches: dict[tuple, tuple] = {}


def scratch(rows: int, slices: int, device: torch.device, what: str = "stats") -> tuple:
    """The slices' partials and the rows' stats ("stats"), or the one-launch form's slice winners
    ("winners"), written and read within a call: one set per shape (the engine launches on one
    stream; two streams sampling the same shape at once would share it)."""
    key = (rows, slices, str(device), what)
    if key not in _scratches:
        f32 = dict(dtype=torch.float32, device=device)
        i64 = dict(dtype=torch.int64, device=device)
        if what == "winners":
            _scratches[key] = (torch.empty(rows, slices, **f32), torch.empty(rows, slices, **i64))
        else:
            _scratches[key] = (torch.empty(rows, slices, **f32), torch.empty(rows, slices, **i64),
                               torch.empty(rows, slices, **f32), torch.empty(rows, **f32), torch.empty(rows, **i64),
                               torch.empty(rows, **f32))
    return _scratches[key]


_placeholders: dict[tuple, torch.Tensor] = {}


def placeholder(dtype: torch.dtype, ndim: int, device: torch.device) -> torch.Tensor:
    key = (dtype, ndim, str(device))
    if key not in _placeholders:
        _placeholders[key] = torch.zeros((1,) * ndim, dtype=dtype, device=device)
    return _placeholders[key]

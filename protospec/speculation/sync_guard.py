"""A guard that turns any host synchronisation into an error (invariant 2 of the GPU path).

On CUDA it is torch's own sync debug mode. On the CPU there is no device to wait for, so it
forbids the calls that would sync on a GPU: reading values into Python (.item(), .tolist(),
.cpu(), bool()/int()/float() of a tensor) and data-dependent shapes (.nonzero()).
"""
from __future__ import annotations

import contextlib

import torch


class HostSyncError(RuntimeError):
    """A host synchronisation happened where the draft loop promised none."""


_SYNCING_METHODS = ("item", "tolist", "cpu", "nonzero", "__bool__", "__int__", "__float__")


@contextlib.contextmanager
def forbid_host_sync(device: torch.device):
    if device.type == "cuda":
        previous = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("error")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(previous)
        return
    originals = {name: getattr(torch.Tensor, name) for name in _SYNCING_METHODS}

    def tripwire(name):
        def call(self, *args, **kwargs):
            raise HostSyncError(f"Tensor.{name}() inside a no-sync region")
        return call

    try:
        for name in _SYNCING_METHODS:
            setattr(torch.Tensor, name, tripwire(name))
        yield
    finally:
        for name, fn in originals.items():
            setattr(torch.Tensor, name, fn)

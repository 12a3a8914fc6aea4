"""Which kernels an engine runs: resolved once, when the engine is built, from its EngineConfig and its
device, and passed to the forwards that use them. Immutable, so two engines in one process can differ
and a result can say exactly which kernels produced it (`as_record()` goes into every result JSON)."""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class KernelPlan:
    # Decode-shaped forwards (draft steps, verify, target decode) on the Numba layer kernels
    # (model/layer_kernels.py) rather than torch's ~20 kernels a layer.
    layer_kernels: bool
    # The layer kernels' linears: one of layout.LINEAR_KERNELS ("cublas" without the layer kernels).
    linear_kernel: str
    # The tensor-core GEMVs, and the kernels after them, as programmatic dependents (sm_90 and later).
    dependent_launch: bool
    # A prefill at batch 1 (a uniform chunk past the decode shapes) on the layer kernels with cuBLAS
    # linears too, not the torch path.
    prefill_kernels: bool
    # Each draft step's softmax and sample, and the verify's softmax, as the sliced Numba kernels.
    fused_sampling: bool
    # The rejection sampler as one Numba kernel rather than ~25 torch ops.
    fused_rejection: bool
    # Fixed-shape forwards replayed as CUDA graphs, and uniform prefill layouts that repeat.
    cuda_graphs: bool

    def as_record(self) -> dict:
        return asdict(self)

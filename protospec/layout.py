"""Conventions every layer shares, kernels included: the paged KV cache's special values and the
layout of a spec step's outcome. Kept below everything that uses them, so the Numba kernels (the
lowest layer) import nothing from the model or the spec step.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

NULL_BLOCK = 0              # block 0 is never handed out: block tables are padded with it
PAD_SLOT_ID = -1            # a token with this slot writes no K/V (padding rows of a fixed-shape batch)
PLACEHOLDER_TOKEN_ID = -1   # an empty position of a spec step's output ids
# The layer kernels' linear layers: torch's (cuBLAS), or "mma_fused": the tensor-core GEMV
# (kernels/linear/gemv_mma.py) wherever it applies (float16, at most layer_kernels.TENSOR_CORE_MAX_ROWS
# token rows, K a multiple of 192), with each RMSNorm and residual add, RoPE with the cache store and
# SiLU x up folded into the GEMVs (5 kernels a decoder layer instead of 9; past
# layer_kernels.MLP_FUSED_MAX_ROWS rows the MLP's two on cuBLAS); cuBLAS elsewhere.
LINEAR_KERNELS = ("cublas", "mma_fused")


@dataclass
class RejectionOutput:
    """What an acceptance rule (speculation/acceptance.py, or the rejection kernel) returns for a batch."""

    output_token_ids: torch.Tensor  # [B, k + 1] int64, PLACEHOLDER_TOKEN_ID after the last emitted
    num_accepted: torch.Tensor      # [B] int64, accepted draft tokens (0..k)
    accepted_mask: torch.Tensor     # [B, k] bool, per position (False after the first rejection)
    passed_mask: torch.Tensor       # [B, k] bool, each draft token's own test u < p/q, also after a
                                    # rejection (those are discarded): what vLLM's acceptance rate counts
    # [B, k + 3] int64 or None: per row the output ids, the accepted and the passed counts, as the
    # commit reads them (the rejection kernel writes it; step_graph.commit_row builds it otherwise)
    commit_columns: torch.Tensor | None = None
    # [B * (k + 3) + 1] int64 or None: commit_columns flat, then the error flag of the step's
    # device-built inputs (the rejection kernel copies it in, where it was given the flag)
    commit_flagged: torch.Tensor | None = None

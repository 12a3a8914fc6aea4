"""The tensor-core GEMV's forms for gpu_typecheck (and the tools built on it: gpu_registers,
gpu_wait_order): every variant the engine launches, on CPU tensors of the shapes that matter (the
typer needs only types and literal sizes)."""
from __future__ import annotations

from dataclasses import replace

import torch


def tensor_core_gemv_forms() -> None:
    from protospec.kernels.linear.gemv_mma import RopeCache, gemv_mma

    half = torch.float16
    for k in (768, 3072):  # 4 and 16 warps a block
        x, w = torch.zeros(6, k, dtype=half), torch.zeros(40, k, dtype=half)
        gemv_mma(x, w)
        gemv_mma(x, w, norm_weight=x[0].clone(), residual=x.clone(), glu=True)
    h = torch.zeros(8, 768, dtype=half)
    ids, qkv_w = torch.zeros(6, dtype=torch.int64), torch.zeros(5 * 64, 768, dtype=half)
    rope = RopeCache(ids, torch.zeros(16, 64, dtype=half), torch.zeros(16, 64, dtype=half),
                     torch.zeros(2, 4, 16, 1, 64, dtype=half), ids, 3)
    unaligned = torch.zeros(40 * 768 + 4, dtype=half)[4:].view(40, 768)  # 8-byte aligned only: one word a load
    for dependent in (False, True):
        gemv_mma(h, qkv_w, norm_weight=h[0].clone(), x_rows=ids, rope=rope, dependent_launch=dependent)  # layer 0's qkv
        gemv_mma(h[:6], qkv_w, norm_weight=h[0].clone(), residual=h[:6].clone(),  # the later layers' qkv
                 rope=replace(rope, inputs_before_wait=True), dependent_launch=dependent)
        gemv_mma(h[:6], torch.zeros(40, 768, dtype=half), dependent_launch=dependent, allow_early=dependent)  # o
        gemv_mma(h[:6], torch.zeros(40, 768, dtype=half), norm_weight=h[0].clone(), residual=h[:6].clone(),
                 glu=True, dependent_launch=dependent, allow_early=dependent)  # gate/up
        gemv_mma(torch.zeros(6, 3072, dtype=half), torch.zeros(40, 3072, dtype=half),  # down
                 dependent_launch=dependent, allow_early=dependent)
        _, squares = gemv_mma(torch.zeros(6, 3072, dtype=half), torch.zeros(768, 3072, dtype=half),  # the last down
                              dependent_launch=dependent, allow_early=dependent,
                              residual_squares=torch.zeros(6, 768, dtype=half))
        gemv_mma(torch.zeros(6, 768, dtype=half), torch.zeros(40, 768, dtype=half), x_rows=ids,  # the folded LM head
                 out_dtype=torch.float32, dependent_launch=dependent, row_squares=squares)
        gemv_mma(h[:6], torch.zeros(40, 768, dtype=half), dependent_launch=dependent)  # a plain one (mma_fused where the shapes do not fuse)
        gemv_mma(h[:6], torch.zeros(40, 768, dtype=half), out_dtype=torch.float32, dependent_launch=dependent)
        gemv_mma(h[:6], unaligned, dependent_launch=dependent)

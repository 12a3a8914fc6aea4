"""The tensor-core GEMV's forms for gpu_typecheck (and the tools built on it: gpu_registers,
gpu_wait_order): every variant the engine and the kernel-form flags can launch, on CPU tensors of the
shapes that matter (the typer needs only types and literal sizes)."""
from __future__ import annotations

import torch


def tensor_core_gemv_forms() -> None:
    from protospec.kernels.gemv_mma import gemv_mma
    for k in (768, 3072):  # 4 and 16 warps a block
        x, w = torch.zeros(6, k, dtype=torch.float16), torch.zeros(40, k, dtype=torch.float16)
        gemv_mma(x, w)
        gemv_mma(x, w, norm_weight=x[0].clone(), residual=x.clone(), glu=True)  # a layer's gate/up
    from protospec.kernels.gemv_mma import RopeCache
    h = torch.zeros(8, 768, dtype=torch.float16)
    ids, qkv_w = torch.zeros(6, dtype=torch.int64), torch.zeros(5 * 64, 768, dtype=torch.float16)
    rope = RopeCache(ids, torch.zeros(16, 64, dtype=torch.float16), torch.zeros(16, 64, dtype=torch.float16),
                     torch.zeros(2, 4, 16, 1, 64, dtype=torch.float16), ids, 3)
    gemv_mma(h, qkv_w, norm_weight=h[0].clone(), x_rows=ids, rope=rope)       # the first layer's qkv (embedding rows)
    gemv_mma(h[:6], qkv_w, norm_weight=h[0].clone(), residual=h[:6].clone(), rope=rope)  # the others'
    gemv_mma(h, torch.zeros(40, 768, dtype=torch.float16), norm_weight=h[0].clone(), residual=h.clone(),
             x_rows=ids, out_dtype=torch.float32)                             # the LM head over the wanted rows
    gemv_mma(h[:6], qkv_w, norm_weight=h[0].clone(), residual=h[:6].clone(), rope=rope, dependent_launch=True)
    from dataclasses import replace
    for dependent in (False, True):  # the later layers' qkv: the RoPE inputs before the wait (--rope-inputs-early)
        gemv_mma(h[:6], qkv_w, norm_weight=h[0].clone(), residual=h[:6].clone(),
                 rope=replace(rope, inputs_before_wait=True), dependent_launch=dependent)
    gemv_mma(h[:6], torch.zeros(40, 768, dtype=torch.float16), dependent_launch=True)
    from protospec.kernels.gemv_mma import head_norm
    for dependent in (False, True):  # the final norm as a kernel of its own (--head-norm separate)
        head_norm(h, h.clone(), h[0].clone(), 1e-6, ids, dependent_launch=dependent)
    gemv_mma(h[:6], torch.zeros(40, 768, dtype=torch.float16), out_dtype=torch.float32, dependent_launch=True)
    from protospec.kernels.gemv_mma import TailNorm
    for dependent in (False, True):  # the last down projection running the final norm (--head-norm tail)
        gemv_mma(torch.zeros(6, 3072, dtype=torch.float16), torch.zeros(768, 3072, dtype=torch.float16),
                 dependent_launch=dependent, allow_early=dependent,
                 tail_norm=TailNorm(h[0].clone(), torch.zeros(6, 768, dtype=torch.float16), 1e-6, ids))
    for dependent in (False, True):  # the last down projection's sums of squares, the LM head's norm from them
        _, squares = gemv_mma(torch.zeros(6, 3072, dtype=torch.float16), torch.zeros(768, 3072, dtype=torch.float16),
                              dependent_launch=dependent, allow_early=dependent,
                              residual_squares=torch.zeros(6, 768, dtype=torch.float16))  # (--head-norm squares)
        gemv_mma(torch.zeros(6, 768, dtype=torch.float16), torch.zeros(40, 768, dtype=torch.float16),
                 norm_weight=h[0].clone(), x_rows=ids, out_dtype=torch.float32, dependent_launch=dependent,
                 row_squares=squares)
        gemv_mma(torch.zeros(6, 768, dtype=torch.float16), torch.zeros(40, 768, dtype=torch.float16), x_rows=ids,
                 out_dtype=torch.float32, dependent_launch=dependent, row_squares=squares)  # (--head-norm folded)
    for splits in (2, 4):  # the down projection's split K (--down-k-splits)
        gemv_mma(torch.zeros(6, 3072, dtype=torch.float16), torch.zeros(40, 3072, dtype=torch.float16),
                 dependent_launch=True, k_splits=splits)
    gemv_mma(h[:6], torch.zeros(40, 768, dtype=torch.float16), dependent_launch=True, allow_early=True)  # o, down
    gemv_mma(h[:6], torch.zeros(40, 768, dtype=torch.float16), norm_weight=h[0].clone(), residual=h[:6].clone(),
             glu=True, dependent_launch=True, allow_early=True)               # gate/up (--gemv-early-allow)
    from protospec.kernels import gemv_mma as linears
    chosen = linears.PREFETCH_NORM
    try:  # the normed forms with the norm weight loaded after and before the wait: qkv, gate/up, the LM head
        for linears.PREFETCH_NORM in (False, True):
            gemv_mma(h, qkv_w, norm_weight=h[0].clone(), x_rows=ids, rope=rope, dependent_launch=True)
            gemv_mma(h[:6], qkv_w, norm_weight=h[0].clone(), residual=h[:6].clone(), rope=rope, dependent_launch=True)
            gemv_mma(h[:6], torch.zeros(40, 768, dtype=torch.float16), norm_weight=h[0].clone(),
                     residual=h[:6].clone(), glu=True, dependent_launch=True)
            gemv_mma(h, torch.zeros(40, 768, dtype=torch.float16), norm_weight=h[0].clone(), residual=h.clone(),
                     x_rows=ids, out_dtype=torch.float32, dependent_launch=True)
            for dependent in (False, True):  # the LM head writing its tiles' statistics (--logit-stats)
                gemv_mma(h, torch.zeros(40, 768, dtype=torch.float16), norm_weight=h[0].clone(), residual=h.clone(),
                         x_rows=ids, out_dtype=torch.float32, dependent_launch=dependent, logit_stats=True)
            for registers in (128, 96):  # the LM head's register caps (--lm-head-max-registers)
                gemv_mma(h, torch.zeros(40, 768, dtype=torch.float16), norm_weight=h[0].clone(), residual=h.clone(),
                         x_rows=ids, out_dtype=torch.float32, dependent_launch=True, max_registers=registers)
    finally:
        linears.PREFETCH_NORM = chosen
    chosen = linears.PIN_WEIGHT_LOADS
    try:  # the dependent forms with their wait kept below the weight loads and not (--pin-weight-loads)
        linears.PIN_WEIGHT_LOADS = not chosen
        gemv_mma(h, qkv_w, norm_weight=h[0].clone(), x_rows=ids, rope=rope, dependent_launch=True)
        gemv_mma(h[:6], qkv_w, norm_weight=h[0].clone(), residual=h[:6].clone(), rope=rope, dependent_launch=True)
        gemv_mma(h[:6], torch.zeros(40, 768, dtype=torch.float16), norm_weight=h[0].clone(),
                 residual=h[:6].clone(), glu=True, dependent_launch=True)
        gemv_mma(h[:6], torch.zeros(40, 768, dtype=torch.float16), dependent_launch=True)
        gemv_mma(h[:6], torch.zeros(40, 768, dtype=torch.float16), out_dtype=torch.float32, dependent_launch=True)
        gemv_mma(torch.zeros(6, 3072, dtype=torch.float16), torch.zeros(40, 3072, dtype=torch.float16),
                 dependent_launch=True)
    finally:
        linears.PIN_WEIGHT_LOADS = chosen
    chosen = linears.WIDE_WEIGHT_LOADS
    try:  # the weights' words loaded one and two at a time (--wide-weight-loads): qkv, o, gate/up, down, LM heads
        linears.WIDE_WEIGHT_LOADS = not chosen
        gemv_mma(h, qkv_w, norm_weight=h[0].clone(), x_rows=ids, rope=rope, dependent_launch=True)
        gemv_mma(h[:6], qkv_w, norm_weight=h[0].clone(), residual=h[:6].clone(), rope=rope, dependent_launch=True)
        for early in (False, True):
            gemv_mma(h[:6], torch.zeros(40, 768, dtype=torch.float16), norm_weight=h[0].clone(),
                     residual=h[:6].clone(), glu=True, dependent_launch=True, allow_early=early)
        gemv_mma(h[:6], torch.zeros(40, 768, dtype=torch.float16), dependent_launch=True, allow_early=True)
        gemv_mma(h[:6], torch.zeros(40, 768, dtype=torch.float16), out_dtype=torch.float32, dependent_launch=True)
        gemv_mma(torch.zeros(6, 3072, dtype=torch.float16), torch.zeros(40, 3072, dtype=torch.float16),
                 dependent_launch=True, allow_early=True)
        gemv_mma(torch.zeros(6, 3072, dtype=torch.float16), torch.zeros(768, 3072, dtype=torch.float16),
                 dependent_launch=True, allow_early=True, tail_norm=TailNorm(h[0].clone(),
                                                                             torch.zeros(6, 768, dtype=torch.float16),
                                                                             1e-6, ids))
    finally:
        linears.WIDE_WEIGHT_LOADS = chosen

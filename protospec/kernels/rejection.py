"""The rejection sampler as one Numba kernel: one block per sequence.

protospec.spec.rejection.rejection_sample is the reference: ~25 small torch ops (gathers, cumprod, the
residual, two exponential races, the output layout). On a GPU each op costs the host a launch
that takes longer than the device needs for the op, so the device waits for the host. This kernel does the same work in one launch and computes the very same float32 values
(u * q < p, max(0, p - q) / noise, p / noise, argmax ties to the lowest index), so both give
identical tokens; tests check that in the simulator and on the GPU.

Per sequence (block) b, with k draft tokens and vocab V:
    thread 0: passed[i] = u[i] * q[i, d_i] < p[i, d_i];  n = first i that failed (k if none)
    all threads: if n < k, the recovered token = argmax_v w[v] / noise[n, v] with w = max(0, p_n - q_n)
                 (or p_n when that is all zero); else the bonus token = argmax_v p_k[v] / bonus_noise[v]
    thread 0: out = d_1..d_n, the recovered or bonus token, then -1 (PLACEHOLDER_TOKEN_ID)
"""
from __future__ import annotations

import torch
from numba import float32, int64

from protospec.kernels import interop
from protospec.kernels.interop import check_tensor, cuda
from protospec.kernels.reductions import tree_argmax
from protospec.layout import PLACEHOLDER_TOKEN_ID, RejectionOutput

# Threads per block (a power of two, for the tree reduction). Each thread strides over the vocab,
# so at batch 1 (one block) the block's width is the parallelism: 512 on a GPU; the simulator runs
# a Python thread per CUDA thread, so it gets a narrow block.
THREADS = 32 if interop.SIMULATOR else 512


@cuda.jit
def rejection_sample_kernel(draft_ids, draft_probs, target_probs, uniforms, recovered_noise, bonus_noise,
                            num_proposed, out_ids, num_accepted, accepted_mask, passed_mask):
    """
    draft_ids       [B, k] int64          draft_probs    [B, k, V] float32
    target_probs    [B, k + 1, V] float32 uniforms       [B, k] float32
    recovered_noise [B, k, V] float32     bonus_noise    [B, V] float32   (Exp(1), > 0)
    num_proposed    [B] int64: positions past it are not tested (their draft_probs rows are zero)
    out_ids         [B, k + 1] int64 out  num_accepted   [B] int64 out
    accepted_mask   [B, k] uint8 out      passed_mask    [B, k] uint8 out
    """
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    k = draft_ids.shape[1]
    vocab = target_probs.shape[2]
    best_value = cuda.shared.array(THREADS, float32)
    best_index = cuda.shared.array(THREADS, int64)
    any_mass = cuda.shared.array(THREADS, int64)
    first_reject = cuda.shared.array(1, int64)
    zero = float32(0.0)

    if tid == 0:
        n = k
        proposed = num_proposed[row]
        for i in range(k):
            d = draft_ids[row, i]
            passed = i < proposed and uniforms[row, i] * draft_probs[row, i, d] < target_probs[row, i, d]
            passed_mask[row, i] = 1 if passed else 0
            if not passed and n == k:
                n = i
        for i in range(k):
            accepted_mask[row, i] = 1 if i < n else 0
        num_accepted[row] = n
        first_reject[0] = n
    cuda.syncthreads()
    n = first_reject[0]

    # Pass 1: the race over max(0, p - q) (n < k) or over p_k (the bonus, n == k).
    value, index, mass = float32(-1.0), int64(vocab), int64(0)
    for v in range(tid, vocab, THREADS):
        if n < k:
            w = target_probs[row, n, v] - draft_probs[row, n, v]
            if w < zero:
                w = zero
            if w > zero:
                mass = 1
            score = w / recovered_noise[row, n, v]
        else:
            score = target_probs[row, k, v] / bonus_noise[row, v]
        if score > value:
            value, index = score, v
    best_value[tid], best_index[tid], any_mass[tid] = value, index, mass
    cuda.syncthreads()
    tree_argmax(best_value, best_index, any_mass, tid, THREADS)

    # Pass 2, only if the residual was all zero (p == q at n): race over p_n itself.
    if n < k and any_mass[0] == 0:
        cuda.syncthreads()
        value, index = float32(-1.0), int64(vocab)
        for v in range(tid, vocab, THREADS):
            score = target_probs[row, n, v] / recovered_noise[row, n, v]
            if score > value:
                value, index = score, v
        best_value[tid], best_index[tid] = value, index
        cuda.syncthreads()
        tree_argmax(best_value, best_index, any_mass, tid, THREADS)

    if tid == 0:
        for i in range(k + 1):
            if i < n:
                out_ids[row, i] = draft_ids[row, i]
            elif i == n:
                out_ids[row, i] = best_index[0]
            else:
                out_ids[row, i] = PLACEHOLDER_TOKEN_ID


_all_proposed: dict[tuple, torch.Tensor] = {}  # (batch, k, device) -> [B] int64 filled with k, never written


def rejection_sample_fused(draft_token_ids, draft_probs, target_probs, uniforms, recovered_noise,
                           bonus_noise, num_proposed=None) -> RejectionOutput:
    """Same arguments and result as protospec.spec.rejection.rejection_sample, in one kernel launch."""
    batch, k = draft_token_ids.shape
    vocab = target_probs.shape[-1]
    # Slices of the spec step's noise block are contiguous at batch 1; copy them otherwise.
    recovered_noise, bonus_noise = recovered_noise.contiguous(), bonus_noise.contiguous()
    for name, t, dtype, ndim in (("draft_token_ids", draft_token_ids, torch.int64, 2),
                                 ("draft_probs", draft_probs, torch.float32, 3),
                                 ("target_probs", target_probs, torch.float32, 3),
                                 ("uniforms", uniforms, torch.float32, 2),
                                 ("recovered_noise", recovered_noise, torch.float32, 3),
                                 ("bonus_noise", bonus_noise, torch.float32, 2)):
        check_tensor(name, t, dtype, ndim, rows=batch)
    if draft_probs.shape != (batch, k, vocab) or target_probs.shape != (batch, k + 1, vocab) \
            or recovered_noise.shape != (batch, k, vocab) or bonus_noise.shape != (batch, vocab) or uniforms.shape != (batch, k):
        raise interop.KernelArgumentError(
            f"rejection_sample_fused: shapes do not fit B={batch}, k={k}, V={vocab}: draft_probs {tuple(draft_probs.shape)}, "
            f"target_probs {tuple(target_probs.shape)}, uniforms {tuple(uniforms.shape)}, "
            f"recovered_noise {tuple(recovered_noise.shape)}, bonus_noise {tuple(bonus_noise.shape)}")
    device = draft_token_ids.device
    if num_proposed is None:
        key = (batch, k, device)
        if key not in _all_proposed:
            _all_proposed[key] = torch.full((batch,), k, dtype=torch.int64, device=device)
        num_proposed = _all_proposed[key]
    check_tensor("num_proposed", num_proposed, torch.int64, 1, rows=batch)
    out_ids = torch.empty(batch, k + 1, dtype=torch.int64, device=device)
    num_accepted = torch.empty(batch, dtype=torch.int64, device=device)
    masks = torch.empty(2, batch, k, dtype=torch.uint8, device=device)  # accepted, passed
    args = [draft_token_ids, draft_probs, target_probs, uniforms, recovered_noise, bonus_noise, num_proposed,
            out_ids, num_accepted, masks[0], masks[1]]
    interop.launch_tensors(rejection_sample_kernel, batch, THREADS, args)
    masks = masks.bool()
    return RejectionOutput(out_ids, num_accepted, masks[0], masks[1])

"""Probabilities and the exponential-race sample of a row of logits, in one Numba kernel.

sampler.py's torch path runs, per draft step: logits / temperature, softmax, probs / noise, argmax,
then two copies into the spec step's buffers (six kernels, six host launches); per verify, the
first two. Here one block per row does it all and writes straight into those buffers:
  pass 1  the max logit and its first index (torch.argmax's tie rule)
  greedy  one-hot probabilities at that index, which is also the sample
  else    pass 2: sum of exp(x/T - max/T); pass 3: p = exp(x/T - max/T) / sum, written, and the
          sample = argmax p / noise (noise ~ Exp(1), drawn by SpecStepRandoms as before)
The same float32 formula as the torch path; only the order of the softmax's sum differs, so
probabilities agree to an ulp or so (tests bound it) and ids agree unless two scores tie to that
precision. Rows with top-k / top-p filtering keep the torch path.

`python -m protospec.bench.layer_kernel_cost` times it against torch (figures in
data/results/README.md): slower at batch 1, because one block per row leaves a batch-1 row on one SM,
and each pass over the vocabulary waits on it; torch spreads its elementwise kernels over the GPU. So the engine keeps the
torch path unless EngineConfig.fused_sampling asks for this one. What would make it win: split the
vocabulary over blocks (partial max / sum / race per block, then a combine that writes the probs).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from numba import float32, int64

from protospec.errors import KernelArgumentError
from protospec.kernels import interop
from protospec.kernels.interop import check_tensor, cuda
from protospec.kernels.reductions import tree_argmax, tree_sum

if TYPE_CHECKING:
    from protospec.spec.sampler import SamplingTensors

THREADS = 32 if interop.SIMULATOR else 1024  # one block per row: at batch 1 its width is the parallelism


@cuda.jit
def probs_and_sample_kernel(logits, temperature, is_greedy, rows_per_seq, probs_out, out_step, do_sample, noise,
                            ids_out, mirror, use_mirror):
    """
    logits [R, V] f32            temperature [B] f32 (1.0 on greedy rows)   is_greedy [B] bool
    rows_per_seq: row r belongs to sequence r // rows_per_seq
    probs_out [R, S, V] f32: row r's probabilities go to probs_out[r, out_step]
    do_sample: 1 = also sample (noise [R, S, V] f32 Exp(1), read at [r, out_step]; the id goes to
    ids_out [R, S] int64 at [r, out_step], and to mirror [>= R] int64 at [r] when use_mirror)
    """
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    vocab = logits.shape[1]
    seq = row // rows_per_seq
    best_value = cuda.shared.array(THREADS, float32)
    best_index = cuda.shared.array(THREADS, int64)
    no_flags = cuda.shared.array(THREADS, int64)  # tree_argmax's OR, unused here
    no_flags[tid] = 0

    value, index = float32(-math.inf), int64(vocab)
    for v in range(tid, vocab, THREADS):
        x = logits[row, v]
        if x > value:
            value, index = x, v
    best_value[tid], best_index[tid] = value, index
    cuda.syncthreads()
    tree_argmax(best_value, best_index, no_flags, tid, THREADS)
    top, chosen = best_value[0], best_index[0]
    cuda.syncthreads()

    if is_greedy[seq]:
        for v in range(tid, vocab, THREADS):
            probs_out[row, out_step, v] = float32(1.0) if v == chosen else float32(0.0)
    else:
        t = temperature[seq]
        shift = top / t
        total = float32(0.0)
        for v in range(tid, vocab, THREADS):
            total += math.exp(logits[row, v] / t - shift)
        best_value[tid] = total
        cuda.syncthreads()
        tree_sum(best_value, tid, THREADS)
        total = best_value[0]
        cuda.syncthreads()
        value, index = float32(-1.0), int64(vocab)
        for v in range(tid, vocab, THREADS):
            p = math.exp(logits[row, v] / t - shift) / total
            probs_out[row, out_step, v] = p
            if do_sample:
                score = p / noise[row, out_step, v]
                if score > value:
                    value, index = score, v
        if do_sample:
            best_value[tid], best_index[tid] = value, index
            cuda.syncthreads()
            tree_argmax(best_value, best_index, no_flags, tid, THREADS)
            chosen = best_index[0]
    if do_sample and tid == 0:
        ids_out[row, out_step] = chosen
        if use_mirror:
            mirror[row] = chosen


def fused_applies(st: SamplingTensors) -> bool:
    """Filtering (top-k / top-p) needs a sort: those batches keep the torch path."""
    return not st.needs_filter


def probs_into(logits: torch.Tensor, st: SamplingTensors, out: torch.Tensor, rows_per_seq: int = 1) -> torch.Tensor:
    """compute_probs, written into `out` [R, V] (contiguous): the verify's target probabilities."""
    _launch(logits, st, rows_per_seq, out.view(out.shape[0], 1, out.shape[1]), 0, None, None, None)
    return out


def sample_into(logits: torch.Tensor, st: SamplingTensors, step: int, draft_probs: torch.Tensor, draft_ids: torch.Tensor,
                noise: torch.Tensor | None, mirror: torch.Tensor | None = None) -> None:
    """One draft step's sample: probabilities into draft_probs[:, step] ([B, k, V]), ids into
    draft_ids[:, step] ([B, k]) and mirror[:B] (the buffer advance_step reads). noise: [B, k, V]
    Exp(1), read at [:, step]; None when every row is greedy."""
    _launch(logits, st, 1, draft_probs, step, noise, draft_ids, mirror)


def _launch(logits, st, rows_per_seq, probs_out, step, noise, ids_out, mirror) -> None:
    rows = logits.shape[0]
    check_tensor("logits", logits, torch.float32, 2)
    check_tensor("probs_out", probs_out, torch.float32, 3, rows=rows)
    if probs_out.shape[2] != logits.shape[1]:
        raise KernelArgumentError(f"probs_out {tuple(probs_out.shape)} does not fit logits {tuple(logits.shape)}")
    do_sample = ids_out is not None
    if do_sample:
        check_tensor("draft_ids", ids_out, torch.int64, 2, rows=rows)
        if noise is not None:
            check_tensor("noise", noise, torch.float32, 3, rows=rows)
        elif not st.all_greedy:
            raise KernelArgumentError("noise: None, but some rows sample with a temperature")
        if mirror is not None:
            check_tensor("mirror", mirror, torch.int64, 1)
    # Placeholders for arguments the kernel will not touch. Never an alias of a real argument: the
    # simulator copies each array argument in and back out, and a second copy would win.
    noise = noise if noise is not None else _placeholder(torch.float32, 3, logits.device)
    ids_out = ids_out if ids_out is not None else _placeholder(torch.int64, 2, logits.device)
    mirror_arg = mirror if mirror is not None else _placeholder(torch.int64, 1, logits.device)
    interop.launch_tensors(probs_and_sample_kernel, rows, THREADS,
                           [logits, st.temperature, st.is_greedy, int(rows_per_seq), probs_out, int(step), int(do_sample),
                            noise, ids_out, mirror_arg, int(mirror is not None)])


_placeholders: dict[tuple, torch.Tensor] = {}


def _placeholder(dtype: torch.dtype, ndim: int, device: torch.device) -> torch.Tensor:
    key = (dtype, ndim, str(device))
    if key not in _placeholders:
        _placeholders[key] = torch.zeros((1,) * ndim, dtype=dtype, device=device)
    return _placeholders[key]

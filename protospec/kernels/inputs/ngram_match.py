"""N-gram (prompt-lookup) proposals on the device: one block per sequence, over its token history.

For a sequence of L tokens h[0..L-1], try n = n_max .. n_min: find the most recent earlier window
h[e-n+1..e] (e < L-1) equal to the last n tokens h[L-n..L-1]; the first n with a match proposes the
tokens that followed it, h[e+1 .. min(e+k, L-1)] (at most k; fewer when the match ends near the end).
No match proposes nothing (num_proposed 0) and the spec step is target-only for that row.

Each thread tests candidate ends e strided over the block; a shared-memory max finds the most recent.
The draft "distribution" of a proposal is one-hot (the lossless rejection sampler then keeps a token
with the target's probability of it): the kernel writes draft_probs too, one-hot rows for the proposed
positions and zero rows past them (what rejection.py expects of positions that were not proposed).
`propose` is the CPU twin: the same rule on a Python list.
"""
from __future__ import annotations

import torch
from numba import int64

from protospec.errors import KernelArgumentError
from protospec.kernels.launch import interop
from protospec.kernels.launch.interop import check_tensor, cuda

THREADS = 8 if interop.SIMULATOR else 256  # the simulator runs an OS thread per CUDA thread


def propose(tokens: list[int], k: int, n_min: int, n_max: int) -> list[int]:
    """The CPU twin: up to k tokens that followed the most recent earlier occurrence of the longest
    suffix of length n_max .. n_min that occurred before."""
    length = len(tokens)
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        suffix = tokens[length - n:]
        for end in range(length - 2, n - 2, -1):  # the window tokens[end - n + 1 .. end], most recent first
            if tokens[end - n + 1: end + 1] == suffix:
                return tokens[end + 1: min(end + k, length - 1) + 1]
    return []


@cuda.jit
def ngram_match_kernel(history, lengths, n_min, n_max, draft_ids, draft_probs, num_proposed):
    """
    history     [B, C] int64: row b's tokens in [0, lengths[b])      lengths [B] int64
    draft_ids   [B, k] int64 out (0 past the proposals)               num_proposed [B] int64 out
    draft_probs [B, k, V] float32 out: one-hot rows for proposals, zero rows past them
    """
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    k = draft_ids.shape[1]
    vocab = draft_probs.shape[2]
    best = cuda.shared.array(THREADS, int64)
    found = cuda.shared.array(1, int64)
    length = lengths[row]
    if tid == 0:
        found[0] = -1
    cuda.syncthreads()
    n = min(n_max, length - 1)
    while n >= n_min:  # the same n for every thread: found[0] is read after a barrier
        mine = int64(-1)
        for end in range(n - 1 + tid, length - 1, THREADS):
            same = True
            for i in range(n):
                if history[row, end - i] != history[row, length - 1 - i]:
                    same = False
                    break
            if same and end > mine:
                mine = end
        best[tid] = mine
        cuda.syncthreads()
        if tid == 0:
            top = int64(-1)
            for t in range(THREADS):
                top = max(top, best[t])
            found[0] = top
        cuda.syncthreads()
        if found[0] >= 0:
            break
        cuda.syncthreads()  # everyone has read found[0] before the next n writes best[]
        n -= 1
    end = found[0]
    count = min(k, length - 1 - end) if end >= 0 else 0
    if tid == 0:
        num_proposed[row] = count
    for i in range(tid, k, THREADS):
        draft_ids[row, i] = history[row, end + 1 + i] if i < count else 0
    for i in range(k):
        token = history[row, end + 1 + i] if i < count else -1
        for v in range(tid, vocab, THREADS):
            draft_probs[row, i, v] = 1.0 if v == token else 0.0


def ngram_match(history: torch.Tensor, lengths: torch.Tensor, n_min: int, n_max: int, draft_ids: torch.Tensor,
                draft_probs: torch.Tensor, num_proposed: torch.Tensor) -> None:
    """Fill draft_ids [B, k], draft_probs [B, k, V] and num_proposed [B] from the first B rows of history."""
    batch = draft_ids.shape[0]
    check_tensor("history", history, torch.int64, 2)
    check_tensor("lengths", lengths, torch.int64, 1, rows=batch)
    check_tensor("draft_ids", draft_ids, torch.int64, 2, rows=batch)
    check_tensor("draft_probs", draft_probs, torch.float32, 3, rows=batch)
    check_tensor("num_proposed", num_proposed, torch.int64, 1, rows=batch)
    if history.shape[0] < batch or not 1 <= n_min <= n_max:
        raise KernelArgumentError(f"ngram_match: {history.shape[0]} history rows for a batch of {batch}, "
                                  f"n_min {n_min}, n_max {n_max} (need 1 <= n_min <= n_max)")
    interop.launch_tensors(ngram_match_kernel, batch, THREADS,
                           [history, lengths, int(n_min), int(n_max), draft_ids, draft_probs, num_proposed])

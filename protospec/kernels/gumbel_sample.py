"""A draft step's token in one launch: the exponential race in its Gumbel-max form.

sampling.py's race picks argmax_v p_v / E_v, p = softmax(x / T), E_v ~ Exp(1): the row's max and sum
first (the statistics launch), then p and the race (the probabilities launch). log is monotone and
log p_v = x_v / T - (M / T + log sum), one shift for the whole row, so the race's winner is also

    argmax_v  x_v / T - log E_v        (greedy rows: argmax_v x_v, torch.argmax's first index)

which needs no statistics: one launch, each row's vocabulary split over the same slices as sampling.py,
the last slice block of a row to finish combining the slices' winners (an arrival count), then the
row's next decode inputs (sampling_advance.py) as the probabilities kernel writes them. The same token
as the race unless two candidates tie to float32 rounding. The draft's probabilities (the rejection
sampler's q) still come from sampling.py's kernels, later and off the draft loop's chain of kernels,
from the copy of the logits this kernel leaves in their buffer (spec/probs_branch.py).
"""
from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import torch
from numba import float32, int32, int64

from protospec.errors import KernelArgumentError
from protospec.kernels import dependent_launch, interop
from protospec.kernels.dependent_launch import allow_dependent_launch, wait_after_issued_loads
from protospec.kernels.interop import check_tensor, cuda
from protospec.kernels.paged_attention import arrival_counters
from protospec.kernels.reductions import better
from protospec.kernels.sampling_advance import finish_row, loads_for_advance
from protospec.kernels.sampling_buffers import mirror_span, no_advance, placeholder
from protospec.kernels.sampling_slices import PER_THREAD, THREADS, VOCAB_PER_BLOCK, slice_winner

if TYPE_CHECKING:
    from protospec.kernels.advance_step import AdvanceStepLauncher
    from protospec.spec.sampler import SamplingTensors


@functools.lru_cache(maxsize=None)
def _kernel(DEPENDENT: bool):  # noqa: N803 (Numba freezes it as a constant)
    """DEPENDENT: launched as a programmatic dependent of the LM head that wrote the logits: the
    noise (written kernels before it) and the advance's inputs are loaded before the wait."""

    @cuda.jit
    def gumbel_sample_kernel(logits, temperature, is_greedy, noise, out_step, logits_out, keep, win_value, win_index,
                             counters, ids_out, mirror, use_mirror, advance, num_queries, block_size, input_ids,
                             positions, seq_lens, slot_mapping, block_tables, error_row):
        """
        logits [R, V] f32; temperature [R] f32; is_greedy [R] bool; noise [R, S, V] f32 Exp(1), read at
        [r, out_step] on rows that are not greedy. keep = 1: the logits also go to logits_out [R, S, V] f32
        at [r, out_step] (the probabilities' pass reads them there later). win_value [R, slices] f32,
        win_index [R, slices] int64: the slices' winners; counters [>= R] int32, zero between calls. Out: ids_out [R, S] int64 at
        [r, out_step], mirror [r * use_mirror] where use_mirror > 0. advance and what follows: as
        sampling.py's probabilities kernel.
        """
        slices = win_value.shape[1]
        row, piece = cuda.blockIdx.x // slices, cuda.blockIdx.x % slices
        tid = cuda.threadIdx.x
        vocab = logits.shape[1]
        greedy = is_greedy[row]
        lo, hi = piece * VOCAB_PER_BLOCK, min((piece + 1) * VOCAB_PER_BLOCK, vocab)
        gumbel = cuda.local.array(PER_THREAD, float32)  # -log E of entry lo + tid + j THREADS (0: greedy)
        for j in range(PER_THREAD):
            v = lo + tid + j * THREADS
            gumbel[j] = noise[row, out_step, v] if v < hi and not greedy else float32(1.0)
        loaded = loads_for_advance(advance, row, num_queries, block_size, seq_lens, block_tables)
        for j in range(PER_THREAD):  # while the LM head still runs
            gumbel[j] = -math.log(gumbel[j])
        if DEPENDENT:
            wait_after_issued_loads(slices)  # kept below the loads above in the machine code
            allow_dependent_launch()
        t = temperature[row]
        value, index = float32(-math.inf), int64(vocab)
        for j in range(PER_THREAD):  # ties (a row of -inf too) to the first entry, torch.argmax's rule
            v = lo + tid + j * THREADS
            if v < hi:
                x = logits[row, v]
                if keep:
                    logits_out[row, out_step, v] = x
                score = x if greedy else x / t + gumbel[j]
                if better(score, v, value, index):
                    value, index = score, v
        best_value = cuda.shared.array(THREADS, float32)
        best_index = cuda.shared.array(THREADS, int64)
        no_flags = cuda.shared.array(THREADS, int64)  # the argmax's OR slots (it writes them), unused here
        last = cuda.shared.array(1, int32)
        if slice_winner(row, piece, value, index, win_value, win_index, counters, best_value, best_index, no_flags,
                        last, tid):  # the row's last block: the slices' best, then the next step's inputs
            finish_row(row, vocab, False, int64(0), win_value, win_index, ids_out, out_step, mirror, use_mirror,
                       best_value, best_index, no_flags, tid, advance, loaded, block_size, input_ids, positions,
                       seq_lens, slot_mapping, error_row)

    return gumbel_sample_kernel


_winners: dict[tuple, tuple] = {}


def _winner_buffers(rows: int, slices: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The slices' winners, written and read within a call: one pair per shape, this kernel's own."""
    key = (rows, slices, str(device))
    if key not in _winners:
        _winners[key] = (torch.empty(rows, slices, dtype=torch.float32, device=device),
                         torch.empty(rows, slices, dtype=torch.int64, device=device))
    return _winners[key]


def gumbel_sample_into(logits: torch.Tensor, st: "SamplingTensors", step: int, draft_ids: torch.Tensor,
                       noise: torch.Tensor | None, mirror: torch.Tensor | None = None, dependent: bool = False,
                       advance: "AdvanceStepLauncher | None" = None, tokens_to: torch.Tensor | None = None,
                       logits_out: torch.Tensor | None = None) -> None:
    """One draft step's token (sampling.sample_into's arguments, no probabilities): ids into
    draft_ids[:, step] ([B, k] int64), mirror and tokens_to as sample_into's; noise [B, k, V] Exp(1)
    read at [:, step] (None: every row greedy); advance: the decode inputs' advance after the sample,
    written by this kernel; logits_out [B, k, V] f32: gets a copy of the logits at [:, step], or None."""
    rows, vocab = logits.shape
    check_tensor("logits", logits, torch.float32, 2)
    check_tensor("draft_ids", draft_ids, torch.int64, 2, rows=rows)
    if noise is not None:
        check_tensor("noise", noise, torch.float32, 3, rows=rows)
        if noise.shape[2] != vocab:
            raise KernelArgumentError(f"noise {tuple(noise.shape)} does not fit logits {tuple(logits.shape)}")
    elif not st.all_greedy:
        raise KernelArgumentError("noise: None, but some rows sample with a temperature")
    if advance is not None and rows > advance.num_rows:
        raise KernelArgumentError(f"gumbel_sample_into: {rows} rows to sample, but the inputs to advance hold "
                                  f"{advance.num_rows}")
    if logits_out is not None:
        check_tensor("logits_out", logits_out, torch.float32, 3, rows=rows)
        if logits_out.shape[2] != vocab:
            raise KernelArgumentError(f"logits_out {tuple(logits_out.shape)} does not fit logits {tuple(logits.shape)}")
    device = logits.device
    keep = int(logits_out is not None)
    logits_out = logits_out if logits_out is not None else placeholder(torch.float32, 3, device)  # (never written)
    noise = noise if noise is not None else placeholder(torch.float32, 3, device)  # (never read: greedy rows)
    one_mirror = tokens_to if tokens_to is not None else mirror  # the advance writes its inputs itself
    mirror_arg, mirror_stride = mirror_span(one_mirror, rows, device)
    advance_args = [int(advance is not None)] + (advance.row_args if advance is not None else no_advance(device))
    slices = -(-vocab // VOCAB_PER_BLOCK)
    win_value, win_index = _winner_buffers(rows, slices, device)
    dependent = bool(dependent) and dependent_launch.STEP_KERNELS
    interop.launch_tensors(_kernel(dependent), rows * slices, THREADS,
                           [logits, st.temperature, st.is_greedy, noise, int(step), logits_out, keep, win_value, win_index,
                            arrival_counters(device, rows, "gumbel"), draft_ids, mirror_arg, mirror_stride]
                           + advance_args, dependent=dependent)


def gumbel_reference(logits: torch.Tensor, temperature: torch.Tensor, is_greedy: torch.Tensor,
                     noise: torch.Tensor | None) -> torch.Tensor:
    """The torch twin: logits [R, V] f32, temperature [R], is_greedy [R] bool, noise [R, V] Exp(1)
    (None: all greedy) -> [R] int64."""
    if noise is None:
        return logits.argmax(-1)
    scores = logits / temperature[:, None] - noise.log()
    return torch.where(is_greedy[:, None], logits, scores).argmax(-1)

"""A draft step's token in one launch: the exponential race in its Gumbel-max form.

sampling/softmax_sample.py's race picks argmax_v p_v / E_v, p = softmax(x / T), E_v ~ Exp(1): the row's max and sum
first (the statistics launch), then p and the race (the probabilities launch). log is monotone and
log p_v = x_v / T - (M / T + log sum), one shift for the whole row, so the race's winner is also

    argmax_v  x_v / T - log E_v        (greedy rows: argmax_v x_v, torch.argmax's first index)

which needs no statistics: one launch, each row's vocabulary split over the same slices as sampling/softmax_sample.py,
each slice's winner folded into the row's packed key (sampling/packed_argmax.py: one atomic max), the last slice
block of a row to finish (an arrival count) reading the row's best from it, then writing the row's
next decode inputs (sampling/advance.py) as the probabilities kernel writes them, in one thread. The same token
as the race unless two candidates tie to float32 rounding. The draft's probabilities (the rejection
sampler's q) still come from sampling/softmax_sample.py's kernels, later and off the draft loop's chain of kernels,
from the copy of the logits this kernel leaves in their buffer (speculation/probs_branch.py).

Waits: no block waits for another (the last of a row's blocks is found by a count each passes once:
arrivals.arrived_last); as a dependent, its wait ends with the kernel before it.
"""
from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import torch
from numba import float32, int64, uint64

from protospec.errors import KernelArgumentError
from protospec.kernels.launch import interop
from protospec.kernels.inputs.advance_step import advance_stores
from protospec.kernels.launch.dependent_launch import allow_dependent_launch, wait_after_issued_loads
from protospec.kernels.launch.interop import placeholder, check_tensor, cuda
from protospec.kernels.primitives.divisions import block_row_and_part
from protospec.kernels.sampling.packed_argmax import EMPTY, argmax_key, key_index
from protospec.kernels.primitives.arrivals import arrival_counters
from protospec.kernels.primitives.reductions import better, block_argmax_or
from protospec.kernels.randoms.counter_randoms import exponential
from protospec.kernels.sampling.advance import loads_for_advance
from protospec.kernels.sampling.buffers import RowSettings, mirror_span, no_advance
from protospec.kernels.sampling.slices import PER_THREAD, THREADS, VOCAB_PER_BLOCK, span_for, span_groups

if TYPE_CHECKING:
    from protospec.kernels.inputs.advance_step import AdvanceStepLauncher


@functools.lru_cache(maxsize=None)
def _kernel(DEPENDENT: bool, SPAN: int, KEYED: bool = False):  # noqa: N803 (Numba freezes them as constants)
    """DEPENDENT: launched as a programmatic dependent of the LM head that wrote the logits: the
    noise or its keys (written kernels before it) and the advance's inputs are loaded before the wait. SPAN:
    vocabulary slices a block (slices.span_for; an argmax, so the same token at any span). KEYED: the
    noise argument is the rows' counter keys [R, 2] and the kernel draws the very numbers the counter
    fill would have written at [r, out_step] (randoms/counter_randoms.py): no fill launch before it."""
    ENTRIES = SPAN * PER_THREAD  # noqa: N806

    @cuda.jit
    def gumbel_sample_kernel(logits, temperature, is_greedy, noise, out_step, logits_out, keep, win_key, counters,
                             ids_out, mirror, use_mirror, advance, num_queries, block_size, input_ids,
                             positions, seq_lens, slot_mapping, block_tables, error_row):
        """
        logits [R, V] f32; temperature [R] f32; is_greedy [R] bool; noise [R, S, V] f32 Exp(1), read at
        [r, out_step] on rows that are not greedy (KEYED: [R, 2] int64, the rows' counter keys). keep = 1: the logits also go to logits_out [R, S, V] f32
        at [r, out_step] (the probabilities' pass reads them there later). win_key [R] int64: the row's
        best so far (sampling/packed_argmax.py), EMPTY between calls; counters [>= R] int32, zero between calls.
        Out: ids_out [R, S] int64 at
        [r, out_step], mirror [r * use_mirror] where use_mirror > 0. advance and what follows: as
        sampling/softmax_sample.py's probabilities kernel.
        """
        groups = ((logits.shape[1] + VOCAB_PER_BLOCK - 1) // VOCAB_PER_BLOCK + SPAN - 1) // SPAN
        row, group = block_row_and_part(groups)
        tid = cuda.threadIdx.x
        vocab = logits.shape[1]
        greedy = is_greedy[row]
        lo = group * SPAN * VOCAB_PER_BLOCK
        hi = min(lo + SPAN * VOCAB_PER_BLOCK, vocab)
        gumbel = cuda.local.array(ENTRIES, float32)  # -log E of entry lo + tid + j THREADS (0: greedy)
        if KEYED:
            key_lo, key_hi = uint64(noise[row, 0]), uint64(noise[row, 1])
            for j in range(ENTRIES):
                v = lo + tid + j * THREADS
                e = exponential(uint64(out_step * vocab + v), key_lo, key_hi) if v < hi and not greedy else float32(1.0)
                gumbel[j] = e
        else:
            for j in range(ENTRIES):
                v = lo + tid + j * THREADS
                gumbel[j] = noise[row, out_step, v] if v < hi and not greedy else float32(1.0)
        loaded = loads_for_advance(advance, row, num_queries, block_size, seq_lens, block_tables)
        for j in range(ENTRIES):  # while the LM head still runs
            gumbel[j] = -math.log(gumbel[j])
        if DEPENDENT:
            wait_after_issued_loads(groups)  # kept below the loads above in the machine code
            allow_dependent_launch()
        t = temperature[row]
        value, index = float32(-math.inf), int64(vocab)
        for j in range(ENTRIES):  # ties (a row of -inf too) to the first entry, torch.argmax's rule
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
        value, index, _ = block_argmax_or(value, index, int64(0), best_value, best_index, no_flags, tid, THREADS)
        if tid == 0:  # the slice's winner into the row's key; the row's last block reads the best
            cuda.atomic.max(win_key, row, argmax_key(value, index))
            cuda.threadfence()
            if cuda.atomic.add(counters, row, 1) == groups - 1:
                counters[row] = 0
                cuda.threadfence()
                chosen = key_index(cuda.atomic.exch(win_key, row, int64(EMPTY)))
                ids_out[row, out_step] = chosen
                if use_mirror > 0:
                    mirror[row * use_mirror] = chosen
                if advance:
                    real, pos, block = loaded
                    advance_stores(row, chosen, real, pos, block, block_size, input_ids, positions, seq_lens,
                                   slot_mapping, error_row)

    return gumbel_sample_kernel


_keys: dict[str, list] = {}  # device -> [int64 buffers], EMPTY between calls; the last the largest


def _key_buffer(rows: int, device: torch.device) -> torch.Tensor:
    """[>= rows] int64 of the rows' packed winners, EMPTY between calls (each row's last block resets its
    slot): one buffer serves every call and replay; a larger need makes a larger one (the old ones stay
    alive: captured graphs point at them)."""
    kept = _keys.setdefault(str(device), [])
    if not kept or kept[-1].numel() < rows:
        kept.append(torch.full((max(rows, 64),), EMPTY, dtype=torch.int64, device=device))
    return kept[-1]


def gumbel_sample_into(logits: torch.Tensor, st: RowSettings, step: int, draft_ids: torch.Tensor,
                       noise: torch.Tensor | None, mirror: torch.Tensor | None = None, dependent: bool = False,
                       advance: "AdvanceStepLauncher | None" = None, tokens_to: torch.Tensor | None = None,
                       logits_out: torch.Tensor | None = None, span: int | None = None,
                       noise_keys: torch.Tensor | None = None) -> None:
    """One draft step's token (softmax_sample.sample_into's arguments, no probabilities): ids into
    draft_ids[:, step] ([B, k] int64), mirror and tokens_to as sample_into's; noise [B, k, V] Exp(1)
    read at [:, step] (None: every row greedy, or noise_keys); noise_keys [B, 2] int64: the rows'
    counter keys, from which the kernel draws the numbers counter_randoms.fill_kernel would write into
    a [B, k, V] noise at [:, step] (one launch fewer); advance: the decode inputs' advance after the sample,
    written by this kernel; logits_out [B, k, V] f32: gets a copy of the logits at [:, step], or None;
    span: vocabulary slices a block (None: by the grid, slices.span_for)."""
    rows, vocab = logits.shape
    check_tensor("logits", logits, torch.float32, 2)
    check_tensor("draft_ids", draft_ids, torch.int64, 2, rows=rows)
    if noise is not None and noise_keys is not None:
        raise KernelArgumentError("gumbel_sample_into: noise or noise_keys, not both")
    if noise_keys is not None:
        check_tensor("noise_keys", noise_keys, torch.int64, 2, rows=rows)
        if noise_keys.shape[1] != 2:
            raise KernelArgumentError(f"noise_keys {tuple(noise_keys.shape)}: a (low, high) key pair a row")
    elif noise is not None:
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
    keyed = noise_keys is not None
    noise = noise_keys if keyed else noise if noise is not None else placeholder(torch.float32, 3, device)  # (greedy: never read)
    one_mirror = tokens_to if tokens_to is not None else mirror  # the advance writes its inputs itself
    mirror_arg, mirror_stride = mirror_span(one_mirror, rows, device)
    advance_args = [int(advance is not None)] + (advance.row_args if advance is not None else no_advance(device))
    span = span or span_for(rows, vocab, interop.sm_count(device))
    dependent = bool(dependent)
    interop.launch_tensors(_kernel(dependent, span, keyed), rows * span_groups(vocab, span), THREADS,
                           [logits, st.temperature, st.is_greedy, noise, int(step), logits_out, keep, _key_buffer(rows, device),
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

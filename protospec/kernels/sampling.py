"""Probabilities and the exponential-race sample of a row of logits, in two Numba kernels.

sampler.py's torch path runs, per draft step: logits / temperature, softmax, probs / noise, argmax, then two
copies into the spec step's buffers (six launches); per verify, the first two. Here two launches do it all, into
those buffers, a row split over blocks of VOCAB_PER_BLOCK entries (one block a row: slower than torch at batch 1):
  stats   (sampling_stats.py) each slice's max logit, its first index (torch.argmax's tie rule) and its
          sum of exp(x/T - slice max/T); the last slice block of a row to finish (an arrival count) combines
          them, a slice per thread and two tree reductions: the row's max M, its index, and
          sum = sum_s sum_s' e^(m_s/T - M/T)
  probs   greedy: one-hot at the max's index, which is also the sample; else p = exp(x/T - M/T) / sum,
          written, each slice's winner of p / noise (noise ~ Exp(1), drawn by SpecStepRandoms); the
          last slice block combines the winners into the sample
The same float32 formula as the torch path for p; only the softmax sum's order and its rescaling by
slice differ, so probabilities agree to a few ulps (tests bound it) and ids agree unless two scores tie
to that precision. Rows with top-k / top-p filtering keep the torch path. Logits the LM head wrote
with its tiles' statistics (logit_stats.py; rows at T = 1 or greedy) skip the statistics launch: one
kernel combines them in every block, then the probabilities as above. EngineConfig.fused_sampling
chooses these kernels over torch's (sampling_slices.py holds the arithmetic; one cooperative launch of it
with a grid sync between the two halves measured slower and was retired: NOTES.md).
Waits: no block waits for another; the last slice block is found by a count each block passes once
(attention_combine.arrived_last says why that ends).
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch
from numba import float32, int32, int64

from protospec.errors import KernelArgumentError
from protospec.kernels import dependent_launch, interop, logit_stats
from protospec.kernels.dependent_launch import allow_dependent_launch, grid_dependency_wait, wait_after_issued_loads
from protospec.kernels.interop import check_tensor, cuda
from protospec.kernels.paged_attention import arrival_counters
from protospec.kernels.sampling_advance import finish_row, loads_for_advance
from protospec.kernels.sampling_buffers import mirror_span, no_advance, placeholder, scratch
from protospec.kernels.sampling_slices import (PER_THREAD, THREADS, VOCAB_PER_BLOCK, combine_stats,  # noqa: F401
                                               combine_winners, prefetch_slice, slice_probs,
                                               slice_probs_prefetched)
from protospec.kernels.sampling_stats import launch_stats, stats_kernel

if TYPE_CHECKING:
    from protospec.kernels.advance_step import AdvanceStepLauncher
    from protospec.spec.sampler import SamplingTensors

# The probabilities kernel, as a dependent, loads its slice's logits and noise before its wait: the
# statistics kernel before it lets it launch only after its own wait, when the LM head that wrote the
# logits has finished (only the row statistics are still being written). Same bits. Set before any
# graph is captured (bench and kernel_census: --probs-prefetch). On: timed faster (data/results/README.md).
PROBS_PREFETCH = True

# A draft step's sample followed by advance_step: the probabilities kernel writes the next step's inputs
# itself (sampling_advance.py) and no advance kernel is launched. The two-launch form only; elsewhere
# the kernel runs after the sample. Set before any graph is captured (--advance-in-sampler). On: timed
# faster (data/results/README.md).
ADVANCE_IN_SAMPLER = True

# Who combines a row's slice statistics (two launches): "last_block", the statistics kernel's last block of
# the row (an arrival count, then a chain of loads), or "every_block", each probabilities block from the
# partials (timed faster). Same bits. Set before any graph is captured (--stats-combine).
STATS_COMBINE = "every_block"


@functools.lru_cache(maxsize=None)
def _kernels(DEPENDENT: bool, prefetch: bool, every_block: bool = False):  # noqa: N803 (Numba freezes it as a constant)
    """The two kernels; DEPENDENT: launched as programmatic dependents (kernels/dependent_launch.py),
    each waits for the kernel before it (the forward that wrote the logits, then the statistics)
    before it reads anything, and lets the next one start as soon as it has (at batch 1 a launch
    costs more than these kernels' bytes). prefetch (with DEPENDENT): PROBS_PREFETCH's form; every_block:
    STATS_COMBINE's "every_block" (the probabilities kernel's stats arguments are then the slices'
    partials [R, S], else the combined rows [R])."""
    PREFETCH, EVERY_BLOCK = DEPENDENT and prefetch, every_block  # noqa: N806

    if EVERY_BLOCK:  # (chosen here, not by a branch in the kernel: the two take arrays of other ranks)
        @cuda.jit(device=True)
        def row_statistics(row, vocab, t, stat_max, stat_index, stat_sum, best_value, best_index, no_flags, tid):
            """The row's (max, its index, sum), combined here from the slices' partials [R, S]."""
            return combine_stats(row, vocab, t, stat_max, stat_index, stat_sum, best_value, best_index, no_flags, tid)
    else:
        @cuda.jit(device=True)
        def row_statistics(row, vocab, t, stat_max, stat_index, stat_sum, best_value, best_index, no_flags, tid):
            """The row's (max, its index, sum) as the statistics kernel's last block combined them ([R])."""
            return stat_max[row], stat_index[row], stat_sum[row]

    @cuda.jit
    def probs_and_sample_kernel(logits, temperature, is_greedy, rows_per_seq, stat_max, stat_index, stat_sum, probs_out,
                                out_step, do_sample, noise, ids_out, mirror, use_mirror, part_max, part_index, counters,
                                advance, num_queries, block_size, input_ids, positions, seq_lens, slot_mapping,
                                block_tables, error_row):
        """
        stat_max, stat_index, stat_sum: row_stats_kernel's rows [R] (or its slices' partials [R, S]
        with EVERY_BLOCK). probs_out [R, S, V] f32: row r's probabilities go
        to probs_out[r, out_step]. do_sample: 1 = also sample (noise [R, S, V] f32 Exp(1), read at
        [r, out_step]; the id goes to ids_out [R, S] int64 at [r, out_step], and to mirror int64 at
        [r * use_mirror] where use_mirror > 0, its stride). part_max, part_index [R, S]: the slices'
        race winners; counters as above.
        advance: 1 = also advance each sampled row's decode inputs (advance_step.advance_row's arguments
        follow: num_queries [1] int32, block_size, input_ids, positions, slot_mapping [>= R] int64,
        seq_lens [>= R] int32, block_tables [>= R, W] int32, error_row [1] int32), 0 = they are placeholders.
        """
        if PREFETCH:
            slices = part_max.shape[1]
            row, piece = cuda.blockIdx.x // slices, cuda.blockIdx.x % slices
            tid = cuda.threadIdx.x
            greedy = is_greedy[row // rows_per_seq]
            xs = cuda.local.array(PER_THREAD, float32)
            ns = cuda.local.array(PER_THREAD, float32)
            prefetch_slice(logits, row, piece, greedy, do_sample, noise, out_step, xs, ns, tid)
            loaded = loads_for_advance(advance, row, num_queries, block_size, seq_lens, block_tables)
            wait_after_issued_loads(slices)  # kept below the loads above in the machine code
            allow_dependent_launch()
            best_value = cuda.shared.array(THREADS, float32)
            best_index = cuda.shared.array(THREADS, int64)
            no_flags = cuda.shared.array(THREADS, int64)
            last = cuda.shared.array(1, int32)
            t = temperature[row // rows_per_seq]
            top, chosen, total = row_statistics(row, logits.shape[1], t, stat_max, stat_index, stat_sum, best_value,
                                                best_index, no_flags, tid)
            if slice_probs_prefetched(row, piece, logits.shape[1], t, greedy, top, chosen, total, probs_out,
                                      out_step, do_sample, xs, ns,
                                      part_max, part_index, counters, best_value, best_index, no_flags, last, tid):
                finish_row(row, logits.shape[1], greedy, chosen, part_max, part_index, ids_out, out_step, mirror,
                           use_mirror, best_value, best_index, no_flags, tid, advance, loaded, block_size, input_ids,
                           positions, seq_lens, slot_mapping, error_row)
            return
        if DEPENDENT:
            grid_dependency_wait()
            allow_dependent_launch()
        slices = part_max.shape[1]
        row, piece = cuda.blockIdx.x // slices, cuda.blockIdx.x % slices
        tid = cuda.threadIdx.x
        seq = row // rows_per_seq
        best_value = cuda.shared.array(THREADS, float32)
        best_index = cuda.shared.array(THREADS, int64)
        no_flags = cuda.shared.array(THREADS, int64)
        last = cuda.shared.array(1, int32)
        greedy = is_greedy[seq]
        loaded = loads_for_advance(advance, row, num_queries, block_size, seq_lens, block_tables)
        top, chosen, total = row_statistics(row, logits.shape[1], temperature[seq], stat_max, stat_index, stat_sum,
                                            best_value, best_index, no_flags, tid)
        if slice_probs(logits, row, piece, temperature[seq], greedy, top, chosen, total, probs_out,
                       out_step, do_sample, noise, part_max, part_index, counters, best_value, best_index, no_flags,
                       last, tid):
            finish_row(row, logits.shape[1], greedy, chosen, part_max, part_index, ids_out, out_step, mirror,
                       use_mirror, best_value, best_index, no_flags, tid, advance, loaded, block_size, input_ids,
                       positions, seq_lens, slot_mapping, error_row)

    @cuda.jit
    def probs_from_tiles_kernel(logits, is_greedy, rows_per_seq, tile_max, tile_index, tile_sum, probs_out, out_step,
                                do_sample, noise, ids_out, mirror, use_mirror, part_max, part_index, counters, advance,
                                num_queries, block_size, input_ids, positions, seq_lens, slot_mapping, block_tables,
                                error_row):
        """probs_and_sample_kernel for rows at T = 1 (or greedy), with no row_stats_kernel before it:
        every block combines its row's max, index and sum from the LM head's tile statistics
        (logit_stats.py; tile_max, tile_sum [R, S'] f32, tile_index [R, S'] int64)."""
        if DEPENDENT:
            grid_dependency_wait()
            allow_dependent_launch()
        slices = part_max.shape[1]
        row, piece = cuda.blockIdx.x // slices, cuda.blockIdx.x % slices
        tid = cuda.threadIdx.x
        best_value = cuda.shared.array(THREADS, float32)
        best_index = cuda.shared.array(THREADS, int64)
        no_flags = cuda.shared.array(THREADS, int64)
        last = cuda.shared.array(1, int32)
        one = float32(1.0)
        greedy = is_greedy[row // rows_per_seq]
        loaded = loads_for_advance(advance, row, num_queries, block_size, seq_lens, block_tables)
        row_max, chosen, total = combine_stats(row, logits.shape[1], one, tile_max, tile_index, tile_sum, best_value,
                                               best_index, no_flags, tid)
        if slice_probs(logits, row, piece, one, greedy, row_max, chosen, total, probs_out, out_step, do_sample, noise,
                       part_max, part_index, counters, best_value, best_index, no_flags, last, tid):
            finish_row(row, logits.shape[1], greedy, chosen, part_max, part_index, ids_out, out_step, mirror,
                       use_mirror, best_value, best_index, no_flags, tid, advance, loaded, block_size, input_ids,
                       positions, seq_lens, slot_mapping, error_row)

    return stats_kernel(DEPENDENT, EVERY_BLOCK), probs_and_sample_kernel, probs_from_tiles_kernel


def fused_applies(st: SamplingTensors) -> bool:
    """Filtering (top-k / top-p) needs a sort: those batches keep the torch path."""
    return not st.needs_filter


def probs_into(logits: torch.Tensor, st: SamplingTensors, out: torch.Tensor, rows_per_seq: int = 1,
               dependent: bool = False, space: str = "") -> torch.Tensor:
    """compute_probs, written into `out` [R, V] (contiguous; `logits` itself is allowed): the verify's target
    probabilities. dependent: as programmatic dependents (sm_90 and later); space: _launch's."""
    _launch(logits, st, rows_per_seq, out.view(out.shape[0], 1, out.shape[1]), 0, None, None, None, dependent,
            space=space)
    return out


def sample_into(logits: torch.Tensor, st: SamplingTensors, step: int, draft_probs: torch.Tensor, draft_ids: torch.Tensor,
                noise: torch.Tensor | None, mirror: torch.Tensor | None = None, dependent: bool = False,
                advance: AdvanceStepLauncher | None = None, tokens_to: torch.Tensor | None = None) -> None:
    """One draft step's sample: probabilities into draft_probs[:, step] ([B, k, V]), ids into
    draft_ids[:, step] ([B, k]) and mirror[:B] (advance_step's buffer, or any [B] view). noise: [B, k, V]
    Exp(1), read at [:, step]; None when every row is greedy. dependent: as probs_into's.
    advance: the decode inputs' advance that follows this sample (over the B rows sampled here): done
    by the probabilities kernel where it can (ADVANCE_IN_SAMPLER, two launches), else launched after it.
    tokens_to: a [B] view that gets the ids too (the verify's draft tokens): the kernel's mirror where
    no advance_step reads one, else a copy after it."""
    if advance is not None and logits.shape[0] > advance.num_rows:
        raise KernelArgumentError(f"sample_into: {logits.shape[0]} rows to sample, but the inputs to advance "
                                  f"hold {advance.num_rows}")
    folded = advance is not None and ADVANCE_IN_SAMPLER
    mirror_free = tokens_to is not None and (advance is None or folded)
    _launch(logits, st, 1, draft_probs, step, noise, draft_ids, tokens_to if mirror_free else mirror, dependent,
            advance if folded else None)
    if advance is not None and not folded:
        advance()
    if tokens_to is not None and not mirror_free:
        tokens_to.copy_(draft_ids[:, step])


def _launch(logits, st, rows_per_seq, probs_out, step, noise, ids_out, mirror, dependent=False, advance=None,
            space="") -> None:  # space: scratch and counters of its own (a concurrent stream's)
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
    noise = noise if noise is not None else placeholder(torch.float32, 3, logits.device)  # (never touched)
    ids_out = ids_out if ids_out is not None else placeholder(torch.int64, 2, logits.device)
    mirror_arg, mirror_stride = mirror_span(mirror, rows, logits.device)
    advance_args = [int(advance is not None)] + (advance.row_args if advance is not None else no_advance(logits.device))
    slices = -(-logits.shape[1] // VOCAB_PER_BLOCK)
    part_max, part_index, part_sum, row_max, row_index, row_sum = scratch(rows, slices, logits.device, "stats" + space)
    counters = arrival_counters(logits.device, rows, "sampling" + space)  # the two launches count in turn
    dependent = bool(dependent) and dependent_launch.STEP_KERNELS  # callers: ModelRunner.launches_dependents
    every_block = STATS_COMBINE == "every_block"
    row_stats_kernel, probs_and_sample_kernel, probs_from_tiles_kernel = _kernels(dependent, dependent and PROBS_PREFETCH,
                                                                                   every_block)
    tiles = logit_stats.attached(logits) if st.unit_temperature else None
    if tiles is not None:  # the LM head wrote its tiles' statistics: no statistics kernel
        interop.launch_tensors(probs_from_tiles_kernel, rows * slices, THREADS,
                               [logits, st.is_greedy, int(rows_per_seq), tiles.tile_max, tiles.tile_index,
                                tiles.tile_sum, probs_out, int(step), int(do_sample), noise, ids_out, mirror_arg,
                                mirror_stride, part_max, part_index, counters] + advance_args,
                               dependent=dependent)
        return
    launch_stats(row_stats_kernel, logits, st, rows_per_seq, slices, space, counters, dependent)
    # The winners go where no block still reads the statistics (every_block: the partials are read).
    stats = (part_max, part_index, part_sum) if every_block else (row_max, row_index, row_sum)
    win_value, win_index = scratch(rows, slices, logits.device, "winners" + space) if every_block else (part_max, part_index)
    interop.launch_tensors(probs_and_sample_kernel, rows * slices, THREADS,
                           [logits, st.temperature, st.is_greedy, int(rows_per_seq), *stats,
                            probs_out, int(step), int(do_sample), noise, ids_out, mirror_arg, mirror_stride,
                            win_value, win_index, counters] + advance_args, dependent=dependent)


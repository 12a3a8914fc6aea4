"""Probabilities and the exponential-race sample of a row of logits, in two Numba kernels.

sampler.py's torch path runs, per draft step: logits / temperature, softmax, probs / noise, argmax, then two
copies into the spec step's buffers (six launches); per verify, the first two. Here two launches do it all, into
those buffers, a row split over slices of VOCAB_PER_BLOCK entries, a block taking a span of them (slices.span_for;
one block a row was slower than torch at batch 1):
  stats   (sampling/stats.py) each slice's max logit, its first index (torch.argmax's tie rule) and its
          sum of exp(x/T - slice max/T), as the row's partials [R, S]
  probs   every block first combines its row's partials, a slice per thread and two tree reductions:
          the row's max M, its index, and sum = sum_s sum_s' e^(m_s/T - M/T) (each block the same
          bits; no block of the statistics kernel ends on that chain of loads); then greedy: one-hot
          at the max's index, which is also the sample; else p = exp(x/T - M/T) / sum, written, each
          span's winner of p / noise (noise ~ Exp(1), drawn by SpecStepRandoms); the row's last
          block combines the winners into the sample
The same float32 formula as the torch path for p; only the softmax sum's order and its rescaling by
slice differ, so probabilities agree to a few ulps (tests bound it) and ids agree unless two scores tie
to that precision. Rows with top-k / top-p filtering keep the torch path. EngineConfig.fused_sampling
chooses these kernels over torch's (sampling/slices.py holds the arithmetic).
A draft step's sample that the decode inputs' advance follows writes the next step's inputs itself
(sampling/advance.py): no advance_step launch after it.
Waits: no block waits for another; the last slice block is found by a count each block passes once
(arrivals.arrived_last says why that ends).
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch
from numba import float32, int32, int64

from protospec.errors import KernelArgumentError
from protospec.kernels.launch import interop
from protospec.kernels.launch.dependent_launch import allow_dependent_launch, wait_after_issued_loads
from protospec.kernels.launch.interop import placeholder, check_tensor, cuda
from protospec.kernels.primitives.divisions import block_row_and_part, divide32
from protospec.kernels.primitives.arrivals import arrival_counters
from protospec.kernels.sampling.advance import finish_row, loads_for_advance
from protospec.kernels.sampling.buffers import RowSettings, mirror_span, no_advance, scratch
from protospec.kernels.sampling.slices import (PER_THREAD, THREADS, combine_stats, prefetch_span, span_for,
                                               span_groups, span_probs)
from protospec.kernels.sampling.stats import launch_stats

if TYPE_CHECKING:
    from protospec.kernels.inputs.advance_step import AdvanceStepLauncher


@functools.lru_cache(maxsize=None)
def _kernel(DEPENDENT: bool, SPAN: int):  # noqa: N803 (Numba freezes them as constants)
    """The probabilities kernel, SPAN vocabulary slices a block. DEPENDENT: it and the statistics kernel
    launched as programmatic dependents (kernels/launch/dependent_launch.py), each letting the next one
    start as soon as it has waited for the kernel before it (at batch 1 a launch costs more than these
    kernels' bytes). The statistics kernel waits for the forward that wrote the logits before it reads
    anything; this one, which that kernel lets launch only after its own wait (when the logits are
    written; only the partials are still being written), loads its span's logits and noise first,
    then waits."""
    ENTRIES = SPAN * PER_THREAD  # noqa: N806 (a local array's size: a constant)

    @cuda.jit
    def probs_and_sample_kernel(logits, temperature, is_greedy, rows_per_seq, stat_max, stat_index, stat_sum, probs_out,
                                out_step, do_sample, noise, ids_out, mirror, use_mirror, part_max, part_index, counters,
                                advance, num_queries, block_size, input_ids, positions, seq_lens, slot_mapping,
                                block_tables, error_row):
        """
        stat_max, stat_sum [R, S] f32, stat_index [R, S] int64: row_stats_kernel's slice partials, which
        every block combines into its row's (max, its index, sum). Grid: R x G blocks, G = ceil(S / SPAN). probs_out [R, S, V] f32: row r's
        probabilities go to probs_out[r, out_step]. do_sample: 1 = also sample (noise [R, S, V] f32
        Exp(1), read at [r, out_step]; the id goes to ids_out [R, S] int64 at [r, out_step], and to
        mirror int64 at [r * use_mirror] where use_mirror > 0, its stride). part_max, part_index [R, G]:
        the spans' race winners (not the statistics' partials: other blocks still read those);
        counters [>= R] int32, zero between calls.
        advance: 1 = also advance each sampled row's decode inputs (advance_step_kernel's arguments
        follow: num_queries [1] int32, block_size, input_ids, positions, slot_mapping [>= R] int64,
        seq_lens [>= R] int32, block_tables [>= R, W] int32, error_row [1] int32), 0 = they are placeholders.
        """
        groups = part_max.shape[1]
        row, group = block_row_and_part(groups)
        tid = cuda.threadIdx.x
        seq, _ = divide32(row, rows_per_seq)
        vocab = logits.shape[1]
        best_value = cuda.shared.array(THREADS, float32)
        best_index = cuda.shared.array(THREADS, int64)
        no_flags = cuda.shared.array(THREADS, int64)
        last = cuda.shared.array(1, int32)
        greedy = is_greedy[seq]
        xs = cuda.local.array(ENTRIES, float32)
        ns = cuda.local.array(ENTRIES, float32)
        prefetch_span(logits, row, group, SPAN, greedy, do_sample, noise, out_step, xs, ns, tid)
        loaded = loads_for_advance(advance, row, num_queries, block_size, seq_lens, block_tables)
        if DEPENDENT:
            wait_after_issued_loads(groups)  # kept below the loads above in the machine code
            allow_dependent_launch()
        t = temperature[seq]
        top, chosen, total = combine_stats(row, vocab, t, stat_max, stat_index, stat_sum, best_value,
                                           best_index, no_flags, tid)
        arrived = span_probs(row, group, SPAN, vocab, t, greedy, top, chosen, total, probs_out, out_step, do_sample,
                             xs, ns, part_max, part_index, counters, best_value, best_index, no_flags, last, tid)
        if arrived:
            finish_row(row, vocab, greedy, chosen, part_max, part_index, ids_out, out_step, mirror, use_mirror,
                       best_value, best_index, no_flags, tid, advance, loaded, block_size, input_ids, positions,
                       seq_lens, slot_mapping, error_row)

    return probs_and_sample_kernel


def fused_applies(st: RowSettings) -> bool:
    """Filtering (top-k / top-p) needs a sort: those batches keep the torch path."""
    return not st.needs_filter


def probs_into(logits: torch.Tensor, st: RowSettings, out: torch.Tensor, rows_per_seq: int = 1,
               dependent: bool = False, space: str = "", span: int | None = None) -> torch.Tensor:
    """compute_probs, written into `out` [R, V] (contiguous; `logits` itself is allowed): the verify's target
    probabilities. dependent: as programmatic dependents (sm_90 and later); space: _launch's; span:
    slices a block (None: by the grid, slices.span_for; the same bits at any span)."""
    _launch(logits, st, rows_per_seq, out.view(out.shape[0], 1, out.shape[1]), 0, None, None, None, dependent,
            space=space, span=span)
    return out


def sample_into(logits: torch.Tensor, st: RowSettings, step: int, draft_probs: torch.Tensor, draft_ids: torch.Tensor,
                noise: torch.Tensor | None, mirror: torch.Tensor | None = None, dependent: bool = False,
                advance: AdvanceStepLauncher | None = None, tokens_to: torch.Tensor | None = None,
                span: int | None = None) -> None:
    """One draft step's sample: probabilities into draft_probs[:, step] ([B, k, V]), ids into
    draft_ids[:, step] ([B, k]) and mirror[:B] (advance_step's buffer, or any [B] view). noise: [B, k, V]
    Exp(1), read at [:, step]; None when every row is greedy. dependent: as probs_into's.
    advance: the decode inputs' advance that follows this sample (over the B rows sampled here), done
    by the probabilities kernel itself: no advance_step launch after it. tokens_to: a [B] view that
    gets the ids too (the verify's draft tokens): the kernel's mirror in place of `mirror` (its callers
    advance in the sampler, or not at all: no advance_step reads the mirror). span: as probs_into's."""
    if advance is not None and logits.shape[0] > advance.num_rows:
        raise KernelArgumentError(f"sample_into: {logits.shape[0]} rows to sample, but the inputs to advance "
                                  f"hold {advance.num_rows}")
    _launch(logits, st, 1, draft_probs, step, noise, draft_ids, tokens_to if tokens_to is not None else mirror,
            dependent, advance, span=span)


def _launch(logits, st, rows_per_seq, probs_out, step, noise, ids_out, mirror, dependent=False, advance=None,
            space="", span=None) -> None:  # space: scratch and counters of its own (a concurrent stream's)
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
    span = span or span_for(rows, logits.shape[1], interop.sm_count(logits.device))  # span: slices a block (tests set it)
    dependent = bool(dependent)  # callers: ModelRunner.launches_dependents
    stats = launch_stats(logits, st, rows_per_seq, space, dependent)  # [R, S] each
    # The winners go where no block still reads the statistics (every block reads its row's partials).
    groups = span_groups(logits.shape[1], span)
    win_value, win_index = scratch(rows, groups, logits.device, "winners" + space)
    counters = arrival_counters(logits.device, rows, "sampling" + space)
    interop.launch_tensors(_kernel(dependent, span), rows * groups, THREADS,
                           [logits, st.temperature, st.is_greedy, int(rows_per_seq), *stats,
                            probs_out, int(step), int(do_sample), noise, ids_out, mirror_arg, mirror_stride,
                            win_value, win_index, counters] + advance_args, dependent=dependent)

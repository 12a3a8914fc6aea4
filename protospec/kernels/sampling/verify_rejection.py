"""The verify's probabilities and the rejection sampler in one launch, after the statistics kernel.

Unfused, a spec step ends in three launches after the verify's LM head: the row statistics, the
probabilities p of the k + 1 rows (sampling/softmax_sample.py), then the rejection sampler reading them back
(rejection.py). The sampler's work is slice-wise too, so here the probabilities kernel's blocks do it
as they write p. Block (b, i, g) takes span g of sequence b's verify row i: `span` consecutive
vocabulary slices of the probabilities kernel's (2 entries a thread a slice on a GPU, 63 slices a
32000-entry row; one slice a block at batch 1, up to slices.MAX_SPAN at batch: slices.span_for):
    all       the row's max and sum from the slices' statistics, p = exp(x/T - M/T) / sum (one-hot at
              the max on greedy rows) into probs_out: the probabilities kernel's arithmetic, so its bits
    i < k     the span's winner of max(0, p - q_i) / noise_i and whether any p > q_i there (the race
              of a rejection at i); span 0's thread 0 also tests i: u_i q_i(d_i) < p_i(d_i) and
              i < the proposed count, into passed_mask
    i == k    the span's winner of p / bonus noise (the race after k accepted)
    each span's winner goes into its row's packed key (sampling/packed_argmax.py: one atomic max); the last of
    the sequence's (k + 1) G blocks to finish (an arrival count), in one thread, finds n, the first
    test that failed, and reads row n's key: the token after the n kept ones (where the residual is
    zero over the whole row, the race over p_n itself, read back from probs_out); then the output
    layout of rejection.py, the commit's row and the error flag.
Every race is rejection.py's (the same float32 values, ties to the lowest index), so both give the
same tokens; tests check that in the simulator and on the GPU. Each block races its own row whether
or not that row turns out to be n: k + 1 races where the sampler ran one, each over one slice in a
block that was running anyway. p's bits do not depend on the span (the row's sum is the slices'
statistics', combined in one order), nor the races' winners (an argmax, ties to the lowest index).

Waits: no block waits for another; the last block to arrive is found by a count each block passes
once (arrivals.arrived_last says why that ends). Launched as a dependent, its
grid_dependency_wait ends when the statistics kernel before it does (launch/dependent_launch.py).
"""
from __future__ import annotations

import functools
import math

import torch
from numba import float32, int32, int64

from protospec.kernels.launch import interop
from protospec.kernels.launch.dependent_launch import allow_dependent_launch, wait_after_issued_loads
from protospec.kernels.launch.interop import check_tensor, cuda, placeholder
from protospec.kernels.primitives.divisions import block_row_and_part, divide32
from protospec.kernels.primitives.arrivals import arrival_counters
from protospec.kernels.sampling.packed_argmax import EMPTY, argmax_key, key_index
from protospec.kernels.primitives.reductions import block_argmax_or
from protospec.kernels.sampling.rejection import RejectionBuffers, check_keys, checked_inputs, filled_noise, keyed_noise
from protospec.kernels.sampling.slices import (PER_THREAD, THREADS, VOCAB_PER_BLOCK, combine_stats, span_for,
                                               span_groups)
from protospec.kernels.sampling.stats import slice_statistics
from protospec.layout import PLACEHOLDER_TOKEN_ID, RejectionOutput


@functools.lru_cache(maxsize=None)
def _kernel(DEPENDENT: bool, SPAN: int, KEYED: bool):  # noqa: N803 (Numba freezes them as constants)
    """DEPENDENT: launched as a programmatic dependent of the statistics kernel, which lets it launch
    only after its own wait, so each thread loads its span's logits, q and noise (written by kernels
    finished by then) before its wait. SPAN: vocabulary slices a block. KEYED: recovered_noise is the
    sequences' counter keys [B, 2] (bonus_noise unused) and the kernel draws each number it reads
    from them, the numbers counter_randoms.fill_kernel writes (no [B, 2k + 1, V] block is filled or read)."""
    ENTRIES = SPAN * PER_THREAD  # noqa: N806
    noise_at = keyed_noise if KEYED else filled_noise
    finish = _finisher(KEYED)

    @cuda.jit
    def verify_rejection_kernel(logits, temperature, is_greedy, stat_max, stat_index, stat_sum, probs_out,
                                draft_ids, draft_probs, uniforms, recovered_noise, bonus_noise, num_proposed,
                                out_ids, num_accepted, accepted_mask, passed_mask, commit, win_key, win_mass,
                                counters, error_flag):
        """
        logits, probs_out [B (k + 1), V] f32: row b (k + 1) + i is sequence b's verify position i (out: p)
        temperature [B] f32 (1.0 on greedy rows), is_greedy [B] bool
        stat_max, stat_sum [B (k + 1), S] f32, stat_index [.., S] int64: the slices' statistics
        draft_ids [B, k] int64, draft_probs [B, k, V] f32, uniforms [B, k] f32, recovered_noise [B, k, V]
        f32, bonus_noise [B, V] f32 (Exp(1), > 0) (KEYED: [B, 2] int64 keys, and unused), num_proposed
        [B] int64: as rejection.py's
        out_ids [B, k + 1] int64, num_accepted [B] int64, accepted_mask / passed_mask [B, k] bool,
        commit [B + 1, k + 3] int64: out, as rejection.py's
        win_key [>= B (k + 1)] int64, win_mass [..] int32: each verify row's race so far (its slices'
        best as a packed_argmax key; whether any slice had residual mass), EMPTY / 0 between calls
        counters [>= B] int32, zero between calls; error_flag [1] int32
        """
        groups = ((logits.shape[1] + VOCAB_PER_BLOCK - 1) // VOCAB_PER_BLOCK + SPAN - 1) // SPAN
        k = draft_ids.shape[1]
        vocab = logits.shape[1]
        row, group = block_row_and_part(groups)
        seq, i = divide32(row, k + 1)
        tid = cuda.threadIdx.x
        lo = group * SPAN * VOCAB_PER_BLOCK
        hi = min(lo + SPAN * VOCAB_PER_BLOCK, vocab)
        greedy = is_greedy[seq]
        residual = i < k
        # What no running kernel writes, first: the span's logits, q and noise; span 0's thread 0
        # also the test's token, u q(d) and logit (a clamped, valid position).
        xs = cuda.local.array(ENTRIES, float32)
        qs = cuda.local.array(ENTRIES, float32)
        ns = cuda.local.array(ENTRIES, float32)
        ii = min(i, k - 1)
        for j in range(ENTRIES):
            v = lo + tid + j * THREADS
            inside = v < hi
            xs[j] = logits[row, v] if inside and not greedy else float32(0.0)
            qs[j] = draft_probs[seq, ii, v] if inside and residual else float32(0.0)
            ns[j] = float32(1.0)
            if inside:
                ns[j] = noise_at(recovered_noise, bonus_noise, seq, i, v, k, vocab)
        tests = residual and group == 0 and tid == 0
        d = min(max(draft_ids[seq, ii], int64(0)), int64(vocab - 1)) if tests else int64(0)
        uq = uniforms[seq, ii] * draft_probs[seq, ii, d] if tests else float32(0.0)
        x_d = logits[row, d] if tests and not greedy else float32(0.0)
        if DEPENDENT:
            wait_after_issued_loads(groups)  # kept below the loads above in the machine code
            allow_dependent_launch()
        best_value = cuda.shared.array(THREADS, float32)
        best_index = cuda.shared.array(THREADS, int64)
        flags = cuda.shared.array(THREADS, int64)
        t = temperature[seq]
        top, chosen, total = combine_stats(row, vocab, t, stat_max, stat_index, stat_sum, best_value, best_index,
                                           flags, tid)
        shift = top / t
        zero = float32(0.0)
        if tests:  # the same p as the slice that holds d writes
            p_d = (float32(1.0) if d == chosen else zero) if greedy else math.exp(x_d / t - shift) / total
            passed_mask[seq, i] = i < num_proposed[seq] and d == draft_ids[seq, i] and uq < p_d
        value, index, mass = float32(-1.0), int64(vocab), int64(0)
        for j in range(ENTRIES):  # ascending: a thread's ties go to its first entry
            v = lo + tid + j * THREADS
            if v < hi:
                p = (float32(1.0) if v == chosen else zero) if greedy else math.exp(xs[j] / t - shift) / total
                probs_out[row, v] = p
                w = max(p - qs[j], zero) if residual else p
                if residual and w > zero:
                    mass = 1
                if w / ns[j] > value:
                    value, index = w / ns[j], v
        value, index, mass = block_argmax_or(value, index, mass, best_value, best_index, flags, tid, THREADS)
        if tid == 0:  # the span's race into the row's key and mass; the sequence's last block reads them
            cuda.atomic.max(win_key, row, argmax_key(value, index))
            if mass != 0:
                cuda.atomic.or_(win_mass, row, 1)
            cuda.threadfence()
            if cuda.atomic.add(counters, seq, 1) == (k + 1) * groups - 1:
                counters[seq] = 0
                cuda.threadfence()
                finish(seq, k, vocab, draft_ids, recovered_noise, bonus_noise, probs_out, out_ids, num_accepted,
                       accepted_mask, passed_mask, commit, win_key, win_mass, error_flag)

    return verify_rejection_kernel


@functools.lru_cache(maxsize=None)
def _finisher(KEYED: bool):  # noqa: N803 (Numba freezes it as a constant)
    """The sequence's last block's work, reading the noise as the kernel of that KEYED does."""
    noise_at = keyed_noise if KEYED else filled_noise

    @cuda.jit(device=True)
    def finish(seq, k, vocab, draft_ids, recovered_noise, bonus_noise, probs_out, out_ids, num_accepted,
               accepted_mask, passed_mask, commit, win_key, win_mass, error_flag):
        """The sequence's last block, one thread: n, the masks, the token after the kept ones (every
        row's key and mass slot reset on the way), the output rows."""
        n, passes = int64(k), int64(0)
        for i in range(k):
            if passed_mask[seq, i]:
                passes += 1
            elif n == k:
                n = i
        key, mass = int64(EMPTY), int32(0)
        for i in range(k + 1):  # the verify row whose race decides: the residual at n < k, the bonus at k
            row_key = cuda.atomic.exch(win_key, seq * (k + 1) + i, int64(EMPTY))
            row_mass = cuda.atomic.exch(win_mass, seq * (k + 1) + i, int32(0))
            if i == n:
                key, mass = row_key, row_mass
        index = key_index(key)
        if n < k and mass == 0:  # the residual was zero everywhere: race over p_n itself (p == q: rare)
            row, value = seq * (k + 1) + n, float32(-1.0)
            for v in range(vocab):
                score = probs_out[row, v] / noise_at(recovered_noise, bonus_noise, seq, n, v, k, vocab)
                if score > value:
                    value, index = score, v
        for i in range(k + 1):
            token = draft_ids[seq, i] if i < n else (index if i == n else PLACEHOLDER_TOKEN_ID)
            out_ids[seq, i], commit[seq, i] = token, token
            if i < k:
                accepted_mask[seq, i] = i < n
        num_accepted[seq] = n
        commit[seq, k + 1], commit[seq, k + 2] = n, passes
        if seq == 0:
            commit[draft_ids.shape[0], 0] = error_flag[0]

    return finish


_slots: dict[str, list] = {}  # device -> [(win_key, win_mass)], EMPTY / 0 between calls; the last the largest


def _row_slots(rows: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """[>= rows] int64 keys and int32 masses of the verify rows' races, reset by each sequence's last
    block: one pair serves every call and replay; a larger need makes a larger pair (the old ones stay
    alive: captured graphs point at them)."""
    kept = _slots.setdefault(str(device), [])
    if not kept or kept[-1][0].numel() < rows:
        size = max(rows, 64)
        kept.append((torch.full((size,), EMPTY, dtype=torch.int64, device=device),
                     torch.zeros(size, dtype=torch.int32, device=device)))
    return kept[-1]


# Sequences up to which a spec step graph's verify samples in this one launch. Past it, the statistics
# and probabilities kernels write p, then rejection.py's kernel tests the draft tokens in every block
# and races row n alone, where this kernel races all k + 1 rows before n is known (k + 1 times the
# hashes, logs and divisions, each block holding three arrays of its span's entries). At batch 1 the
# launch saved is worth more than that work; by batch 16 the two kernels take less time (NOTES.md).
ONE_LAUNCH_MAX_SEQUENCES = 4


def one_launch(sequences: int) -> bool:
    """Whether a spec step graph of `sequences` rows samples its verify in this launch (see above)."""
    return sequences <= ONE_LAUNCH_MAX_SEQUENCES


def applies(st, acceptance) -> bool:
    """This one launch serves a spec step graph whose rejection sampler is the fused kernel (not typical
    acceptance, not the torch sampler) and whose rows the fused sampling kernels take (no top-k / top-p);
    elsewhere the probabilities kernel and the rejection kernel run apart."""
    from protospec.kernels.sampling.rejection import rejection_sample_fused

    return getattr(acceptance, "sample", None) is rejection_sample_fused and not st.needs_filter


def probs_and_rejection(logits: torch.Tensor, st, draft_token_ids, draft_probs, uniforms, recovered_noise,
                        bonus_noise, num_proposed=None, error_flag=None, dependent: bool = False,
                        span: int | None = None, noise_keys: torch.Tensor | None = None) -> tuple[torch.Tensor, RejectionOutput]:
    """The verify's probabilities of logits [B (k + 1), V] f32 (st: the B rows' settings) and
    rejection.rejection_sample_fused's result over them, in the statistics launch and this one:
    (probabilities [B, k + 1, V] f32, RejectionOutput). dependent: as the sampling kernels'; span:
    vocabulary slices a block (None: by the grid, slices.span_for; the same results at any span).
    noise_keys [B, 2] int64: the sequences' counter keys, from which the kernel draws the numbers
    counter_randoms.fill_kernel writes into a spec step's [B, 2k + 1, V] noise block (recovered_noise
    and bonus_noise then None: nothing of that size is filled or read)."""
    batch, k = draft_token_ids.shape
    vocab = logits.shape[-1]
    check_tensor("logits", logits, torch.float32, 2, rows=batch * (k + 1))
    keyed = noise_keys is not None
    if keyed:
        if recovered_noise is not None or bonus_noise is not None:
            raise interop.KernelArgumentError("probs_and_rejection: noise or noise_keys, not both")
        check_keys("probs_and_rejection", noise_keys, batch)
    recovered_noise, bonus_noise, num_proposed, flag = checked_inputs(
        "probs_and_rejection", draft_token_ids, draft_probs, uniforms, recovered_noise, bonus_noise, num_proposed,
        error_flag, vocab)
    if keyed:
        recovered_noise, bonus_noise = noise_keys, placeholder(torch.float32, 2, logits.device)
    dependent = bool(dependent)
    device = logits.device
    rows = batch * (k + 1)
    span = span or span_for(rows, vocab, interop.sm_count(device))
    stats = slice_statistics(logits, st, k + 1, dependent)  # [B (k + 1), S] each
    probs = torch.empty_like(logits)  # [B (k + 1), V]
    out = RejectionBuffers.empty(batch, k, device)
    args = [logits, st.temperature, st.is_greedy, *stats, probs, draft_token_ids, draft_probs, uniforms,
            recovered_noise, bonus_noise, num_proposed, *out.kernel_args, *_row_slots(rows, device),
            arrival_counters(device, batch, "verify_rejection"), flag]
    interop.launch_tensors(_kernel(dependent, span, keyed), rows * span_groups(vocab, span), THREADS, args,
                           dependent=dependent)
    return probs.view(batch, k + 1, vocab), out.result(error_flag is not None)

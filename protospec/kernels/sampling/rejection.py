"""The rejection sampler as one Numba kernel: each sequence's vocabulary split over several blocks.

protospec.speculation.rejection.rejection_sample is the reference: ~25 small torch ops (gathers, cumprod, the
residual, two exponential races, the output layout). On a GPU each op costs the host a launch
that takes longer than the device needs for the op, so the device waits for the host. This kernel does
the same work in one launch and computes the very same float32 values (u * q < p, max(0, p - q) / noise,
p / noise, argmax ties to the lowest index), so both give identical tokens; tests check that in the
simulator and on the GPU.

At batch 1 the kernel's time is latency, not bytes: every step that waits on a load before the next
is spread over threads. Block (b, s) takes the vocabulary slice s of sequence b: `span` of
slices.py's VOCAB_PER_BLOCK-entry slices, the span by the grid as the sampling kernels' (slices.span_for:
at batch 1 a slice a block, 2 entries a thread, so a 32000-entry row spreads over 63 blocks; once the
grid fills the GPU, fewer blocks with more entries each, each repeating the k tests less often):
    thread i < k: passed[i] = u[i] * q[i, d_i] < p[i, d_i] (each thread its own two dependent loads;
              one thread walking the k positions chained 2k of them); n = the first i that failed (k if
              none) and the number passed, warp shuffles and one merge of the warps; slice 0 writes the
              masks and the count
    all:      if n < k, the slice's argmax of w[v] / noise[n, v], w = max(0, p_n - q_n), whether any w > 0,
              and its argmax of p_n[v] / noise[n, v] (the fallback when the whole residual is zero);
              else the slice's argmax of p_k[v] / bonus_noise[v]
    the last slice block to finish (an arrival count) combines the slices, a slice per thread and a
    block reduction (ties to the lowest index), and writes out = d_1..d_n, the recovered or bonus token,
    then -1 (PLACEHOLDER_TOKEN_ID), a position per thread, and the same ids with n and the number passed
    as the row the commit reads (step_graph.commit_row): three torch kernels a step fewer; row 0's
    last block also copies the device-built inputs' error flag after the rows (two kernels fewer).
The noise comes from the spec step's filled block, or (keyed) from the sequences' counter keys as it is
read: row n's numbers alone, the same ones the fill would have written (randoms/counter_randoms.py).
Waits: no block waits for another (arrivals.arrived_last says why the last-block count ends).
"""
from __future__ import annotations

import functools
import math

import torch
from numba import float32, int32, int64, uint64

from protospec.kernels.launch import interop
from protospec.kernels.launch.interop import check_tensor, cuda, placeholder
from protospec.kernels.primitives.divisions import block_row_and_part
from protospec.kernels.primitives.arrivals import arrival_counters, arrived_last
from protospec.kernels.primitives.reductions import better, block_argmax_or, block_min_and_sum
from protospec.kernels.randoms.counter_randoms import exponential
from protospec.kernels.sampling.slices import VOCAB_PER_BLOCK, span_for, span_groups
from protospec.layout import PLACEHOLDER_TOKEN_ID, RejectionOutput

# Threads per block (a power of two, for the tree reduction). The simulator runs a Python thread per
# CUDA thread: a narrow block.
THREADS = 32 if interop.SIMULATOR else 256


@cuda.jit(device=True)
def filled_noise(recovered_noise, bonus_noise, seq, i, v, k, vocab):  # noqa: ARG001
    """Row i's Exp(1) number at v: recovered_noise [B, k, V] for i < k, bonus_noise [B, V] at i == k."""
    return recovered_noise[seq, i, v] if i < k else bonus_noise[seq, v]


@cuda.jit(device=True)
def keyed_noise(keys, unused, seq, i, v, k, vocab):  # noqa: ARG001
    """The same number drawn from the sequence's key (keys [B, 2] int64): a spec step's noise block
    [2k + 1, V] holds recovered row i at k + i and the bonus at 2k (SpecStepRandoms' layout)."""
    return exponential(uint64((k + i) * vocab + v), uint64(keys[seq, 0]), uint64(keys[seq, 1]))


@cuda.jit(device=True)
def written_row(row_stats, row_index, temperature, is_greedy, seq, i):  # noqa: ARG001
    """The probabilities are written: no row constants (written_prob's unused arguments)."""
    return float32(1.0), float32(0.0), float32(1.0), int64(0), False


@cuda.jit(device=True)
def written_prob(values, seq, i, v, t, shift, total, chosen, greedy):  # noqa: ARG001
    """p at v of row i (values [B, rows, V]: the probabilities)."""
    return values[seq, i, v]


@cuda.jit(device=True)
def logits_row(row_stats, row_index, temperature, is_greedy, seq, i):
    """Row i's constants of logits_prob from its statistics (row_stats [B, rows, 2] f32 max and sum,
    row_index [B, rows] int64: stats.py's finish): (T, max / T, sum, argmax, greedy)."""
    t = temperature[seq]
    return t, row_stats[seq, i, 0] / t, row_stats[seq, i, 1], row_index[seq, i], is_greedy[seq]


@cuda.jit(device=True)
def logits_prob(values, seq, i, v, t, shift, total, chosen, greedy):
    """p at v of row i from its logits (values [B, rows, V]): the probabilities kernel's formula
    (slices.span_probs), so the bits it would have written."""
    if greedy:
        return float32(1.0) if v == chosen else float32(0.0)
    return math.exp(values[seq, i, v] / t - shift) / total


@cuda.jit(device=True)
def _block_best(value, index, flag, best_value, best_index, flags, tid):
    """The block's best (value, index) (ties to the lowest index) and the OR of its flags, in every thread."""
    return block_argmax_or(value, index, flag, best_value, best_index, flags, tid, THREADS)


@functools.lru_cache(maxsize=None)
def _kernel(KEYED: bool, SPAN: int, LOGITS: bool):  # noqa: N803 (Numba freezes them as constants)
    """SPAN: VOCAB_PER_BLOCK-entry slices a block. KEYED: recovered_noise is the sequences' counter keys
    [B, 2] (bonus_noise unused) and the kernel draws each number it reads from them: those
    counter_randoms.fill_kernel writes into a spec step's noise block, and only row n's, where the
    filled form reads a [B, 2k + 1, V] block filled before it. LOGITS: draft_probs and target_probs
    hold logits, each p formed where it is read from the rows' statistics (no probabilities written)."""
    noise_at = keyed_noise if KEYED else filled_noise
    row_of, prob = (logits_row, logits_prob) if LOGITS else (written_row, written_prob)
    entries = VOCAB_PER_BLOCK * SPAN

    @cuda.jit
    def rejection_sample_kernel(draft_ids, draft_probs, target_probs, uniforms, recovered_noise, bonus_noise,
                                num_proposed, out_ids, num_accepted, accepted_mask, passed_mask, commit,
                                part_value, part_index, part_mass, counters, error_flag, temperature, is_greedy,
                                draft_stats, draft_index, target_stats, target_index):
        """
        draft_ids       [B, k] int64          draft_probs    [B, k, V] float32
        target_probs    [B, k + 1, V] float32 uniforms       [B, k] float32
        recovered_noise [B, k, V] float32     bonus_noise    [B, V] float32   (Exp(1), > 0; keyed: [B, 2]
                        int64 counter keys, and unused)
        num_proposed    [B] int64: positions past it are not tested (their draft_probs rows are zero)
        out_ids         [B, k + 1] int64 out  num_accepted   [B] int64 out
        accepted_mask   [B, k] bool out       passed_mask    [B, k] bool out
        commit          [B + 1, k + 3] int64 out: per row the ids, n and the number passed (the commit's
                        row), then error_flag[0] at [B, 0]
        part_value      [B, S, 2] float32, part_index [B, S, 2] int64, part_mass [B, S] int32: each slice's
                        (residual or bonus race, fallback race) winners and whether its residual had mass
        counters        [>= B] int32, zero between calls (the last block of a row resets its own)
        error_flag      [1] int32: the step's device-built inputs' flag (0 = none), copied into commit
        LOGITS: temperature [B] f32, is_greedy [B] bool, and each row's statistics: draft_stats [B, k, 2] f32
        (max, sum), draft_index [B, k] int64, target_stats [B, k + 1, 2], target_index [B, k + 1]
        (logits_row's); else placeholders
        """
        slices = part_mass.shape[1]
        row, piece = block_row_and_part(slices)
        tid = cuda.threadIdx.x
        k = draft_ids.shape[1]
        vocab = target_probs.shape[2]
        best_value = cuda.shared.array(THREADS, float32)
        best_index = cuda.shared.array(THREADS, int64)
        flags = cuda.shared.array(THREADS, int64)
        last = cuda.shared.array(1, int32)
        zero = float32(0.0)

        # The acceptance tests, a position per thread; n = the first that failed. The thread's first
        # position's token, uniform and q(d) first (a clamped, always valid position).
        proposed = num_proposed[row]
        first = min(tid, k - 1)
        first_d = draft_ids[row, first]
        t, shift, total, chosen, greedy = row_of(draft_stats, draft_index, temperature, is_greedy, row, first)
        first_uq = uniforms[row, first] * prob(draft_probs, row, first, first_d, t, shift, total, chosen, greedy)
        failed, passes = int64(k), int64(0)
        for i in range(tid, k, THREADS):
            d = first_d if i == tid else draft_ids[row, i]
            if i != tid:
                t, shift, total, chosen, greedy = row_of(draft_stats, draft_index, temperature, is_greedy, row, i)
            uq = first_uq if i == tid else uniforms[row, i] * prob(draft_probs, row, i, d, t, shift, total, chosen,
                                                                   greedy)
            t, shift, total, chosen, greedy = row_of(target_stats, target_index, temperature, is_greedy, row, i)
            passed = i < proposed and uq < prob(target_probs, row, i, d, t, shift, total, chosen, greedy)
            if piece == 0:
                passed_mask[row, i] = passed
            if passed:
                passes += 1
            elif failed == k:
                failed = i
        n, passes = block_min_and_sum(failed, passes, best_index, flags, tid, THREADS)
        if piece == 0:
            for i in range(tid, k, THREADS):
                accepted_mask[row, i] = i < n
            if tid == 0:
                num_accepted[row] = n
        nn = min(n, k - 1)  # a row index that exists when n == k (its values unused then)

        # The slice's races: max(0, p - q) / noise and p / noise at n (n < k), or p_k / bonus noise (n == k)
        value, index, mass = float32(-1.0), int64(vocab), int64(0)
        fallback_value, fallback_index = float32(-1.0), int64(vocab)
        pt, pshift, ptotal, pchosen, pgreedy = row_of(target_stats, target_index, temperature, is_greedy, row,
                                                      nn if n < k else k)
        qt, qshift, qtotal, qchosen, qgreedy = row_of(draft_stats, draft_index, temperature, is_greedy, row, nn)
        for v in range(piece * entries + tid, min((piece + 1) * entries, vocab), THREADS):
            if n < k:
                p = prob(target_probs, row, nn, v, pt, pshift, ptotal, pchosen, pgreedy)
                noise = noise_at(recovered_noise, bonus_noise, row, nn, v, k, vocab)
                w = max(p - prob(draft_probs, row, nn, v, qt, qshift, qtotal, qchosen, qgreedy), zero)
                if w > zero:
                    mass = 1
                score = w / noise
                if p / noise > fallback_value:
                    fallback_value, fallback_index = p / noise, v
            else:
                score = prob(target_probs, row, k, v, pt, pshift, ptotal, pchosen, pgreedy) / noise_at(
                    recovered_noise, bonus_noise, row, k, v, k, vocab)
            if score > value:
                value, index = score, v
        value, index, mass = _block_best(value, index, mass, best_value, best_index, flags, tid)
        if tid == 0:
            part_value[row, piece, 0], part_index[row, piece, 0], part_mass[row, piece] = value, index, mass
        if n < k:  # the fallback race matters only past a rejection
            value, index, mass = _block_best(fallback_value, fallback_index, 0, best_value, best_index, flags, tid)
            if tid == 0:
                part_value[row, piece, 1], part_index[row, piece, 1] = value, index

        if arrived_last(counters, row, slices, last, tid):  # the row's last block: a slice per thread
            value, index, mass = float32(-1.0), int64(vocab), int64(0)
            for s in range(tid, slices, THREADS):
                mass = mass | part_mass[row, s]
                if better(part_value[row, s, 0], part_index[row, s, 0], value, index):
                    value, index = part_value[row, s, 0], part_index[row, s, 0]
            value, index, mass = _block_best(value, index, mass, best_value, best_index, flags, tid)
            if n < k and mass == 0:  # the residual was zero everywhere: race over p_n itself
                value, index = float32(-1.0), int64(vocab)
                for s in range(tid, slices, THREADS):
                    if better(part_value[row, s, 1], part_index[row, s, 1], value, index):
                        value, index = part_value[row, s, 1], part_index[row, s, 1]
                index = _block_best(value, index, 0, best_value, best_index, flags, tid)[1]
            for i in range(tid, k + 1, THREADS):
                token = draft_ids[row, i] if i < n else (index if i == n else PLACEHOLDER_TOKEN_ID)
                out_ids[row, i], commit[row, i] = token, token
            if tid == 0:
                commit[row, k + 1], commit[row, k + 2] = n, passes
                if row == 0:
                    commit[draft_ids.shape[0], 0] = error_flag[0]

    return rejection_sample_kernel


_all_proposed: dict[tuple, torch.Tensor] = {}  # (batch, k, device) -> [B] int64 filled with k, never written
_partials: dict[tuple, tuple] = {}  # (batch, slices, device) -> the slices' winners (part_value, part_index, part_mass)


def rejection_sample_fused(draft_token_ids, draft_probs, target_probs, uniforms, recovered_noise,
                           bonus_noise, num_proposed=None, error_flag=None, noise_keys=None,
                           span: int | None = None, from_logits=None) -> RejectionOutput:
    """Same arguments and result as protospec.speculation.rejection.rejection_sample, in one kernel launch.
    error_flag: [1] int32 the step's device-built inputs' flag, or None; given, the result's
    commit_flagged is the commit's row with it (RejectionOutput); an ordinary launch (never a
    programmatic dependent). noise_keys [B, 2] int64: the sequences' counter keys, from
    which the kernel draws the numbers a spec step's noise block would hold (recovered_noise and
    bonus_noise then None). span: vocabulary slices a block (None: by the grid, slices.span_for; the
    same results at any span). from_logits: (settings, draft rows, target rows): draft_probs and
    target_probs hold the logits, whose probabilities are formed where they are read, the same bits
    (settings: RowSettings; each rows: stats.launch_stats' finished (row_stats [R, 2], row_index [R]),
    R = B k and B (k + 1))."""
    batch, k = draft_token_ids.shape
    check_tensor("target_probs", target_probs, torch.float32, 3, rows=batch)
    keyed = noise_keys is not None
    if keyed:
        if recovered_noise is not None or bonus_noise is not None:
            raise interop.KernelArgumentError("rejection_sample_fused: noise or noise_keys, not both")
        check_tensor("noise_keys", noise_keys, torch.int64, 2, rows=batch)
        if noise_keys.shape[1] != 2:
            raise interop.KernelArgumentError(f"rejection_sample_fused: noise_keys {tuple(noise_keys.shape)}: a "
                                              f"(low, high) key pair a row")
    elif recovered_noise is None or bonus_noise is None:
        raise interop.KernelArgumentError("rejection_sample_fused: recovered_noise and bonus_noise are tensors, "
                                          "not None (or noise_keys given)")
    vocab, device = target_probs.shape[-1], draft_token_ids.device
    recovered_noise, bonus_noise, num_proposed, flag = _checked_inputs(
        draft_token_ids, draft_probs, uniforms, recovered_noise, bonus_noise, num_proposed, error_flag, vocab)
    if keyed:
        recovered_noise, bonus_noise = noise_keys, placeholder(torch.float32, 2, device)
    if target_probs.shape != (batch, k + 1, vocab):
        raise interop.KernelArgumentError(f"rejection_sample_fused: shapes do not fit B={batch}, k={k}: target_probs "
                                          f"{tuple(target_probs.shape)}")
    # A call's outputs, new tensors each call (a captured graph keeps its own)
    out_ids = torch.empty(batch, k + 1, dtype=torch.int64, device=device)      # [B, k + 1]
    num_accepted = torch.empty(batch, dtype=torch.int64, device=device)        # [B]
    masks = torch.empty(2, batch, k, dtype=torch.bool, device=device)          # [2, B, k] accepted, passed
    commit = torch.empty(batch + 1, k + 3, dtype=torch.int64, device=device)   # [B + 1, k + 3] the rows, the flag
    span = span or span_for(batch, vocab, interop.sm_count(device))
    slices = span_groups(vocab, span)
    key = (batch, slices, device)
    if key not in _partials:  # written and read inside one launch: one set serves every call
        _partials[key] = (torch.empty(batch, slices, 2, dtype=torch.float32, device=device),
                          torch.empty(batch, slices, 2, dtype=torch.int64, device=device),
                          torch.empty(batch, slices, dtype=torch.int32, device=device))
    if from_logits is not None:
        settings, (draft_stats, draft_index), (target_stats, target_index) = from_logits
        for name, t, dtype, ndim, count in (
                ("temperature", settings.temperature, torch.float32, 1, batch), ("is_greedy", settings.is_greedy,
                torch.bool, 1, batch), ("draft row_stats", draft_stats, torch.float32, 2, batch * k), ("draft row_index",
                draft_index, torch.int64, 1, batch * k), ("target row_stats", target_stats, torch.float32, 2,
                batch * (k + 1)), ("target row_index", target_index, torch.int64, 1, batch * (k + 1))):
            check_tensor(name, t, dtype, ndim, rows=count)
        rows = [draft_stats.view(batch, k, 2), draft_index.view(batch, k), target_stats.view(batch, k + 1, 2),
                target_index.view(batch, k + 1)]
        rows = [settings.temperature, settings.is_greedy] + rows
    else:
        rows = [placeholder(torch.float32, 1, device), placeholder(torch.bool, 1, device)] + [
            placeholder(dtype, ndim, device) for dtype, ndim in ((torch.float32, 3), (torch.int64, 2)) * 2]
    args = [draft_token_ids, draft_probs, target_probs, uniforms, recovered_noise, bonus_noise, num_proposed,
            out_ids, num_accepted, masks[0], masks[1], commit, *_partials[key],
            arrival_counters(device, batch, "rejection"), flag, *rows]
    interop.launch_tensors(_kernel(keyed, span, from_logits is not None), batch * slices, THREADS, args)
    flagged = commit.view(-1)[: batch * (k + 3) + 1] if error_flag is not None else None
    return RejectionOutput(out_ids, num_accepted, masks[0], masks[1], commit_columns=commit[:batch],
                           commit_flagged=flagged)


def _checked_inputs(draft_token_ids, draft_probs, uniforms, recovered_noise, bonus_noise, num_proposed, error_flag,
                    vocab) -> tuple:
    """The draft-side inputs checked against B, k and V (a KernelArgumentError that names the first
    misfit): (recovered_noise, bonus_noise contiguous, num_proposed, the error flag), the last two made
    where not given (k for every row; a zero flag). Both noises None: the keyed form, its keys checked
    by the caller."""
    batch, k = draft_token_ids.shape
    keyed = recovered_noise is None and bonus_noise is None
    tensors = [("draft_token_ids", draft_token_ids, torch.int64, 2), ("draft_probs", draft_probs, torch.float32, 3),
               ("uniforms", uniforms, torch.float32, 2)]
    if not keyed:  # slices of the spec step's noise block are contiguous at batch 1; copy them otherwise
        recovered_noise, bonus_noise = recovered_noise.contiguous(), bonus_noise.contiguous()
        tensors += [("recovered_noise", recovered_noise, torch.float32, 3), ("bonus_noise", bonus_noise, torch.float32, 2)]
    for name, t, dtype, ndim in tensors:
        check_tensor(name, t, dtype, ndim, rows=batch)
    if draft_probs.shape != (batch, k, vocab) or uniforms.shape != (batch, k) or not keyed and (
            recovered_noise.shape != (batch, k, vocab) or bonus_noise.shape != (batch, vocab)):
        noise = "" if keyed else (f", recovered_noise {tuple(recovered_noise.shape)}, "
                                  f"bonus_noise {tuple(bonus_noise.shape)}")
        raise interop.KernelArgumentError(
            f"rejection_sample_fused: shapes do not fit B={batch}, k={k}, V={vocab}: draft_probs {tuple(draft_probs.shape)}, "
            f"uniforms {tuple(uniforms.shape)}{noise}")
    device = draft_token_ids.device
    if num_proposed is None:
        key = (batch, k, device)
        if key not in _all_proposed:
            _all_proposed[key] = torch.full((batch,), k, dtype=torch.int64, device=device)
        num_proposed = _all_proposed[key]
    check_tensor("num_proposed", num_proposed, torch.int64, 1, rows=batch)
    flag = error_flag if error_flag is not None else _no_flag(device)
    check_tensor("error_flag", flag, torch.int32, 1, rows=1)
    return recovered_noise, bonus_noise, num_proposed, flag


_no_flags: dict = {}  # device -> [1] int32 zero: the flag of a call that was given none (never written)


def _no_flag(device) -> torch.Tensor:
    if device not in _no_flags:
        _no_flags[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return _no_flags[device]

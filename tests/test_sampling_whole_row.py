"""The one-launch sampler whose blocks each read their whole row (sampling.LAUNCHES = "whole_row",
kernels/sampling_whole_row.py) against the torch sampler: the same ids, probabilities to float32
rounding, greedy rows one-hot at the first max, masked stretches and all -inf rows, the draft and the
verify layouts, several blocks a row; rows that are not whole 16-byte words keep the two launches.
Simulator on CPU (narrow blocks and slices), the GPU where there is one."""
import pytest
import torch

from protospec.kernels import dependent_launch, sampling, sampling_whole_row
from protospec.kernels.interop import KERNEL_DEVICE_TYPE
from protospec.spec.sampler import compute_probs, exponential_noise, sample
from test_sampling_kernel import _narrow_slices, _tensors

DEV = KERNEL_DEVICE_TYPE


def _whole_row(monkeypatch, dependent=False) -> int:
    """The form switched on (narrow in the simulator); a vocabulary of three slices, the last one cut."""
    _narrow_slices(monkeypatch)
    monkeypatch.setattr(sampling, "LAUNCHES", "whole_row")
    monkeypatch.setattr(dependent_launch, "STEP_KERNELS", dependent)
    return 3 * sampling_whole_row.WHOLE_ROW_SLICE - 8


@pytest.mark.parametrize("dependent", [False, True])
def test_draft_step_sample_matches_the_torch_sampler(monkeypatch, launched_kernels, dependent):
    vocab = _whole_row(monkeypatch, dependent)
    temperatures, k, step = [0.7, 0.0, 1.3, 1.0], 3, 1
    batch = len(temperatures)
    st = _tensors(temperatures, vocab)
    raw = torch.randn(batch, vocab, generator=torch.Generator().manual_seed(21)) * 4
    raw[0, : vocab // 2] = -float("inf")    # a masked stretch over whole slices
    raw[3, 5] = raw[3].max() + 30.0         # a sampled row that is nearly one-hot
    logits = raw.to(DEV)
    noise = exponential_noise((2 * k + 1, vocab), st.generators, DEV)[:, :k].contiguous()  # [B, k, V]
    ref_ids, ref_probs = sample(logits, st, noise[:, step])
    for _ in range(2):  # the arrival counters are back at zero between calls
        ids = torch.full((batch, k), -7, dtype=torch.int64, device=DEV)
        probs = torch.zeros(batch, k, vocab, device=DEV)
        mirror = torch.full((batch + 1,), -7, dtype=torch.int64, device=DEV)
        sampling.sample_into(logits, st, step, probs, ids, noise, mirror, dependent=dependent)
        assert ids[:, step].tolist() == ref_ids.tolist() == mirror[:batch].tolist()
        assert mirror[batch].item() == -7 and (ids[:, [0, 2]] == -7).all() and probs[:, [0, 2]].abs().sum() == 0
        torch.testing.assert_close(probs[:, step], ref_probs, atol=1e-6, rtol=1e-5)
        assert probs[1, step, logits[1].argmax()] == 1 and probs[1, step].sum() == 1  # greedy: one-hot
        assert (probs[0, step, : vocab // 2] == 0).all() and torch.isfinite(probs).all()
    assert launched_kernels == ["probs_whole_row_kernel"] * 2


def test_verify_probabilities_follow_each_sequences_temperature(monkeypatch, launched_kernels):
    vocab = _whole_row(monkeypatch)
    rows_per_seq = 3
    st = _tensors([0.5, 0.0], vocab)
    logits = (torch.randn(2 * rows_per_seq, vocab, generator=torch.Generator().manual_seed(22)) * 3).to(DEV)
    got = sampling.probs_into(logits, st, torch.empty_like(logits), rows_per_seq)
    torch.testing.assert_close(got, compute_probs(logits, st, rows_per_seq=rows_per_seq), atol=1e-6, rtol=1e-5)
    assert launched_kernels == ["probs_whole_row_kernel"]


def test_ties_go_to_the_lowest_index_and_rows_of_minus_infinity_to_zero(monkeypatch):
    """Greedy rows: equal maxima in different slices, in one thread's 16-byte word and in two threads'
    words pick the lowest index (torch.argmax's rule); a row of -inf picks 0 with a one-hot at 0."""
    vocab = _whole_row(monkeypatch)
    st = _tensors([0.0, 0.0, 0.0, 0.0], vocab)
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(23))
    logits[0, [9, vocab - 3]] = 50.0        # different slices
    logits[1, [13, 14]] = 50.0              # one 16-byte word
    logits[2, [vocab - 1, 4]] = 50.0        # the last entry and an early one
    logits[3] = -float("inf")
    logits = logits.to(DEV)
    ids = torch.full((4, 1), -7, dtype=torch.int64, device=DEV)
    probs = torch.zeros(4, 1, vocab, device=DEV)
    sampling.sample_into(logits, st, 0, probs, ids, None)
    assert ids[:, 0].tolist() == [9, 13, 4, 0] == logits.argmax(-1).tolist()
    assert (probs[:, 0].sum(-1) == 1).all() and probs[3, 0, 0] == 1


def test_rows_that_are_not_whole_words_keep_the_two_launches(monkeypatch, launched_kernels):
    vocab = _whole_row(monkeypatch) - 2     # not a multiple of 4 entries
    st = _tensors([0.9], vocab)
    logits = (torch.randn(1, vocab, generator=torch.Generator().manual_seed(24)) * 2).to(DEV)
    noise = exponential_noise((3, vocab), st.generators, DEV)[:, :1].contiguous()
    ids = torch.zeros(1, 1, dtype=torch.int64, device=DEV)
    probs = torch.zeros(1, 1, vocab, device=DEV)
    sampling.sample_into(logits, st, 0, probs, ids, noise)
    ref_ids, ref_probs = sample(logits, st, noise[:, 0])
    assert ids[:, 0].tolist() == ref_ids.tolist() and not sampling_whole_row.applies(logits)
    torch.testing.assert_close(probs[:, 0], ref_probs, atol=1e-6, rtol=1e-5)
    assert launched_kernels == ["row_stats_kernel", "probs_and_sample_kernel"]

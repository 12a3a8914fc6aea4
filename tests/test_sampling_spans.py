"""A sampling block taking several vocabulary slices (a span) gives the bits of a block a slice: the
slices' statistics, the probabilities, the samples (the rejection kernel's spans: test_rejection_kernel.py).
Simulator on CPU (its narrow blocks and 128-entry slices), the GPU where there is one; spans that cut the
row unevenly."""
import pytest
import torch

from protospec.config import SamplingParams
from protospec.kernels.launch.interop import KERNEL_DEVICE_TYPE, SIMULATOR
from protospec.kernels.sampling import gumbel_sample, slices
from protospec.kernels.sampling.softmax_sample import probs_into, sample_into
from protospec.kernels.sampling.stats import launch_stats
from protospec.speculation.sampler import SamplingTensors, exponential_noise

DEV = KERNEL_DEVICE_TYPE
# Spans of several slices that cut the row unevenly (5 slices: 2 + 2 + 1, 4 + 1). The simulator, where
# each span's case costs 10-20 s, takes the span of 4 alone; a GPU takes both.
SPANS = (1, 4) if SIMULATOR else (1, 2, 4)


def _case(temperatures, slices_per_row=5, seed=0):
    """Rows at the given temperatures (0: greedy) over slices_per_row slices, the last one ragged; row 0
    masked over its first slice and part of the second; a greedy row's max in the last slice."""
    vocab = slices_per_row * slices.VOCAB_PER_BLOCK - 37
    params = [SamplingParams(temperature=t) for t in temperatures]
    st = SamplingTensors.build(params, [torch.Generator(device=DEV).manual_seed(i) for i in range(len(params))],
                               vocab, DEV)
    logits = torch.randn(len(params), vocab, generator=torch.Generator().manual_seed(seed)) * 3
    logits[0, : slices.VOCAB_PER_BLOCK + 5] = -float("inf")
    logits[-1, vocab - 2] = 30.0
    return st, logits.to(DEV), vocab


def test_the_span_grows_with_the_grid_and_keeps_it_filled():
    sms, vocab = 132, 63 * slices.VOCAB_PER_BLOCK
    resident = slices.RESIDENT_BLOCKS * sms
    assert slices.span_for(6, vocab, sms) == 1  # batch 1's verify: a block a slice
    assert slices.span_for(16, vocab, sms) == 1  # 1,008 blocks: not yet one wave of resident blocks
    assert slices.span_for(64, vocab, sms) == 4
    assert slices.span_for(384, vocab, sms) == slices.MAX_SPAN
    spans = [slices.span_for(rows, vocab, sms) for rows in range(1, 2000, 7)]
    assert spans == sorted(spans) and max(spans) == slices.MAX_SPAN
    for rows, span in zip(range(1, 2000, 7), spans):
        if span > 1:  # at least half a wave of resident blocks after the last doubling
            assert 2 * rows * slices.span_groups(vocab, span) >= resident


def test_each_slices_statistics_are_its_max_first_index_and_softmax_sum():
    """Against float64 on the host: a masked slice (no max: index V, sum 0), a partly masked one, ties
    (the first index wins), a greedy row (sum 0), the ragged last slice."""
    st, logits, vocab = _case([0.7, 1.3, 0.0])
    logits[1, 300:304] = 25.0  # a four-way tie for row 1's max in its third slice
    part_max, part_index, part_sum = (t.cpu() for t in launch_stats(logits, st, 1, "", False))
    x = logits.cpu().double()
    per = slices.VOCAB_PER_BLOCK
    for row, temperature in enumerate([0.7, 1.3, 0.0]):
        for s in range(part_max.shape[1]):
            piece = x[row, s * per: (s + 1) * per]
            top = piece.max()
            if top == -float("inf"):
                assert part_max[row, s] == top and part_index[row, s] == vocab and part_sum[row, s] == 0
                continue
            first = s * per + int((piece == top).nonzero()[0])
            assert part_max[row, s] == top and part_index[row, s] == first
            expected = 0.0 if temperature == 0 else float(((piece - top) / temperature).exp().sum())
            assert abs(float(part_sum[row, s]) - expected) <= 1e-5 * max(expected, 1.0)
    assert part_index[1, 300 // per] == 300


@pytest.mark.parametrize("span", SPANS[1:])
def test_probabilities_have_the_same_bits_at_any_span(span):
    st, logits, vocab = _case([0.7, 1.3, 0.0])
    probs = probs_into(logits, st, torch.empty_like(logits), span=1)
    assert torch.equal(probs_into(logits, st, torch.empty_like(logits), span=span), probs)
    assert probs[2, vocab - 2] == 1 and probs[0, : slices.VOCAB_PER_BLOCK].abs().sum() == 0


@pytest.mark.parametrize("span", SPANS[1:])
def test_samples_are_the_same_at_any_span(span):
    st, logits, vocab = _case([0.7, 1.3, 0.0], seed=1)
    k, step = 2, 1
    noise = exponential_noise((2 * k + 1, vocab), st.generators, DEV)[:, :k].contiguous()
    got = []
    for s in (1, span):
        ids = torch.full((3, k), -7, dtype=torch.int64, device=DEV)
        probs = torch.zeros(3, k, vocab, device=DEV)
        sample_into(logits, st, step, probs, ids, noise, span=s)
        gumbel_ids = torch.full((3, k), -7, dtype=torch.int64, device=DEV)
        gumbel_sample.gumbel_sample_into(logits, st, step, gumbel_ids, noise, span=s)
        got.append((ids[:, step].tolist(), probs, gumbel_ids[:, step].tolist()))
    assert got[0][0] == got[1][0] and got[0][0][2] == vocab - 2
    assert torch.equal(got[0][1], got[1][1])
    reference = gumbel_sample.gumbel_reference(logits, st.temperature, st.is_greedy, noise[:, step])
    assert got[0][2] == got[1][2] == reference.tolist()

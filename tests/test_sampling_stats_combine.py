"""The row statistics combined by every block of the probabilities kernel (sampling.STATS_COMBINE =
"every_block") against the statistics kernel's last block combining them (the default): the same
function on the same partials, so the same probabilities and ids bit for bit, in both forms of the
probabilities kernel (loads after and before its wait), sampled and greedy rows, a masked stretch, a
greedy row of -inf, the draft and the verify layouts, twice in a row (the arrival counters back at
zero). Simulator on CPU, the GPU where there is one."""
import pytest
import torch

from protospec.kernels import dependent_launch, sampling
from protospec.kernels.interop import KERNEL_DEVICE_TYPE
from protospec.spec.sampler import exponential_noise, sample
from test_sampling_kernel import _narrow_slices, _tensors

DEV = KERNEL_DEVICE_TYPE


@pytest.mark.parametrize("prefetch", [False, True], ids=["loads_after_wait", "loads_before_wait"])
@pytest.mark.parametrize("rows_per_seq", [1, 3], ids=["draft", "verify"])
def test_every_block_combining_gives_the_last_blocks_bits(monkeypatch, prefetch, rows_per_seq):
    slice_width = _narrow_slices(monkeypatch)
    launched, launch = [], sampling.interop.launch_tensors

    def recording(kernel, grid, block, args, dependent=False):
        launched.append(kernel)
        launch(kernel, grid, block, args, dependent)

    monkeypatch.setattr(sampling.interop, "launch_tensors", recording)
    monkeypatch.setattr(dependent_launch, "STEP_KERNELS", True)
    monkeypatch.setattr(sampling, "PROBS_PREFETCH", prefetch)
    batch, k, step = 3, 2, 1
    vocab = 3 * slice_width - 5
    st = _tensors([0.7, 0.0, 1.3], vocab)
    rows = batch * rows_per_seq
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(31)) * 4
    logits[0, : slice_width + 2] = -float("inf")   # a whole slice and part of the next
    logits[rows_per_seq] = -float("inf")           # the greedy sequence's first row: its id is 0
    logits = logits.to(DEV)
    noise = exponential_noise((2 * k + 1, vocab), st.generators, DEV)[:, :k].contiguous()  # [B, k, V]
    out = {}
    for form, calls in (("last_block", 1), ("every_block", 2)):
        monkeypatch.setattr(sampling, "STATS_COMBINE", form)
        for _ in range(calls):
            ids = torch.full((rows, k), -7, dtype=torch.int64, device=DEV)
            if rows_per_seq == 1:
                probs = torch.zeros(rows, k, vocab, device=DEV)
                sampling.sample_into(logits, st, step, probs, ids, noise, dependent=True)
            else:  # the verify's layout: probabilities only
                probs = sampling.probs_into(logits, st, torch.zeros(rows, vocab, device=DEV), rows_per_seq,
                                            dependent=True)
            out[form] = (ids.cpu(), probs.cpu())
    assert torch.equal(out["every_block"][0], out["last_block"][0])
    assert torch.equal(out["every_block"][1], out["last_block"][1])
    if rows_per_seq == 1:  # and both are the torch sampler's
        ref_ids, ref_probs = sample(logits, st, noise[:, step])
        assert out["every_block"][0][:, step].tolist() == ref_ids.tolist() and ref_ids[1] == 0
        torch.testing.assert_close(out["every_block"][1][:, step], ref_probs.cpu(), atol=1e-6, rtol=1e-5)
    # the statistics and probabilities kernels of each form (built with and without the combine)
    assert launched == list(sampling._kernels(True, prefetch, False)[:2]) + list(sampling._kernels(True, prefetch, True)[:2]) * 2
    counters = sampling.arrival_counters(logits.device, rows, "sampling")
    assert not counters.any()  # every count back at zero for the next call or replay


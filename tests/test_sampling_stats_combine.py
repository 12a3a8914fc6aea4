"""The row statistics combined by every block of the probabilities kernel (sampling.STATS_COMBINE =
"every_block", the default) against the statistics kernel's last block combining them: the same
function on the same partials, so the same probabilities and ids bit for bit, in both forms of the
probabilities kernel (loads after and before its wait), sampled and greedy rows, a masked stretch, a
greedy row of -inf, the draft and the verify layouts, twice in a row (the arrival counters back at
zero). Simulator on CPU, the GPU where there is one."""
import pytest
import torch

from protospec.kernels import dependent_launch, sampling
from protospec.kernels.interop import KERNEL_DEVICE_TYPE
from protospec.spec.sampler import sample
from test_sampling_kernel import _narrow_slices, mixed_case, sample_layout

DEV = KERNEL_DEVICE_TYPE


# Each form of the probabilities kernel once, in one layout each (the simulator takes ~20 s a case).
@pytest.mark.parametrize("prefetch,rows_per_seq", [(True, 1), (False, 3)],
                         ids=["loads_before_wait-draft", "loads_after_wait-verify"])
def test_every_block_combining_gives_the_last_blocks_bits(monkeypatch, prefetch, rows_per_seq):
    st, logits, noise = mixed_case(3, rows_per_seq, _narrow_slices(monkeypatch), seed=31)
    launched, launch = [], sampling.interop.launch_tensors

    def recording(kernel, grid, block, args, dependent=False):
        launched.append(kernel)
        launch(kernel, grid, block, args, dependent)

    monkeypatch.setattr(sampling.interop, "launch_tensors", recording)
    monkeypatch.setattr(dependent_launch, "STEP_KERNELS", True)
    monkeypatch.setattr(sampling, "PROBS_PREFETCH", prefetch)
    step, out = 1, {}
    for form, calls in (("last_block", 1), ("every_block", 2)):
        monkeypatch.setattr(sampling, "STATS_COMBINE", form)
        for _ in range(calls):
            out[form] = sample_layout(logits, st, step, noise, rows_per_seq, dependent=True)
    assert torch.equal(out["every_block"][0], out["last_block"][0])
    assert torch.equal(out["every_block"][1], out["last_block"][1])
    if rows_per_seq == 1:  # and both are the torch sampler's
        ref_ids, ref_probs = sample(logits, st, noise[:, step])
        assert out["every_block"][0][:, step].tolist() == ref_ids.tolist() and ref_ids[1] == 0
        torch.testing.assert_close(out["every_block"][1][:, step], ref_probs.cpu(), atol=1e-6, rtol=1e-5)
    # the statistics and probabilities kernels of each form (built with and without the combine)
    assert launched == list(sampling._kernels(True, prefetch, False)[:2]) + list(sampling._kernels(True, prefetch, True)[:2]) * 2
    counters = sampling.arrival_counters(logits.device, logits.shape[0], "sampling")
    assert not counters.any()  # every count back at zero for the next call or replay


"""The draft step's advance done by the probabilities kernel (kernels/sampling/advance.py) against the
sample followed by the advance_step kernel: the same ids and probabilities, and the same decode inputs
(tokens, positions, lengths, slots), padding rows and a position past its block table included; the
advance kernel is not launched when the sampler does its work. Simulator on CPU, the GPU where there is one."""
import pytest
import torch

from protospec.errors import KernelArgumentError
from protospec.kernels.sampling import softmax_sample as sampling
from protospec.kernels.inputs.advance_step import AdvanceStepLauncher
from protospec.kernels.launch.interop import KERNEL_DEVICE_TYPE
from protospec.layout import NULL_BLOCK, PAD_SLOT_ID
from protospec.speculation.sampler import exponential_noise
from test_advance_step import NAMES, make_batch
from test_sampling_kernel import _narrow_slices, _tensors

DEV = torch.device(KERNEL_DEVICE_TYPE)
BLOCK_SIZE = 4


class CountingAdvance:
    """An AdvanceStepLauncher that counts its own launches (the sampler must not call it)."""

    def __init__(self, launcher: AdvanceStepLauncher):
        self.launcher, self.calls = launcher, 0
        self.num_rows, self.row_args = launcher.num_rows, launcher.row_args

    def __call__(self) -> None:
        self.calls += 1
        self.launcher()


def _decode_buffers(rows: int):
    """A batch of `rows` decode rows padded to rows + 2 (the buffers' own width): two real rows, one
    of them at a position past its block table, the rest padding."""
    t = make_batch(2, rows + 2, BLOCK_SIZE, [5, 9], seed=3)
    t["block_tables"][1, 2:] = NULL_BLOCK  # row 1's position 9 needs block index 2
    return t


@pytest.mark.parametrize("dependent", [False, True], ids=["plain", "dependent"])
def test_the_sampler_advances_the_rows_as_the_advance_kernel_does(monkeypatch, dependent):
    slice_width = _narrow_slices(monkeypatch)
    rows, k, step, vocab = 3, 3, 1, 2 * slice_width + 5
    st = _tensors([1.0, 0.0, 1.0], vocab)
    raw = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(5)) * 3
    noise = exponential_noise((2 * k + 1, vocab), st.generators, DEV)[:, :k].contiguous()  # [B, k, V]
    out = {}
    for folded in (False, True):  # the reference: the sample into the advance's mirror, then its kernel
        logits = raw.to(DEV)
        t = _decode_buffers(rows)
        advance = CountingAdvance(AdvanceStepLauncher(BLOCK_SIZE, *(t[n] for n in NAMES), dependent=dependent))
        ids = torch.full((rows, k), -7, dtype=torch.int64, device=DEV)
        probs = torch.zeros(rows, k, vocab, device=DEV)
        sampling.sample_into(logits, st, step, probs, ids, noise, t["sampled_ids"], dependent,
                             advance if folded else None)
        if not folded:
            advance()
        assert advance.calls == (0 if folded else 1)
        out[folded] = (ids.cpu(), probs.cpu(), {n: t[n].cpu() for n in NAMES})
    (ids, probs, inputs), (fold_ids, fold_probs, fold_inputs) = out[False], out[True]
    assert torch.equal(fold_ids, ids) and torch.equal(fold_probs, probs)
    for name in ("input_ids", "positions", "seq_lens", "slot_mapping", "error_row"):
        assert torch.equal(fold_inputs[name][:rows], inputs[name][:rows]), name
    assert fold_inputs["input_ids"][:2].tolist() == fold_ids[:2, step].tolist()  # the sampled tokens themselves
    assert fold_inputs["positions"][:2].tolist() == [5, 9] and fold_inputs["seq_lens"][:2].tolist() == [6, 10]
    assert fold_inputs["slot_mapping"][1:rows].tolist() == [PAD_SLOT_ID] * (rows - 1)  # row 1 flagged, row 2 padding
    assert fold_inputs["error_row"].item() == 2
    # rows past the ones sampled are the graph's own padding, untouched by the sampler
    assert fold_inputs["input_ids"][rows:].tolist() == [-7, -7]


def test_an_advance_over_fewer_rows_than_the_sample_is_refused():
    st = _tensors([1.0, 1.0, 1.0], 40)
    t = make_batch(1, 2, BLOCK_SIZE, [3], seed=0)
    advance = AdvanceStepLauncher(BLOCK_SIZE, *(t[n] for n in NAMES))
    with pytest.raises(KernelArgumentError, match="3 rows to sample, but the inputs to advance hold 2"):
        sampling.sample_into(torch.zeros(3, 40, device=DEV), st, 0, torch.zeros(3, 2, 40, device=DEV),
                             torch.zeros(3, 2, dtype=torch.int64, device=DEV), None, None, False, advance)

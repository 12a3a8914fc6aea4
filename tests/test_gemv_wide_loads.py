"""The tensor-core GEMV's weights loaded 16 bytes at a time (gemv_mma.WIDE_WEIGHT_LOADS): the same
words reach the same products, so every form gives the same bits as with 8-byte loads."""
import pytest
import torch

from protospec.kernels import gemv_mma as kernel
from protospec.kernels.interop import KERNEL_DEVICE_TYPE

DEV = torch.device(KERNEL_DEVICE_TYPE)


@pytest.mark.parametrize("form", ["plain", "glu_normed"])
def test_wide_weight_loads_give_the_same_bits(form, monkeypatch, launched_kernels):
    gen = torch.Generator().manual_seed(17)
    k, tokens = kernel.COLUMNS_PER_WARP * (2 if form == "plain" else 1), 3
    x = torch.randn(tokens, k, generator=gen).half().to(DEV)
    w = (torch.randn(34, k, generator=gen) / k ** 0.5).half().to(DEV)  # a tile past N's end (rows clamp)
    args = {} if form == "plain" else dict(norm_weight=(1 + 0.3 * torch.randn(k, generator=gen)).half().to(DEV),
                                           residual=torch.randn(tokens, k, generator=gen).half().to(DEV), glu=True)
    monkeypatch.setattr(kernel, "PIN_WEIGHT_LOADS", False)
    out = {}
    for wide in (False, True):
        monkeypatch.setattr(kernel, "WIDE_WEIGHT_LOADS", wide)
        out[wide] = kernel.gemv_mma(x, w, **args)
        assert launched_kernels[-1].endswith("_w16") is wide
    for narrow, wide in zip(*(o if isinstance(o, tuple) else (o,) for o in (out[False], out[True]))):
        assert torch.equal(narrow, wide)
    want = kernel.gemv_mma_reference(x, w, **args)
    got, want = (out[True][0], want[0]) if form != "plain" else (out[True], want)
    torch.testing.assert_close(got.float(), want.float(), atol=3e-3, rtol=3e-3)

"""The tensor-core GEMV loads its weights 16 bytes at a time where their data is 16-byte aligned, 8
bytes at a time where it is not (a weight viewed from an odd word of a larger tensor): the same words
reach the same products, so both give the same bits."""
import pytest
import torch

from protospec.kernels.linear import gemv_mma as kernel
from protospec.kernels.launch.interop import KERNEL_DEVICE_TYPE

DEV = torch.device(KERNEL_DEVICE_TYPE)


@pytest.mark.parametrize("form", ["plain", "glu_normed"])
def test_wide_and_narrow_weight_loads_give_the_same_bits(form, launched_kernels):
    gen = torch.Generator().manual_seed(17)
    k, tokens = kernel.COLUMNS_PER_WARP * (2 if form == "plain" else 1), 3
    x = torch.randn(tokens, k, generator=gen).half().to(DEV)
    w = (torch.randn(34, k, generator=gen) / k ** 0.5).half().to(DEV)  # a tile past N's end (rows clamp)
    unaligned = torch.empty(w.numel() + 4, dtype=torch.float16, device=DEV)[4:].view(w.shape)  # 8 bytes past 16
    unaligned.copy_(w)
    assert w.data_ptr() % 16 == 0 and unaligned.data_ptr() % 16 == 8
    args = {} if form == "plain" else dict(norm_weight=(1 + 0.3 * torch.randn(k, generator=gen)).half().to(DEV),
                                           residual=torch.randn(tokens, k, generator=gen).half().to(DEV), glu=True)
    wide = kernel.gemv_mma(x, w, **args)
    assert launched_kernels[-1].endswith("_w16")
    narrow = kernel.gemv_mma(x, unaligned, **args)
    assert not launched_kernels[-1].endswith("_w16")
    for a, b in zip(*(o if isinstance(o, tuple) else (o,) for o in (narrow, wide))):
        assert torch.equal(a, b)
    want = kernel.gemv_mma_reference(x, w, **args)
    got, want = (wide[0], want[0]) if form != "plain" else (wide, want)
    torch.testing.assert_close(got.float(), want.float(), atol=3e-3, rtol=3e-3)

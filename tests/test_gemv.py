"""The decode GEMV kernel against torch's linear: ragged row counts, several token rows, both activation dtypes."""
import pytest
import torch

from protospec.errors import KernelArgumentError
from protospec.kernels import gemv as kernel
from protospec.kernels.interop import KERNEL_DEVICE_TYPE

DEV = torch.device(KERNEL_DEVICE_TYPE)


@pytest.mark.parametrize("words", [False, True], ids=["halves", "words"])
@pytest.mark.parametrize("tokens,n,rows,dtype", [(1, 5, 1, torch.float32), (3, 7, 2, torch.float16), (2, 9, 4, torch.float32)])
def test_gemv_matches_torch_linear(tokens, n, rows, dtype, words):
    """Rows per warp that do not divide N (the last warp's extra rows are dropped, not written);
    K walked in two steps (unroll 4 columns, or 1 word of 4 columns, per lane per step)."""
    gen = torch.Generator().manual_seed(tokens * 100 + n)
    k = 2 * kernel.WARP * 4
    x = torch.randn(tokens, k, generator=gen).to(dtype).to(DEV)
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).half().to(DEV)
    expected = torch.nn.functional.linear(x.float(), w.float())
    got = kernel.gemv(x, w, rows=rows, unroll=1 if words else 4, words=words)
    assert got.shape == (tokens, n) and got.dtype == dtype
    tol = dict(atol=2e-3, rtol=2e-3) if dtype == torch.float16 else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.float(), expected, **tol)


def test_gemv_names_bad_arguments():
    x = torch.zeros(1, 256, device=DEV)
    w = torch.zeros(4, 256, dtype=torch.float16, device=DEV)
    with pytest.raises(KernelArgumentError, match="float16"):
        kernel.gemv(x, w.float())
    with pytest.raises(KernelArgumentError, match="columns"):
        kernel.gemv(torch.zeros(1, 128, device=DEV), w)
    with pytest.raises(KernelArgumentError, match="multiple of"):
        kernel.gemv(torch.zeros(1, 96, device=DEV), torch.zeros(4, 96, dtype=torch.float16, device=DEV))
    with pytest.raises(KernelArgumentError, match="multiple of 384"):  # 3 words of 4 columns x 32 lanes
        kernel.gemv(x, w, unroll=3, words=True)
    with pytest.raises(KernelArgumentError, match="token rows"):
        kernel.gemv(torch.zeros(kernel.MAX_TOKENS + 1, 256, device=DEV), w)
    with pytest.raises(KernelArgumentError, match="float16 or float32"):
        kernel.gemv(x.double(), w)


@pytest.mark.parametrize("words", [False, True], ids=["halves", "words"])
@pytest.mark.parametrize("tokens,dtype", [(1, torch.float16), (2, torch.float32)])
def test_the_folded_rms_norm_feeds_the_gemv_what_add_rms_norm_would(tokens, dtype, words):
    """gemv(x, W, norm_weight=g) == linear(add_rms_norm's output, W): the norm computed, scaled and
    rounded to the activation dtype as the separate kernel stores it."""
    from protospec.kernels import layer_ops

    gen = torch.Generator().manual_seed(7 + tokens)
    k, n = 2 * kernel.WARP * 4, 6
    x = (3 * torch.randn(tokens, k, generator=gen)).to(dtype).to(DEV)
    g = (1 + 0.1 * torch.randn(k, generator=gen)).to(dtype).to(DEV)
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).half().to(DEV)
    normed, _ = layer_ops.add_rms_norm(x, None, g, 1e-6, torch.arange(tokens, device=DEV))
    expected = torch.nn.functional.linear(normed.float(), w.float())
    got = kernel.gemv(x, w, rows=2, unroll=2 if words else 4, norm_weight=g, eps=1e-6, words=words)
    tol = dict(atol=2e-3, rtol=2e-3) if dtype == torch.float16 else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.float(), expected, **tol)
    unnormed = kernel.gemv(x, w, rows=2, unroll=4)  # the norm is really applied (x has rms ~3)
    assert not torch.allclose(unnormed.float(), expected, **tol)

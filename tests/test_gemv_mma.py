"""The tensor-core GEMV against torch's linear: token counts up to the product's 8 columns, output
rows that do not fill a 16-row tile, K split over one and several warps."""
import pytest
import torch

from protospec.errors import KernelArgumentError
from protospec.kernels import gemv_mma as kernel
from protospec.kernels.interop import KERNEL_DEVICE_TYPE

DEV = torch.device(KERNEL_DEVICE_TYPE)


@pytest.mark.parametrize("tokens,n,warps", [(1, 16, 1), (6, 37, 2), (8, 5, 1)])
def test_gemv_mma_matches_torch_linear(tokens, n, warps):
    gen = torch.Generator().manual_seed(tokens * 100 + n)
    k = warps * kernel.COLUMNS_PER_WARP
    x = torch.randn(tokens, k, generator=gen).half().to(DEV)
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).half().to(DEV)
    expected = torch.nn.functional.linear(x.float(), w.float())
    got = kernel.gemv_mma(x, w)
    assert got.shape == (tokens, n) and got.dtype == torch.float16
    torch.testing.assert_close(got.float(), expected, atol=3e-3, rtol=3e-3)


def test_gemv_mma_sees_every_column_once():
    """A weight that is one-hot in each column block catches a permutation that skips or repeats columns:
    row r of the output is x's column r (W = the identity on the first N columns)."""
    k, n, tokens = 2 * kernel.COLUMNS_PER_WARP, 24, 3
    x = torch.arange(tokens * k, dtype=torch.float32).remainder(997).div(64).half().view(tokens, k).to(DEV)
    for shift in (0, k - n):  # the identity on the first and on the last N columns
        w = torch.zeros(n, k, dtype=torch.float16)
        w[torch.arange(n), torch.arange(n) + shift] = 1.0
        got = kernel.gemv_mma(x, w.to(DEV))
        assert torch.equal(got.cpu(), x.cpu()[:, shift : shift + n])


@pytest.mark.parametrize("with_residual", [True, False], ids=["residual", "no_residual"])
@pytest.mark.parametrize("glu", [False, True], ids=["linear", "glu"])
def test_gemv_mma_folds_the_norm_and_the_glu(with_residual, glu):
    """The fused forms a decoder layer uses: norm (after the residual add) folded into x's loads, the
    residual stream returned as a new tensor, and silu(gate) * up computed in the epilogue."""
    gen = torch.Generator().manual_seed(7 + 2 * glu + with_residual)
    tokens, k, n = 5, 2 * kernel.COLUMNS_PER_WARP, 21
    x = torch.randn(tokens, k, generator=gen).half()
    residual = torch.randn(tokens, k, generator=gen).half() if with_residual else None
    g = (1 + 0.3 * torch.randn(k, generator=gen)).half()
    w = (torch.randn(2 * n if glu else n, k, generator=gen) / k ** 0.5).half()
    out, stream = kernel.gemv_mma_reference(x, w, norm_weight=g, residual=residual, eps=1e-6, glu=glu)
    if glu:  # the twin itself, against the layer ops' definitions: add_rms_norm, linear, silu_and_mul
        v = x.float() if residual is None else (x.float() + residual.float()).half().float()
        h = (g.float() * v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6)).half().float()
        gate_up = (h @ w.float().T).half().float()
        torch.testing.assert_close(out.float(), torch.nn.functional.silu(gate_up[:, :n]) * gate_up[:, n:],
                                   atol=2e-3, rtol=2e-3)
    got, got_stream = kernel.gemv_mma(x.to(DEV), w.to(DEV), norm_weight=g.to(DEV),
                                      residual=None if residual is None else residual.to(DEV), eps=1e-6, glu=glu)
    assert got.shape == (tokens, n) and got_stream.shape == (tokens, k)
    assert torch.equal(got_stream.cpu(), stream)  # the residual stream exactly as add_rms_norm stores it
    torch.testing.assert_close(got.float().cpu(), out.float(), atol=4e-3, rtol=4e-3)


def test_gemv_mma_names_bad_arguments():
    k = kernel.COLUMNS_PER_WARP
    w = torch.zeros(16, k, dtype=torch.float16, device=DEV)
    with pytest.raises(KernelArgumentError, match="float16"):
        kernel.gemv_mma(torch.zeros(1, k, device=DEV), w)
    with pytest.raises(KernelArgumentError, match="multiple of 192"):
        kernel.gemv_mma(torch.zeros(1, 128, dtype=torch.float16, device=DEV),
                        torch.zeros(16, 128, dtype=torch.float16, device=DEV))
    with pytest.raises(KernelArgumentError, match="token rows"):
        kernel.gemv_mma(torch.zeros(kernel.MAX_TOKENS + 1, k, dtype=torch.float16, device=DEV), w)
    with pytest.raises(KernelArgumentError, match="columns"):
        kernel.gemv_mma(torch.zeros(1, 2 * k, dtype=torch.float16, device=DEV), w)
    x = torch.zeros(2, k, dtype=torch.float16, device=DEV)
    with pytest.raises(KernelArgumentError, match="only with the norm"):
        kernel.gemv_mma(x, w, residual=x)
    with pytest.raises(KernelArgumentError, match="must match x"):
        kernel.gemv_mma(x, w, norm_weight=x[0], residual=x[:1])
    with pytest.raises(KernelArgumentError, match="even count"):
        kernel.gemv_mma(x, w[:15], glu=True)

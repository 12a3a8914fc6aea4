"""The fused forward's final norm, split between the last down projection and the LM head: the down
projection adds the residual stream and writes each 16-column tile's sum of squares a token (in
gemv_mma_norm.block_inv_rms's order), and the plain LM head, its weight times the norm's, scales each
row of logits by 1 / rms from them: no norm in the head's ~2000 blocks' prologue."""
import pytest
import torch

from protospec.errors import KernelArgumentError
from protospec.kernels.linear import gemv_mma as kernel
from protospec.kernels.launch.interop import KERNEL_DEVICE_TYPE

DEV = torch.device(KERNEL_DEVICE_TYPE)
ON_GPU_ONLY = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="minutes in the simulator")]


def _operands(seed: int, tokens: int, head_warps: int):
    """A down projection's input and weight (K over 2 warps), the residual stream, a norm weight and an
    LM head over N = the head's K (`head_warps` warps' columns), on DEV."""
    gen = torch.Generator().manual_seed(seed)
    k, n = 2 * kernel.COLUMNS_PER_WARP, head_warps * kernel.COLUMNS_PER_WARP
    x = torch.randn(tokens, k, generator=gen).half().to(DEV)
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).half().to(DEV)
    residual = (3 * torch.randn(tokens, n, generator=gen)).half().to(DEV)
    g = (1 + 0.3 * torch.randn(n, generator=gen)).half().to(DEV)
    head = (torch.randn(37, n, generator=gen) / n ** 0.5).half().to(DEV)
    return x, w, residual, g, head


@pytest.mark.parametrize("head_warps", [1, pytest.param(2, marks=ON_GPU_ONLY), pytest.param(4, marks=ON_GPU_ONLY)])
def test_the_last_down_projection_adds_the_stream_and_writes_its_tiles_squares(head_warps, launched_kernels):
    """N over one, two and four warps' columns (the models' 768): the stream is the plain product plus
    the residual as add_rms_norm stores it, bit for bit; the sums are its 16-column tiles' squares."""
    tokens = 6 if DEV.type == "cuda" else 3
    x, w, residual, g, head = _operands(41 + head_warps, tokens, head_warps)
    y = kernel.gemv_mma(x, w, dependent_launch=True)
    stream, squares = kernel.gemv_mma(x, w, dependent_launch=True, allow_early=True, residual_squares=residual)
    assert torch.equal(stream, (y.float() + residual.float()).half())
    assert launched_kernels[-1] == f"gemv_mma_k{2 * 192}_dep_early_squares_w16"
    want_stream, want_squares = kernel.gemv_mma_reference(x, w, residual_squares=residual)
    assert squares.shape == (tokens, 12 * head_warps)
    torch.testing.assert_close(squares, stream.float().pow(2).view(tokens, -1, 16).sum(-1), atol=1e-3, rtol=1e-5)
    torch.testing.assert_close(stream.float(), want_stream.float(), atol=1e-2, rtol=3e-3)
    torch.testing.assert_close(squares, want_squares, atol=0.2, rtol=3e-3)


def test_the_folded_head_scales_the_plain_products_by_the_rows_norm(launched_kernels):
    """The plain LM head over the stream with the norm's weight folded into its rows, each logit row
    scaled by 1 / rms from the sums of squares: the normed head's logits (the norm in its loads) to
    float16 rounding, not its bits, and the twin's."""
    x, w, residual, g, head = _operands(7, 3, 1)
    rows = torch.tensor([2, 0], device=DEV)
    stream, squares = kernel.gemv_mma(x, w, residual_squares=residual)
    folded = (head * g).contiguous()
    got = kernel.gemv_mma(stream, folded, eps=1e-6, x_rows=rows, row_squares=squares, out_dtype=torch.float32,
                          dependent_launch=True)
    assert launched_kernels[-1] == "gemv_mma_k192_gather_dep_pin_scaled_w16_f32" and got.shape == (2, 37)
    normed, _ = kernel.gemv_mma(stream, head, g, None, 1e-6, x_rows=rows, out_dtype=torch.float32)
    torch.testing.assert_close(got, normed, atol=3e-3, rtol=3e-3)
    want = kernel.gemv_mma_reference(stream, folded, eps=1e-6, x_rows=rows, row_squares=squares, out_dtype=torch.float32)
    torch.testing.assert_close(got, want, atol=3e-3, rtol=3e-3)
    unscaled = kernel.gemv_mma(stream, folded, x_rows=rows, out_dtype=torch.float32)
    assert not torch.allclose(unscaled, got, atol=3e-2)  # the scale is applied (the stream's rms is far from 1)


def test_the_squares_name_bad_arguments():
    x, w, residual, g, head = _operands(3, 2, 1)
    stream, squares = kernel.gemv_mma_reference(x, w, residual_squares=residual)
    with pytest.raises(KernelArgumentError, match="residual_squares takes the plain float16 form"):
        kernel.gemv_mma(x, w, out_dtype=torch.float32, residual_squares=residual)
    with pytest.raises(KernelArgumentError, match="multiple of 16"):
        kernel.gemv_mma(x, w[:40], residual_squares=residual[:, :40].contiguous())
    with pytest.raises(KernelArgumentError, match=r"residual_squares \(1, 192\) must match y"):
        kernel.gemv_mma(x, w, residual_squares=residual[:1])
    with pytest.raises(KernelArgumentError, match="residual_squares: dtype"):
        kernel.gemv_mma(x, w, residual_squares=residual.float())
    with pytest.raises(KernelArgumentError, match="row_squares takes the plain form"):
        kernel.gemv_mma(stream, head, g, None, 1e-6, row_squares=squares)
    with pytest.raises(KernelArgumentError, match="row_squares takes the plain form"):
        kernel.gemv_mma(stream, torch.cat([head, head]), glu=True, row_squares=squares)
    with pytest.raises(KernelArgumentError, match="row_squares takes the plain form"):
        kernel.gemv_mma(x, w, residual_squares=residual, row_squares=squares)
    with pytest.raises(KernelArgumentError, match=r"row_squares \(2, 6\) must be x's rows by its 16-column tiles"):
        kernel.gemv_mma(stream, head, row_squares=squares[:, :6].contiguous())
    with pytest.raises(KernelArgumentError, match="row_squares: dtype"):
        kernel.gemv_mma(stream, head, row_squares=squares.half())

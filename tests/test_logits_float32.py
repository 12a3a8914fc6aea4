"""The LM head hands the sampler float32 logits straight from the accumulator: two logits closer than
half precision's step must stay apart, or greedy decoding takes the lower token id instead of the
model's choice (and the linear kernels, whose heads round differently, part on such ties)."""
import pytest
import torch

from protospec.model.llama import lm_head_logits, logits_float32

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="cuBLAS's half-in, float-out matmul needs a GPU")])]


def _near_tie(dtype: torch.dtype, device: str):
    # logits 2.0 and 2 + 2**-10: one float32 apart, the same number once rounded to float16 (step 2**-9 at 2.0)
    h = torch.tensor([[1.0, 1.0]], dtype=dtype, device=device)                        # [1, hidden=2]
    w = torch.tensor([[1.0, 1.0], [1.0, 1.0 + 2 ** -10]], dtype=dtype, device=device)  # [vocab=2, hidden]
    return h, w


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_logits_keep_a_tie_below_half_precision_apart(device, dtype):
    h, w = _near_tie(dtype, device)
    if dtype == torch.bfloat16:  # bfloat16's step at 1.0 is 2**-7: the weight itself must be representable
        w[1, 1] = 1.0 + 2 ** -7
    logits = logits_float32(h, w)
    assert logits.dtype == torch.float32 and logits.shape == (1, 2)
    assert logits[0, 1] - logits[0, 0] == float(w[1, 1].float() - 1.0)
    assert torch.nn.functional.linear(h, w).float().argmax(-1).item() == 0  # rounded first: a tie, lower id
    assert logits.argmax(-1).item() == 1


@pytest.mark.parametrize("device", DEVICES)
def test_the_torch_head_keeps_the_tie_after_the_norm(device):
    h, w = _near_tie(torch.float16, device)
    norm_w = torch.ones(2, dtype=torch.float16, device=device)
    x, residual = h.repeat(3, 1), torch.zeros(3, 2, dtype=torch.float16, device=device)  # [T=3, hidden]
    logits = lm_head_logits(x, residual, torch.tensor([2], device=device), norm_w, 0.0, w)  # rows [1, 1] stay [1, 1]
    assert logits.shape == (1, 2) and logits.argmax(-1).item() == 1


def test_float32_and_float64_heads_are_plain_linears():
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        h, w = torch.randn(4, 8, dtype=dtype), torch.randn(16, 8, dtype=dtype)
        assert torch.equal(logits_float32(h, w), torch.nn.functional.linear(h, w).float())

"""The tensor-core GEMV past 8 token rows: a block takes 8 (BLOCK_TOKENS), the grid adds a token tile
per 8, so each form must give, bit for bit, what calling it on each 8-row slice alone gives (a wrong
offset in any token-indexed load or store shows up here), and stay close to its torch twin."""
import pytest
import torch

from protospec.kernels.linear import gemv_mma as kernel
from protospec.kernels.launch.interop import KERNEL_DEVICE_TYPE

DEV = torch.device(KERNEL_DEVICE_TYPE)
TOKENS = 19  # three token tiles, the last one partial


def _slices(tokens: int = TOKENS) -> list[slice]:
    return [slice(s, min(s + kernel.BLOCK_TOKENS, tokens)) for s in range(0, tokens, kernel.BLOCK_TOKENS)]


def _operands(seed: int, rows: int, weight_rows: int, warps: int = 1):
    gen = torch.Generator().manual_seed(seed)
    k = kernel.COLUMNS_PER_WARP * warps
    x, residual = (torch.randn(rows, k, generator=gen).half() for _ in range(2))
    g = (1 + 0.3 * torch.randn(k, generator=gen)).half()
    w = (torch.randn(weight_rows, k, generator=gen) / k ** 0.5).half()
    return x.to(DEV), residual.to(DEV), g.to(DEV), w.to(DEV)


def _cat(parts):
    """Concatenate a list of results (tensors, or tuples of tensors) along the rows."""
    if isinstance(parts[0], tuple):
        return tuple(torch.cat(column) for column in zip(*parts))
    return torch.cat(parts)


def _same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b)) if isinstance(a, tuple) else torch.equal(a, b)


def test_the_plain_form_is_its_slices_and_matches_torch():
    x, _, _, w = _operands(1, TOKENS, 37, warps=2)
    got = kernel.gemv_mma(x, w)
    assert got.shape == (TOKENS, 37)
    assert torch.equal(got, _cat([kernel.gemv_mma(x[s].contiguous(), w) for s in _slices()]))
    torch.testing.assert_close(got.float(), torch.nn.functional.linear(x.float(), w.float()), atol=3e-3, rtol=3e-3)


@pytest.mark.parametrize("glu,dependent", [(False, False), (True, True)], ids=["linear", "glu_dependent"])
def test_the_normed_forms_are_their_slices(glu, dependent):
    """norm + residual (+ SiLU x up): the output and the residual stream each token tile writes."""
    x, residual, g, w = _operands(2 + glu, TOKENS, 32 if glu else 21)
    got = kernel.gemv_mma(x, w, g, residual, 1e-6, glu=glu, dependent_launch=dependent)
    sliced = _cat([kernel.gemv_mma(x[s].contiguous(), w, g, residual[s].contiguous(), 1e-6, glu=glu)
                   for s in _slices()])
    assert _same(got, sliced)
    want = kernel.gemv_mma_reference(x, w, g, residual, 1e-6, glu=glu)
    assert torch.equal(got[1], want[1])
    torch.testing.assert_close(got[0].float(), want[0].float(), atol=4e-3, rtol=4e-3)


def test_gathered_rows_and_float32_logits_are_their_slices():
    """x_rows (the first layer's embedding rows, the LM head's wanted rows) offset by the token tile."""
    table, residual, g, w = _operands(4, 30, 16)
    rows = torch.tensor([7, 0, 29, 7, 3, 3, 12, 28, 1, 0, 5, 6, 9, 29, 2, 11, 4, 8, 20], device=DEV)
    got = kernel.gemv_mma(table, w, g, residual, 1e-6, x_rows=rows, out_dtype=torch.float32)
    sliced = _cat([kernel.gemv_mma(table, w, g, residual, 1e-6, x_rows=rows[s].contiguous(), out_dtype=torch.float32)
                   for s in _slices(rows.shape[0])])
    assert _same(got, sliced)
    want = kernel.gemv_mma_reference(table, w, g, residual, 1e-6, x_rows=rows, out_dtype=torch.float32)
    torch.testing.assert_close(got[0], want[0], atol=3e-3, rtol=3e-3)


def test_the_rope_epilogue_rotates_and_stores_every_token_tile():
    """q and the cache slots each token tile's tokens write (their positions and slots offset too)."""
    gen = torch.Generator().manual_seed(5)
    heads, kv_heads, d, k, slots_total = 3, 1, 16, kernel.COLUMNS_PER_WARP, 64
    x = torch.randn(TOKENS, k, generator=gen).half().to(DEV)
    w = (torch.randn((heads + 2 * kv_heads) * d, k, generator=gen) / k ** 0.5).half().to(DEV)
    angles = torch.arange(40).float()[:, None] * (0.3 ** torch.arange(d // 2).float())[None]
    cos, sin = (torch.cat([f] * 2, 1).half().to(DEV) for f in (angles.cos(), angles.sin()))
    cache = torch.randn(2, slots_total // 4, 4, kv_heads, d, generator=gen).half().to(DEV)
    positions = torch.randint(0, 40, (TOKENS,), generator=gen).to(DEV)
    slots = torch.randperm(slots_total, generator=gen)[:TOKENS].to(DEV)
    slots[9] = -1  # a padding row inside the second tile: nothing stored for it
    whole_cache, sliced_cache = cache.clone(), cache.clone()
    got = kernel.gemv_mma(x, w, rope=kernel.RopeCache(positions, cos, sin, whole_cache, slots, heads))
    sliced = _cat([kernel.gemv_mma(x[s].contiguous(), w, rope=kernel.RopeCache(
        positions[s].contiguous(), cos, sin, sliced_cache, slots[s].contiguous(), heads)) for s in _slices()])
    assert torch.equal(got, sliced) and torch.equal(whole_cache, sliced_cache)
    twin_cache = cache.clone()
    want = kernel.gemv_mma_reference(x, w, rope=kernel.RopeCache(positions, cos, sin, twin_cache, slots, heads))
    torch.testing.assert_close(got.float(), want.float(), atol=3e-3, rtol=3e-3)
    torch.testing.assert_close(whole_cache.float(), twin_cache.float(), atol=3e-3, rtol=3e-3)


def test_the_final_norms_sums_of_squares_and_scaled_head_are_their_slices():
    """The last down projection's (y + residual, its tiles' sums of squares) and the folded LM head
    scaled by them, over gathered rows."""
    x, _, _, w = _operands(6, TOKENS, kernel.COLUMNS_PER_WARP)
    residual = _operands(7, TOKENS, 16)[0]
    got = kernel.gemv_mma(x, w, residual_squares=residual)
    sliced = _cat([kernel.gemv_mma(x[s].contiguous(), w, residual_squares=residual[s].contiguous()) for s in _slices()])
    assert _same(got, sliced)
    stream, squares = got
    head = _operands(8, 1, 24)[3]
    rows = torch.arange(TOKENS - 1, -1, -1, device=DEV)  # every row, reversed
    logits = kernel.gemv_mma(stream, head, eps=1e-6, x_rows=rows, row_squares=squares, out_dtype=torch.float32)
    assert torch.equal(logits, _cat([kernel.gemv_mma(stream, head, eps=1e-6, x_rows=rows[s].contiguous(),
                                                     row_squares=squares, out_dtype=torch.float32)
                                     for s in _slices()]))
    want = kernel.gemv_mma_reference(stream, head, eps=1e-6, x_rows=rows, row_squares=squares, out_dtype=torch.float32)
    torch.testing.assert_close(logits, want, atol=3e-3, rtol=3e-3)

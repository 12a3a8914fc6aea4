"""The tensor-core GEMV against torch's linear: token counts up to the product's 8 columns, output
rows that do not fill a 16-row tile, K split over one and several warps."""
import pytest
import torch

from protospec.errors import KernelArgumentError
from protospec.kernels.linear import gemv_mma as kernel
from protospec.kernels.launch.interop import KERNEL_DEVICE_TYPE

DEV = torch.device(KERNEL_DEVICE_TYPE)


def _normed_operands(seed: int, rows: int, weight_rows: int, warps: int = 1):
    """x rows, a residual, a norm weight and a weight (K = `warps` warps' columns) for the normed forms, on DEV."""
    gen = torch.Generator().manual_seed(seed)
    k = kernel.COLUMNS_PER_WARP * warps
    table, residual = (torch.randn(rows, k, generator=gen).half().to(DEV) for _ in range(2))
    g = (1 + 0.3 * torch.randn(k, generator=gen)).half().to(DEV)
    w = (torch.randn(weight_rows, k, generator=gen) / k ** 0.5).half().to(DEV)
    return table, residual, g, w


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
        kernel.gemv_mma(torch.zeros(kernel.MAX_ROWS + 1, k, dtype=torch.float16, device=DEV), w)
    with pytest.raises(KernelArgumentError, match="columns"):
        kernel.gemv_mma(torch.zeros(1, 2 * k, dtype=torch.float16, device=DEV), w)
    x = torch.zeros(2, k, dtype=torch.float16, device=DEV)
    with pytest.raises(KernelArgumentError, match="only with the norm"):
        kernel.gemv_mma(x, w, residual=x)
    with pytest.raises(KernelArgumentError, match="must match x"):
        kernel.gemv_mma(x, w, norm_weight=x[0], residual=x[:1])
    with pytest.raises(KernelArgumentError, match="even count"):
        kernel.gemv_mma(x, w[:15], glu=True)
    with pytest.raises(KernelArgumentError, match="out_dtype"):
        kernel.gemv_mma(x, w, out_dtype=torch.bfloat16)
    ids = torch.zeros(2, dtype=torch.int64, device=DEV)
    tables = torch.zeros(4, 16, dtype=torch.float16, device=DEV)
    cache = torch.zeros(2, 2, 4, 1, 16, dtype=torch.float16, device=DEV)
    with pytest.raises(KernelArgumentError, match="16 weight rows are not 3 q heads"):
        kernel.gemv_mma(x, w, rope=kernel.RopeCache(ids, tables, tables, cache, ids, 3))
    with pytest.raises(KernelArgumentError, match="no glu"):
        kernel.gemv_mma(x, torch.zeros(160, k, dtype=torch.float16, device=DEV), glu=True,
                        rope=kernel.RopeCache(ids, tables, tables, cache, ids, 3))


def _rope_case(tokens: int, seed: int):
    """A qkv projection of 3 q heads and 1 kv head of 16 dims (K = 192), a paged cache, RoPE tables."""
    gen = torch.Generator().manual_seed(seed)
    heads, kv_heads, d, k, slots_total = 3, 1, 16, kernel.COLUMNS_PER_WARP, 32
    x = torch.randn(tokens, k, generator=gen).half()
    w = (torch.randn((heads + 2 * kv_heads) * d, k, generator=gen) / k ** 0.5).half()
    angles = torch.arange(40).float()[:, None] * (0.3 ** torch.arange(d // 2).float())[None]
    cos, sin = torch.cat([angles.cos()] * 2, 1).half(), torch.cat([angles.sin()] * 2, 1).half()  # [P, d]
    cache = torch.randn(2, slots_total // 4, 4, kv_heads, d, generator=gen).half()
    positions = torch.randint(0, 40, (tokens,), generator=gen)
    slots = torch.randperm(slots_total, generator=gen)[:tokens]
    slots[-1] = -1  # a graph's padding row: nothing may be stored for it
    return x, w, cos, sin, cache, positions, slots, heads


@pytest.mark.parametrize("early", [False, True], ids=["inputs_after_wait", "inputs_before_wait"])
def test_gemv_mma_rope_epilogue_matches_the_separate_rope_and_cache(launched_kernels, early):
    """The qkv projection with RoPE and the cache store in its epilogue: q, the stored K/V, and nothing
    stored for slot -1, against (1) the twin and (2) linear + layer_ops.rope_and_cache, the unfused path;
    with the epilogue's inputs (positions, slots, cos / sin rows) loaded before the wait or after it."""
    from protospec.kernels.linear.layer_ops import rope_and_cache

    x, w, cos, sin, cache, positions, slots, heads = _rope_case(tokens=5, seed=11)
    unfused_cache = cache.clone()
    qkv = torch.nn.functional.linear(x.float(), w.float()).half()
    q_unfused = rope_and_cache(qkv.to(DEV), positions.to(DEV), cos.to(DEV), sin.to(DEV), dev_cache := unfused_cache.to(DEV),
                               slots.to(DEV), heads).cpu()
    unfused_cache = dev_cache.cpu()
    twin_cache = cache.clone()
    q_twin = kernel.gemv_mma_reference(x, w, rope=kernel.RopeCache(positions, cos, sin, twin_cache, slots, heads))
    torch.testing.assert_close(q_twin.float(), q_unfused.float(), atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(twin_cache.float(), unfused_cache.float(), atol=2e-3, rtol=2e-3)
    got_cache = cache.to(DEV)
    got = kernel.gemv_mma(x.to(DEV), w.to(DEV), rope=kernel.RopeCache(
        positions.to(DEV), cos.to(DEV), sin.to(DEV), got_cache, slots.to(DEV), heads, inputs_before_wait=early))
    assert got.shape == (5, heads, 16) and got.dtype == torch.float16
    assert launched_kernels[-1].endswith("_ropeearly") == early
    torch.testing.assert_close(got.float().cpu(), q_twin.float(), atol=3e-3, rtol=3e-3)
    torch.testing.assert_close(got_cache.float().cpu(), twin_cache.float(), atol=3e-3, rtol=3e-3)
    untouched = torch.ones(cache.view(2, -1, 1, 16).shape[1], dtype=torch.bool)
    untouched[slots[slots >= 0]] = False
    assert torch.equal(got_cache.cpu().view(2, -1, 1, 16)[:, untouched], cache.view(2, -1, 1, 16)[:, untouched])


def test_gemv_mma_gathers_rows_and_writes_float32():
    """x_rows: the embedding gathered by token ids (norm, no residual) and the LM head over the wanted
    rows (norm after the residual add), its float32 logits the accumulator's (not float16 values: a
    float16 step near 2 is 0.002, which turns near ties into exact ones that greedy breaks by token id)."""
    gen = torch.Generator().manual_seed(5)
    k, n = kernel.COLUMNS_PER_WARP, 40
    table = torch.randn(30, k, generator=gen).half()
    residual = torch.randn(30, k, generator=gen).half()
    g = (1 + 0.3 * torch.randn(k, generator=gen)).half()
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).half()
    rows = torch.tensor([7, 0, 29, 7])
    for res, out_dtype in ((None, torch.float16), (residual, torch.float32)):
        want, want_stream = kernel.gemv_mma_reference(table[rows], w, g, None if res is None else res[rows], 1e-6)
        got, stream = kernel.gemv_mma(table.to(DEV), w.to(DEV), g.to(DEV), None if res is None else res.to(DEV), 1e-6,
                                      x_rows=rows.to(DEV), out_dtype=out_dtype)
        assert got.dtype == out_dtype and got.shape == (4, n)
        assert torch.equal(stream.cpu(), want_stream)   # the gathered residual stream (the embedding rows)
        assert torch.equal(got.cpu().half().float(), got.cpu().float()) is (out_dtype == torch.float16)
        torch.testing.assert_close(got.float().cpu(), want.float(), atol=3e-3, rtol=3e-3)


def test_an_early_allow_gives_the_same_bits_under_its_own_name(launched_kernels):
    """allow_early moves only when the next kernel may launch (a no-op in the simulator), and a
    dependent form without it keeps its wait below the weight loads (the machine code's order:
    tests/test_gpu_typecheck.py reads it): the o, gate/up and down forms give the same results,
    through kernels named for their form; without a dependent launch there is nothing to allow or pin."""
    table, residual, g, w = _normed_operands(14, 4, 42)
    x = table[:3].contiguous()
    for form in (dict(), dict(norm_weight=g, residual=residual[:3].contiguous(), glu=True)):
        default, early = (kernel.gemv_mma(x, w, dependent_launch=True, allow_early=on, **form) for on in (False, True))
        assert all(torch.equal(a, b) for a, b in zip(default, early)) if form else torch.equal(default, early)
    kernel.gemv_mma(x, w, allow_early=True)
    assert launched_kernels == ["gemv_mma_k192_dep_pin_w16", "gemv_mma_k192_dep_early_w16",
                                "gemv_mma_k192_norm_residual_glu_dep_pin_w16",
                                "gemv_mma_k192_norm_residual_glu_dep_early_w16", "gemv_mma_k192_w16"]


def test_dependent_launches_give_the_same_results():
    """Launched as a programmatic dependent, the GEMV loads its weights, then waits, then reads x (here
    gathered rows plus the residual, normalised): exactly the ordinary launch's results. On a GPU also a
    chain of three, each reading the one before, captured in a CUDA graph and replayed, as a forward is."""
    k = kernel.COLUMNS_PER_WARP
    table, residual, g, w = _normed_operands(9, 6, 24)
    rows = torch.tensor([4, 1, 4], device=DEV)
    plain = kernel.gemv_mma(table, w, g, residual, 1e-6, x_rows=rows)
    dependent = kernel.gemv_mma(table, w, g, residual, 1e-6, x_rows=rows, dependent_launch=True)
    assert torch.equal(dependent[0], plain[0]) and torch.equal(dependent[1], plain[1])
    if not torch.cuda.is_available():
        return
    gen = torch.Generator().manual_seed(10)
    ws = [(torch.randn(k, k, generator=gen) / k ** 0.5).half().to(DEV) for _ in range(3)]

    def chain(dependent):
        h = table
        for w in ws:
            h = kernel.gemv_mma(h, w, dependent_launch=dependent)
        return h

    expected = chain(False)
    assert torch.equal(chain(True), expected)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain(True)
    out.zero_()
    graph.replay()
    assert torch.equal(out, expected)


def test_a_dependent_launch_config_has_the_drivers_layout():
    """cuLaunchKernelEx reads CUlaunchConfig and CUlaunchAttribute by offset: the structs must match
    the driver's (attribute 72 bytes, its value at 8; config 56 bytes, stream at 32, attrs at 40)."""
    import ctypes

    from protospec.kernels.launch import driver_launch as dl

    assert ctypes.sizeof(dl._LaunchAttribute) == 72 and dl._LaunchAttribute.value.offset == 8
    assert ctypes.sizeof(dl._LaunchConfig) == 56
    assert (dl._LaunchConfig.stream.offset, dl._LaunchConfig.attrs.offset, dl._LaunchConfig.num_attrs.offset) == (32, 40, 48)
    config = dl.dependent_launch_config(7, 128, 0xABC)
    assert list(config.grid) == [7, 1, 1] and list(config.block) == [128, 1, 1] and config.stream == 0xABC
    assert config.num_attrs == 1 and config.attrs[0].id == 6 and config.attrs[0].value == 1

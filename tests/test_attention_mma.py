"""Attention on tensor cores (kernels/attention/mma.py): the warp product against numpy, then the
kernel against the torch path for decode and verify windows, GQA rows in 8- and 16-row chunks,
split-K (the last split block combining), walks of several tiles a warp, stale NaN slots and padding
rows. On CPU the simulator's Python twin of the product runs (a few cases: each costs seconds there);
on a GPU the PTX itself, every case."""
import numpy as np
import pytest
import torch
from numba import float32, uint32

from protospec.errors import KernelArgumentError
from protospec.kernels.attention import mma as by_mma, paged_attention as kernel
from protospec.kernels.launch.interop import SIMULATOR, cuda, launch_tensors
from protospec.kernels.primitives.warp_mma import mma_f16, scratch_size
from tests.test_paged_attention import DEV, TOL, _case, _kernel, _poisoned, _torch_reference

SCRATCH = scratch_size(1)


@cuda.jit
def _one_product(a_words, b_words, c, d):
    """One warp: a_words [32, 4], b_words [32, 2] uint32 fragments, c / d [32, 4] f32 -> d = A B + C."""
    lane = cuda.threadIdx.x
    scratch = cuda.shared.array(SCRATCH, uint32)
    d[lane, 0], d[lane, 1], d[lane, 2], d[lane, 3] = mma_f16(
        a_words[lane, 0], a_words[lane, 1], a_words[lane, 2], a_words[lane, 3], b_words[lane, 0], b_words[lane, 1],
        float32(c[lane, 0]), float32(c[lane, 1]), float32(c[lane, 2]), float32(c[lane, 3]), scratch, lane)


def _fragments(a: np.ndarray, b: np.ndarray, c: np.ndarray):
    """Distribute A [16, 16] fp16, B [16, 8] fp16, C [16, 8] f32 over the warp's lanes as the PTX ISA lays them out."""
    a_words = np.zeros((32, 4), np.uint32)
    b_words = np.zeros((32, 2), np.uint32)
    c_frag = np.zeros((32, 4), np.float32)
    for lane in range(32):
        g, t = divmod(lane, 4)
        for i, (row, k) in enumerate([(g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8)]):
            a_words[lane, i] = a[row, k:k + 2].view(np.uint32)[0]
        for i, k in enumerate((2 * t, 2 * t + 8)):
            b_words[lane, i] = np.ascontiguousarray(b[k:k + 2, g]).view(np.uint32)[0]
        c_frag[lane] = [c[g, 2 * t], c[g, 2 * t + 1], c[g + 8, 2 * t], c[g + 8, 2 * t + 1]]
    return a_words, b_words, c_frag


def test_the_warp_product_lays_out_its_fragments_as_the_isa_says():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((16, 16)).astype(np.float16)
    b = rng.standard_normal((16, 8)).astype(np.float16)
    c = rng.standard_normal((16, 8)).astype(np.float32)
    a_words, b_words, c_frag = _fragments(a, b, c)
    tensors = [torch.from_numpy(x.view(np.int32) if x.dtype == np.uint32 else x).to(DEV) for x in (a_words, b_words, c_frag)]
    d = torch.zeros(32, 4, dtype=torch.float32, device=DEV)
    launch_tensors(_one_product, 1, 32, [*tensors, d])
    expected = a.astype(np.float32) @ b.astype(np.float32) + c
    got = np.zeros((16, 8), np.float32)
    for lane, row in enumerate(d.cpu().numpy()):
        g, t = divmod(lane, 4)
        got[g, 2 * t], got[g, 2 * t + 1], got[g + 8, 2 * t], got[g + 8, 2 * t + 1] = row
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


# (query_len, lengths, heads, kv_heads, head_dim, splits): decode with GQA; a 6-query window of an
# MHA model (8-row chunks, causal inside); 6 queries x 4 heads = 24 rows (16-row chunks, the last partial);
# split-K, also where a split sees no key (3 splits of a 3-key context);
# head_dim 96 and 128 (3 and 4 words of V per lane and key; 16-row chunks at 128: fewer warps fit).
CASES = [
    (1, [7, 45, 1], 4, 2, 32, None),
    (6, [16, 33, 8], 4, 4, 64, 1),
    (6, [20, 47], 8, 2, 32, 3),
    (3, [40, 3], 4, 4, 32, 3),
    (6, [20, 47], 8, 2, 128, None),
    (1, [33, 17], 4, 4, 96, 2),
]
SIMULATED = (CASES[0], CASES[2])


@pytest.mark.parametrize("case", SIMULATED if SIMULATOR else CASES, ids=lambda c: f"{c[0]}q-{c[2]}h{c[3]}kv-d{c[4]}-s{c[5]}")
def test_tensor_core_attention_matches_the_torch_path(case):
    query_len, lengths, heads, kv_heads, head_dim, splits = case
    inputs, cache, q = _case(query_len, lengths, heads, kv_heads, head_dim, 16, torch.float16, seed=5)
    expected = _torch_reference(inputs, cache, q, torch.float16)
    got = _kernel(inputs, cache, q, path="mma", splits=splits)
    torch.testing.assert_close(got, expected, **TOL[torch.float16])
    if case is CASES[0] or not SIMULATOR:  # launched as a programmatic dependent: its positions, table
        # entries and first tile (when every key in it is older than the sequence's first query: the
        # long contexts' tiles) load before its wait, and the walk starts from that tile: the same bits
        assert torch.equal(got, _kernel(inputs, cache, q, path="mma", splits=splits, dependent_launch=True))


MINUTES_IN_THE_SIMULATOR = pytest.mark.skipif(SIMULATOR, reason="a minute in the simulator; its twin case runs there")


@pytest.mark.parametrize("dependent", [pytest.param(False, marks=MINUTES_IN_THE_SIMULATOR), True],
                         ids=["plain", "dependent"])
def test_a_walk_of_several_tiles_a_warp_matches_the_torch_path(dependent):
    """A warp loads its next tile (and the table entry of the one after) before the products of this
    one: a context of several steps a warp (3 of the 70-key context's 16-key cache blocks a warp in the
    simulator's 2-warp blocks: the entries change every tile), a 1-key one and 3 splits where one sees
    no key, launched plainly and as a dependent (its first tile loaded before the wait)."""
    for query_len, lengths, splits in ((1, [70, 1], None), (3, [40, 3], 3)):
        inputs, cache, q = _case(query_len, lengths, 4, 2, 32, 16, torch.float16, seed=8)
        got = _kernel(inputs, cache, q, path="mma", splits=splits, dependent_launch=dependent)
        torch.testing.assert_close(got, _torch_reference(inputs, cache, q, torch.float16), **TOL[torch.float16])


def test_stale_nan_slots_and_padding_rows_stay_out_of_real_rows():
    """A wide table (a captured batch), NaN in every slot no context covers, and a padding row at
    position 0 with a stale table: real rows exact, the padding row finite."""
    inputs, cache, q = _case(1, [9, 30], 2, 1, 32, 16, torch.float16, seed=6, width=4)
    poisoned = _poisoned(inputs, cache, [9, 30])
    expected = _torch_reference(inputs, cache, q, torch.float16)
    tables = torch.cat([inputs.meta.block_tables, inputs.meta.block_tables[:1]])
    positions = torch.cat([inputs.positions, torch.zeros(1, dtype=torch.int64, device=DEV)])
    got = kernel.paged_attention(torch.cat([q, q[:1]]), poisoned, tables, positions, 1, 32 ** -0.5, path="mma")
    torch.testing.assert_close(got[:2], expected, **TOL[torch.float16])
    assert torch.isfinite(got[2]).all()


def test_warps_per_block_follow_the_grid():
    """A 6-query verify of a 12-head model on 132 SMs: 8 warps a block at batch 1 (12 blocks), 4 at
    batch 16, 2 at batch 64; rows of 8 or 16 per chunk."""
    assert [by_mma.warps_per_block(12 * batch, 132) for batch in (1, 16, 64)] == [8, 8, 2]
    assert by_mma.warps_per_block(10**6, 132) == 2 and by_mma.warps_per_block(1, 132) == by_mma.MAX_WARPS
    # 16-row chunks of head_dim 128 merge 8 KB per warp: 4 warps keep the block's shared memory in bounds.
    assert by_mma.warps_per_block(1, 132, group_rows=24, head_dim=128) == 4
    assert [by_mma.rows_per_chunk(n) for n in (1, 6, 8, 9, 24)] == [8, 8, 8, 16, 16]


def test_the_tensor_core_path_refuses_what_it_cannot_hold():
    assert by_mma.supports(64, 16) and not by_mma.supports(16, 16) and not by_mma.supports(64, 8)
    assert by_mma.supports(by_mma.MAX_HEAD_DIM, 16) and not by_mma.supports(256, 16)
    positions = torch.zeros(1, dtype=torch.int64, device=DEV)
    tables = torch.ones(1, 1, dtype=torch.int32, device=DEV)
    for dtype, head_dim, block_size in [(torch.float32, 32, 16), (torch.float16, 16, 16), (torch.float16, 32, 8)]:
        q = torch.zeros(1, 2, head_dim, dtype=dtype, device=DEV)
        cache = torch.zeros(2, 2, block_size, 2, head_dim, dtype=dtype, device=DEV)
        with pytest.raises(KernelArgumentError, match="mma takes float16"):
            kernel.paged_attention(q, cache, tables, positions, 1, 0.25, path="mma")

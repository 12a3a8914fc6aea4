"""The paged-attention kernel against the torch path (attention.py): ragged contexts, GQA, block and
tile boundaries, 1 and k + 1 queries, padding rows, fp16 and fp32, every split of the keys (the
simulator on CPU, the GPU where there is one)."""

from unittest.mock import patch

import pytest
import torch

from protospec.model.attention import paged_attention as torch_paged_attention, plan_attention, prompt_attention
from protospec.errors import KernelArgumentError
from protospec.model.inputs import prepare_inputs
from protospec.kernels.attention import by_kv_head, mma as by_mma, paged_attention as kernel
from protospec.kernels.launch import interop
from protospec.kernels.launch.interop import KERNEL_DEVICE_TYPE, SIMULATOR
from protospec.kernels.primitives import arrivals

DEV = KERNEL_DEVICE_TYPE
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=4e-3, rtol=4e-3)}


def _case(query_len, lengths, heads, kv_heads, d, block_size, dtype, seed=0, width=None):
    """Sequences whose last `query_len` tokens are this forward's queries, blocks scattered over a
    pool, K/V random (their own K/V already in the cache, as the layer writes it first)."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // block_size) for n in lengths]
    num_blocks = sum(need) + 4
    free = torch.randperm(num_blocks - 1, generator=gen).add(1).tolist()  # block 0 is the null block
    tables = [[free.pop() for _ in range(b)] for b in need]
    inputs = prepare_inputs([[1] * query_len for _ in lengths], [n - query_len for n in lengths], tables, block_size,
                            query_len, torch.device(DEV), width)
    cache = torch.randn(2, num_blocks, block_size, kv_heads, d, generator=gen).to(dtype).to(DEV)
    q = torch.randn(inputs.input_ids.shape[0], heads, d, generator=gen).to(dtype).to(DEV)
    return inputs, cache, q


def _torch_reference(inputs, cache, q, dtype):
    meta, d = inputs.meta, q.shape[2]
    kv_heads = cache.shape[3]
    k = cache[0].view(-1, kv_heads, d)[meta.slot_mapping]  # rewriting what is there: the cache is unchanged
    v = cache[1].view(-1, kv_heads, d)[meta.slot_mapping]
    plan = plan_attention(inputs.positions, meta, dtype)
    return torch_paged_attention(q, k, v, cache.clone(), meta, plan, d ** -0.5).flatten(1)


def _poisoned(inputs, cache, lengths):
    """A copy of the cache with NaN in every slot that no sequence's context (lengths) covers."""
    block_size = cache.shape[2]
    used = torch.zeros(cache.shape[1], block_size, dtype=torch.bool)
    for row, n in zip(inputs.meta.block_tables.cpu(), lengths):
        for pos in range(n):
            used[row[pos // block_size], pos % block_size] = True
    poisoned = cache.clone()
    poisoned[:, ~used.to(DEV)] = float("nan")
    return poisoned


def _kernel(inputs, cache, q, path=None, splits=None, dependent_launch=False):
    return kernel.paged_attention(q, cache, inputs.meta.block_tables, inputs.positions, inputs.meta.uniform_query_len,
                                  q.shape[2] ** -0.5, path=path, splits=splits, dependent_launch=dependent_launch)


CASES = [
    (1, [7, 45, 1], 4, 2),    # decode, ragged contexts, one of a single key, GQA 2:1
    (3, [40, 9], 4, 4),       # a verify window (causal inside), MHA
    (6, [16, 33, 8], 8, 2),   # k + 1 = 6 queries, contexts ending on a block boundary (16), GQA 4:1
]
# On a GPU every path x dtype x case. In the simulator (CI's CPU), fp16 runs the decode and verify-window
# cases only: a 6-query case costs 30-90 s there, and fp16 changes only the loads' conversion.
# The path that takes every dtype and head size here (mma takes fp16 and head_dim a multiple of 32:
# tests/test_attention_mma.py).
GENERAL_PATHS = ("by_kv_head",)
COMBOS = [(path, dtype, *case) for path in GENERAL_PATHS for dtype in (torch.float32, torch.float16) for case in CASES
          if not (SIMULATOR and dtype == torch.float16 and case is CASES[2])]


@pytest.mark.parametrize("path,dtype,query_len,lengths,heads,kv_heads", COMBOS,
                         ids=[f"{c[0]}-{str(c[1]).removeprefix('torch.')}-{c[2]}q" for c in COMBOS])
def test_paged_attention_matches_the_torch_path(path, dtype, query_len, lengths, heads, kv_heads):
    inputs, cache, q = _case(query_len, lengths, heads, kv_heads, 16, 4, dtype)
    expected = _torch_reference(inputs, cache, q, dtype)
    torch.testing.assert_close(_kernel(inputs, cache, q, path=path), expected, **TOL[dtype])


@pytest.mark.parametrize("dtype,heads,kv_heads", [(torch.float32, 4, 2), (torch.float16, 4, 4)])
def test_whole_prompts_take_causal_attention_over_their_own_keys(dtype, heads, kv_heads):
    """prompt_attention (a prefill's): prompts of 11 tokens from position 0, GQA and MHA, q and k passed
    as views of one [T, h + kvh, d] tensor and v as a view off wider rows (as the layer passes them):
    the torch path's output over a cache holding those keys; a batch whose chunks start past 0 is not
    one of whole prompts."""
    inputs, cache, q = _case(11, [11, 11, 11], heads, kv_heads, 16, 4, dtype, seed=3)
    assert inputs.meta.whole_prompts and not _case(3, [11, 5], 4, 2, 16, 4, dtype)[0].meta.whole_prompts
    expected = _torch_reference(inputs, cache, q, dtype)
    d = q.shape[2]
    key, value = (cache[i].view(-1, kv_heads, d)[inputs.meta.slot_mapping] for i in (0, 1))  # [T, kvh, d]
    q_and_k = torch.cat([q, key], dim=1)  # [T, h + kvh, d]
    rows = torch.cat([q_and_k.flatten(1), value.flatten(1)], dim=1)  # [T, (h + 2 kvh) * d], as qkv
    got = prompt_attention(q_and_k[:, :heads], q_and_k[:, heads:],
                           rows[:, (heads + kv_heads) * d:].view(-1, kv_heads, d), 11, d ** -0.5)
    torch.testing.assert_close(got, expected, **TOL[dtype])


@pytest.mark.parametrize("splits,block_size", [(1, 4), (2, 5), (3, 6), (8, 4)])
def test_every_split_of_the_keys_gives_the_same_output(splits, block_size):
    """Splits with no key at all (8 splits of 12 keys) and splits that end mid-round included; block
    sizes that let a lane group take 4, 1 and 2 keys per step."""
    assert [by_kv_head.keys_per_group(4, b) for b in (4, 5, 6)] == [4, 1, 2]
    inputs, cache, q = _case(2, [45, 12], 4, 2, 16, block_size, torch.float32, seed=1)
    expected = _torch_reference(inputs, cache, q, torch.float32)
    torch.testing.assert_close(_kernel(inputs, cache, q, path="by_kv_head", splits=splits), expected, **TOL[torch.float32])


def test_the_split_k_combine_leaves_its_counters_at_zero_and_serves_the_next_call():
    """Every row group's last split block resets its arrival counter, so a second call (a graph
    replay reuses the same buffer) combines again, not at a stale count."""
    inputs, cache, q = _case(1, [9, 5], 2, 1, 16, 4, torch.float32, seed=4)
    expected = _torch_reference(inputs, cache, q, torch.float32)
    for _ in range(2):
        torch.testing.assert_close(_kernel(inputs, cache, q, path="by_kv_head", splits=2), expected, **TOL[torch.float32])
        assert all(int(c.abs().sum()) == 0 for c in arrivals._COUNTERS[(q.device, "attention")])


def test_keys_on_tile_and_block_boundaries():
    """Contexts of exactly one round of a block's keys in flight, one key past it, one key short of a block."""
    tile = by_kv_head.keys_in_flight(16, rows=2, block_size=8)  # 2 query heads per KV head
    lengths = [tile, tile + 1, 2 * tile, 15, 1, 33]
    inputs, cache, q = _case(1, lengths, 2, 1, 16, 8, torch.float32, seed=2)
    expected = _torch_reference(inputs, cache, q, torch.float32)
    for splits in (1, 2):
        torch.testing.assert_close(_kernel(inputs, cache, q, path="by_kv_head", splits=splits), expected, **TOL[torch.float32])


def test_more_query_rows_than_a_block_holds_take_several_row_chunks():
    """5 queries x 4 heads per KV head = 20 rows: chunks of MAX_ROWS, the last one partial."""
    rows = by_kv_head.rows_per_block(20)
    assert rows < 20 and 20 % rows != 0
    inputs, cache, q = _case(5, [12, 6], 8, 2, 32, 4, torch.float32, seed=3)  # 4 lanes per key
    expected = _torch_reference(inputs, cache, q, torch.float32)
    torch.testing.assert_close(_kernel(inputs, cache, q, path="by_kv_head"), expected, **TOL[torch.float32])


def test_padding_rows_and_a_wide_table_leave_real_rows_exact_and_stay_finite():
    """A captured batch: the table is wider than any context, and padding rows (position 0, a table
    of stale block ids and null blocks) stand beside real ones. NaN in unused cache slots must not
    leak into anyone's output."""
    inputs, cache, q = _case(1, [9, 30], 4, 2, 16, 4, torch.float32, seed=4, width=16)
    poisoned = _poisoned(inputs, cache, [9, 30])
    expected = _torch_reference(inputs, cache, q, torch.float32)
    for path in GENERAL_PATHS:
        torch.testing.assert_close(_kernel(inputs, poisoned, q, path=path), expected, **TOL[torch.float32])
    # Two padding rows: position 0 and stale ids in the table, as PersistentInputs.fill leaves them.
    tables = torch.cat([inputs.meta.block_tables, inputs.meta.block_tables[:1]])
    tables = torch.cat([tables, torch.zeros_like(tables[:1])])
    positions = torch.cat([inputs.positions, torch.zeros(2, dtype=torch.int64, device=DEV)])
    q_pad = torch.cat([q, q[:2]])
    for path in GENERAL_PATHS:
        padded = kernel.paged_attention(q_pad, poisoned, tables, positions, 1, 16 ** -0.5, path=path)
        torch.testing.assert_close(padded[:2], expected, **TOL[torch.float32])
        assert torch.isfinite(padded[2]).all()  # row 2 reads key 0 of a real block: finite


def test_the_head_size_chooses_the_path_and_the_shape_the_split():
    dev = torch.device(DEV)
    sms = interop.sm_count(dev)
    assert kernel.choose_path(64) == "by_kv_head"      # every served shape: it measured faster everywhere
    assert kernel.choose_path(24) is None              # 24 = 8 x 3 lanes: by_kv_head cannot split a key's dims
    assert not kernel.supports(4, 24, 64, torch.float32, 16)  # the layer kernels then keep the torch path
    assert kernel.choose_path(96, torch.float16, 16) == "mma"  # a multiple of 32: tensor cores serve it
    # Tensor cores for fp16 in whole 16-key tiles (verify windows, GQA and single decode rows alike).
    assert kernel.choose_path(64, torch.float16, 16) == "mma"   # whatever the rows per KV head, one included
    assert kernel.choose_path(64, torch.float32, 16) == "by_kv_head"
    assert kernel.choose_path(64, torch.float16, 8) == "by_kv_head"    # a tile would straddle blocks
    assert kernel.choose_path(16, torch.float16, 16) == "by_kv_head"
    target = kernel.BLOCKS_PER_SM * sms
    assert kernel.choose_splits(target, 4096, 32, dev) == 1             # enough groups: no split-K
    assert kernel.choose_splits(1, 1 << 20, 32, dev) == target          # few groups: spread wide
    assert kernel.choose_splits(1, 3 * 32, 32, dev) == 3                # no more splits than key steps
    assert kernel.choose_splits(target // 2 + 1, 1 << 20, 32, dev) == 1  # two a group would pass the target
    assert kernel.choose_splits(1, 1023, 32, dev, min_keys=1024) == 1   # a table narrower than min_keys: one
    assert kernel.choose_splits(1, 1024, 32, dev, min_keys=1024) == min(target, 1024 // 32)  # wide enough
    # mma at one decode row a KV head (the seed target at batch 1 on a GPU of 132 SMs: 12 blocks of 8
    # warps): one split in the 512-key tables of the seed's context, four (a split per 256 keys) in
    # 1,024-key tables and no more in wider ones; never more blocks than SMs (batch 4: 48 x 2, batch 8:
    # 96 x 1); none once the blocks outnumber the SMs (batch 16: 192).
    mma_rule = dict(step_keys=by_mma.keys_per_split(8), device=dev, blocks_per_sm=by_mma.BLOCKS_PER_SM,
                    min_keys=by_mma.MIN_SPLIT_KEYS, max_splits=by_mma.MAX_SPLITS)
    with patch.object(interop, "sm_count", lambda device: 132):
        assert [kernel.choose_splits(12, keys, **mma_rule) for keys in (512, 1024, 2048, 8192)] == [1, 4, 4, 4]
        assert kernel.choose_splits(24, 1024, **mma_rule) == 4             # batch 2: 96 blocks
        assert kernel.choose_splits(48, 4096, **mma_rule) == 2             # batch 4: 3 splits would be 144 blocks
        assert kernel.choose_splits(96, 4096, **mma_rule) == 1             # batch 8
        assert kernel.choose_splits(16 * 12, 2048, **mma_rule) == 1
    # Rows per block halve where the batch leaves the SMs short of blocks (batch 16 of an MHA verify).
    assert by_kv_head.rows_per_block(6, kv_pairs=16 * 12, sm_count=132) == 3
    assert by_kv_head.rows_per_block(6, kv_pairs=64 * 12, sm_count=132) == 6
    assert by_kv_head.rows_per_block(1, kv_pairs=1, sm_count=132) == 1
    # A lane group loads as many keys per step as the registers left beside its rows allow.
    assert by_kv_head.keys_per_group(1, 16) > by_kv_head.keys_per_group(by_kv_head.MAX_ROWS, 16) >= 1


def test_paged_attention_refuses_what_it_cannot_hold():
    q = torch.zeros(1, 4, 16, device=DEV)
    cache = torch.zeros(2, 4, 4, 2, 16, device=DEV)
    positions = torch.zeros(1, dtype=torch.int64, device=DEV)
    with pytest.raises(KernelArgumentError, match="block_tables"):
        kernel.paged_attention(q, cache, torch.zeros(1, 2, dtype=torch.int64, device=DEV), positions, 1, 0.25)
    wide = torch.zeros(1, 1, 512, device=DEV)
    with pytest.raises(KernelArgumentError, match="head_dim 512 is not served"):
        kernel.paged_attention(wide, torch.zeros(2, 4, 4, 1, 512, device=DEV), torch.zeros(1, 2, dtype=torch.int32, device=DEV),
                               positions, 1, 0.25)
    with pytest.raises(KernelArgumentError, match="kv heads"):  # 4 heads cannot share 3 KV heads
        kernel.paged_attention(q, torch.zeros(2, 4, 4, 3, 16, device=DEV), torch.zeros(1, 2, dtype=torch.int32, device=DEV),
                               positions, 1, 0.25)
    with pytest.raises(KernelArgumentError, match="dtype"):
        kernel.paged_attention(q, cache.half(), torch.zeros(1, 2, dtype=torch.int32, device=DEV), positions, 1, 0.25)
    with pytest.raises(KernelArgumentError, match="path"):
        kernel.paged_attention(q, cache, torch.zeros(1, 2, dtype=torch.int32, device=DEV), positions, 1, 0.25, path="bogus")
    with pytest.raises(KernelArgumentError, match="splits"):
        kernel.paged_attention(q, cache, torch.zeros(1, 2, dtype=torch.int32, device=DEV), positions, 1, 0.25, splits=0)

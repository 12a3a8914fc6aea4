"""The Numba layer kernels against the torch path they replace (simulator on CPU, the GPU where there
is one): each op alone, then a whole decode-shaped forward, its logits and the K/V it writes."""
import pytest
import torch
import torch.nn.functional as F
from tiny import TARGET_CFG

from protospec.model.attention import write_kv
from protospec.errors import KernelArgumentError
from protospec.model.inputs import prepare_inputs
from protospec.kernels.launch.interop import KERNEL_DEVICE_TYPE
from protospec.kernels.linear.layer_ops import add_rms_norm, rope_and_cache, silu_and_mul
from protospec.model.layer_kernels import enable_layer_kernels
from protospec.model.llama import LlamaForCausalLM, apply_rope, rms_norm
from protospec.model.config import LlamaArchConfig

DEV = KERNEL_DEVICE_TYPE
# float16 rounds after every torch op but once per kernel: allow a few ulps of 2^-10 at |x| ~ 1-4.
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=8e-3, rtol=4e-3)}


def _randn(*shape, dtype, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(DEV)


@pytest.mark.parametrize("dtype,hidden", [(torch.float32, 48), (torch.float16, 48), (torch.float16, 100)])
def test_add_rms_norm_matches_torch_and_updates_the_residual_in_place(dtype, hidden):
    """hidden 48 and 100: a thread's last entry past the row in some threads (one or several entries a thread)."""
    x, residual = _randn(5, hidden, dtype=dtype), _randn(5, hidden, dtype=dtype, seed=1)
    w = _randn(hidden, dtype=dtype, seed=2)
    expected_residual = x + residual
    expected = rms_norm(expected_residual, w, 1e-6)
    rows = torch.arange(5, device=DEV)
    out, new_residual = add_rms_norm(x, residual, w, 1e-6, rows)
    assert new_residual is residual  # in place
    torch.testing.assert_close(residual, expected_residual, atol=0, rtol=0)
    torch.testing.assert_close(out, expected, **TOL[dtype])
    # Selected rows only, no residual: the LM head's path and the first layer's.
    picked = torch.tensor([3, 0], device=DEV)
    out, same = add_rms_norm(x, None, w, 1e-6, picked)
    assert same is x and out.shape == (2, hidden)
    torch.testing.assert_close(out, rms_norm(x, w, 1e-6)[picked], **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rope_and_cache_matches_apply_rope_and_write_kv(dtype):
    heads, kv_heads, d, tokens, block_size = 4, 2, 16, 3, 4
    model = LlamaForCausalLM(LlamaArchConfig.from_dict(TARGET_CFG))
    cos, sin = model.rope.cos.to(dtype).to(DEV), model.rope.sin.to(dtype).to(DEV)
    qkv = _randn(tokens, (heads + 2 * kv_heads) * d, dtype=dtype)
    positions = torch.tensor([5, 17, 30], device=DEV)
    slots = torch.tensor([9, -1, 22], device=DEV)  # the middle token is a padding row: no write
    cache = torch.zeros(2, 8, block_size, kv_heads, d, dtype=dtype, device=DEV)
    q = rope_and_cache(qkv, positions, cos, sin, cache, slots, heads)

    grid = qkv.view(tokens, heads + 2 * kv_heads, d)
    rotated = apply_rope(grid[:, : heads + kv_heads], cos[positions][:, None], sin[positions][:, None])
    torch.testing.assert_close(q, rotated[:, :heads], **TOL[dtype])
    expected = torch.zeros_like(cache)
    keep = slots >= 0
    write_kv(expected, rotated[keep, heads:], grid[keep, heads + kv_heads:], slots[keep])
    torch.testing.assert_close(cache, expected, **TOL[dtype])
    assert cache.view(2, -1, kv_heads, d)[:, [s for s in range(32) if s not in (9, 22)]].abs().sum() == 0
    # with_keys (a prefill's): the rotated k after q, for every token (a padding row's too), the same cache
    again = torch.zeros_like(cache)
    q_and_k = rope_and_cache(qkv, positions, cos, sin, again, slots, heads, with_keys=True)
    assert q_and_k.shape == (tokens, heads + kv_heads, d) and torch.equal(q_and_k[:, :heads], q)
    torch.testing.assert_close(q_and_k[:, heads:], rotated[:, heads:], **TOL[dtype])
    assert torch.equal(again, cache)


def test_rope_and_cache_in_float16_words_gives_the_entry_kernels_bits():
    """float16 with head sizes of whole words a half (d = 16) and 8-byte aligned tensors take four pairs a
    thread; the same qkv 2 bytes off that boundary takes a pair a thread: the same q and cache bits."""
    heads, kv_heads, d, tokens, block_size = 4, 2, 16, 5, 4
    model = LlamaForCausalLM(LlamaArchConfig.from_dict(TARGET_CFG))
    cos, sin = model.rope.cos.half().to(DEV), model.rope.sin.half().to(DEV)
    qkv = _randn(tokens, (heads + 2 * kv_heads) * d, dtype=torch.float16) * 8
    shifted = torch.empty(qkv.numel() + 1, dtype=torch.float16, device=DEV)[1:].view_as(qkv)
    shifted.copy_(qkv)
    positions = torch.tensor([5, 17, 30, 31, 2], device=DEV)
    slots = torch.tensor([9, -1, 22, 23, 0], device=DEV)
    caches = [torch.zeros(2, 8, block_size, kv_heads, d, dtype=torch.float16, device=DEV) for _ in range(2)]
    q_words = rope_and_cache(qkv, positions, cos, sin, caches[0], slots, heads)
    q_entries = rope_and_cache(shifted, positions, cos, sin, caches[1], slots, heads)
    assert torch.equal(q_words, q_entries) and torch.equal(caches[0], caches[1])
    assert caches[0].abs().sum() > 0
    keys_words = rope_and_cache(qkv, positions, cos, sin, caches[0], slots, heads, with_keys=True)
    keys_entries = rope_and_cache(shifted, positions, cos, sin, caches[1], slots, heads, with_keys=True)
    assert torch.equal(keys_words, keys_entries) and torch.equal(keys_words[:, :heads], q_words)
    stored = caches[0][0].view(-1, kv_heads, d)[slots[slots >= 0]]  # what the kernels wrote as k
    assert torch.equal(keys_words[slots >= 0, heads:], stored)


def test_silu_and_mul_matches_torch():
    gate_up = _randn(3, 2 * 40, dtype=torch.float32)
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(silu_and_mul(gate_up), F.silu(gate) * up, **TOL[torch.float32])


def test_silu_and_mul_in_float16_words_gives_the_entry_kernels_bits():
    """float16 with whole 8-byte words (inter 40, data 8-byte aligned) takes four outputs a thread; the
    same values 2 bytes off that boundary, or a width of no whole words (38), take an entry a thread:
    every output is silu(gate) * up in float32 rounded once, so the two give the same bits."""
    for inter in (40, 38):
        gate_up = (_randn(3, 2 * inter, dtype=torch.float32) * 4).to(torch.float16)  # saturated and small gates
        shifted = torch.empty(gate_up.numel() + 1, dtype=torch.float16, device=DEV)[1:].view_as(gate_up)
        shifted.copy_(gate_up)
        assert gate_up.data_ptr() % 8 == 0 and shifted.data_ptr() % 8 == 2
        gate, up = gate_up.float().chunk(2, dim=-1)
        out = silu_and_mul(gate_up)
        torch.testing.assert_close(out, (F.silu(gate) * up).to(torch.float16), **TOL[torch.float16])
        torch.testing.assert_close(out, silu_and_mul(shifted), atol=0, rtol=0)


def _uniform_batch(query_len: int, lengths: list[int], block_size: int, num_blocks: int, seed: int = 0):
    """Sequences whose last `query_len` tokens are this forward's queries, with scattered blocks."""
    gen = torch.Generator().manual_seed(seed)
    free = torch.randperm(num_blocks - 1, generator=gen).add(1).tolist()  # block 0 is the null block
    tables = []
    for n in lengths:
        need = -(-n // block_size)
        tables.append([free.pop() for _ in range(need)])
    chunks = [[1] * query_len for _ in lengths]
    starts = [n - query_len for n in lengths]
    return prepare_inputs(chunks, starts, tables, block_size, query_len, torch.device(DEV))


def test_layer_ops_refuse_a_dtype_they_do_not_take():
    with pytest.raises(KernelArgumentError, match="dtype"):
        add_rms_norm(torch.zeros(2, 8, dtype=torch.float64, device=DEV), None, torch.ones(8, dtype=torch.float64, device=DEV),
                     1e-6, torch.arange(2, device=DEV))


@pytest.mark.parametrize("query_len", [1, 2])
def test_a_decode_shaped_forward_gives_the_torch_paths_logits_and_cache(query_len):
    """Whole model, float32: same logits, same K/V written, whichever path runs."""
    cfg = LlamaArchConfig.from_dict(TARGET_CFG)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).place(DEV, torch.float32)
    block_size, num_blocks = 4, 40
    inputs = _uniform_batch(query_len, [30, 13], block_size, num_blocks, seed=5)
    inputs.input_ids.copy_(torch.randint(3, cfg.vocab_size, inputs.input_ids.shape))
    caches = [_randn(2, num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim, dtype=torch.float32, seed=i)
              for i in range(cfg.num_hidden_layers)]
    torch_caches = [c.clone() for c in caches]
    expected = model(inputs.input_ids, inputs.positions, torch_caches, inputs.meta)
    enable_layer_kernels(model)
    assert model.layer_kernels.applies(inputs.meta)
    got = model(inputs.input_ids, inputs.positions, caches, inputs.meta)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    for c, t in zip(caches, torch_caches):
        torch.testing.assert_close(c, t, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [pytest.param(torch.float32, marks=pytest.mark.skipif(
    KERNEL_DEVICE_TYPE == "cpu", reason="the simulator runs the float16 case only (~20 s a prefill)")),
    torch.float16])
def test_a_prefill_on_the_long_chunk_kernels_gives_the_torch_paths_logits_and_cache(dtype, monkeypatch):
    """long_chunks (KernelPlan.prefill_kernels): a whole prompt (batch 1, past MAX_QUERY_LEN tokens, from position 0) on the 9-kernel
    path: the torch path's logits (the last token's) and K/V, to rounding."""
    from protospec.kernels.launch.interop import SIMULATOR
    from protospec.model import layer_kernels

    if SIMULATOR:  # a shorter "decode shape" and prompt: a 25-token prompt takes the simulator minutes
        monkeypatch.setattr(layer_kernels, "MAX_QUERY_LEN", 2)
    cfg = LlamaArchConfig.from_dict(TARGET_CFG)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).place(DEV, dtype)
    block_size, num_blocks = 16, 6
    length = layer_kernels.MAX_QUERY_LEN + (3 if SIMULATOR else 9)
    prompt = torch.randint(3, cfg.vocab_size, (length,), generator=torch.Generator().manual_seed(2)).tolist()
    inputs = prepare_inputs([prompt], [0], [[4, 2]], block_size, 1, torch.device(DEV))
    caches = [torch.zeros(2, num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim, dtype=dtype, device=DEV)
              for _ in range(cfg.num_hidden_layers)]
    torch_caches = [c.clone() for c in caches]
    expected = model(inputs.input_ids, inputs.positions, torch_caches, inputs.meta)
    enable_layer_kernels(model)
    assert not model.layer_kernels.applies(inputs.meta)  # off: the torch path's
    enable_layer_kernels(model, long_chunks=True)
    assert model.layer_kernels.applies(inputs.meta)
    got = model(inputs.input_ids, inputs.positions, caches, inputs.meta)
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(got, expected, **tol)
    for c, t in zip(caches, torch_caches):
        torch.testing.assert_close(c, t, **(TOL[dtype] if dtype == torch.float32 else tol))
    # the draft's prefill wants no logits: none come back, the cache is written the same
    no_logits = prepare_inputs([prompt], [0], [[4, 2]], block_size, 0, torch.device(DEV))
    fresh = [torch.zeros_like(c) for c in caches]
    assert model(no_logits.input_ids, no_logits.positions, fresh, no_logits.meta).shape == (0, cfg.vocab_size)
    for c, t in zip(fresh, caches):
        assert torch.equal(c, t)


def test_prefill_and_ragged_batches_keep_the_torch_path():
    """Without long_chunks (KernelPlan.prefill_kernels: on a GPU only) a prefill keeps the torch path; a
    ragged batch always."""
    model = LlamaForCausalLM(LlamaArchConfig.from_dict(TARGET_CFG)).place(DEV, torch.float32)
    enable_layer_kernels(model)
    prefill = prepare_inputs([list(range(3, 40))], [0], [list(range(1, 11))], 4, 1, torch.device(DEV))
    ragged = prepare_inputs([[5], [6, 7]], [3, 4], [[1, 2], [3, 4]], 4, 1, torch.device(DEV))
    assert not model.layer_kernels.applies(prefill.meta) and not model.layer_kernels.applies(ragged.meta)
    decode = prepare_inputs([[5], [6]], [3, 4], [[1, 2], [3, 4]], 4, 1, torch.device(DEV))
    assert model.layer_kernels.applies(decode.meta)
    enable_layer_kernels(model, long_chunks=True)
    assert model.layer_kernels.applies(prefill.meta) and not model.layer_kernels.applies(ragged.meta)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (a minute per generate in the simulator)")
@pytest.mark.parametrize("mode", ["main", "gpu", "graph"])
def test_the_engine_generates_the_same_greedy_tokens_with_and_without_layer_kernels(tiny_target, tiny_draft, mode):
    from tiny import random_prompts, tiny_llm

    from protospec import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    prompts = random_prompts(3, seed=2)
    runs = {}
    for on in (False, True):
        llm = tiny_llm(tiny_target, tiny_draft, k=3, device="cuda", layer_kernels=on, draft_loop=mode)
        assert llm.engine.use_layer_kernels is on
        runs[on] = [o.token_ids for o in llm.generate(prompts, params)]
    assert runs[True] == runs[False]


def test_layer_kernels_refuse_a_dtype_they_do_not_take(tiny_target):
    from tiny import tiny_llm

    from protospec.errors import ConfigError

    with pytest.raises(ConfigError, match="layer_kernels=True with dtype torch.bfloat16"):
        tiny_llm(tiny_target, device=DEV, dtype="bfloat16", layer_kernels=True)


def test_the_linear_kernel_switch_is_checked_and_reaches_every_model(tiny_target, tiny_draft):
    from tiny import tiny_llm

    from protospec.errors import ConfigError

    with pytest.raises(ConfigError, match="linear_kernel must be None or one of"):
        tiny_llm(tiny_target, device=DEV, linear_kernel="cutlass")
    with pytest.raises(ConfigError, match="linear_kernel='mma_fused' needs the layer kernels"):
        tiny_llm(tiny_target, device=DEV, layer_kernels=False, linear_kernel="mma_fused")
    llm = tiny_llm(tiny_target, tiny_draft, device=DEV, layer_kernels=True, linear_kernel="cublas")
    assert [m.model.layer_kernels.linear for m in (llm.engine.target, llm.engine.draft)] == ["cublas", "cublas"]
    # None (the default) chooses: the fused tensor-core linears with the layer kernels, torch's without
    assert tiny_llm(tiny_target, device=DEV, layer_kernels=True).engine.linear_kernel == "mma_fused"
    assert tiny_llm(tiny_target, device=DEV, layer_kernels=False).engine.linear_kernel == "cublas"


@pytest.mark.parametrize("query_len,lengths", [(2, [9, 14]), (3, [9, 14, 11, 20, 7]), (11, [12, 14, 13])],
                         ids=["4_rows", "15_rows", "33_rows"])
@pytest.mark.parametrize("fuses,norms,ropes", [(False, 3, 1), (True, 0, 0)], ids=["unfused", "fused"])
def test_the_tensor_core_linears_give_the_cublas_forwards_logits(monkeypatch, fuses, norms, ropes, query_len, lengths):
    """float16, a model whose widths the tensor-core GEMV takes (K = 192): linear="mma_fused" folds the
    norms, RoPE and the cache store into the GEMVs and the final norm into the last down projection
    and the LM head (no separate norm or RoPE kernel is left; past LM_HEAD_MAX_ROWS the head is the
    final norm and cuBLAS; past MLP_FUSED_MAX_ROWS the MLP is the norm, cuBLAS and SiLU x up); where the
    fused forms do not apply (fuses off) every linear layer still goes through the GEMV one by one
    (counted). Both agree with the torch path's forward, logits and K/V, for one token tile of the
    GEMV, for two, and for five."""
    from protospec.model import layer_kernels
    from protospec.kernels.linear import gemv_mma
    from protospec.model.layer_kernels import LayerKernelForward

    if DEV == "cpu" and not fuses and len(lengths) * query_len > layer_kernels.MLP_FUSED_MAX_ROWS:
        pytest.skip("on the CPU the GEMV is its torch twin, whatever its token tiles: unfused, 33 rows take the "
                    "15-row case's path (a minute and a half in the simulator)")
    cfg = LlamaArchConfig.from_dict(dict(TARGET_CFG, hidden_size=192, intermediate_size=192, num_hidden_layers=1,
                                         num_attention_heads=3, num_key_value_heads=1, vocab_size=64))
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).place(DEV, torch.float16)
    with torch.no_grad():  # norms that differ from each other, so a norm applied in the wrong place shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    block_size, num_blocks = 4, 48
    inputs = _uniform_batch(query_len, lengths, block_size, num_blocks, seed=3)
    inputs.input_ids.copy_(torch.randint(3, cfg.vocab_size, inputs.input_ids.shape))
    caches = [_randn(2, num_blocks, block_size, 1, cfg.head_dim, dtype=torch.float16, seed=1)]
    mma_caches = [c.clone() for c in caches]
    expected = model(inputs.input_ids, inputs.positions, caches, inputs.meta)  # the torch path
    calls, norm_calls = [], []
    # On the CPU the GEMV's torch twin stands in (the simulator takes a minute per forward; the kernel is
    # held to the twin in test_gemv_mma.py): here the forward's plumbing is what is tested.
    real = gemv_mma.gemv_mma if DEV != "cpu" else gemv_mma.gemv_mma_reference
    real_norm, real_rope, rope_calls = layer_kernels.add_rms_norm, layer_kernels.rope_and_cache, []
    monkeypatch.setattr(gemv_mma, "gemv_mma", lambda x, w, *a, **kw: calls.append(tuple(w.shape)) or real(x, w, *a, **kw))
    monkeypatch.setattr(layer_kernels, "add_rms_norm", lambda *a: norm_calls.append(1) or real_norm(*a))
    monkeypatch.setattr(layer_kernels, "rope_and_cache", lambda *a: rope_calls.append(1) or real_rope(*a))
    model.layer_kernels = LayerKernelForward(model, linear="mma_fused")
    assert model.layer_kernels.fuses  # the model's shapes fuse; the unfused case turns it off
    model.layer_kernels.fuses = fuses
    got = model(inputs.input_ids, inputs.positions, mma_caches, inputs.meta)
    # qkv, o, gate_up, down, and the LM head up to LM_HEAD_MAX_ROWS rows (past them the norm and cuBLAS)
    rows = len(lengths) * query_len
    head_on_gemv = rows <= layer_kernels.LM_HEAD_MAX_ROWS
    mlp_on_gemv = not fuses or rows <= layer_kernels.MLP_FUSED_MAX_ROWS
    final_norm = fuses and not (head_on_gemv and mlp_on_gemv)
    mlp_norm = not mlp_on_gemv
    assert len(calls) == 2 + 2 * mlp_on_gemv + head_on_gemv
    assert len(norm_calls) == norms + final_norm + mlp_norm and len(rope_calls) == ropes
    torch.testing.assert_close(got, expected, atol=2e-2, rtol=1e-2)
    torch.testing.assert_close(mma_caches[0], caches[0], **TOL[torch.float16])
    with pytest.raises(Exception, match="linear must be one of"):
        LayerKernelForward(model, linear="cutlass")


def test_dependent_launch_is_checked_and_reaches_every_model(tiny_target, tiny_draft):
    from tiny import tiny_llm

    from protospec.errors import ConfigError

    with pytest.raises(ConfigError, match="dependent_launch=True needs the tensor-core linears"):
        tiny_llm(tiny_target, device=DEV, layer_kernels=False, dependent_launch=True)
    with pytest.raises(ConfigError, match="'cublas'"):
        tiny_llm(tiny_target, device=DEV, layer_kernels=True, linear_kernel="cublas", dependent_launch=True)
    llm = tiny_llm(tiny_target, tiny_draft, device=DEV, layer_kernels=True, dependent_launch=True)
    assert [m.model.layer_kernels.dependent for m in (llm.engine.target, llm.engine.draft)] == [True, True]
    assert llm.engine.target.launches_dependents and llm.engine.draft.launches_dependents  # the sampling follows
    # The default: on wherever the tensor-core linears run on a CUDA device of sm_90 or later.
    from protospec.kernels.launch import dependent_launch

    default = tiny_llm(tiny_target, device=DEV, layer_kernels=True).engine
    assert default.dependent_launch == (DEV == "cuda" and dependent_launch.supported(torch.device(DEV)))
    assert default.target.model.layer_kernels.dependent == default.dependent_launch
    off = tiny_llm(tiny_target, device=DEV, layer_kernels=True, dependent_launch=False).engine
    assert not off.dependent_launch and not off.target.launches_dependents
    assert not tiny_llm(tiny_target).engine.target.launches_dependents  # torch's forwards (no layer kernels)
    assert not tiny_llm(tiny_target, device=DEV, layer_kernels=True, linear_kernel="cublas").engine.dependent_launch


def test_a_uniform_chunk_takes_the_layer_kernels_up_to_their_row_cap():
    """A batch of prompts prefilled as one uniform chunk (64 x 256 = 16,384 rows) runs on the layer
    kernels with long chunks on; one row past MAX_ROWS, or a long chunk without them, keeps the torch path."""
    from types import SimpleNamespace

    from protospec.model import layer_kernels

    model = LlamaForCausalLM(LlamaArchConfig.from_dict(TARGET_CFG)).place(DEV, torch.float32)
    forward = layer_kernels.LayerKernelForward(model, long_chunks=True)

    def chunk(rows: int, query_len: int = 256):
        return SimpleNamespace(uniform_query_len=query_len, block_tables=torch.zeros(1, 16, dtype=torch.int32),
                               block_size=16, slot_mapping=torch.zeros(rows, dtype=torch.int64))

    assert forward.applies(chunk(64 * 256)) and forward.applies(chunk(layer_kernels.MAX_ROWS))
    assert not forward.applies(chunk(layer_kernels.MAX_ROWS + 1))
    assert not layer_kernels.LayerKernelForward(model).applies(chunk(64 * 256))  # long chunks off

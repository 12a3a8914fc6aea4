"""The fusion switch keeps the tokens: the seed configuration's pair (dummy float16 weights) decodes the
same greedy and seeded tokens with the fused tensor-core linears (linear_kernel="mma_fused") as with
cuBLAS and the separate norm, RoPE and SiLU kernels ("cublas"), in the fastest draft loop: in the
first call (which captures the CUDA graphs) and in a later one (which replays them), as the ablation
times it; and with the fused linears launched as programmatic dependents (sm_90). At batch 4 the two
may part, but only at a near tie of float16 rounding."""
import pytest
import torch

from protospec.bench.ablation import BenchSetup


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the tensor-core GEMV runs a minute per forward in the simulator")
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "seeded"])
def test_fused_and_unfused_linears_decode_the_same_tokens(temperature):
    from protospec.kernels.launch import dependent_launch

    runs = {}
    configs = [("cublas", False), ("mma_fused", False)]
    if dependent_launch.supported(torch.device("cuda")):  # sm_90: the fused linears as dependents too
        configs.append(("mma_fused", True))
    for linear, dependent in configs:
        setup = BenchSetup("JackFram/llama-160m", "JackFram/llama-68m", 5, 256, 128, 1, 0, 1, load_format="dummy",
                           temperature=temperature, linear_kernel=linear, dependent_launch=dependent)
        llm = setup.llm(draft_loop="graph")
        assert [m.model.layer_kernels.fuses for m in (llm.engine.target, llm.engine.draft)] == [linear == "mma_fused"] * 2
        prompts = setup.prompts(llm.engine.vocab_size)
        runs[linear + "_dependent" * dependent] = [[o.token_ids for o in llm.generate(prompts, setup.params())]
                                                   for _ in range(3)]
        del llm
    assert len(runs["cublas"][0][0]) == 128
    for name, calls in runs.items():
        assert calls[1] == calls[0] and calls[2] == calls[0], f"{name}: a replayed call decoded other tokens"
    assert all(calls == runs["cublas"] for calls in runs.values())


def parting_gap(model, prompt: list[int], a: list[int], b: list[int]) -> tuple[int, float, float] | None:
    """Where two greedy decodes of one prompt first part: None where they never do, else (that index,
    how far the lower of the two tokens lies below the float32 reference's best logit there, float16's
    own largest logit error there). model: a protospec LlamaForCausalLM in float16; the reference is
    transformers' Llama on its weights, once in float32 and once as is."""
    from protospec.bench.hf_peer import to_hf

    i = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if i is None:
        return None
    ids = torch.tensor([list(prompt) + a[:i]], device=next(model.parameters()).device)
    hf = to_hf(model)
    with torch.no_grad():
        half = hf(ids).logits[0, -1].float()             # [V]
        full = hf.float()(ids).logits[0, -1]             # [V]
    below = (full.max() - torch.minimum(full[a[i]], full[b[i]])).item()
    return i, below, (half - full).abs().max().item()


def test_parting_gap_finds_the_first_difference_and_measures_it(tiny_target):
    """The helper itself, on the CPU: no parting, and a parting whose tokens it weighs."""
    from tiny import tiny_llm

    model = tiny_llm(tiny_target, dtype="float16").engine.target.model
    prompt = [5, 9, 11, 3]
    assert parting_gap(model, prompt, [4, 7, 8], [4, 7, 8]) is None
    index, below, error = parting_gap(model, prompt, [4, 7, 8], [4, 6, 8])
    assert index == 1 and below >= 0.0 and error >= 0.0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the tensor-core GEMV runs a minute per forward in the simulator")
def test_at_batch_4_fused_and_cublas_linears_part_only_at_near_ties():
    """Batch 4 (24 verify rows: three token tiles, the LM head on cuBLAS past LM_HEAD_MAX_ROWS): greedy
    tokens of the fused and the cuBLAS linears may part where two tokens' logits lie within float16's
    rounding (512 tokens of dummy weights make such ties likely), but only there: at each request's
    first difference both tokens lie within twice float16's own logit error of the float32
    reference's best. A wrong token tile or row would part at a token far below it."""
    runs, model, prompts = {}, None, None
    for linear in ("cublas", "mma_fused"):
        setup = BenchSetup("JackFram/llama-160m", "JackFram/llama-68m", 5, 256, 128, 4, 0, 1, load_format="dummy",
                           temperature=0.0, linear_kernel=linear)
        llm = setup.llm(draft_loop="graph")
        prompts = setup.prompts(llm.engine.vocab_size)
        runs[linear] = [o.token_ids for o in llm.generate(prompts, setup.params())]
        if model is None:  # the reference's weights (the same dummy weights in both engines)
            model = llm.engine.target.model
        del llm
    for prompt, a, b in zip(prompts, runs["cublas"], runs["mma_fused"]):
        parted = parting_gap(model, prompt, a, b)
        if parted is not None:
            index, below, error = parted
            assert below <= 2 * error, f"parted at token {index}: {below:.4f} below the best, float16 error {error:.4f}"

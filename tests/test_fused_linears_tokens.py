"""The fusion switch keeps the tokens: the seed configuration's pair (dummy float16 weights) decodes the
same greedy and seeded tokens with the fused tensor-core linears (linear_kernel="mma_fused") as with
cuBLAS and the separate norm, RoPE and SiLU kernels ("cublas"), in the fastest draft loop: in the
first call (which captures the CUDA graphs) and in a later one (which replays them), as the ablation
times it; and with the fused linears launched as programmatic dependents (sm_90)."""
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

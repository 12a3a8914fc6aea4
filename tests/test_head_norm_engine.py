"""The LM head's final norm as a kernel of its own (layer_kernels.HEAD_NORM = "separate",
gemv_mma.head_norm) end to end: an engine whose forwards run the tensor-core layer kernels (float16,
on a GPU) launches it before the plain LM head and emits the tokens of the fused head form, greedy
and seeded, in the captured draft loop. (The kernel's bits against the fused form's run in the
simulator too: tests/test_gemv_mma.py.)"""
import pytest
import torch

from protospec.config import SamplingParams


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "seeded_t1"])
def test_the_separate_head_norm_keeps_the_engines_tokens(mma_pair, temperature, monkeypatch,
                                                         launched_kernels):
    from tiny import random_prompts, tiny_llm

    from protospec.model import layer_kernels

    names = launched_kernels
    params = SamplingParams(temperature=temperature, max_tokens=24, ignore_eos=True, seed=4)
    prompts = random_prompts(3, seed=3)
    tokens = {}
    for head_norm in ("fused", "separate"):
        monkeypatch.setattr(layer_kernels, "HEAD_NORM", head_norm)
        names.clear()
        llm = tiny_llm(*mma_pair, k=3, dtype="float16", device="cuda", draft_loop="graph")
        tokens[head_norm] = [o.token_ids for o in llm.generate(prompts, params)]
        assert any(name.startswith("head_norm_") for name in names) is (head_norm == "separate")
    assert tokens["separate"] == tokens["fused"] and all(len(t) == params.max_tokens for t in tokens["fused"])

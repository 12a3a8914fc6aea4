"""The LM head's tile statistics end to end (kernels/logit_stats.py, gemv_mma.LOGIT_STATS): an engine
whose forwards run the tensor-core layer kernels (float16, on a GPU) launches the head's form with the
statistics and emits the tokens it emits with them off, greedy and seeded at T = 1, in both loops. (The
captured loop samples each draft token in one launch, which takes no statistics; the step-by-step loop's
logits come back as slices of a graph's buffer, without them: its sampler falls back.) (The simulator would take minutes for one such
engine; the kernels' own tests run there: tests/test_gemv_mma.py, tests/test_sampling_kernel.py.)"""
import pytest
import torch

from protospec.config import SamplingParams


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("mode", ["gpu", "graph"])
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "seeded_t1"])
def test_tile_statistics_keep_the_engines_tokens(mma_pair, temperature, mode, monkeypatch,
                                                 launched_kernels):
    from tiny import random_prompts, tiny_llm

    from protospec.kernels import gemv_mma

    names = launched_kernels
    params = SamplingParams(temperature=temperature, max_tokens=24, ignore_eos=True, seed=4)
    prompts = random_prompts(3, seed=3)
    tokens = {}
    for on in (False, True):
        monkeypatch.setattr(gemv_mma, "LOGIT_STATS", on)
        names.clear()
        llm = tiny_llm(*mma_pair, k=3, dtype="float16", device="cuda", draft_loop=mode)
        assert llm.engine.fused_sampling
        tokens[on] = [o.token_ids for o in llm.generate(prompts, params)]
        head_forms = [name for name in names if name.startswith("gemv_mma_")]
        assert any("stats" in name.split("_") for name in head_forms) is on  # the LM head's form with the statistics
    assert tokens[True] == tokens[False] and all(len(t) == params.max_tokens for t in tokens[True])

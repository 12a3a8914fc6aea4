"""The LM head's tile statistics end to end (kernels/logit_stats.py, gemv_mma.LOGIT_STATS): an engine
whose forwards run the tensor-core layer kernels (float16, on a GPU) samples without the statistics
kernel in the captured draft loop (the step-by-step loop falls back) and emits the tokens it emits with
them off, greedy and seeded at T = 1, in both loops. (The simulator would take minutes for one such
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
    from protospec.spec import probs_branch

    # the captured loop's two-launch sampler (the one-launch token takes no statistics)
    monkeypatch.setattr(probs_branch, "SAMPLE_FIRST", False)
    names = launched_kernels
    params = SamplingParams(temperature=temperature, max_tokens=24, ignore_eos=True, seed=4)
    prompts = random_prompts(3, seed=3)
    tokens, statistics_kernels = {}, {}
    for on in (False, True):
        monkeypatch.setattr(gemv_mma, "LOGIT_STATS", on)
        names.clear()
        llm = tiny_llm(*mma_pair, k=3, dtype="float16", device="cuda", draft_loop=mode)
        assert llm.engine.fused_sampling
        tokens[on] = [o.token_ids for o in llm.generate(prompts, params)]
        head_forms = [name for name in names if name.startswith("gemv_mma_")]
        assert any("stats" in name.split("_") for name in head_forms) is on  # the LM head's form with the statistics
        # The captured draft loop samples the logits tensor the head returned; the step-by-step loop's
        # forwards are graph replays whose logits come back as a slice of the graph's buffer, without
        # the statistics: its sampler falls back (the head's form still launched at capture).
        assert ("probs_from_tiles_kernel" in names) is (on and mode == "graph")
        statistics_kernels[on] = names.count("row_stats_kernel")  # prefills (not the layer kernels') keep it
    assert (statistics_kernels[True] < statistics_kernels[False]) is (mode == "graph")
    assert tokens[True] == tokens[False] and all(len(t) == params.max_tokens for t in tokens[True])

"""The same-bits kernel forms end to end (the tensor-core GEMV's, the attention's, the sampling's): an engine
whose forwards run the tensor-core layer kernels (float16, on a GPU) launches the form it is set to and emits
the tokens of the other form, greedy and seeded, in the captured draft loop. The forms: the LM head's final
norm as a kernel of its own, folded into the head, run by the last down projection's last block, or taken from
the sums of squares it writes (layer_kernels.HEAD_NORM); the o and down projections' K split over several
blocks a tile or not (gemv_mma.O_K_SPLITS, DOWN_K_SPLITS); the linears that let the next kernel launch before
their wait (gemv_mma.EARLY_ALLOW); the wait kept below the weight loads (gemv_mma.PIN_WEIGHT_LOADS); the
weights loaded 16 bytes at a time (gemv_mma.WIDE_WEIGHT_LOADS); the attention loading a warp's next key tile
before this one's products (attention_mma.PIPELINE); the probabilities kernel's logits and noise before its
wait (sampling.PROBS_PREFETCH); the draft step's advance done by the probabilities kernel
(sampling.ADVANCE_IN_SAMPLER). (Their bits against each other run in the simulator too:
tests/test_gemv_mma.py, test_attention_mma.py, test_sampling_kernel.py.)"""
import pytest
import torch

from protospec.config import SamplingParams

FORMS = {  # setting -> (module, attribute, the two values, a kernel name only the second launches[, other forms'
    # values to run beside it, where its effect depends on them: every other form is at its first value)
    "head_norm": ("protospec.model.layer_kernels", "HEAD_NORM", ("fused", "separate"), "head_norm_"),
    "head_norm_squares": ("protospec.model.layer_kernels", "HEAD_NORM", ("tail", "squares"),
                          "gemv_mma_k768_dep_squares"),
    "head_norm_tail": ("protospec.model.layer_kernels", "HEAD_NORM", ("separate", "tail"), "gemv_mma_k768_dep_normtail"),
    "down_k_splits": ("protospec.kernels.gemv_mma", "DOWN_K_SPLITS", (1, 2), "gemv_mma_k768_dep_split2"),
    "o_k_splits": ("protospec.kernels.gemv_mma", "O_K_SPLITS", (1, 2), "gemv_mma_k384_dep_split2"),
    "gemv_early_allow": ("protospec.kernels.gemv_mma", "EARLY_ALLOW",
                         (frozenset(), frozenset({"o", "gate_up", "down"})), "gemv_mma_k384_dep_early"),
    "pin_weight_loads": ("protospec.kernels.gemv_mma", "PIN_WEIGHT_LOADS", (False, True), "gemv_mma_k384_dep_pin"),
    "wide_weight_loads": ("protospec.kernels.gemv_mma", "WIDE_WEIGHT_LOADS", (False, True), "gemv_mma_k384_dep_w16"),
    "attention_pipeline": ("protospec.kernels.attention_mma", "PIPELINE", (False, True), "attention_mma_kernel_pipe"),
    "probs_prefetch": ("protospec.kernels.sampling", "PROBS_PREFETCH", (False, True), None),  # one kernel name
    "advance_in_sampler": ("protospec.kernels.sampling", "ADVANCE_IN_SAMPLER", (False, True), None),  # one kernel less
}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "seeded_t1"])
def test_a_same_bits_form_keeps_the_engines_tokens(mma_pair, form, temperature, monkeypatch, launched_kernels):
    import importlib

    from tiny import random_prompts, tiny_llm

    module, attribute, values, marker, *beside = FORMS[form]
    names = launched_kernels
    params = SamplingParams(temperature=temperature, max_tokens=24, ignore_eos=True, seed=4)
    prompts = random_prompts(3, seed=3)
    tokens = {}
    for other in FORMS.values():  # every other form at its first value, so only this one's marker can show
        monkeypatch.setattr(importlib.import_module(other[0]), other[1], other[2][0])
    for name, value in (beside[0] if beside else {}).items():
        monkeypatch.setattr(importlib.import_module(FORMS[name][0]), FORMS[name][1], value)
    for value in values:
        monkeypatch.setattr(importlib.import_module(module), attribute, value)
        names.clear()
        llm = tiny_llm(*mma_pair, k=3, dtype="float16", device="cuda", draft_loop="graph")
        tokens[value] = [o.token_ids for o in llm.generate(prompts, params)]
        if marker is not None:
            assert any(name.startswith(marker) for name in names) is (value == values[1])
    assert tokens[values[1]] == tokens[values[0]] and all(len(t) == params.max_tokens for t in tokens[values[0]])

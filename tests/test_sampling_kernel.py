"""The fused sampling kernels against the torch sampler (simulator on CPU, the GPU where there is
one): probabilities to float32 rounding, the same ids, greedy rows one-hot, the verify's layout."""
import pytest
import torch

from protospec.config import SamplingParams
from protospec.errors import KernelArgumentError
from protospec.kernels.launch.interop import KERNEL_DEVICE_TYPE
from protospec.kernels.sampling.softmax_sample import fused_applies, probs_into, sample_into
from protospec.speculation.sampler import SamplingTensors, compute_probs, exponential_noise, sample

DEV = KERNEL_DEVICE_TYPE


def _tensors(temperatures, vocab):
    params = [SamplingParams(temperature=t) for t in temperatures]
    gens = [torch.Generator(device=DEV).manual_seed(i) for i in range(len(params))]
    return SamplingTensors.build(params, gens, vocab, DEV)


@pytest.mark.parametrize("temperatures", [[0.7, 1.0, 1.3], [1.0, 0.0, 0.5], [0.0, 0.0]])
def test_draft_step_sample_matches_the_torch_sampler(temperatures):
    batch, k, vocab, step = len(temperatures), 3, 300, 1
    st = _tensors(temperatures, vocab)
    logits = (torch.randn(batch, vocab, generator=torch.Generator().manual_seed(0)) * 3).to(DEV)
    noise = None if st.all_greedy else exponential_noise((2 * k + 1, vocab), st.generators, DEV)  # the spec step's block
    ref_ids, ref_probs = sample(logits, st, None if noise is None else noise[:, step])

    draft_ids = torch.full((batch, k), -7, dtype=torch.int64, device=DEV)
    draft_probs = torch.zeros(batch, k, vocab, device=DEV)
    mirror = torch.full((batch + 2,), -7, dtype=torch.int64, device=DEV)
    sample_into(logits, st, step, draft_probs, draft_ids, noise, mirror)
    assert draft_ids[:, step].tolist() == ref_ids.tolist() == mirror[:batch].tolist()
    assert mirror[batch:].tolist() == [-7, -7] and (draft_ids[:, [0, 2]] == -7).all()  # nothing else written
    # a mirror that is a column of a wider buffer (the verify's tokens: a row's k + 1 side by side)
    tokens = torch.full((batch, k + 1), -7, dtype=torch.int64, device=DEV)
    sample_into(logits, st, step, torch.zeros_like(draft_probs), draft_ids, noise, tokens[:, step + 1])
    assert tokens[:, step + 1].tolist() == ref_ids.tolist()
    assert (tokens[:, [0, 1, 3]] == -7).all()
    torch.testing.assert_close(draft_probs[:, step], ref_probs, atol=1e-6, rtol=1e-5)
    assert draft_probs[:, [0, 2]].abs().sum() == 0
    for b, t in enumerate(temperatures):
        if t == 0:  # greedy: one-hot at the argmax
            assert draft_probs[b, step].sum() == 1 and draft_probs[b, step, logits[b].argmax()] == 1


def test_more_slices_than_threads_are_combined_by_every_thread_in_turn(monkeypatch):
    """A vocabulary of more slices than a block has threads (a block's threads then take several
    slices each when they combine them): the sample and the probabilities are still the torch sampler's,
    and a greedy row's max in the very last slice is found."""
    from protospec.kernels.sampling import slices as sampling_slices

    slice_width = _narrow_slices(monkeypatch)
    vocab, k, step = (sampling_slices.THREADS + 8) * slice_width, 2, 1
    st = _tensors([0.8, 0.0], vocab)
    logits = torch.randn(2, vocab, generator=torch.Generator().manual_seed(6)) * 2
    logits[1, vocab - 3] = 40.0
    logits = logits.to(DEV)
    noise = exponential_noise((2 * k + 1, vocab), st.generators, DEV)
    ref_ids, ref_probs = sample(logits, st, noise[:, step])
    draft_ids = torch.zeros(2, k, dtype=torch.int64, device=DEV)
    draft_probs = torch.zeros(2, k, vocab, device=DEV)
    sample_into(logits, st, step, draft_probs, draft_ids, noise)
    assert draft_ids[:, step].tolist() == ref_ids.tolist() and draft_ids[1, step] == vocab - 3
    torch.testing.assert_close(draft_probs[:, step], ref_probs, atol=1e-6, rtol=1e-5)


def test_masked_logits_spanning_whole_slices_of_the_vocabulary():
    """-inf logits over whole blocks' slices (a masked stretch of the vocabulary): those slices add
    nothing, the rest is the torch sampler's softmax and sample (no NaN from -inf - -inf)."""
    batch, k, vocab, step = 2, 2, 300, 0
    st = _tensors([1.0, 0.0], vocab)
    logits = (torch.randn(batch, vocab, generator=torch.Generator().manual_seed(3)) * 3)
    logits[:, :150] = -float("inf")  # a whole simulator slice of 128 and part of the next
    logits = logits.to(DEV)
    noise = exponential_noise((2 * k + 1, vocab), st.generators, DEV)
    ref_ids, ref_probs = sample(logits, st, noise[:, step])
    draft_ids = torch.zeros(batch, k, dtype=torch.int64, device=DEV)
    draft_probs = torch.zeros(batch, k, vocab, device=DEV)
    sample_into(logits, st, step, draft_probs, draft_ids, noise)
    assert draft_ids[:, step].tolist() == ref_ids.tolist()
    assert torch.isfinite(draft_probs).all() and (draft_probs[:, step, :150] == 0).all()
    torch.testing.assert_close(draft_probs[:, step], ref_probs, atol=1e-6, rtol=1e-5)


def test_verify_probs_follow_each_sequences_temperature():
    batch, rows_per_seq, vocab = 2, 3, 300  # several slices of the vocabulary per row
    st = _tensors([0.5, 0.0], vocab)
    logits = torch.randn(batch * rows_per_seq, vocab, generator=torch.Generator().manual_seed(1)).to(DEV)
    got = probs_into(logits, st, torch.empty_like(logits), rows_per_seq)
    torch.testing.assert_close(got, compute_probs(logits, st, rows_per_seq=rows_per_seq), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("vocab", [300, 7000], ids=["simulator-slices", "gpu-slices"])
def test_ties_across_slices_go_to_the_lowest_index_and_masked_rows_to_zero(vocab):
    """Greedy rows: equal maxima in different slices of the vocabulary (blocks of VOCAB_PER_BLOCK)
    pick the lowest index, as torch.argmax does; a row of -inf logits picks 0. Twice in a row: the
    slices' arrival counters are back at zero between calls."""
    from protospec.kernels.sampling import slices

    if vocab > 3 * slices.VOCAB_PER_BLOCK * 2:  # the simulator's 128-entry slices: fifty-odd blocks
        pytest.skip("sized for the GPU's slices")
    st = _tensors([0.0, 0.0], vocab)
    logits = torch.randn(2, vocab, generator=torch.Generator().manual_seed(4))
    low, high = 10, vocab - 20  # different slices at either slice width
    logits[0, [low, high]] = 50.0
    logits[1] = -float("inf")
    logits = logits.to(DEV)
    for _ in range(2):
        ids = torch.full((2, 1), -7, dtype=torch.int64, device=DEV)
        probs = torch.zeros(2, 1, vocab, device=DEV)
        sample_into(logits, st, 0, probs, ids, None)
        assert ids[:, 0].tolist() == [low, 0] == logits.argmax(-1).tolist()
        assert probs[0, 0, low] == 1 and probs[0, 0].sum() == 1


def _narrow_slices(monkeypatch):
    """The simulator reads the block and slice widths at run time: narrow ones keep its tests small."""
    from protospec.kernels.launch import interop
    from protospec.kernels.sampling import softmax_sample as sampling, slices as sampling_slices

    if interop.SIMULATOR:
        for module in (sampling, sampling_slices):
            monkeypatch.setattr(module, "THREADS", 8)
            monkeypatch.setattr(module, "VOCAB_PER_BLOCK", 16, raising=False)
    return sampling_slices.VOCAB_PER_BLOCK


def mixed_case(batch, rows_per_seq, slice_width, seed, k=2):
    """Sequences at T = 0.7, greedy and 1.3 over three slices of the vocabulary (the last one cut): row 0
    masked over a whole slice and part of the next, the greedy sequence's first row all -inf (its id
    is 0). (st, logits [B * rows_per_seq, V], noise [B, k, V] Exp(1))."""
    vocab = 3 * slice_width - 8
    st = _tensors([0.7, 0.0, 1.3][:batch], vocab)
    logits = torch.randn(batch * rows_per_seq, vocab, generator=torch.Generator().manual_seed(seed)) * 4
    logits[0, : slice_width + 2] = -float("inf")
    logits[rows_per_seq] = -float("inf")
    noise = exponential_noise((2 * k + 1, vocab), st.generators, DEV)[:, :k].contiguous()
    return st, logits.to(DEV), noise


def sample_layout(logits, st, step, noise, rows_per_seq, dependent=False):
    """One call in the draft layout (rows_per_seq 1: sample step `step` of noise [B, k, V]) or the verify's
    (probabilities only, rows_per_seq rows a sequence): (ids [R, k] with -7 where not written, probs), on the CPU."""
    rows, vocab, k = logits.shape[0], logits.shape[1], noise.shape[1]
    ids = torch.full((rows, k), -7, dtype=torch.int64, device=DEV)
    if rows_per_seq == 1:
        probs = torch.zeros(rows, k, vocab, device=DEV)
        sample_into(logits, st, step, probs, ids, noise, dependent=dependent)
    else:
        probs = probs_into(logits, st, torch.zeros(rows, vocab, device=DEV), rows_per_seq, dependent)
    return ids.cpu(), probs.cpu()


@pytest.mark.parametrize("batch,rows_per_seq", [(3, 1), (2, 3)])
def test_the_dependent_form_gives_the_plain_forms_bits(monkeypatch, launched_kernels, batch, rows_per_seq):
    """As a dependent the probabilities kernel reads its slice's logits and noise before its wait into
    registers: probabilities and ids equal bit for bit to the plain launch's (loads where they are
    used), and the torch sampler's ids, over sampled and greedy rows (greedy rows read no logits), a
    masked stretch, a greedy row of -inf and a slice cut by the vocabulary, in the draft and the
    verify layouts; twice in a row (the arrival counters back at zero)."""
    from protospec.kernels.sampling import softmax_sample as sampling

    st, logits, noise = mixed_case(batch, rows_per_seq, _narrow_slices(monkeypatch), seed=12)
    step, out = 1, {}
    for dependent, calls in ((False, 1), (True, 2)):
        for _ in range(calls):
            out[dependent] = sample_layout(logits, st, step, noise, rows_per_seq, dependent=dependent)
    assert torch.equal(out[True][0], out[False][0]) and torch.equal(out[True][1], out[False][1])
    if rows_per_seq == 1:  # and both are the torch sampler's
        ref_ids, ref_probs = sample(logits, st, noise[:, step])
        assert out[True][0][:, step].tolist() == ref_ids.tolist() and ref_ids[1] == 0
        torch.testing.assert_close(out[True][1][:, step], ref_probs.cpu(), atol=1e-6, rtol=1e-5)
    assert launched_kernels == ["row_stats_kernel", "probs_and_sample_kernel"] * 3
    assert not sampling.arrival_counters(logits.device, logits.shape[0], "sampling").any()  # for the next call


def test_filtered_batches_keep_the_torch_path_and_bad_buffers_are_named():
    st = SamplingTensors.build([SamplingParams(temperature=1.0, top_k=5)], [torch.Generator(device=DEV)], 50, DEV)
    assert not fused_applies(st) and fused_applies(_tensors([1.0], 50))
    logits = torch.zeros(1, 50, device=DEV)
    with pytest.raises(KernelArgumentError, match="probs_out"):
        sample_into(logits, _tensors([1.0], 50), 0, torch.zeros(1, 2, 49, device=DEV), torch.zeros(1, 2, dtype=torch.int64, device=DEV),
                    torch.ones(1, 2, 50, device=DEV))
    with pytest.raises(KernelArgumentError, match="noise"):
        sample_into(logits, _tensors([1.0], 50), 0, torch.zeros(1, 2, 50, device=DEV), torch.zeros(1, 2, dtype=torch.int64, device=DEV), None)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("mode", ["main", "gpu", "graph"])
def test_the_engine_gives_the_same_greedy_tokens_with_either_sampler(tiny_target, tiny_draft, mode):
    from tiny import random_prompts, tiny_llm

    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    runs = {}
    for fused in (False, True):
        llm = tiny_llm(tiny_target, tiny_draft, k=3, device="cuda", fused_sampling=fused, draft_loop=mode)
        runs[fused] = [o.token_ids for o in llm.generate(random_prompts(3, seed=8), params)]
    assert runs[True] == runs[False]


def test_the_sampling_kernels_are_the_default_only_on_a_gpu_with_the_layer_kernels(tiny_target, tiny_draft):
    """Where they were measured faster; in the simulator (layer kernels asked for on a CPU) they would
    only be slow, and a torch-only engine keeps torch's sampler unless they are asked for."""
    from tiny import tiny_llm

    if KERNEL_DEVICE_TYPE == "cpu":  # the simulator: layer kernels on CPU tensors
        simulated = tiny_llm(tiny_target, tiny_draft, k=2, layer_kernels=True).engine
        assert simulated.use_layer_kernels and not simulated.fused_sampling
        assert tiny_llm(tiny_target, tiny_draft, k=2, fused_sampling=True).engine.fused_sampling
    assert not tiny_llm(tiny_target, tiny_draft, k=2).engine.fused_sampling
    if torch.cuda.is_available():
        assert tiny_llm(tiny_target, tiny_draft, k=2, device="cuda").engine.fused_sampling
        assert not tiny_llm(tiny_target, tiny_draft, k=2, device="cuda", layer_kernels=False).engine.fused_sampling



@pytest.mark.parametrize("dependent", [pytest.param(False, marks=pytest.mark.skipif(
    DEV == "cpu", reason="the simulator ignores the flag and samples slowly: the other case shows the threading")), True])
def test_the_sampling_kernels_launch_as_dependents_exactly_when_the_forwards_do(tiny_target, tiny_draft, dependent,
                                                                               monkeypatch):
    """Every sampling launch (draft steps, the verify's probabilities, the prefill's token) and the draft's
    advance_step follow the forward that wrote the logits: programmatic dependents when that model's
    kernels are (ModelRunner.launches_dependents, from dependent_launch), ordinary launches otherwise; the
    same tokens either way (on a GPU the dependents really overlap; in the simulator both are no-ops)."""
    from tiny import random_prompts, tiny_llm

    from protospec.kernels.sampling import softmax_sample as sampling
    from protospec.model.runner import ModelRunner

    seen, launch = [], sampling._launch

    def recording(logits, st, rows_per_seq, probs_out, step, noise, ids_out, mirror, dependent=False, advance=None,
                  space="", span=None):
        seen.append((rows_per_seq, dependent))
        launch(logits, st, rows_per_seq, probs_out, step, noise, ids_out, mirror, dependent, advance, space, span)

    params = SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True, seed=3)
    prompts = random_prompts(1, seed=2)
    expected = None
    if DEV == "cuda":  # where the dependents really start early, the tokens must not move
        plain = tiny_llm(tiny_target, tiny_draft, k=2, device=DEV, fused_sampling=True, draft_loop="gpu",
                         dependent_launch=False)
        expected = [o.token_ids for o in plain.generate(prompts, params)]
    monkeypatch.setattr(ModelRunner, "launches_dependents", property(lambda runner: dependent))
    monkeypatch.setattr(sampling, "_launch", recording)
    llm = tiny_llm(tiny_target, tiny_draft, k=2, device=DEV, fused_sampling=True, draft_loop="gpu")
    tokens = [o.token_ids for o in llm.generate(prompts, params)]
    assert len(tokens[0]) == params.max_tokens and tokens == (expected or tokens)
    assert {flag for _, flag in seen} == {dependent}
    assert {rows for rows, _ in seen} == {1, 3}  # draft samples and the verify's k + 1 rows a sequence
    from protospec.kernels.inputs.advance_step import _advance_kernel  # advance_step follows the sampling's choice
    assert llm.engine.spec_step.draft_loop.decode.advance.kernel is _advance_kernel(dependent)


@pytest.mark.parametrize("dependent", [False, True])
def test_the_callers_dependent_argument_picks_the_form(dependent, monkeypatch):
    """What the caller asks for decides: both kernels go out as dependents (and as the kernels built
    with the wait) exactly when it asks."""
    from protospec.kernels.launch import interop
    from protospec.kernels.sampling import softmax_sample as sampling

    launched = []
    monkeypatch.setattr(interop, "launch_tensors",
                        lambda kernel, grid, block, args, dependent=False: launched.append((kernel, dependent)))
    st, vocab = _tensors([1.0], 50), 50
    sample_into(torch.zeros(1, vocab, device=DEV), st, 0, torch.zeros(1, 2, vocab, device=DEV),
                torch.zeros(1, 2, dtype=torch.int64, device=DEV), torch.ones(1, 2, vocab, device=DEV),
                dependent=dependent)
    assert [flag for _, flag in launched] == [dependent, dependent]
    from protospec.kernels.sampling.stats import stats_kernel

    # statistics, probabilities: one slice a block on a one-row grid
    assert [kernel for kernel, _ in launched] == [stats_kernel(dependent, False), sampling._kernel(dependent, 1)]

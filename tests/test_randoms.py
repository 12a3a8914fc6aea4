"""A spec step's random numbers drawn for the whole batch at once (counter_randoms): the kernel equals
its torch twin, the numbers have the right laws, a request's numbers depend on its seed only, kept
rows (or their keys) are reused without touching their generator, and the engine's modes stay
token-identical."""
import pytest
import torch

from protospec import SamplingParams
from protospec.speculation import randoms
from protospec.kernels.randoms import counter_randoms
from protospec.kernels.launch.interop import KERNEL_DEVICE_TYPE
from protospec.speculation.randoms import SpecStepRandoms, step_key
from protospec.speculation.sampler import SamplingTensors
from tiny import random_prompts, tiny_llm

DEV = KERNEL_DEVICE_TYPE


def _keys(*values):
    return torch.tensor([counter_randoms.split_key(v) for v in values], dtype=torch.int64)


def test_the_kernel_computes_its_torch_twin():
    keys = _keys(1, 2**63 + 12345, 2**64 - 1)
    noise = torch.empty(3, 3, 7, device=DEV)
    uniforms = torch.empty(3, 2, device=DEV)
    counter_randoms.fill_kernel(keys.to(DEV), noise, uniforms)
    twin_noise, twin_uniforms = counter_randoms.fill_torch(keys, 3, 7, 2)
    assert torch.equal(uniforms.cpu(), twin_uniforms)           # integer hash, exact
    torch.testing.assert_close(noise.cpu(), twin_noise, rtol=1e-6, atol=0)  # the log may differ in its last bit


def test_a_fill_from_a_later_number_writes_the_uniforms_of_the_whole_fill():
    """first = R V with no noise rows: the uniforms alone, the very numbers of the fill of R noise rows
    (a spec step whose samplers draw their noise from the keys fills only these)."""
    keys = _keys(7, 2**40 + 3).to(DEV)
    noise, uniforms, alone = torch.empty(2, 3, 7, device=DEV), torch.empty(2, 2, device=DEV), torch.empty(2, 2, device=DEV)
    counter_randoms.fill_kernel(keys, noise, uniforms)
    counter_randoms.fill_kernel(keys, torch.empty(2, 0, 7, device=DEV), alone, first=3 * 7)
    assert torch.equal(alone, uniforms)


def test_the_twin_hash_matches_plain_integer_arithmetic():
    """int64 torch ops must give lowbias32's 32-bit results (a carry or sign slip would not)."""
    def lowbias32(x):
        x ^= x >> 16
        x = (x * 0x7FEB352D) & 0xFFFFFFFF
        x ^= x >> 15
        x = (x * 0x846CA68B) & 0xFFFFFFFF
        return x ^ (x >> 16)
    index, lo, hi = [0, 1, 7, 2**31, 2**32 - 1], 0xDEADBEEF, 0x12345678
    expected = [lowbias32(lowbias32(((i * 0x9E3779B9) & 0xFFFFFFFF) ^ lo) ^ hi) for i in index]
    got = counter_randoms.hash_torch(torch.tensor(index), torch.tensor(lo), torch.tensor(hi))
    assert got.tolist() == expected


def test_noise_is_exponential_and_uniforms_are_uniform():
    noise, uniforms = counter_randoms.fill_torch(_keys(*range(8)), 4, 5000, 3000)
    assert noise.min() > 0 and torch.isfinite(noise).all()
    assert uniforms.min() >= 0 and uniforms.max() < 1
    assert abs(noise.mean() - 1) < 0.01 and abs(noise.var() - 1) < 0.03            # 160k samples
    assert abs(uniforms.mean() - 0.5) < 0.005 and abs(uniforms.var() * 12 - 1) < 0.02
    # P(Exp(1) > 3) = e^-3; rows (keys) are not copies of one another
    assert abs((noise > 3).float().mean() - torch.exp(torch.tensor(-3.0))) < 0.003
    corr = torch.corrcoef(noise.flatten(1))  # 8 rows of 20k: off-diagonal ~ N(0, 0.007^2)
    assert (corr - torch.eye(8)).abs().max() < 0.035


def _st(seeds):
    gens = [torch.Generator(device=DEV).manual_seed(s) for s in seeds]
    return SamplingTensors.build([SamplingParams(temperature=1.0)] * len(seeds), gens, 50, DEV)


def test_a_requests_numbers_depend_on_its_seed_not_its_row_or_neighbours():
    alone = SpecStepRandoms.draw(_st([6]), 3, 50, DEV, batched=True)
    in_batch = SpecStepRandoms.draw(_st([5, 6, 6]), 3, 50, DEV, batched=True)
    assert torch.equal(in_batch.noise_block[1], alone.noise_block[0]) and torch.equal(in_batch.uniforms[2], alone.uniforms[0])
    assert not torch.equal(in_batch.noise_block[0], in_batch.noise_block[1])
    # and the next step of the same request draws new numbers
    st = _st([6])
    first, second = (SpecStepRandoms.draw(st, 3, 50, DEV, batched=True) for _ in range(2))
    assert not torch.equal(first.noise_block, second.noise_block)
    assert first.noise_block.shape == (1, 7, 50) and first.uniforms.shape == (1, 3)


def test_kept_rows_are_reused_and_leave_their_generator_alone():
    st = _st([1, 2])
    kept_row = (torch.full((3,), 0.25, device=DEV), torch.full((7, 50), 2.0, device=DEV))
    before = step_key(torch.Generator(device=DEV).manual_seed(2))
    r = SpecStepRandoms.draw(st, 3, 50, DEV, kept=[None, kept_row], batched=True)
    assert torch.equal(r.uniforms[1], kept_row[0]) and torch.equal(r.noise_block[1], kept_row[1])
    assert step_key(st.generators[1]) == before  # its first key is still to come


def test_a_kept_key_regenerates_the_discarded_steps_numbers_and_leaves_its_generator_alone():
    first = SpecStepRandoms.draw(_st([4, 8]), 3, 50, DEV, batched=True)
    kept = [None, first.kept_row(1)]
    assert isinstance(kept[1], int) and kept[1] == first.keys[1]
    st = _st([5, 8])
    before = step_key(torch.Generator(device=DEV).manual_seed(8))
    again = SpecStepRandoms.draw(st, 3, 50, DEV, kept=kept, batched=True)
    assert torch.equal(again.noise_block[1], first.noise_block[1]) and torch.equal(again.uniforms[1], first.uniforms[1])
    assert not torch.equal(again.noise_block[0], first.noise_block[0])
    assert step_key(st.generators[1]) == before  # the kept row drew no key
    # a per-request draw that meets a kept key regenerates the same numbers from it
    mixed = SpecStepRandoms.draw(_st([5, 9]), 3, 50, DEV, kept=kept, batched=False)
    assert torch.allclose(mixed.noise_block[1], first.noise_block[1]) and torch.equal(mixed.uniforms[1], first.uniforms[1])


def test_keyed_randoms_are_views_of_the_owners_buffers_and_draw_the_batched_keys():
    uniforms, noise = torch.zeros(2, 3), torch.ones(2, 7, 50)
    r = SpecStepRandoms.keyed(_st([1, 2]), 3, uniforms, noise, kept=[None, 77])
    assert r.keys == [step_key(torch.Generator(device=DEV).manual_seed(1)), 77]
    assert r.noise_block is noise and r.recovered_noise.data_ptr() == noise[:, 3].data_ptr()
    assert r.bonus_noise.data_ptr() == noise[:, 6].data_ptr() and r.kept_row(1) == 77
    # the owner's fill from those keys gives what a batched draw gives
    drawn = SpecStepRandoms.draw(_st([1, 2]), 3, 50, DEV, kept=[None, 77], batched=True)
    filled, filled_uniforms = counter_randoms.fill_torch(_keys(*r.keys), 7, 50, 3)
    torch.testing.assert_close(drawn.noise_block.cpu(), filled, rtol=1e-6, atol=0)  # the log's last bit
    assert torch.equal(drawn.uniforms.cpu(), filled_uniforms)


def test_batched_draws_keep_the_modes_token_identical(tiny_target, tiny_draft, monkeypatch):
    """The batched fill (a GPU engine's randoms) run on a CPU engine's spec step."""
    params = SamplingParams(temperature=1.0, top_k=50, max_tokens=24, ignore_eos=True, seed=3)
    outs = {}
    for mode in ("main", "sampler"):
        llm = tiny_llm(tiny_target, tiny_draft, k=3, device="cpu", draft_loop=mode)
        monkeypatch.setattr(randoms, "batched_draws", lambda device, batched=None: True)
        outs[mode] = [o.token_ids for o in llm.generate(random_prompts(3), params)]
    assert outs["main"] == outs["sampler"]
    monkeypatch.undo()
    per_request = [o.token_ids for o in tiny_llm(tiny_target, tiny_draft, k=3, device="cpu",
                                                 draft_loop="main").generate(random_prompts(3), params)]
    assert per_request != outs["main"]  # the batched fill really changed the stream


@pytest.mark.parametrize("bad", ["keys", "noise"])
def test_the_kernel_refuses_the_wrong_dtype(bad):
    keys = _keys(1).to(DEV)
    noise, uniforms = torch.empty(1, 2, 3, device=DEV), torch.empty(1, 2, device=DEV)
    if bad == "keys":
        keys = keys.to(torch.int32)
    else:
        noise = noise.double()
    with pytest.raises(Exception, match=bad):
        counter_randoms.fill_kernel(keys, noise, uniforms)


def test_a_gpu_draws_batched_at_every_batch_size():
    """No threshold: with one, a seeded request alone and the same request in a larger batch would
    draw from different streams and give different tokens."""
    assert randoms.batched_draws("cuda") and not randoms.batched_draws("cpu")
    assert randoms.batched_draws("cpu", batched=True) and not randoms.batched_draws("cuda", batched=False)

"""Every random number a spec step needs, drawn in one go from each request's own generator.

On a GPU each request takes one key per step from its generator and one kernel fills the whole
batch's numbers from the keys (kernels/randoms/counter_randoms.py); on a CPU each request draws its own
with torch. Either way a request's numbers depend on its generator only, never on its batch.
They are drawn in draft step 1, after its forward is queued (the device runs the forward while the
host draws) and before anything samples. That keeps draft steps 2..k free of RNG calls (the graph
mode captures them as one CUDA graph), makes seeded runs repeat, and gives every draft-loop mode the
very same random numbers, so their outputs can be compared token for token.

A batched draw's numbers are a function of its keys alone, so a request whose launched step is
discarded keeps its key (not the numbers) and the next draw regenerates the very same numbers; and a
spec step graph takes the keys only, filling its own buffers inside its replay (`keyed`), where a
fill outside it would cost the copies into its buffers.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from protospec.model.inputs import host_to_device
from protospec.kernels.randoms import counter_randoms
from protospec.kernels.randoms.counter_randoms import split_key
from protospec.speculation.sampler import SamplingTensors, exponential_noise


def batched_draws(device, batched: bool | None = None) -> bool:
    """Whether a step's randoms come from one counter-based fill rather than two draws per request
    from its torch generator (cheap on a CPU, two launches per request on a GPU). None: batched on a
    GPU, at every batch size (a request's stream must not depend on how many run beside it)."""
    return torch.device(device).type == "cuda" if batched is None else batched


def step_key(generator: torch.Generator) -> int:
    """A request's 64-bit key for one spec step, advancing its generator (seeded runs repeat).
    A CUDA generator is read and advanced on the host (its Philox offset), never on the device."""
    if generator.device.type == "cpu":  # a CPU tensor's value: no device to wait for
        return int(torch.randint(0, 2**62, (1,), generator=generator).numpy()[0])
    offset = generator.get_offset()
    generator.set_offset(offset + 4)  # Philox offsets move in fours
    return _mix64(generator.initial_seed() * 0x9E3779B97F4A7C15 + offset)


def _mix64(x: int) -> int:
    """splitmix64's finaliser: nearby (seed, offset) pairs give unrelated keys."""
    x &= (1 << 64) - 1
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & ((1 << 64) - 1)
    return x ^ (x >> 31)


def step_keys(generators: list, kept: list | None = None) -> list[int]:
    """Each request's 64-bit key for this spec step: a kept key (an int, from a discarded step) as
    is, leaving its generator alone; otherwise the next one from its generator."""
    kept = kept or [None] * len(generators)
    return [row if isinstance(row, int) else step_key(g) for g, row in zip(generators, kept)]


@dataclass
class SpecStepRandoms:
    uniforms: torch.Tensor            # [B, k] U[0, 1) for the accept tests
    # Exp(1) for recovered tokens [B, k, V] and for the bonus token [B, V]; None where the kernels
    # draw them from the keys (a keyed spec step graph: step_graph.py)
    recovered_noise: torch.Tensor | None
    bonus_noise: torch.Tensor | None
    # Exp(1) for the draft's samples, [B, 2k + 1, V]: [:, j] is draft step j's noise (j < k); the
    # rest backs recovered_noise and bonus_noise. None if all greedy. Kept whole (contiguous): the
    # fused sampling kernel reads it in place.
    noise_block: torch.Tensor | None
    # A batched draw's 64-bit key per request (the numbers follow from them); None otherwise.
    keys: list[int] | None = None

    @property
    def draft_noise(self) -> torch.Tensor | None:
        """[B, k, V] the draft steps' noise (a view of noise_block), None if all greedy."""
        return None if self.noise_block is None else self.noise_block[:, : self.uniforms.shape[1]]

    def kept_row(self, row: int):
        """What a discarded step keeps of request `row` for its next draw: its key (batched draws),
        else its (uniforms [k], noise [2k + 1, V]); None if all greedy."""
        if self.keys is not None:
            return self.keys[row]
        return None if self.noise_block is None else (self.uniforms[row], self.noise_block[row])

    @classmethod
    def keyed(cls, st: SamplingTensors, k: int, uniforms: torch.Tensor, noise_block: torch.Tensor | None,
              kept: list | None = None) -> "SpecStepRandoms":
        """The batch's keys, the numbers left to the owner of uniforms [B, k] and noise_block
        [B, 2k + 1, V] (counter_randoms.fill_kernel from the keys): a spec step graph fills its own
        buffers inside its replay. Views, valid until that owner's next fill. noise_block None: the
        owner's kernels draw the noise from the keys (no block at all)."""
        if noise_block is None:
            return cls(uniforms, None, None, noise_block=None, keys=step_keys(st.generators, kept))
        return cls(uniforms, noise_block[:, k : 2 * k], noise_block[:, 2 * k], noise_block=noise_block,
                   keys=step_keys(st.generators, kept))

    @classmethod
    def draw(cls, st: SamplingTensors, k: int, vocab: int, device, kept: list | None = None,
             batched: bool | None = None) -> "SpecStepRandoms":
        """kept: per row None, or what that row's request kept of a discarded launched step
        (kept_row: its key, or its uniforms [k] and noise [2k + 1, V]); those rows reuse them and
        leave their generator alone. batched: one counter-based fill for the batch (None: on a GPU)."""
        batch = len(st.generators)
        if st.all_greedy:  # one-hot probabilities make every draw irrelevant: skip the work
            # Two contiguous blocks (not slices of one): the fused rejection kernel takes them as is.
            ones_k, ones_bonus = torch.ones(batch, k, vocab, device=device), torch.ones(batch, vocab, device=device)
            return cls(torch.zeros(batch, k, device=device), ones_k, ones_bonus, noise_block=None)
        if batched_draws(device, batched):
            return cls._draw_batched(st.generators, k, vocab, device, kept)
        if kept is None or not any(row is not None for row in kept):
            # One Exp(1) block and one uniform block per request: [2k + 1, V] and [k].
            noise = exponential_noise((2 * k + 1, vocab), st.generators, device)  # [B, 2k + 1, V]
            uniforms = torch.stack([torch.rand(k, device=device, generator=g) for g in st.generators])
        else:  # the same per-request draws (noise, then uniforms, from each generator), row by row
            rows = [cls._kept_numbers(row, k, vocab, device) if row is not None else cls._draw_row(g, k, vocab, device)
                    for g, row in zip(st.generators, kept)]
            noise = torch.stack([n for _, n in rows])  # [B, 2k + 1, V]
            uniforms = torch.stack([u for u, _ in rows])
        return cls(uniforms, noise[:, k : 2 * k], noise[:, 2 * k], noise_block=noise)

    @classmethod
    def _draw_batched(cls, generators: list, k: int, vocab: int, device, kept: list | None) -> "SpecStepRandoms":
        """Each request's key for this step (kept or from its generator), then one fill for the batch."""
        kept = kept or [None] * len(generators)
        numbers_kept = [row if isinstance(row, tuple) else None for row in kept]  # from a per-request draw
        keys = step_keys(generators, [0 if isinstance(row, tuple) else row for row in kept])  # 0: overwritten
        noise, uniforms = fill_from_keys(keys, 2 * k + 1, vocab, k, device)
        for b, row in enumerate(numbers_kept):
            if row is not None:
                uniforms[b], noise[b] = row
        return cls(uniforms, noise[:, k : 2 * k], noise[:, 2 * k], noise_block=noise, keys=keys)

    @staticmethod
    def _kept_numbers(row, k: int, vocab: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """A kept row's (uniforms [k], noise [2k + 1, V]): as kept, or regenerated from its key."""
        if isinstance(row, tuple):
            return row
        noise, uniforms = fill_from_keys([row], 2 * k + 1, vocab, k, device)
        return uniforms[0], noise[0]

    @staticmethod
    def _draw_row(generator: torch.Generator, k: int, vocab: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        noise = exponential_noise((2 * k + 1, vocab), [generator], device)[0]  # [2k + 1, V]
        return torch.rand(k, device=device, generator=generator), noise


def fill_from_keys(keys: list[int], noise_rows: int, vocab: int, k: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The counter-based numbers of 64-bit keys: (noise [B, noise_rows, V], uniforms [B, k]) float32,
    by the kernel on a GPU, by its torch twin elsewhere."""
    pairs = host_to_device([split_key(key) for key in keys], torch.int64, device)  # [B, 2]
    if torch.device(device).type != "cuda":
        return counter_randoms.fill_torch(pairs, noise_rows, vocab, k)
    noise = torch.empty(len(keys), noise_rows, vocab, device=device)
    uniforms = torch.empty(len(keys), k, device=device)
    counter_randoms.fill_kernel(pairs, noise, uniforms)
    return noise, uniforms


def force_acceptance(uniforms: torch.Tensor, alpha: float) -> torch.Tensor:
    """For timing only (lab.forced_acceptance): the accept tests' uniforms [B, k], in place, made 0 with
    probability alpha (u < alpha: the test u * q < p passes wherever the target gives the draft token
    any probability) and inf otherwise (no test passes, whatever p / q is). Each draft token is then kept
    with probability alpha whatever the models say, so the output is not the target's distribution."""
    passed = uniforms < alpha  # [B, k] bool
    return uniforms.fill_(float("inf")).masked_fill_(passed, 0.0)

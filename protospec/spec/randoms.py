"""Every random number a spec step needs, drawn in one go from each request's own generator.

On a GPU each request takes one key per step from its generator and one kernel fills the whole
batch's numbers from the keys (kernels/counter_randoms.py); on a CPU each request draws its own
with torch. Either way a request's numbers depend on its generator only, never on its batch.
They are drawn in draft step 1, after its forward is queued (the device runs the forward while the
host draws) and before anything samples. That keeps draft steps 2..k free of RNG calls (the graph
mode captures them as one CUDA graph), makes seeded runs repeat, and gives every draft-loop mode the
very same random numbers, so their outputs can be compared token for token.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from protospec.model.inputs import host_to_device
from protospec.kernels import counter_randoms
from protospec.kernels.counter_randoms import split_key
from protospec.spec.sampler import SamplingTensors, exponential_noise


# None: batched draws on a GPU, at every batch size (a request's stream must not depend on how many
# run beside it); True / False forces them (the tests run the batched path on a CPU).
BATCHED: bool | None = None


def batched_draws(device, batched: bool | None = None) -> bool:
    """Whether a step's randoms come from one counter-based fill rather than two draws per request
    from its torch generator (cheap on a CPU, two launches per request on a GPU)."""
    choice = BATCHED if batched is None else batched
    return torch.device(device).type == "cuda" if choice is None else choice


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


@dataclass
class SpecStepRandoms:
    uniforms: torch.Tensor            # [B, k] U[0, 1) for the accept tests
    recovered_noise: torch.Tensor     # [B, k, V] Exp(1) for recovered tokens
    bonus_noise: torch.Tensor         # [B, V] Exp(1) for the bonus token
    # Exp(1) for the draft's samples, [B, 2k + 1, V]: [:, j] is draft step j's noise (j < k); the
    # rest backs recovered_noise and bonus_noise. None if all greedy. Kept whole (contiguous): the
    # fused sampling kernel reads it in place.
    noise_block: torch.Tensor | None

    @property
    def draft_noise(self) -> torch.Tensor | None:
        """[B, k, V] the draft steps' noise (a view of noise_block), None if all greedy."""
        return None if self.noise_block is None else self.noise_block[:, : self.uniforms.shape[1]]

    @classmethod
    def draw(cls, st: SamplingTensors, k: int, vocab: int, device, kept: list | None = None,
             batched: bool | None = None) -> "SpecStepRandoms":
        """kept: per row None, or (uniforms [k], noise [2k + 1, V]) that row's request drew already
        (a discarded overlapped step); those rows reuse them and leave their generator alone.
        batched: one counter-based fill for the batch (None: on a GPU)."""
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
            rows = [row or cls._draw_row(g, k, vocab, device) for g, row in zip(st.generators, kept)]
            noise = torch.stack([n for _, n in rows])  # [B, 2k + 1, V]
            uniforms = torch.stack([u for u, _ in rows])
        return cls(uniforms, noise[:, k : 2 * k], noise[:, 2 * k], noise_block=noise)

    @classmethod
    def _draw_batched(cls, generators: list, k: int, vocab: int, device, kept: list | None) -> "SpecStepRandoms":
        """Each request's key for this step from its generator, then one fill for the whole batch."""
        kept = kept or [None] * len(generators)
        keys = [split_key(0 if row is not None else step_key(g)) for g, row in zip(generators, kept)]
        keys = host_to_device(keys, torch.int64, device)                  # [B, 2]
        if torch.device(device).type == "cuda":
            noise = torch.empty(len(generators), 2 * k + 1, vocab, device=device)  # [B, 2k + 1, V]
            uniforms = torch.empty(len(generators), k, device=device)              # [B, k]
            counter_randoms.fill_kernel(keys, noise, uniforms)
        else:
            noise, uniforms = counter_randoms.fill_torch(keys, 2 * k + 1, vocab, k)
        for b, row in enumerate(kept):
            if row is not None:
                uniforms[b], noise[b] = row
        return cls(uniforms, noise[:, k : 2 * k], noise[:, 2 * k], noise_block=noise)

    @staticmethod
    def _draw_row(generator: torch.Generator, k: int, vocab: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        noise = exponential_noise((2 * k + 1, vocab), [generator], device)[0]  # [2k + 1, V]
        return torch.rand(k, device=device, generator=generator), noise

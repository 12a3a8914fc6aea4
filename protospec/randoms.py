"""Every random number a spec step needs, drawn in one go from each request's own generator.

They are drawn in draft step 1, after its forward is queued (the device runs the forward while the
host draws) and before anything samples. That keeps draft steps 2..k free of RNG calls (the graph
mode captures them as one CUDA graph), makes seeded runs repeat, and gives every draft-loop mode the
very same random numbers, so their outputs can be compared token for token.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from protospec.sampler import SamplingTensors, exponential_noise


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
    def draw(cls, st: SamplingTensors, k: int, vocab: int, device, kept: list | None = None) -> "SpecStepRandoms":
        """kept: per row None, or (uniforms [k], noise [2k + 1, V]) that row's request drew already
        (a discarded overlapped step); those rows reuse them and leave their generator alone."""
        batch = len(st.generators)
        if st.all_greedy:  # one-hot probabilities make every draw irrelevant: skip the work
            # Two contiguous blocks (not slices of one): the fused rejection kernel takes them as is.
            ones_k, ones_bonus = torch.ones(batch, k, vocab, device=device), torch.ones(batch, vocab, device=device)
            return cls(torch.zeros(batch, k, device=device), ones_k, ones_bonus, noise_block=None)
        if kept is None or not any(row is not None for row in kept):
            # One Exp(1) block and one uniform block per request: [2k + 1, V] and [k].
            noise = exponential_noise((2 * k + 1, vocab), st.generators, device)  # [B, 2k + 1, V]
            uniforms = torch.stack([torch.rand(k, device=device, generator=g) for g in st.generators])
        else:  # the same per-request draws (noise, then uniforms, from each generator), row by row
            rows = [row or cls._draw_row(g, k, vocab, device) for g, row in zip(st.generators, kept)]
            noise = torch.stack([n for _, n in rows])  # [B, 2k + 1, V]
            uniforms = torch.stack([u for u, _ in rows])
        return cls(uniforms, noise[:, k : 2 * k], noise[:, 2 * k], noise_block=noise)

    @staticmethod
    def _draw_row(generator: torch.Generator, k: int, vocab: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        noise = exponential_noise((2 * k + 1, vocab), [generator], device)[0]  # [2k + 1, V]
        return torch.rand(k, device=device, generator=generator), noise

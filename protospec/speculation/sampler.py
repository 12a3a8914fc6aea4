"""logits -> processed probabilities -> token ids, all on the model's device.

Nothing here reads a value back to the host: sampling is an "exponential race"
(argmax of probs / Exp(1) noise picks token i with probability probs[i], as gpt-fast does),
instead of torch.multinomial, which syncs. Whether the caller then copies the ids to the host
every step (the "main" baseline) or keeps them on the device is the caller's choice.

Greedy rows (temperature 0) get one-hot probabilities at the argmax. The rejection sampler then
needs no greedy branch: min(1, p/q) is 1 when draft and target argmax agree and 0 otherwise,
and the recovered token from max(0, p - q) is the target's argmax.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from protospec.config import SamplingParams
from protospec.model.inputs import host_to_device


@dataclass
class SamplingTensors:
    """Per-sequence sampling settings as device tensors, built once per spec step and reused."""

    temperature: torch.Tensor  # [B] float32, greedy rows hold 1.0 (never divided by 0)
    is_greedy: torch.Tensor    # [B] bool
    top_k: torch.Tensor        # [B] int64, vocab size where off
    top_p: torch.Tensor        # [B] float32, 1.0 where off
    generators: list[torch.Generator]
    all_greedy: bool           # host-side facts, known without reading the device
    any_greedy: bool
    needs_filter: bool

    @classmethod
    def build(cls, params: list[SamplingParams], generators: list[torch.Generator], vocab_size: int, device) -> "SamplingTensors":
        def dev(values, dtype):
            return host_to_device(values, dtype, device)

        return cls(
            temperature=dev([p.temperature if not p.greedy else 1.0 for p in params], torch.float32),
            is_greedy=dev([p.greedy for p in params], torch.bool),
            top_k=dev([p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in params], torch.int64),
            top_p=dev([p.top_p for p in params], torch.float32),
            generators=generators,
            all_greedy=all(p.greedy for p in params),
            any_greedy=any(p.greedy for p in params),
            needs_filter=any((0 < p.top_k < vocab_size or p.top_p < 1.0) and not p.greedy for p in params),
        )


def _filter_top_k_top_p(probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Zero tokens outside top-k, then outside the top-p nucleus of what is left; renormalise."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)           # [N, V]
    rank = torch.arange(probs.shape[-1], device=probs.device)
    sorted_probs = sorted_probs * (rank[None, :] < top_k[:, None])
    sorted_probs = sorted_probs / sorted_probs.sum(-1, keepdim=True)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs                 # the top token always stays
    sorted_probs = sorted_probs * (mass_before < top_p[:, None])
    filtered = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return filtered / filtered.sum(-1, keepdim=True)


def compute_probs(logits: torch.Tensor, st: SamplingTensors, rows_per_seq: int = 1) -> torch.Tensor:
    """logits [B * rows_per_seq, V] float32 (rows of one sequence adjacent) -> probs, same shape."""
    def per_row(t):
        return t if rows_per_seq == 1 else t.repeat_interleave(rows_per_seq)

    if st.any_greedy:
        greedy_probs = torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
        if st.all_greedy:
            return greedy_probs
    probs = torch.softmax(logits / per_row(st.temperature)[:, None], dim=-1)
    if st.needs_filter:
        probs = _filter_top_k_top_p(probs, per_row(st.top_k), per_row(st.top_p))
    if st.any_greedy:
        probs = torch.where(per_row(st.is_greedy)[:, None], greedy_probs, probs)
    return probs


def exponential_noise(shape_per_seq: tuple[int, ...], generators: list[torch.Generator], device) -> torch.Tensor:
    """Exp(1) noise [B, *shape_per_seq], each sequence's slice from its own generator (seeded runs repeat)."""
    noise = torch.stack([torch.empty(shape_per_seq, device=device).exponential_(generator=g) for g in generators])
    # An exact 0 would turn probs / noise into inf or nan; Exp(1) puts mass ~1e-38 there.
    return noise.clamp_min_(torch.finfo(noise.dtype).tiny)


def sample_from_probs(probs: torch.Tensor, noise: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """probs [..., V], noise [..., V] Exp(1) -> ids [...] int64. No host sync."""
    return torch.argmax(probs / noise, dim=-1, out=out)


def sample(logits: torch.Tensor, st: SamplingTensors, noise: torch.Tensor | None = None,
           out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One row per sequence: logits [B, V] -> (ids [B] int64, probs [B, V] float32), on the device.

    noise: Exp(1) [B, V] drawn beforehand (SpecStepRandoms); None draws it here, per request.
    out: an int64 [B] tensor to write the ids into (a persistent buffer that a kernel reads).
    """
    probs = compute_probs(logits, st)
    if st.all_greedy:
        return torch.argmax(probs, dim=-1, out=out), probs
    if noise is None:
        noise = exponential_noise((probs.shape[-1],), st.generators, probs.device)  # [B, V]
    return sample_from_probs(probs, noise, out), probs

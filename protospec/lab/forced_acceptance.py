"""Acceptance set, not hoped for: for timing a speculative engine at a chosen acceptance rate.

force_acceptance(llm, alpha) makes the rejection sampler keep each draft token with probability alpha,
independently of the models: the accept tests' uniforms become 0 (every test passes) with probability
alpha and 1 (none passes) otherwise (speculation/randoms.force_acceptance). Everything else is the real step:
the same draft forwards, verify, probabilities and rejection kernels, in the same CUDA graphs, so a spec
step costs what it costs at that acceptance. The tokens are NOT the target's distribution; this is for
timing (the speed-up surface, bench/surface.py) and never for output, and it is reachable only here,
not through LLM's or the bench's serving options.
"""
from __future__ import annotations

from protospec.errors import ConfigError
from protospec import registry


def force_acceptance(llm, alpha: float | None) -> None:
    """Keep each draft token with probability alpha in [0, 1] from the next generate() on (None: the
    real rejection sampler again). Needs a speculative engine with rejection sampling and requests at
    temperature > 0 (a greedy row's tests compare one-hot distributions)."""
    engine = llm.engine
    if engine.spec_step is None:
        raise ConfigError("force_acceptance needs a speculative engine (a draft model or the n-gram proposer)")
    if engine.config.acceptance != registry.REJECTION:
        raise ConfigError(f"force_acceptance sets the rejection sampler's tests; this engine uses acceptance="
                          f"{engine.config.acceptance!r}")
    if alpha is not None and not (isinstance(alpha, (int, float)) and 0.0 <= alpha <= 1.0):
        raise ConfigError(f"force_acceptance: alpha must be in [0, 1], got {alpha!r}")
    if engine.running or engine.waiting:
        raise ConfigError("force_acceptance between generate() calls only")
    engine.forced_acceptance = None if alpha is None else float(alpha)
    engine.spec_step.forced_acceptance = engine.forced_acceptance

"""Speculative decoding metrics, per request and summed over requests.

Definitions:
- acceptance_rate     = draft tokens that pass their own acceptance test / proposed draft tokens.
                        This is vLLM's draft_acceptance_rate (its rejection sampler sums the
                        per-position test, tokens after the first rejection included, though those
                        are discarded), i.e. the per-token acceptance alpha of Leviathan et al.
- prefix_acceptance_rate = draft tokens that reach the output / proposed: only the accepted
                        prefix counts. Always <= acceptance_rate; equals (mean_accepted_len - 1) / k.
- system_efficiency   = emitted tokens / positions verified (spec steps * (k + 1) with a fixed k; a
                        step that proposes fewer still verifies k + 1); 1.0 means every step emitted k+1
- mean_accepted_len   = 1 + kept draft tokens / spec steps: tokens a spec step yields on average,
                        counting the recovered or bonus token every step emits
- per_position_acceptance[i] = P(draft token i reaches the output) over all spec steps
Accepted counts what the rejection sampler kept; emitted counts what reached the output
(the last step of a request may emit fewer because max_tokens or EOS cut it).
"""
from __future__ import annotations

from dataclasses import dataclass, field

# The per-run rates that reports copy from a summary() (bench JSON, train.evaluate).
RATE_KEYS = ("acceptance_rate", "prefix_acceptance_rate", "system_efficiency", "mean_accepted_len",
             "per_position_acceptance")


@dataclass
class RequestMetrics:
    num_spec_steps: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0      # kept: the accepted prefix of each step
    num_passed_tokens: int = 0        # passed their own test (vLLM's count), >= num_accepted_tokens
    num_emitted_tokens: int = 0       # tokens from spec / decode steps (not the prefill's first token)
    num_verified_positions: int = 0   # target positions verified: k + 1 per spec step
    accepted_per_position: list[int] = field(default_factory=list)
    elapsed_s: float = 0.0            # wall time of the generate() call that served the request
    num_output_tokens: int = 0

    def record_step(self, k: int, num_accepted: int, num_emitted: int, num_passed: int,
                    num_verified: int | None = None) -> None:
        """k: draft tokens proposed in this step; num_verified: positions the verify covered (k + 1
        unless the proposer offered fewer than the step's lookahead)."""
        if not 0 <= num_accepted <= num_passed <= k:
            raise ValueError(f"record_step: need 0 <= accepted ({num_accepted}) <= passed ({num_passed}) <= k ({k})")
        if len(self.accepted_per_position) < k:
            self.accepted_per_position.extend([0] * (k - len(self.accepted_per_position)))
        self.num_spec_steps += 1
        self.num_draft_tokens += k
        self.num_accepted_tokens += num_accepted
        self.num_passed_tokens += num_passed
        self.num_emitted_tokens += num_emitted
        self.num_verified_positions += k + 1 if num_verified is None else num_verified
        for i in range(num_accepted):
            self.accepted_per_position[i] += 1

    def merge(self, other: "RequestMetrics") -> None:
        n = max(len(self.accepted_per_position), len(other.accepted_per_position))
        mine = self.accepted_per_position + [0] * (n - len(self.accepted_per_position))
        theirs = other.accepted_per_position + [0] * (n - len(other.accepted_per_position))
        self.accepted_per_position = [a + b for a, b in zip(mine, theirs)]
        self.num_spec_steps += other.num_spec_steps
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        self.num_passed_tokens += other.num_passed_tokens
        self.num_emitted_tokens += other.num_emitted_tokens
        self.num_verified_positions += other.num_verified_positions
        self.num_output_tokens += other.num_output_tokens
        self.elapsed_s = max(self.elapsed_s, other.elapsed_s)

    @property
    def acceptance_rate(self) -> float | None:
        return self.num_passed_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @property
    def prefix_acceptance_rate(self) -> float | None:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @property
    def system_efficiency(self) -> float | None:
        return self.num_emitted_tokens / self.num_verified_positions if self.num_verified_positions else None

    @property
    def mean_accepted_len(self) -> float | None:
        return 1 + self.num_accepted_tokens / self.num_spec_steps if self.num_spec_steps else None

    @property
    def per_position_acceptance(self) -> list[float]:
        steps = self.num_spec_steps
        return [a / steps for a in self.accepted_per_position] if steps else []

    @property
    def tokens_per_second(self) -> float | None:
        return self.num_output_tokens / self.elapsed_s if self.elapsed_s > 0 else None

    def summary(self) -> dict:
        return {
            "num_spec_steps": self.num_spec_steps,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "num_passed_tokens": self.num_passed_tokens,
            "num_emitted_tokens": self.num_emitted_tokens,
            "num_output_tokens": self.num_output_tokens,
            "acceptance_rate": self.acceptance_rate,
            "prefix_acceptance_rate": self.prefix_acceptance_rate,
            "system_efficiency": self.system_efficiency,
            "mean_accepted_len": self.mean_accepted_len,
            "per_position_acceptance": self.per_position_acceptance,
            "tokens_per_second": self.tokens_per_second,
            "elapsed_s": self.elapsed_s,
        }

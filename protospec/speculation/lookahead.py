"""The k + 1 arithmetic of a spec step, in one place.

For a sequence of L tokens (the last not yet in either cache) a spec step feeds the target
t_{L-1}, d_1..d_k at positions L-1 .. L-1+k: k + 1 verify positions, so k slots past the end are
reserved up front. An overlapped commit queues the next step before this one's outcome is known on
the host: its L' is at most L + k + 1 and it writes up to L' - 1 + k, so 2k + 1 slots past L. That
step is queued even for a request that may end in this one (its row then runs for nothing), so a
request's last token can be followed by 2k written slots: admission reserves them, and RoPE and the
block tables cover them past max_model_len.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Lookahead:
    k: int  # draft tokens per spec step; 0 = target-only decoding

    @property
    def verify_len(self) -> int:
        """Target positions per spec step (and the widest forward a CUDA graph must hold)."""
        return self.k + 1

    @property
    def slots_past_end(self) -> int:
        """KV slots past the last token that a spec step may write."""
        return self.k

    @property
    def next_step_slots(self) -> int:
        """Slots past L that an overlapped commit's next step may write before L' is known."""
        return 2 * self.k + 1

    @property
    def extra_positions(self) -> int:
        """Positions past max_model_len that RoPE and a block table must cover: a launched next step's
        writes past a request's last token."""
        return self.next_step_slots

    @property
    def reserved_slots(self) -> int:
        """Slots past prompt + max_tokens that admission reserves for a request: a next step launched
        at L <= prompt + max_tokens - 1 writes up to position L + 2k."""
        return 2 * self.k

    @property
    def commit_row_width(self) -> int:
        """Integers per sequence in the commit's copy: k + 1 output ids, accepted, passed."""
        return self.k + 3

    def may_finish_within_step(self, num_remaining: int) -> bool:
        """A step emits at most k + 1 tokens: with no more left than that, the request may end in it
        (an overlapped commit queues no next step when every request of the batch may)."""
        return num_remaining <= self.k + 1

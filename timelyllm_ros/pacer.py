"""Token pacer (Andes §5): the delivery side releases a reply at the consumer's pace.

The server pushes tokens as soon as they exist; a user cannot read (or listen) faster than r
tokens/s, so the pacer buffers them and releases each one on the actual consumption timeline of
core/qoe.py: token i is released at max(delivery_i, release_{i-1} + 1/r), never before the ideal
start (arrival + TTFT target).  For a speaking robot the unit is a sentence: a sentence starts when
it has arrived and the previous one has been spoken, and lasts tokens/r — the spoken sentence *is*
the segment's execution, so a chat executor can take (start, end) from ``push`` directly.

The buffer level (``buffer_s``) is what lets the server pause a request at no QoE cost: the Andes
policy computes the same quantity from dispatched segments.  Pure: the caller passes times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .core.qoe import QoE, Run, qoe_of_runs


class PacerError(ValueError):
    """Bad pacer input (non-positive rate, negative token count, time going backwards)."""


@dataclass(frozen=True, slots=True)
class Release:
    """One pushed chunk (a sentence segment): when its consumption starts and ends."""

    index: int
    tokens: int
    delivered: float
    start: float
    end: float
    payload: Any = None


@dataclass
class TokenPacer:
    rate: float  # consumption speed, tokens/s
    ideal_start: float  # arrival + TTFT target: nothing is consumed before it
    releases: list[Release] = field(default_factory=list)
    _last_push: float = -math.inf

    def __post_init__(self) -> None:
        if not (isinstance(self.rate, (int, float)) and math.isfinite(self.rate) and self.rate > 0):
            raise PacerError(f"rate must be a finite number > 0 tokens/s, got {self.rate!r}")
        if not math.isfinite(self.ideal_start):
            raise PacerError("ideal_start must be finite")

    @property
    def next_free(self) -> float:
        """Earliest time the next pushed chunk can start being consumed."""
        return self.releases[-1].end if self.releases else self.ideal_start

    def push(self, tokens: int, delivered: float, payload: Any = None) -> Release:
        """A chunk of ``tokens`` arrived at ``delivered``; returns its consumption window."""
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            raise PacerError(f"a chunk needs >= 1 token, got {tokens!r}")
        if not math.isfinite(delivered) or delivered < self._last_push:
            raise PacerError(f"deliveries must be finite and in order ({delivered!r} after {self._last_push!r})")
        self._last_push = delivered
        start = max(delivered, self.next_free)
        rel = Release(len(self.releases), tokens, delivered, start, start + tokens / self.rate, payload)
        self.releases.append(rel)
        return rel

    def released_tokens(self, now: float) -> int:
        """Tokens handed to the user by ``now`` (token k of a chunk at start + k/r)."""
        n = 0
        for r in self.releases:
            if now < r.start:
                break
            n += min(r.tokens, int(math.floor((now - r.start) * self.rate + 1e-9)) + 1)
        return n

    def buffered_tokens(self, now: float) -> int:
        return sum(r.tokens for r in self.releases if r.delivered <= now) - self.released_tokens(now)

    def buffer_s(self, now: float) -> float:
        """Seconds of consumption already in hand at ``now`` (0: the user is about to starve)."""
        delivered = [r for r in self.releases if r.delivered <= now]
        if not delivered:
            return 0.0
        return max(0.0, delivered[-1].end - max(now, self.ideal_start))

    def qoe(self, now: float | None = None, complete: bool = True) -> QoE:
        """QoE of what was pushed (same timeline as core.qoe)."""
        runs = [Run(r.delivered, r.tokens) for r in self.releases]
        return qoe_of_runs(runs, ideal_start=self.ideal_start, rate=self.rate, now=now, complete=complete)

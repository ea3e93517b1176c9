"""Batch-size controllers: may the next queued generation join the running batch?

`LatencyGuidedBatch` is TimelyLLM §4.4: the most urgent running generation must still finish its
current segment within its remaining time budget at the measured decode speed (worst case: the
segment runs to the robot's max segment length), and free KV memory must hold the newcomer.
`FixedBatch` caps the batch at N (the Fig. 7 sweep; vLLM-style baselines).
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from itertools import islice
from typing import Callable, Protocol, Sequence

from .engine import EngineStats
from .types import Generation


class BatchSizer(Protocol):
    def can_admit(self, running: Sequence[Generation], candidate: Generation, stats: EngineStats,
                  now: float) -> tuple[bool, str]: ...


def kv_blocks_needed(candidate: Generation, max_segment_tokens: int, block_size: int) -> int:
    """Blocks a newcomer needs for its own tokens plus one worst-case segment (the shared
    prompt prefix is assumed cached; a cache miss shows up as lower free blocks next step)."""
    own = len(candidate.output_ids) + max_segment_tokens + 1
    return max(1, math.ceil(own / max(1, block_size)))


@dataclass
class FixedBatch:
    max_batch: int
    max_segment_tokens: Callable[[Generation], int] = lambda g: 16
    kv_watermark: float = 0.01

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise ValueError(f"max batch must be >= 1, got {self.max_batch}")

    def can_admit(self, running, candidate, stats, now):
        if len(running) >= self.max_batch:
            return False, f"batch full ({self.max_batch})"
        need = kv_blocks_needed(candidate, self.max_segment_tokens(candidate), stats.block_size)
        if stats.kv_free_blocks - need < self.kv_watermark * stats.kv_total_blocks:
            return False, "kv memory"
        return True, ""


@dataclass
class LatencyGuidedBatch:
    """§4.4.  `budget(g, now)` is the time left before g's current segment is due (the planner
    supplies it from TUF/ERT and execution estimates); `max_segment_tokens(g)` the robot's bound."""

    budget: Callable[[Generation, float], float]
    max_segment_tokens: Callable[[Generation], int]
    max_batch: int = 256  # hard cap (engine max_num_seqs)
    min_batch: int = 1  # always allow this many, whatever the estimate
    slowdown: float = 0.1  # assumed relative slowdown of a decode step by one more sequence
    kv_watermark: float = 0.01
    _memo: tuple | None = field(default=None, init=False, repr=False, compare=False)  # can_admit's scan so far

    def wcet(self, g: Generation, tokens_per_s: float) -> float:
        """Worst-case time for g to finish its current segment at the measured speed."""
        remaining = max(0, self.max_segment_tokens(g) - g.seg_tokens)
        return remaining / tokens_per_s if tokens_per_s > 0 else 0.0

    def can_admit(self, running, candidate, stats, now):
        need = kv_blocks_needed(candidate, self.max_segment_tokens(candidate), stats.block_size)
        if stats.kv_free_blocks - need < self.kv_watermark * stats.kv_total_blocks:
            return False, "kv memory"
        if len(running) < self.min_batch:
            return True, ""
        if len(running) >= self.max_batch:
            return False, f"batch cap ({self.max_batch})"
        if stats.tokens_per_s <= 0:
            return True, ""
        # Protect the running generations that can still meet their budget at the measured speed
        # (one that cannot make it even now is not saved by refusing newcomers); the most urgent of
        # them decides.  The measured speed reflects the current batch — the paper's "lag of one
        # generation" — and `slowdown` is the margin left for the newcomer's effect on it.
        worst: tuple[float, Generation] | None = None
        tps = stats.tokens_per_s
        # The planner asks once per candidate within a scheduling point, appending each admitted
        # one to the same `running` list: nothing the scan reads changes meanwhile (no engine
        # step), so the scan goes on from where the last call stopped when the call has the same
        # list (same leading generations), time, speed and callables; else it starts afresh.
        memo = self._memo
        start = 0
        if (memo is not None and memo[0] is running and memo[1] == now and memo[2] == tps
                and memo[3] is self.budget and memo[4] is self.max_segment_tokens
                and len(memo[5]) <= len(running) and all(map(operator.is_, memo[5], running))):
            start, worst = len(memo[5]), memo[6]
        for g in islice(running, start, None):
            b, w = self.budget(g, now), self.wcet(g, tps)
            if w <= b and (worst is None or b - w < worst[0]):
                worst = (b - w, g)
        self._memo = (running, now, tps, self.budget, self.max_segment_tokens, list(running), worst)
        if worst is None:
            return True, ""
        g = worst[1]
        if self.wcet(g, stats.tokens_per_s) * (1.0 + self.slowdown) <= self.budget(g, now):
            return True, ""
        return False, f"{g.gen_id} would miss its budget ({self.budget(g, now) * 1e3:.0f} ms)"

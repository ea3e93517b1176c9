"""Policy interface: how ready generations are ordered (and, for some, preempted).

A policy is refreshed at every scheduling point because priorities depend on time.  It never
touches the engine: it returns an order (and optional preemptions) and the planner acts.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Sequence

from ...engines.base import EngineStats
from ..exec_time import ExecTimeEstimator
from ..robots import RobotSpec
from ..types import Generation, Segment


class DispatchMode(enum.Enum):
    SUSPEND = "suspend"  # TimelyLLM: cut, suspend (free the slot), dispatch, resume later
    STREAM = "stream"  # vLLM-stream: dispatch each statement at once, keep generating
    WHOLE = "whole"  # vLLM: generate the whole plan, then dispatch its statements


@dataclass
class PolicyContext:
    """What policies may read at a scheduling point (owned by the planner)."""

    estimator: ExecTimeEstimator
    robots: dict[str, RobotSpec]
    stats: EngineStats
    seg_gen_s: float  # G: average generation time of one segment (profiled, updated online)
    token_s: float  # average time per decoded token (1 / tokens_per_s), for length-based policies
    running: Sequence[Generation] = ()
    iteration: int = 0


@dataclass
class Selection:
    order: list[Generation]  # ready generations, best first; the planner admits in this order
    preempt: list[Generation] = field(default_factory=list)  # running ones to suspend now


class Policy:
    """Base: priority-ordered, non-preemptive, suspend mode, vLLM's cache-style KV on suspend."""

    name = "base"
    mode = DispatchMode.SUSPEND

    def priority(self, g: Generation, ctx: PolicyContext, now: float) -> float:
        """Higher runs first."""
        raise NotImplementedError

    def select(self, ready: Sequence[Generation], running: Sequence[Generation], ctx: PolicyContext,
               now: float) -> Selection:
        for g in ready:
            g.priority = self.priority(g, ctx, now)
        order = sorted(ready, key=lambda g: (-g.priority, g.ready_since, g.request.arrival, g.gen_id))
        return Selection(order=order)

    def kv_mode(self, g: Generation, seg: Segment | None, ctx: PolicyContext) -> str:
        """KV handling when g is suspended after `seg` (None: preempted mid-segment)."""
        return "cache"

    def on_token(self, g: Generation, n_new: int, ctx: PolicyContext) -> None:
        """Hook for policies that refine predictions as tokens arrive (Trail)."""

    def params(self) -> dict:
        return {}

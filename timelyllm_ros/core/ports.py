"""Ports the planner talks through: where segments go (executors) and where status goes."""

from __future__ import annotations

from typing import Protocol

from .types import Generation, Segment, SegmentGoal


class Dispatcher(Protocol):
    """Sends segment goals to robots' executors.  Results come back asynchronously through
    `Planner.post_result(SegmentResult)` (thread-safe), never as a return value here."""

    def dispatch(self, goal: SegmentGoal) -> None: ...

    def cancel(self, request_id: str) -> None:
        """Cancel whatever this request has executing or queued on its robot."""
        ...


class PlannerListener:
    """Where status goes: the planner calls every listener's three hooks, always, from its own
    thread with its lock held (so a hook must be quick and must not call back into the planner).
    Each hook does nothing here; a listener (the ROS node, the journal) overrides those it needs.
    An exception a hook raises while the planner handles one request's output or result fails
    that request alone (`Planner._request_fault`)."""

    def on_request_update(self, gen: Generation) -> None:
        """gen changed state (submitted, admitted, suspended, waiting, resumed, ended, ...)."""

    def on_segment_dispatched(self, gen: Generation, seg: Segment) -> None:
        """seg (the last of gen.segments or a held one) is about to be sent to gen's robot."""

    def on_segment_result(self, gen: Generation, seg: Segment) -> None:
        """seg's executor result was recorded on it (also for a request that has already ended)."""

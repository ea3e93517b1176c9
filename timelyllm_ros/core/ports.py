"""Ports the planner talks through: where segments go (executors) and where status goes."""

from __future__ import annotations

from typing import Protocol

from .types import SegmentGoal


class Dispatcher(Protocol):
    """Sends segment goals to robots' executors.  Results come back asynchronously through
    `Planner.post_result(SegmentResult)` (thread-safe), never as a return value here."""

    def dispatch(self, goal: SegmentGoal) -> None: ...

    def cancel(self, request_id: str) -> None:
        """Cancel whatever this request has executing or queued on its robot."""
        ...

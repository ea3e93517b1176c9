"""Injected clocks: the core never reads time itself, so simulation and serving share code."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on this clock's own time base."""
        ...


class VirtualClock:
    """Simulated time; only the simulation driver moves it, and never backwards."""

    def __init__(self, start: float = 0.0) -> None:
        self._t = float(start)

    def now(self) -> float:
        return self._t

    def advance(self, dt: float) -> float:
        if dt < 0:
            raise ValueError(f"cannot move a virtual clock backwards by {dt}")
        self._t += dt
        return self._t

    def advance_to(self, t: float) -> float:
        if t > self._t:
            self._t = t
        return self._t


class WallClock:
    """Monotonic wall time, for real serving."""

    def __init__(self) -> None:
        self._t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self._t0

"""Stopping a process on SIGINT / SIGTERM without a lock in the signal handler.

A Python signal handler runs in the main thread between two bytecodes — also inside
`threading.Event.wait`, after the wait has taken the event's own lock back (a plain, non-reentrant
`Lock`) and before it lets go of it.  A handler that calls `Event.set()` there waits for that lock
forever: the process never stops on Ctrl-C (once in CI: the ROS-graph demo's agents process hung on
SIGINT and was killed; see also python/cpython#126434 on `Event.set` in handlers).  `StopFlag` is
set by one assignment and waited for by short sleeps, so its handler takes no lock."""

from __future__ import annotations

import math
import signal
import time


class StopFlag:
    """`threading.Event`'s is_set / wait / set, safe to set from a signal handler."""

    def __init__(self) -> None:
        self.signal: int | None = None  # the signal that set it (0: set by code)

    def set(self, sig: int = 0) -> None:
        self.signal = sig  # (one assignment: no lock)

    def is_set(self) -> bool:
        return self.signal is not None

    def wait(self, timeout_s: float | None = None) -> bool:
        """True once set; False after `timeout_s` (None: no limit).  Polled in sleeps of 20 ms at
        most, so a signal another thread received still runs its handler in the main thread
        when the sleep returns (an untimed wait would never return)."""
        end = math.inf if timeout_s is None else time.monotonic() + timeout_s
        while self.signal is None:
            left = end - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(0.02, left))
        return True


def stop_on_signals() -> StopFlag:
    """A StopFlag that SIGINT and SIGTERM set (call from the main thread)."""
    flag = StopFlag()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda s, _frame: flag.set(s))
    return flag

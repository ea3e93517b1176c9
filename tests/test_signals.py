"""signals.py: a stop flag that SIGINT / SIGTERM set without a lock in the handler (an
`Event.set()` there can wait forever for the lock `Event.wait` holds at that moment)."""

import os
import signal
import threading
import time

from timelyllm_ros.signals import StopFlag, stop_on_signals


def test_a_signal_sets_the_flag_while_the_main_thread_waits_on_it():
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            stop = stop_on_signals()
            assert not stop.is_set() and stop.wait(0.05) is False
            threading.Timer(0.1, os.kill, (os.getpid(), sig)).start()
            t0 = time.monotonic()
            while not stop.wait(0.2):  # the nodes' loop
                assert time.monotonic() - t0 < 10, "the signal never set the flag"
            assert stop.is_set() and stop.signal == sig
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def test_set_by_code_and_waits_in_short_sleeps():
    flag = StopFlag()
    threading.Timer(0.05, flag.set).start()
    assert flag.wait(10.0) is True and flag.signal == 0
    assert StopFlag().wait(0.0) is False
    later = StopFlag()
    threading.Timer(0.05, later.set, (15,)).start()
    assert later.wait() is True and later.signal == 15  # no timeout: until set

"""ROS 2 tests: real rclpy over Fast DDS, nodes in separate processes.

Isolation: each test session picks its own ROS_DOMAIN_ID (from its pid) and keeps discovery on
this host (ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST), so parallel `make test` runs on one machine
do not see each other's nodes; every subprocess a test starts inherits both.  Set
TIMELYLLM_TEST_ROS_DOMAIN_ID to force a domain.
"""

from __future__ import annotations

import os

# before anything imports rclpy: the domain is read when the context is initialised
# 1..100: DDS ports of domains above 101 can fall into Linux's ephemeral port range (ROS docs)
os.environ["ROS_DOMAIN_ID"] = os.environ.get("TIMELYLLM_TEST_ROS_DOMAIN_ID") or str(1 + os.getpid() % 100)
os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
os.environ.pop("ROS_STATIC_PEERS", None)
os.environ.pop("ROS_LOCALHOST_ONLY", None)  # deprecated in Jazzy; the range above replaces it


# A test that hangs must not hold the whole run until CI's limit.  Fast DDS 2.14 (the PyPI Jazzy
# wheels) can deadlock inside one process — a publisher created while discovery removes a remote
# participant (eProsima/Fast-DDS#6502: ResourceEvent::unregister_timer against
# PDP::check_remote_participant_liveliness; seen here 2026-11-30 in
# test_vllm_planner_node_plans_over_dds, its RequestClient's create_publisher waiting forever).
# Nothing in Python can interrupt a thread blocked in C++, so a C-level watchdog (faulthandler)
# dumps every thread's stack to the terminal and ends the run with a failure once one test has run
# TIMELYLLM_TEST_HANG_S (default 1,800 s: the longest test, the vLLM node's, retried once, stays
# under ~20 min).
import faulthandler  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402

_HANG_S = float(os.environ.get("TIMELYLLM_TEST_HANG_S", "1800"))
_hang_out = None  # the terminal's stderr (pytest captures fd 2 during a test; a dump there dies with the run)


def pytest_configure(config):
    global _hang_out
    capman = config.pluginmanager.getplugin("capturemanager")
    err = getattr(getattr(capman, "_global_capturing", None), "err", None)
    fd = getattr(err, "targetfd_save", None)  # (pytest's copy of the real fd 2, where it captures)
    _hang_out = os.fdopen(os.dup(fd), "w") if isinstance(fd, int) else sys.__stderr__


@pytest.fixture(autouse=True)
def _hang_watchdog():
    """Every tests_ros2 test under the watchdog: past TIMELYLLM_TEST_HANG_S, every thread's
    stack (the test's function among them) to the terminal, and the run ends (exit status 1)."""
    faulthandler.dump_traceback_later(_HANG_S, exit=True, file=_hang_out or sys.__stderr__)
    yield
    faulthandler.cancel_dump_traceback_later()

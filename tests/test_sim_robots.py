"""Simulated robots: FIFO timing, network latency, MiniSpec execution, determinism, faults."""

from __future__ import annotations

import heapq
import math
from typing import Callable

import pytest

from timelyllm_ros.core.clock import VirtualClock
from timelyllm_ros.core.minispec import parse_statement
from timelyllm_ros.core.robots import RobotSpec, load_robots, parse_robot
from timelyllm_ros.core.types import ResultCode, SegmentGoal, SegmentResult, SkillCall
from timelyllm_ros.sim.robots import FaultConfig, FaultError, SimulatedRobots

BOT = parse_robot({
    "robot_type": "bot", "language": "minispec", "max_segment_tokens": 12,
    "skills": {
        "move": {"abbr": "mv", "args": [{"name": "distance", "type": "int", "min": 0, "max": 500}],
                 "exec_time": {"base_s": 1.0, "per_unit_s": 0.01, "unit_arg": "distance"}},
        "look": {"abbr": "lk", "args": [{"name": "object", "type": "str"}], "returns": "bool",
                 "blocking": True, "exec_time": {"base_s": 0.5}},
        "scan": {"abbr": "s", "args": [{"name": "object", "type": "str"}], "returns": "bool",
                 "blocking": True, "exec_time": {"min_s": 2.0, "max_s": 10.0}},
        "photo": {"abbr": "tp", "exec_time": {"base_s": 0.25}},
    },
}, "test-bot")


class Loop:
    """A minimal virtual-time event loop (what sim/runner.py provides in the real simulation)."""

    def __init__(self) -> None:
        self.clock = VirtualClock()
        self._q: list[tuple[float, int, Callable[[], None]]] = []
        self._n = 0
        self.results: list[SegmentResult] = []

    def schedule(self, t: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._q, (t, self._n, fn))
        self._n += 1

    def run(self, until: float = math.inf) -> None:
        while self._q and self._q[0][0] <= until:
            t, _, fn = heapq.heappop(self._q)
            self.clock.advance_to(t)
            fn()
        if until != math.inf:
            self.clock.advance_to(until)

    def by(self, rid: str) -> list[SegmentResult]:
        return sorted((r for r in self.results if r.request_id == rid), key=lambda r: r.segment_index)


def robots_for(loop: Loop, specs: dict[str, RobotSpec] | None = None, **kw) -> SimulatedRobots:
    return SimulatedRobots(loop.clock, specs or {"bot": BOT}, loop.results.append, loop.schedule, **kw)


def goal(text: str, rid: str = "r1", idx: int = 0, robot: str = "bot1", spec: RobotSpec = BOT) -> SegmentGoal:
    calls = parse_statement(text, spec).calls if spec.language == "minispec" else ()
    return SegmentGoal(rid, robot, spec.robot_type, idx, text, calls, 0.0,
                       any(spec.skill(c.abbr).blocking for c in calls))


def always(value):
    return lambda call, spec, rng: value if spec.returns != "none" else None


# ---------------------------------------------------------------- FIFO, latency, timing

def test_fifo_order_network_latency_and_durations() -> None:
    loop = Loop()
    r = robots_for(loop)
    r.dispatch(goal("mv(100);", "r1", 0))
    loop.schedule(0.5, lambda: r.dispatch(goal("mv(50);", "r1", 1)))
    r.dispatch(goal("tp;", "r2", 0, robot="bot2"))  # another robot runs in parallel
    loop.run()
    a, b = loop.by("r1")
    assert (a.code, a.exec_start, a.exec_end, a.call_durations_s, a.calls_done) == \
        (ResultCode.OK, pytest.approx(0.008), pytest.approx(2.008), (pytest.approx(2.0),), 1)
    # arrives at 0.508, waits for the first segment to end
    assert (b.exec_start, b.exec_end) == (pytest.approx(2.008), pytest.approx(3.508))
    (c,) = loop.by("r2")
    assert (c.exec_start, c.exec_end) == (pytest.approx(0.008), pytest.approx(0.258))
    assert not r.busy()


def test_results_are_posted_at_exec_end() -> None:
    loop = Loop()
    seen: list[tuple[float, int]] = []
    r = SimulatedRobots(loop.clock, {"bot": BOT}, lambda res: seen.append((loop.clock.now(), res.segment_index)),
                        loop.schedule, network_latency_s=0.1)
    r.dispatch(goal("mv(0);", "r1", 0))
    r.dispatch(goal("mv(0);", "r1", 1))
    loop.run()
    assert seen == [(pytest.approx(1.1), 0), (pytest.approx(2.1), 1)]


def test_conditionals_and_variables_run_through_minispec() -> None:
    loop = Loop()
    r = robots_for(loop, answer=always(True))
    r.dispatch(goal("?lk('cat')==True{mv(100);tp;}", "yes", 0))
    r.dispatch(goal("_1=lk('dog');", "var", 0, robot="bot2"))
    r.dispatch(goal("?_1==True{tp;}", "var", 1, robot="bot2"))
    loop.run()
    (y,) = loop.by("yes")
    assert y.calls_done == 3 and y.call_durations_s == pytest.approx((0.5, 2.0, 0.25))
    v0, v1 = loop.by("var")
    assert v0.value is True and v1.calls_done == 1 and v1.call_durations_s == pytest.approx((0.25,))

    loop = Loop()
    r = robots_for(loop, answer=always(False))
    r.dispatch(goal("?lk('cat')==True{mv(100);tp;}", "no", 0))
    r.dispatch(goal("s('cat');", "scan", 0, robot="bot2"))
    loop.run()
    (n,) = loop.by("no")
    assert n.calls_done == 1 and n.exec_end - n.exec_start == pytest.approx(0.5)
    (s,) = loop.by("scan")
    assert s.value is False and s.call_durations_s == (10.0,)  # a failed search runs its full course


def test_blocking_value_is_deterministic_perception() -> None:
    def values(seed: int, p: float) -> list:
        loop = Loop()
        r = robots_for(loop, seed=seed, perception_true_p=p)
        for i in range(40):
            r.dispatch(goal("lk('cat');", f"q{i}", 0, robot=f"b{i}"))
        loop.run()
        return [loop.by(f"q{i}")[0].value for i in range(40)]

    assert values(1, 0.5) == values(1, 0.5)
    assert values(1, 0.5) != values(2, 0.5)
    assert 5 < sum(values(1, 0.5)) < 35
    assert all(values(3, 1.0)) and not any(values(3, 0.0))


def test_chat_sentence_takes_reading_time() -> None:
    chat = load_robots()["chat"]
    loop = Loop()
    r = robots_for(loop, {"chat": chat})
    text = "The quick brown fox jumps over the lazy dog twice today."  # 11 words
    g = SegmentGoal("c1", "chat1", "chat", 0, text, (SkillCall("say", "say", (text,)),), 0.0, False)
    r.dispatch(g)
    loop.run()
    (res,) = loop.by("c1")
    assert res.ok and res.call_durations_s == (pytest.approx(11 * 60 / 300),)


def test_deterministic_regardless_of_interleaving() -> None:
    tello = load_robots()["tello"]  # real jittered models

    def run(order: list[tuple[str, str, int, str]]) -> dict:
        loop = Loop()
        r = robots_for(loop, {"tello": tello}, seed=7)
        for t, (rid, robot, idx, text) in enumerate(order):
            loop.schedule(t * 0.01, lambda rid=rid, robot=robot, idx=idx, text=text:
                          r.dispatch(goal(text, rid, idx, robot, tello)))
        loop.run()
        return {(x.request_id, x.segment_index): (x.call_durations_s, x.value) for x in loop.results}

    a = [("r1", "d1", 0, "mf(100);"), ("r1", "d1", 1, "tc(90);"), ("r2", "d2", 0, "s('cat');"),
         ("r2", "d2", 1, "tp;")]
    b = [a[2], a[0], a[3], a[1]]
    assert run(a) == run(b)
    durs = run(a)[("r1", 0)][0]
    assert durs[0] != pytest.approx(3.2, abs=1e-9)  # jitter applied (nominal 1.2 + 0.02*100)


# ---------------------------------------------------------------- invalid goals, cancel

def test_invalid_goals_are_rejected_with_a_reason() -> None:
    loop = Loop()
    r = robots_for(loop)
    r.dispatch(SegmentGoal("u", "x", "nosuch", 0, "tp;", (), 0.0, False))
    r.dispatch(SegmentGoal("v", "bot1", "bot", 0, "fly(3);", (), 0.0, False))
    r.dispatch(SegmentGoal("w", "bot1", "bot", 0, "mv(9999);", (), 0.0, False))
    loop.run()
    codes = {x.request_id: (x.code, x.error) for x in loop.results}
    assert codes["u"][0] == ResultCode.REJECTED and "unknown robot type" in codes["u"][1]
    assert codes["v"][0] == ResultCode.REJECTED and "invalid statement" in codes["v"][1]
    assert codes["w"][0] == ResultCode.REJECTED and "9999" in codes["w"][1]
    with pytest.raises(TypeError):
        r.dispatch("mv(1);")  # type: ignore[arg-type]


def test_cancel_stops_running_and_queued_goals_and_frees_the_robot() -> None:
    loop = Loop()
    r = robots_for(loop)
    r.dispatch(goal("1{mv(0);tp;mv(100);}", "r1", 0))  # 1.0 + 0.25 + 2.0, starts 0.008
    r.dispatch(goal("mv(0);", "r1", 1))  # queued behind it
    r.dispatch(goal("tp;", "r2", 0))  # another request's goal on the same robot
    loop.schedule(1.5, lambda: r.cancel("r1"))
    loop.run()
    s0, s1 = loop.by("r1")
    assert s0.code == ResultCode.CANCELLED and s0.exec_end == pytest.approx(1.5)
    assert s0.calls_done == 2 and s0.call_durations_s == pytest.approx((1.0, 0.25))
    assert s1.code == ResultCode.CANCELLED and s1.exec_start == s1.exec_end == pytest.approx(1.5)
    (o,) = loop.by("r2")
    assert o.ok and o.exec_start == pytest.approx(1.5)  # the robot is free at once
    # a goal still on the network when its request is cancelled never runs
    loop2 = Loop()
    r2 = robots_for(loop2)
    r2.dispatch(goal("mv(0);", "z", 0))
    r2.cancel("z")
    loop2.run()
    (z,) = loop2.by("z")
    assert z.code == ResultCode.CANCELLED and z.calls_done == 0 and not r2.busy()


# ---------------------------------------------------------------- faults

def test_fault_injection_outcomes() -> None:
    loop = Loop()
    r = robots_for(loop, faults=FaultConfig(reject_p=1.0))
    r.dispatch(goal("mv(0);"))
    loop.run()
    (x,) = loop.results
    assert x.code == ResultCode.REJECTED and "rejected" in x.error and x.exec_start == pytest.approx(0.008)

    loop = Loop()
    r = robots_for(loop, faults=FaultConfig(abort_p=1.0))
    r.dispatch(goal("3{mv(0);}"))
    loop.run()
    (x,) = loop.results
    assert x.code == ResultCode.ABORTED and x.calls_done < 3 and x.exec_end < 0.008 + 3.0
    assert len(x.call_durations_s) == x.calls_done and "aborted" in x.error

    loop = Loop()
    r = robots_for(loop, faults=FaultConfig(timeout_p=1.0, timeout_s=5.0))
    r.dispatch(goal("mv(0);", "a", 0))
    loop.run()
    (x,) = loop.results
    assert x.code == ResultCode.TIMEOUT and x.exec_end == pytest.approx(5.008)

    loop = Loop()
    r = robots_for(loop, faults=FaultConfig(slow_factor=2.0, slow_robots=frozenset({"slow"})))
    r.dispatch(goal("mv(0);", "a", 0, robot="slow"))
    r.dispatch(goal("mv(0);", "b", 0, robot="fast"))
    loop.run()
    assert loop.by("a")[0].call_durations_s == (2.0,) and loop.by("b")[0].call_durations_s == (1.0,)


def test_disconnect_fails_running_queued_and_later_goals() -> None:
    loop = Loop()
    r = robots_for(loop, faults=FaultConfig(disconnects={"bot1": 1.5}))
    r.dispatch(goal("2{mv(0);}", "r1", 0))  # runs 0.008 .. 2.008: cut at 1.5
    r.dispatch(goal("tp;", "r1", 1))  # queued
    loop.schedule(3.0, lambda: r.dispatch(goal("tp;", "r2", 0)))  # after the disconnect
    r.dispatch(goal("tp;", "r3", 0, robot="bot2"))  # other robots are unaffected
    loop.run()
    s0, s1 = loop.by("r1")
    assert s0.code == ResultCode.DISCONNECTED and s0.exec_end == pytest.approx(1.5) and s0.calls_done == 1
    assert s1.code == ResultCode.DISCONNECTED and s1.exec_end == pytest.approx(1.5)
    assert loop.by("r2")[0].code == ResultCode.DISCONNECTED
    assert loop.by("r3")[0].ok


def test_fault_rates_and_that_faults_do_not_change_durations() -> None:
    tello = load_robots()["tello"]

    def run(faults: FaultConfig) -> list[SegmentResult]:
        loop = Loop()
        r = robots_for(loop, {"tello": tello}, seed=3, faults=faults)
        for i in range(300):
            r.dispatch(goal("mf(100);", f"q{i}", 0, robot=f"d{i}", spec=tello))
        loop.run()
        return sorted(loop.results, key=lambda x: x.request_id)

    clean = run(FaultConfig())
    faulty = run(FaultConfig(reject_p=0.2, abort_p=0.1, timeout_p=0.1))
    counts = {c: sum(1 for x in faulty if x.code == c) for c in ResultCode}
    assert 35 <= counts[ResultCode.REJECTED] <= 85
    assert 10 <= counts[ResultCode.ABORTED] <= 50 and 10 <= counts[ResultCode.TIMEOUT] <= 50
    for a, b in zip(clean, faulty):
        if b.ok:
            assert a.call_durations_s == b.call_durations_s


def test_fault_config_validation() -> None:
    with pytest.raises(FaultError, match="reject_p"):
        FaultConfig(reject_p=1.5)
    with pytest.raises(FaultError, match="exceed 1"):
        FaultConfig(reject_p=0.6, abort_p=0.6)
    with pytest.raises(FaultError, match="slow_factor"):
        FaultConfig(slow_factor=0)
    with pytest.raises(FaultError, match="disconnect time"):
        FaultConfig(disconnects={"a": "soon"})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="network_latency_s"):
        robots_for(Loop(), network_latency_s=-1)

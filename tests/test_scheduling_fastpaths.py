"""The scheduling core's fast paths must give exactly what the plain code gives.

priority_order vs sorting by the (-priority, ready_since, arrival, gen_id) tuple; TimelyLLM's
vectorised Eq. 4 vs the formula written out; the simulated engine's resume validation (only what
follows the validated prompt is re-checked, but bad ids there are still refused).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timelyllm_ros.core.clock import VirtualClock
from timelyllm_ros.core.policies.base import PolicyContext, priority_order
from timelyllm_ros.core.policies.timelyllm import TimelyLLM
from timelyllm_ros.core.tuf import NORMAL, TUF
from timelyllm_ros.core.types import Generation, PlanRequest, Segment
from timelyllm_ros.engines.simulated import SimulatedEngine


def _gen(i: int, *, priority: float = 0.0, ready_since: float = 0.0, arrival: float = 0.0,
         tuf: TUF = NORMAL) -> Generation:
    req = PlanRequest(request_id=f"r{i}", robot_id="x", robot_type="tello", task="t", scene="", tuf=tuf,
                      arrival=arrival)
    g = Generation(request=req, ready_since=ready_since)
    g.priority = priority
    return g


def _plain(gens):
    return sorted(gens, key=lambda g: (-g.priority, g.ready_since, g.request.arrival, g.gen_id))


_PRI = st.one_of(st.sampled_from([0.0, -0.0, 1.0, 1, 2, 0.5, math.inf, -math.inf, math.nan]),
                 st.floats(allow_nan=True))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(_PRI, st.sampled_from([0.0, 1.0, 2.0]), st.sampled_from([0.0, 1.0])), max_size=25))
def test_priority_order_equals_tuple_sort(items):
    gens = [_gen(i, priority=p, ready_since=rs, arrival=a) for i, (p, rs, a) in enumerate(items)]
    assert [g.gen_id for g in priority_order(gens)] == [g.gen_id for g in _plain(gens)]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_PRI, st.sampled_from([0.0, 1.0, 2.0])), max_size=25))
def test_priority_order_with_another_tie_key(items):
    gens = [_gen(i, priority=p, arrival=a) for i, (p, a) in enumerate(items)]
    key = lambda g: (g.request.arrival, g.gen_id)  # noqa: E731 - Hybrid's order
    plain = sorted(gens, key=lambda g: (-g.priority,) + key(g))
    assert [g.gen_id for g in priority_order(gens, key)] == [g.gen_id for g in plain]


def test_priority_order_breaks_ties_fcfs():
    gens = [_gen(0, priority=1.0, ready_since=2.0), _gen(1, priority=1.0, ready_since=1.0),
            _gen(2, priority=3.0, ready_since=5.0), _gen(3, priority=1.0, ready_since=1.0, arrival=-1.0)]
    assert [g.gen_id for g in priority_order(gens)] == ["r2", "r3", "r1", "r0"]


_F = st.floats(min_value=-50, max_value=50)
_OPT = st.one_of(st.none(), _F)


def eq4_reference(g, G, now, min_slack, rescue):
    """Paper Eq. 4 as written (module doc of policies/timelyllm.py), with the TUF's own methods:
    the oracle of the vectorised `eq4`."""
    G = max(G, 1e-6)
    tuf = g.request.tuf
    if g.k == 0:
        due = g.request.arrival + tuf.ert
        utility = tuf(now + G - g.request.arrival)
    else:
        prev_end = g.prev_exec_end_estimate()
        due = prev_end if prev_end is not None else now
        utility = tuf.suspended(now + G - due)
    floor = G if min_slack is None else min_slack
    slack = max(due - (now + G), floor, 1e-6)
    if rescue and utility < tuf.beta:
        utility = tuf.beta + (tuf.beta - utility)
    return utility / (G * slack)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_F, st.floats(0, 3), st.floats(-10, 0), st.floats(0.01, 3),
                          st.lists(st.tuples(_F, _OPT, _OPT, _OPT, st.floats(0, 20)), max_size=3)),
                max_size=10),
       _F, st.floats(0, 1), st.one_of(st.none(), st.floats(0, 1)), st.booleans())
def test_timelyllm_select_matches_eq4_formula(items, now, G, min_slack, rescue):
    gens = []
    for i, (arrival, ert, alpha, beta, segs) in enumerate(items):
        g = _gen(i, arrival=arrival, tuf=TUF(ert, alpha, beta))
        for j, (t, disp, start, end, est) in enumerate(segs):
            g.segments.append(Segment(index=j, text="", calls=(), blocking=False, token_count=1, gen_start=t,
                                      gen_end=t, est_exec_s=est, dispatched_at=disp, exec_start=start,
                                      exec_end=end))
        gens.append(g)
    ctx = PolicyContext(estimator=None, robots={}, stats=None, seg_gen_s=G, token_s=0.02)  # type: ignore[arg-type]
    policy = TimelyLLM(min_slack_s=min_slack, rescue_late=rescue)
    expected = [eq4_reference(g, G, now, min_slack, rescue) for g in gens]
    assert [repr(policy.priority(g, ctx, now)) for g in gens] == [repr(p) for p in expected]  # bit for bit
    order = policy.select(gens, [], ctx, now).order
    assert [repr(g.priority) for g in gens] == [repr(p) for p in expected]
    assert [g.gen_id for g in order] == [g.gen_id for g in _plain(gens)]


def test_timelyllm_subclass_overriding_priority_is_honoured():
    class Const(TimelyLLM):
        def priority(self, g, ctx, now):
            return float(g.gen_id[1:])

    gens = [_gen(i) for i in range(3)]
    ctx = PolicyContext(estimator=None, robots={}, stats=None, seg_gen_s=0.1, token_s=0.02)  # type: ignore[arg-type]
    assert [g.gen_id for g in Const().select(gens, [], ctx, 0.0).order] == ["r2", "r1", "r0"]


def _engine() -> SimulatedEngine:
    e = SimulatedEngine(VirtualClock())
    e.set_script("g", "mf(50);")
    return e


def test_resume_still_rejects_bad_ids_after_the_validated_prompt():
    e = _engine()
    prompt = list(range(100, 180))
    e.add("g", prompt, 4)
    out = [o.token_ids[0] for o in e.step()]
    e.abort("g", "cache")
    for bad in (-1, True, 3.0, "7"):
        with pytest.raises(ValueError, match="bad token id"):
            e.add("g", prompt + out + [bad], 4)
    e.add("g", prompt + out + [5], 4)  # the good resume is accepted and reuses the cached prefix
    e.check_invariants()


def test_resume_with_a_changed_prefix_is_validated_in_full():
    e = _engine()
    prompt = list(range(100, 180))
    e.add("g", prompt, 4)
    e.step()
    e.abort("g", "cache")
    with pytest.raises(ValueError, match="bad token id -3"):
        e.add("g", [-3] + prompt[1:], 4)
    changed = [7] + prompt[1:]
    e.add("g", changed, 4)  # different content: nothing of the old prompt's blocks is claimed
    assert e.stats().running == 1
    e.check_invariants()

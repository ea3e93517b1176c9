"""Metrics against hand-computed timelines (paper Fig. 3 definitions)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timelyllm_ros.core.metrics import aggregate, request_metrics, rounded, run_end_of, summarize, to_json
from timelyllm_ros.core.tuf import NORMAL, URGENT
from timelyllm_ros.core.types import Generation, GenState, PlanRequest, Segment


def _req(rid: str, arrival: float, tuf=NORMAL, task_type="T1", category="normal") -> PlanRequest:
    return PlanRequest(request_id=rid, robot_id="d0", robot_type="tello", task="t", scene="s", tuf=tuf,
                       arrival=arrival, task_type=task_type, category=category)


def _seg(i: int, gen: tuple[float, float], ex: tuple[float, float] | None) -> Segment:
    s = Segment(index=i, text=f"s{i}", calls=(), blocking=False, token_count=5, gen_start=gen[0],
                gen_end=gen[1], est_exec_s=1.0)
    if ex is not None:
        s.exec_start, s.exec_end = ex
    return s


def _gen(req, segs, state=GenState.FINISHED, finished_at=None) -> Generation:
    return Generation(request=req, segments=list(segs), state=state, finished_at=finished_at)


def test_hand_computed_timeline():
    # arrival 10.0; s0 generated 10.0-10.3, runs 10.308-12.308; s1 generated while s0 runs, starts
    # right after (no wait); s2 starts 0.5 s after s1 ends.
    g = _gen(_req("r1", 10.0), [
        _seg(0, (10.0, 10.3), (10.308, 12.308)),
        _seg(1, (10.3, 10.5), (12.308, 13.308)),
        _seg(2, (13.3, 13.8), (13.808, 14.808)),
    ])
    m = request_metrics(g)
    assert m.response_s == pytest.approx(0.308)
    assert m.waiting_s == pytest.approx(0.308 + 0.0 + 0.5)
    assert m.execution_s == pytest.approx(2.0 + 1.0 + 1.0)
    assert m.completion_s == pytest.approx(14.808 - 10.0)
    assert m.completion_s == pytest.approx(m.waiting_s + m.execution_s)
    assert m.utility == pytest.approx(1.0)  # within ERT 1 s
    assert m.segments == m.segments_executed == 3
    assert m.state == "finished"


def test_late_urgent_utility_follows_eq1():
    # urgent: ERT 0.2, beta 2, alpha -6.67 -> response 0.35 gives 2 - 6.67*0.15
    g = _gen(_req("u", 0.0, tuf=URGENT, task_type="T6", category="urgent"), [_seg(0, (0, 0.3), (0.35, 1.0))])
    m = request_metrics(g)
    assert m.utility == pytest.approx(2 - 6.67 * 0.15)
    assert m.max_utility == 2.0


def test_overlapping_segment_start_clips_wait_to_zero():
    # a segment reported as starting before the previous ended (clock skew) adds no negative wait
    g = _gen(_req("r", 0.0), [_seg(0, (0, 0.1), (0.2, 1.0)), _seg(1, (0.1, 0.2), (0.9, 2.0))])
    m = request_metrics(g)
    assert m.waiting_s == pytest.approx(0.2)


def test_failed_request_without_action_earns_no_credit():
    g = _gen(_req("f", 5.0), [_seg(0, (5.0, 5.2), None)], state=GenState.FAILED, finished_at=5.5)
    m = request_metrics(g)
    assert m.response_s is None and m.waiting_s is None and m.completion_s is None
    assert m.utility == 0.0  # TUF would be 1.0 at 0.5 s, but no action ever started
    g2 = _gen(_req("f2", 0.0), [], state=GenState.FAILED, finished_at=3.0)
    assert request_metrics(g2).utility == pytest.approx(NORMAL(3.0))  # negative stays negative


def test_partial_execution_stops_at_first_unexecuted_segment():
    g = _gen(_req("p", 0.0), [_seg(0, (0, 0.1), (0.2, 1.0)), _seg(1, (0.1, 0.2), None),
                              _seg(2, (0.2, 0.3), (3.0, 4.0))], state=GenState.FAILED)
    m = request_metrics(g)
    assert m.segments_executed == 1 and m.execution_s == pytest.approx(0.8)


def test_aggregates_by_type_and_category():
    gens = [
        _gen(_req("a", 0.0), [_seg(0, (0, 0.1), (0.5, 1.5))]),
        _gen(_req("b", 1.0), [_seg(0, (1, 1.1), (2.25, 3.0))]),  # response 1.25 -> utility 0.5
        _gen(_req("c", 2.0, tuf=URGENT, task_type="T6", category="urgent"), [_seg(0, (2, 2.1), (2.1, 3.0))]),
    ]
    s = summarize(gens)
    t1 = s["by_task_type"]["T1"]
    assert t1["count"] == 2
    assert t1["utility_mean"] == pytest.approx(0.75)
    assert t1["utility_pct_of_max"] == pytest.approx(75.0)
    assert t1["response_s"]["mean"] == pytest.approx((0.5 + 1.25) / 2)
    assert t1["response_s"]["median"] == pytest.approx((0.5 + 1.25) / 2)
    assert s["by_category"]["urgent"]["utility_pct_of_max"] == pytest.approx(100.0)
    assert s["overall"]["count"] == 3
    assert s["overall"]["utility_pct_of_max"] == pytest.approx(100 * (1 + 0.5 + 2) / 4)
    assert [r["request_id"] for r in s["requests"]] == ["a", "b", "c"]


def test_p99_interpolates_like_numpy():
    np = pytest.importorskip("numpy")
    xs = [0.1 * i * i for i in range(37)]
    gens = [_gen(_req(f"r{i}", 0.0), [_seg(0, (0, 0.01), (x, x + 1))]) for i, x in enumerate(xs)]
    agg = aggregate([request_metrics(g) for g in gens])
    assert agg["response_s"]["p99"] == pytest.approx(float(np.percentile(xs, 99)))
    assert agg["response_s"]["median"] == pytest.approx(float(np.median(xs)))


def test_json_is_canonical():
    g = _gen(_req("a", 0.0), [_seg(0, (0, 0.1), (0.1 + 1e-12, 1.0))])
    a = to_json(summarize([g]))
    b = to_json(summarize([g]))
    assert a == b
    data = json.loads(a)
    assert data["requests"][0]["response_s"] == 0.1
    assert list(data) == sorted(data)
    assert rounded(-0.0) == 0.0 and rounded(float("nan")) is None


# --------------------------------------------------------------------------- no response: no gain

def test_a_request_without_response_counts_as_answered_at_the_end_of_the_run():
    """Issue 15: a request that ends without a response counts as if answered at the end of the
    run (never above 0) — so failing it early cannot beat answering it late (it used to: a
    failure at 0.5 s scored min(0, TUF(0.5)) = 0, the late answer below TUF(10) = -17)."""
    late = _gen(_req("late", 0.0), [_seg(0, (0, 0.1), (10.0, 11.0))])
    dropped = _gen(_req("drop", 0.0), [], state=GenState.FAILED, finished_at=0.5)
    s = summarize([late, dropped])
    rows = {r["request_id"]: r for r in s["requests"]}
    assert rows["late"]["utility"] == pytest.approx(NORMAL(10.0))
    assert rows["drop"]["utility"] == pytest.approx(NORMAL(11.0))  # the run's last event: 11.0
    assert rows["drop"]["utility"] <= rows["late"]["utility"]
    # a run end given by the caller (simulator's final time) counts when it is later ...
    assert summarize([late, dropped], run_end=20.0)["requests"][0]["utility"] == pytest.approx(NORMAL(20.0))
    # ... never when it is earlier than what the run recorded
    assert summarize([late, dropped], run_end=1.0)["requests"][0]["utility"] == pytest.approx(NORMAL(11.0))
    # never positive, even when the run ends within the request's ERT
    alone = _gen(_req("a", 0.0), [], state=GenState.FAILED, finished_at=0.1)
    assert summarize([alone])["requests"][0]["utility"] == 0.0


_TUFS = [NORMAL, URGENT]
_req_spec = st.tuples(
    st.floats(0.0, 50.0),  # arrival
    st.sampled_from([0, 1]),  # TUF
    st.one_of(st.none(), st.floats(0.0, 40.0)),  # response delay (None: no response)
    st.floats(0.0, 20.0),  # execution + later segments after the response, or time to the ending
)


def _run(specs):
    gens = []
    for i, (arr, k, resp, rest) in enumerate(specs):
        req = _req(f"r{i:03d}", arr, tuf=_TUFS[k], category=("normal", "urgent")[k])
        if resp is None:
            gens.append(_gen(req, [], state=GenState.FAILED, finished_at=arr + rest))
        else:
            start = arr + resp
            gens.append(_gen(req, [_seg(0, (arr, start), (start, start + rest))], finished_at=start + rest))
    return gens


def _dropped(g, at):
    """g as if it had been dropped (failed, shed) at time `at`, with no response."""
    return _gen(g.request, [], state=GenState.FAILED, finished_at=at)


def _total(s):
    return s["overall"]["utility_sum"]


@settings(max_examples=300, deadline=None)
@given(specs=st.lists(_req_spec, min_size=1, max_size=12), pick=st.integers(0, 11), frac=st.floats(0.0, 1.0))
def test_dropping_a_request_never_raises_the_aggregate(specs, pick, frac):
    """Property: in a run (its horizon fixed: the run end), turning any request — answered or
    not — into one dropped at any time within the run never raises the total utility, nor the
    total of its category.  Also with the horizon taken from the generations alone, when the
    drop keeps the request's own ending (the run ends no earlier)."""
    gens = _run(specs)
    i = pick % len(gens)
    end = run_end_of(gens)
    base = summarize(gens, run_end=end)
    arr = gens[i].request.arrival
    for at in (arr + frac * (end - arr), gens[i].finished_at):
        changed = gens[:i] + [_dropped(gens[i], at)] + gens[i + 1:]
        after = summarize(changed, run_end=end)
        assert _total(after) <= _total(base) + 1e-9
        cat = gens[i].request.category
        assert after["by_category"][cat]["utility_sum"] <= base["by_category"][cat]["utility_sum"] + 1e-9
    kept_end = gens[:i] + [_dropped(gens[i], gens[i].finished_at)] + gens[i + 1:]
    assert _total(summarize(kept_end)) <= _total(summarize(gens)) + 1e-9


# --------------------------------------------------------------------------- the whole plan (Eq. 3)

def test_eq3_hand_computed_three_requests_with_a_failure_mid_plan():
    """Issue 25: Eq. 3 on three requests, by hand.  TUF0 on the first action's response, TUF1
    (ERT 0) on each later wait; a request failing mid-plan is charged min(0, TUF1(run end −
    its last action's end)) for the continuation it never got, and that continuation keeps its β."""
    a = _gen(_req("a", 0.0), [  # normal: ERT 1, alpha -2, beta 1
        _seg(0, (0.0, 0.4), (0.5, 2.0)),  # W0 = 0.5 -> TUF0 = 1
        _seg(1, (0.4, 0.6), (2.0, 3.0)),  # W1 = 0 -> 1
        _seg(2, (3.0, 3.2), (3.25, 4.0)),  # W2 = 0.25 -> 1 - 2 * 0.25 = 0.5
    ])
    b = _gen(_req("b", 1.0, tuf=URGENT, task_type="T6", category="urgent"), [  # ERT 0.2, alpha -6.67, beta 2
        _seg(0, (1.0, 1.2), (1.3, 2.0)),  # W0 = 0.3 -> 2 - 6.67 * 0.1 = 1.333
        _seg(1, (2.0, 2.05), (2.1, 3.0)),  # W1 = 0.1 -> 2 - 0.667 = 1.333
    ])
    c = _gen(_req("c", 2.0), [
        _seg(0, (2.0, 2.4), (2.5, 3.0)),  # W0 = 0.5 -> 1
        _seg(1, (3.0, 3.3), None),  # never executed: failed at 3.5
    ], state=GenState.FAILED, finished_at=3.5)
    s = summarize([a, b, c], run_end=5.0)
    rows = {r["request_id"]: r for r in s["requests"]}
    assert rows["a"]["accrued_utility"] == pytest.approx(2.5) and rows["a"]["accrued_max_utility"] == 3.0
    assert rows["b"]["accrued_utility"] == pytest.approx(2 * (2 - 0.667)) and rows["b"]["accrued_max_utility"] == 4.0
    # c: 1 + min(0, TUF1(5.0 - 3.0)) = 1 + (1 - 2 * 2) = -2, max beta * (1 + 1) = 2
    assert rows["c"]["accrued_utility"] == pytest.approx(-2.0) and rows["c"]["accrued_max_utility"] == 2.0
    assert rows["c"]["continuations"] == 1 and tuple(rows["c"]["continuation_waits_s"]) == pytest.approx((2.0,))
    ov = s["overall"]
    assert ov["accrued_utility_sum"] == pytest.approx(2.5 + 2.666 - 2.0)
    assert ov["accrued_utility_pct_of_max"] == pytest.approx(100 * (2.5 + 2.666 - 2.0) / 9)
    assert ov["utility_pct_of_max"] == pytest.approx(100 * (1 + 1.333 + 1) / 4)  # first action, as before
    waits = sorted([0.0, 0.25, 0.1, 2.0])
    assert ov["continuation_wait_s"]["mean"] == pytest.approx(sum(waits) / 4)
    assert ov["continuation_wait_s"]["max"] == pytest.approx(2.0)
    assert ov["continuation_wait_s"]["p99"] == pytest.approx(0.25 + (2.0 - 0.25) * 0.97)
    assert ov["completion_s"]["mean"] == pytest.approx((4.0 + 2.0 + 1.0) / 3)
    assert s["by_category"]["urgent"]["accrued_utility_pct_of_max"] == pytest.approx(100 * 2.666 / 4)
    assert s["by_task_type"]["T1"]["accrued_utility_pct_of_max"] == pytest.approx(100 * 0.5 / 5)
    # a single generation without a run end is charged at its own ending (3.5): 1 + min(0, 1 - 1) = 1
    assert request_metrics(c).accrued_utility == pytest.approx(1.0)


def test_a_continuation_waiting_less_than_zero_counts_as_zero():
    g = _gen(_req("r", 0.0), [_seg(0, (0, 0.1), (0.2, 1.0)), _seg(1, (0.1, 0.2), (0.9, 2.0))])
    m = request_metrics(g)
    assert m.continuation_waits_s == (0.0,) and m.accrued_utility == pytest.approx(2.0)


def test_a_live_generation_is_scored_on_what_it_executed():
    g = _gen(_req("r", 0.0), [_seg(0, (0, 0.1), (0.2, 1.0)), _seg(1, (1.0, 1.1), None)], state=GenState.SUSPENDED)
    m = request_metrics(g)
    assert m.accrued_utility == pytest.approx(1.0) and m.accrued_max_utility == 1.0 and m.continuations == 0
    # at the end of a run it had not finished: charged the continuation it never got
    m = request_metrics(g, run_end=4.0)
    assert m.accrued_utility == pytest.approx(1.0 + NORMAL.suspended(3.0)) and m.accrued_max_utility == 2.0


_plan_spec = st.tuples(
    st.floats(0.0, 30.0),  # arrival
    st.sampled_from([0, 1]),  # TUF
    st.floats(0.0, 5.0),  # response delay
    st.lists(st.tuples(st.floats(0.0, 5.0), st.floats(0.1, 5.0)), min_size=0, max_size=6),  # (wait, exec) per action
)


def _plans(specs):
    gens = []
    for i, (arr, k, resp, acts) in enumerate(specs):
        req = _req(f"r{i:03d}", arr, tuf=_TUFS[k], category=("normal", "urgent")[k])
        t = arr + resp
        segs = []
        for j, (w, ex) in enumerate([(0.0, 1.0)] + acts):
            start = t + (w if j else 0.0)
            segs.append(_seg(j, (arr, start), (start, start + ex)))
            t = start + ex
        gens.append(_gen(req, segs, finished_at=t))
    return gens


def _ended_early(g, executed, at):
    """g as if it had failed at `at` after its first `executed` actions (0: before acting)."""
    segs = [dataclasses.replace(s) for s in g.segments[:executed]]
    if executed < len(g.segments):
        nxt = g.segments[executed]
        segs.append(_seg(executed, (nxt.gen_start, nxt.gen_end), None))
    return _gen(g.request, segs, state=GenState.FAILED, finished_at=at)


@settings(max_examples=300, deadline=None)
@given(specs=st.lists(_plan_spec, min_size=1, max_size=8), pick=st.integers(0, 7), cut=st.integers(0, 7),
       frac=st.floats(0.0, 1.0))
def test_ending_a_plan_early_never_raises_the_accrued_score(specs, pick, cut, frac):
    """Property (issue 25): in a run (horizon: its end), failing, cancelling or shedding any
    request after any number of its actions, at any time within the run, never raises the accrued
    utility, nor its % of max where that is >= 0 (below 0, a missing continuation charged 0 — an
    end within β/|α| of the run's end — adds β of maximum and moves the % towards 0), overall and
    in the request's category."""
    gens = _plans(specs)
    i = pick % len(gens)
    end = run_end_of(gens)
    base = summarize(gens, run_end=end)
    g = gens[i]
    executed = cut % (len(g.segments) + 1)
    last = g.segments[executed - 1].exec_end if executed else g.request.arrival
    changed = gens[:i] + [_ended_early(g, executed, last + frac * (end - last))] + gens[i + 1:]
    after = summarize(changed, run_end=end)
    cat = g.request.category
    for grp, grp_after in ((base["overall"], after["overall"]), (base["by_category"][cat], after["by_category"][cat])):
        assert grp_after["accrued_utility_sum"] <= grp["accrued_utility_sum"] + 1e-9
        if grp["accrued_utility_sum"] >= 0:
            assert grp_after["accrued_utility_pct_of_max"] <= grp["accrued_utility_pct_of_max"] + 1e-9

"""Metrics against hand-computed timelines (paper Fig. 3 definitions)."""

from __future__ import annotations

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

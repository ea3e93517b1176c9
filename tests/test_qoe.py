"""Andes QoE (Eqs. 1-3) on hand-computed timelines, closed-form runs vs per-token recurrence."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timelyllm_ros.core.qoe import (READING_TOK_S, SPEAKING_TOK_S, QoEError, Run, consume_rate, expected_tokens,
                                    qoe_of_deliveries, qoe_of_runs, qoe_summary, request_qoe)
from timelyllm_ros.core.robots import load_robots
from timelyllm_ros.core.tuf import NORMAL
from timelyllm_ros.core.types import Generation, GenState, PlanRequest, Segment

# ideal_start 1.0 s, r = 2 tok/s (u = 0.5 s): ideal timeline 1.0, 1.5, 2.0


def test_perfect_when_tokens_arrive_early():
    q = qoe_of_deliveries([0.5, 0.6, 0.7], ideal_start=1.0, rate=2.0)
    assert q.qoe == pytest.approx(1.0) and q.s_delay == pytest.approx(0.0)


def test_long_initial_delay():
    # actual 3.0, 3.5, 4.0: S_delay = 3 * 2 = 6; S_whole = (4-1)+(4-1.5)+(4-2) = 7.5
    q = qoe_of_deliveries([3.0, 3.0, 3.0], ideal_start=1.0, rate=2.0)
    assert (q.s_delay, q.s_whole) == (pytest.approx(6.0), pytest.approx(7.5))
    assert q.qoe == pytest.approx(1 - 6 / 7.5)


def test_pause_during_streaming():
    # actual 1.0, 1.5, 4.0: S_delay = 2; S_whole = 7.5
    q = qoe_of_deliveries([1.0, 1.5, 4.0], ideal_start=1.0, rate=2.0)
    assert q.qoe == pytest.approx(1 - 2 / 7.5)


def test_slow_streaming_as_a_run():
    # delivered at 1, 2, 3 (interval 1 s > u): actual = delivery; S_delay = 0+0.5+1; S_whole = 2+1.5+1
    run = qoe_of_runs([Run(1.0, 3, 1.0)], ideal_start=1.0, rate=2.0)
    assert run.qoe == pytest.approx(1 - 1.5 / 4.5)
    assert qoe_of_deliveries([1.0, 2.0, 3.0], ideal_start=1.0, rate=2.0).qoe == pytest.approx(run.qoe)


def test_unfinished_request_counts_expected_tokens_at_now():
    # nothing delivered, now = 2.0: 3 tokens expected (ideal 1.0, 1.5, 2.0), none consumed: actual
    # 2.0, 2.0, 2.0 -> S_delay = 1 + 0.5 + 0 = S_whole -> QoE 0 ("when no tokens arrive ... 0")
    q = qoe_of_runs([], ideal_start=1.0, rate=2.0, now=2.0, complete=False)
    assert q.tokens == 3 and q.s_delay == pytest.approx(1.5) and q.qoe == pytest.approx(0.0)
    # before the TTFT target nothing is expected yet: perfect so far
    assert qoe_of_runs([], ideal_start=1.0, rate=2.0, now=0.9, complete=False).qoe == 1.0
    # 2 tokens at 1.0, now 3.0: expected 5; actual 1.0, 1.5, 3.0, 3.0, 3.0; ideal 1 .. 3 step 0.5:
    # S_delay = 1 + 0.5 = 1.5, S_whole = 2 + 1.5 + 1 + 0.5 + 0 = 5
    part = qoe_of_runs([Run(1.0, 2)], ideal_start=1.0, rate=2.0, now=3.0, complete=False)
    assert part.qoe == pytest.approx(0.7) and part.delivered == 2
    # waiting longer lowers it
    assert qoe_of_runs([Run(1.0, 2)], ideal_start=1.0, rate=2.0, now=6.0, complete=False).qoe < part.qoe
    # deliveries after `now` do not count yet
    later = qoe_of_runs([Run(3.5, 5)], ideal_start=1.0, rate=2.0, now=2.0, complete=False)
    assert later.qoe == pytest.approx(q.qoe)


def test_expected_tokens_and_validation():
    assert expected_tokens(1.0, 2.0, 0.99) == 0
    assert expected_tokens(1.0, 2.0, 1.0) == 1
    assert expected_tokens(1.0, 2.0, 2.0) == 3
    with pytest.raises(QoEError):
        qoe_of_runs([Run(1.0, 1)], ideal_start=0.0, rate=0.0)
    with pytest.raises(QoEError):
        qoe_of_runs([Run(math.nan, 1)], ideal_start=0.0, rate=1.0)
    with pytest.raises(QoEError):
        qoe_of_runs([], ideal_start=0.0, rate=1.0, complete=False)


def _recurrence(times, ideal_start, rate):
    """The textbook per-token recurrence, written independently of the module."""
    u = 1 / rate
    ts = sorted(times)
    actual = []
    for i, d in enumerate(ts):
        ideal = ideal_start + i * u
        actual.append(max(d, ideal) if i == 0 else max(d, actual[-1] + u))
    ideal = [ideal_start + i * u for i in range(len(ts))]
    s_delay = sum(a - b for a, b in zip(actual, ideal))
    s_whole = sum(actual[-1] - b for b in ideal)
    return 1.0 if s_whole <= 1e-9 else 1 - s_delay / s_whole


runs_st = st.lists(st.tuples(st.floats(0, 20), st.integers(1, 12), st.sampled_from([0.0, 0.05, 0.2, 0.3, 0.7, 1.5])),
                   min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(runs_st, st.floats(0, 5), st.sampled_from([1.0, 3.3, 4.8, 10.0]))
def test_closed_form_runs_equal_per_token_recurrence(runs, ideal_start, rate):
    # runs are contiguous in delivery order when expanded (sorted by start, non-overlapping)
    t = 0.0
    rs, times = [], []
    for start, count, iv in runs:
        t = max(t, start)
        rs.append(Run(t, count, iv))
        times.extend(t + k * iv for k in range(count))
        t = t + (count - 1) * iv + 0.01
    got = qoe_of_runs(rs, ideal_start=ideal_start, rate=rate).qoe
    assert got == pytest.approx(_recurrence(times, ideal_start, rate), abs=1e-7)


def _gen(state=GenState.RUNNING, rate=2.0, segs=()):
    req = PlanRequest("c1", "u1", "chat", "hi", "", NORMAL, arrival=0.0, category="chat", consume_rate=rate)
    g = Generation(request=req, state=state)
    for i, (t, n) in enumerate(segs):
        g.segments.append(Segment(index=i, text="x.", calls=(), blocking=False, token_count=n, gen_start=t,
                                  gen_end=t, est_exec_s=0.0, dispatched_at=t))
    return g


def test_request_qoe_in_every_state():
    # TTFT target = ERT 1.0 s; r = 2 tok/s.  Finished: 2 tokens at 1.0, 2 tokens at 3.0:
    # actual 1.0, 1.5, 3.0, 3.5; ideal 1.0, 1.5, 2.0, 2.5: S_delay = 2; S_whole = 2.5+2+1.5+1 = 7
    fin = _gen(GenState.FINISHED, segs=[(1.0, 2), (3.0, 2)])
    assert request_qoe(fin, now=99.0).qoe == pytest.approx(1 - 2 / 7)
    # running at now = 2.0 with the first segment only: 3 expected, 2 delivered -> one placed at 2.0
    run = _gen(GenState.RUNNING, segs=[(1.0, 2)])
    # actual 1.0, 1.5, 2.0 = ideal -> perfect so far
    assert request_qoe(run, now=2.0).qoe == pytest.approx(1.0)
    queued = _gen(GenState.QUEUED)
    assert request_qoe(queued, now=0.5).qoe == 1.0  # nothing due yet
    assert request_qoe(queued, now=2.0).qoe == pytest.approx(0.0)
    failed = _gen(GenState.FAILED)
    assert request_qoe(failed, now=5.0).qoe == 0.0


def test_consume_rates():
    robots = load_robots()
    req = PlanRequest("c", "u", "chat", "t", "", NORMAL, 0.0)
    assert consume_rate(req, robots["chat"]) == READING_TOK_S
    assert consume_rate(req, robots["chat"], speaking_types=["chat"]) == SPEAKING_TOK_S
    tello = PlanRequest("d", "u", "tello", "t", "", NORMAL, 0.0)
    assert consume_rate(tello, robots["tello"], action_rate=7.0) == 7.0
    own = PlanRequest("e", "u", "chat", "t", "", NORMAL, 0.0, consume_rate=9.0)
    assert consume_rate(own, robots["chat"]) == 9.0


def test_summary_share():
    s = qoe_summary([1.0, 0.96, 0.5, 0.95])
    assert s["qoe_mean"] == pytest.approx((1 + 0.96 + 0.5 + 0.95) / 4) and s["share_ge"] == 0.75
    assert qoe_summary([])["qoe_mean"] is None


def test_metrics_summary_reports_qoe_of_chat_requests_only():
    from timelyllm_ros.core.metrics import summarize

    fin = _gen(GenState.FINISHED, segs=[(1.0, 2), (3.0, 2)])
    fin.finished_at = 5.0
    robot = Generation(request=PlanRequest("d1", "d", "tello", "t", "", NORMAL, 0.0), state=GenState.FAILED,
                       finished_at=1.0)
    s = summarize([fin, robot])
    assert s["qoe"]["count"] == 1 and s["qoe"]["per_request"]["c1"] == pytest.approx(1 - 2 / 7)
    assert "qoe" not in summarize([robot])


def test_reading_speed_is_per_word_and_follows_the_tokenizer():
    from timelyllm_ros.core.qoe import measured_tokens_per_word

    robots = load_robots()
    req = PlanRequest("c", "u", "chat", "t", "", NORMAL, 0.0)
    # the paper's 4.8 tok/s at 1.3 tokens/word = 3.69 words/s; at 2.6 tokens/word that is 9.6 tok/s
    assert consume_rate(req, robots["chat"], tokens_per_word=2.6) == pytest.approx(9.6)
    g = Generation(request=req, state=GenState.FINISHED)
    g.segments.append(Segment(index=0, text="It is sunny today.", calls=(), blocking=False, token_count=10,
                              gen_start=0, gen_end=0, est_exec_s=0, dispatched_at=0.5))
    assert measured_tokens_per_word(g) == pytest.approx(10 / 4)
    assert measured_tokens_per_word(Generation(request=req)) is None
    # 10 tokens at 0.5 s, TTFT target 1 s: perfect at any rate
    assert request_qoe(g, 9.0).qoe == 1.0

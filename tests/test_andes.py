"""Andes policy: greedy packing, selective triggering, gain-per-memory decisions, the refiner."""

import pytest

from timelyllm_ros.core.exec_time import ExecTimeEstimator
from timelyllm_ros.core.policies import DispatchMode, PolicyContext, make_policy, policy_names
from timelyllm_ros.core.policies.andes import Andes
from timelyllm_ros.core.robots import load_robots
from timelyllm_ros.core.tuf import NORMAL
from timelyllm_ros.core.types import Generation, GenState, PlanRequest, Segment
from timelyllm_ros.engines.base import EngineStats

from policy_oracles import andes_rate, andes_select_reference, greedy_pack

ROBOTS = load_robots()


def ctx(total_blocks=1000, free_blocks=1000, token_s=0.022):
    return PolicyContext(estimator=ExecTimeEstimator(ROBOTS), robots=ROBOTS,
                         stats=EngineStats(total_blocks, free_blocks, 16, 0, 1 / token_s), seg_gen_s=0.1,
                         token_s=token_s)


def chat(rid, arrival, state=GenState.QUEUED, delivered=(), prompt=100, rate=4.8):
    """delivered: (dispatch time, tokens) per sentence already sent to the user."""
    req = PlanRequest(rid, "u", "chat", "t", "", NORMAL, arrival, category="chat", consume_rate=rate)
    g = Generation(request=req, state=state, ready_since=arrival, prompt_ids=[1] * prompt)
    for i, (t, n) in enumerate(delivered):
        g.segments.append(Segment(index=i, text="s.", calls=(), blocking=False, token_count=n, gen_start=t,
                                  gen_end=t, est_exec_s=0.0, dispatched_at=t))
        g.output_ids.extend([2] * n)
    return g


def blocked(g):
    g.blocked = "batch full"
    return g


def test_greedy_pack_is_algorithm_1():
    assert greedy_pack([0, 1, 2], [3, 2, 1], [5, 5, 5], 12, 3) == [0, 1]  # memory
    assert greedy_pack([0, 1, 2], [3, 2, 1], [5, 5, 5], 100, 1) == [0]  # batch size
    # stops at the first misfit even though a later one would fit
    assert greedy_pack([0, 1, 2], [3, 2, 1], [5, 10, 1], 12, 3) == [0]


def test_registry_and_validation():
    assert "andes" in policy_names()
    p = make_policy("andes", delta_t=5.0, max_batch=4)
    assert p.mode is DispatchMode.STREAM and p.params()["delta_t"] == 5.0
    for bad in ({"delta_t": 0}, {"kv_trigger": 1.5}, {"solve_every": 0}, {"max_batch": 0}, {"mode": "whole"}):
        with pytest.raises(ValueError):
            make_policy("andes", **bad)


def test_not_triggered_is_fcfs_without_preemption():
    p = Andes()
    a, b = chat("a", 1.0), chat("b", 0.5)
    run = chat("r", 0.0, GenState.RUNNING, delivered=[(0.5, 10)])
    sel = p.select([a, b], [run], ctx(), 2.0)
    assert [g.gen_id for g in sel.order] == ["b", "a"] and sel.preempt == [] and p.solves == 0


def test_buffered_request_yields_to_a_new_one_when_full():
    p = Andes()
    # A delivered 100 tokens at 1.0: ~21 s of reading at 4.8 tok/s -> serving it gains nothing in 10 s
    a = chat("a", 0.0, GenState.RUNNING, delivered=[(1.0, 100)])
    b = blocked(chat("b", 1.9))  # just arrived: waiting 10 s would cost all its QoE
    sel = p.select([b], [a], ctx(), 2.0)
    assert [g.gen_id for g in sel.preempt] == ["a"] and [g.gen_id for g in sel.order] == ["b"]
    assert p.last_decision["B"] == 1 and b.priority > a.priority


def test_kv_pressure_triggers_the_solver():
    p = Andes()
    a = chat("a", 0.0, GenState.RUNNING, delivered=[(1.0, 100)])
    b = chat("b", 1.9)
    # 95 % of KV in use: triggered even though no admission was refused; memory M = 1000*16 tokens
    sel = p.select([b], [a], ctx(free_blocks=50), 2.0)
    assert p.solves == 1 and [g.gen_id for g in sel.order] == ["b"] and sel.preempt == []  # both fit


def test_gain_per_memory_prefers_small_context():
    p = Andes(max_batch=1)
    big = blocked(chat("big", 1.9, prompt=5000))
    small = chat("small", 1.9, prompt=50)
    run = chat("r", 0.0, GenState.RUNNING, delivered=[(1.0, 100)])
    sel = p.select([big, small], [run], ctx(), 2.0)
    assert [g.gen_id for g in sel.order] == ["small"] and sel.preempt == [run]


def test_refiner_cancels_pairs_whose_overhead_costs_more_than_they_gain():
    # c is exactly on schedule (no buffer): any stall delays its next tokens
    def setup():
        a = chat("a", 0.0, GenState.RUNNING, delivered=[(1.0, 5)], prompt=100)  # 5 tokens at 4.8/s ~ 1 s buffer
        c = chat("c", 0.0, GenState.RUNNING, delivered=[(1.0, 5)], prompt=100)
        b = blocked(chat("b", 3.0, prompt=100))
        return a, c, b
    # a and c are both starving at now = 2.0; b just arrived.  With a 30 s restore stall (absurd
    # prefill cost) admitting b would freeze c for 30 s: the refiner refuses.
    a, c, b = setup()
    slow = Andes(max_batch=2, prefill_s_per_token=0.3)
    sel = slow.select([b], [a, c], ctx(), 2.0)
    assert slow.last_decision["proposed_admit"] == 1 and sel.order == [] and sel.preempt == []
    a, c, b = setup()
    unrefined = Andes(max_batch=2, prefill_s_per_token=0.3, refine=False)
    sel = unrefined.select([b], [a, c], ctx(), 2.0)
    assert [g.gen_id for g in sel.order] == ["b"] and len(sel.preempt) == 1
    a, c, b = setup()
    cheap = Andes(max_batch=2)  # ~10 ms restore: worth it
    sel = cheap.select([b], [a, c], ctx(), 2.0)
    assert [g.gen_id for g in sel.order] == ["b"] and len(sel.preempt) == 1


def test_solver_period_and_priority_order_between_solves():
    p = Andes(solve_every=3)
    a = chat("a", 0.0, GenState.RUNNING, delivered=[(1.0, 100)])
    for i in range(3):
        p.select([blocked(chat(f"b{i}", 1.9))], [a], ctx(), 2.0)
    assert p.solves == 1


def test_speaking_robots_consume_slower():
    p = Andes(speaking_types=("chat",))
    g = chat("x", 0.0)
    g.request = PlanRequest("x", "u", "chat", "t", "", NORMAL, 0.0, category="chat")
    assert andes_rate(p, g, ctx()) == 3.3
    assert andes_rate(Andes(), g, ctx()) == 4.8


def test_reading_rate_learns_tokens_per_word_from_delivered_text():
    p = Andes()
    g = chat("x", 0.0, GenState.RUNNING)
    g.request = PlanRequest("x", "u", "chat", "t", "", NORMAL, 0.0, category="chat")
    g.segments.append(Segment(index=0, text="one two three four", calls=(), blocking=False, token_count=10,
                              gen_start=0, gen_end=0, est_exec_s=0, dispatched_at=0.5))
    assert andes_rate(p, g, ctx()) == pytest.approx(4.8 * 2.5 / 1.3)  # its own 2.5 tokens/word
    fixed = Andes(tokens_per_word=1.3)
    assert andes_rate(fixed, g, ctx()) == pytest.approx(4.8)


def test_an_empty_engine_is_given_work_even_when_no_admission_gains():
    """Regression (regime map: andes on the edge board's kv/4 and cap 8 runs could not finish).
    A request whose user is still reading what was delivered on time has QoE 1 whether served in
    the next Δt or not (gain 0), so the refiner kept no admission and — with nothing running — the
    engine stayed empty although work was ready.  An empty engine stalls no one: the packed set
    is admitted.  Fast path and reference path alike."""
    def buffered():  # 400 tokens delivered on time 4.5 s ago: ~80 s of reading at 4.8 tok/s
        return [chat(f"r{i}", 995.0, GenState.SUSPENDED, delivered=[(995.5, 400)]) for i in range(3)]

    orders = []
    for select in (Andes.select, andes_select_reference):
        p = Andes()
        gens = buffered()
        sel = select(p, gens, [], ctx(token_s=0.5), 1000.0)  # slow tokens: triggered
        assert p.solves == 1 and p.last_decision["proposed_admit"] >= 1
        assert all(g.priority == 0.0 for g in gens)  # nothing to gain: the refiner alone keeps none
        assert sel.order and sel.preempt == []
        orders.append([g.gen_id for g in sel.order])
    assert orders[0] == orders[1]


def test_a_running_batch_still_refuses_admissions_that_do_not_pay():
    """The idle-engine rule applies only to an empty engine: with a request running the refiner
    still keeps no admission whose gain is <= 0."""
    p = Andes()
    run = chat("run", 999.0, GenState.RUNNING, delivered=[(999.5, 5)])
    waiting = chat("r", 995.0, GenState.SUSPENDED, delivered=[(995.5, 400)])
    sel = p.select([waiting], [run], ctx(token_s=0.5), 1000.0)
    assert p.solves == 1 and waiting.priority == 0.0 and sel.order == []

"""The default policy: one decision-rule test per mechanism, its online-ness, and its endings."""

import dataclasses
import math

import pytest

from timelyllm_ros.cli import main
from timelyllm_ros.core.exec_time import ExecTimeEstimator
from timelyllm_ros.core.policies import DEFAULT_POLICY, PolicyContext, make_policy
from timelyllm_ros.core.policies.default import Default
from timelyllm_ros.core.robots import load_robots
from timelyllm_ros.core.tuf import NORMAL, URGENT
from timelyllm_ros.core.policy_state import PolicyState
from timelyllm_ros.core.types import Generation, GenState, PlanRequest, Segment
from timelyllm_ros.engines.base import EngineStats
from timelyllm_ros.workloads.format import scaled_drones
from timelyllm_ros.sim.runner import run_simulation
from timelyllm_ros.sim.robots import FaultConfig

ROBOTS = load_robots()
TOKEN_S = 0.02  # lead = max(0.05, 4 * 0.02) = 0.08 s; tello's first guess: 6 tokens per segment


def ctx():
    return PolicyContext(estimator=ExecTimeEstimator(ROBOTS), robots=ROBOTS,
                         stats=EngineStats(1000, 1000, 16, 0, 45.0), seg_gen_s=0.1, token_s=TOKEN_S)


def gen(rid, arrival, tuf=NORMAL, segments=(), state=GenState.QUEUED):
    g = Generation(request=PlanRequest(rid, "d1", "tello", "t", "s", tuf, arrival), state=state)
    g.segments.extend(segments)
    g.ready_since = arrival
    return g


def seg(index, gen_end, est, tokens=5, blocking=False):
    return Segment(index=index, text="mf(50);", calls=(), blocking=blocking, token_count=tokens,
                   gen_start=gen_end - 0.1, gen_end=gen_end, est_exec_s=est, dispatched_at=gen_end)


def ids(gs):
    return [g.gen_id for g in gs]


def test_default_is_registered_and_named_default():
    assert DEFAULT_POLICY == "default"
    p = make_policy("default")
    assert isinstance(p, Default) and p.name == "default" and p.batching() == "continuous"
    with pytest.raises(ValueError, match="preempt_ratio"):
        make_policy("default", preempt_ratio=0.5)


def test_slack_uses_deadline_minus_online_estimate():
    p = Default()
    g = gen("u", 10.0, URGENT)
    # first segment: due 10.2; 6 predicted tokens + 1 step to enter the batch, at 0.02 s each
    assert p.slack(g, ctx(), 10.0, running=False) == pytest.approx(0.2 - 7 * TOKEN_S)
    # later segment: due when the robot finishes the dispatched action (10.5 + 3.0)
    c = gen("c", 10.0, NORMAL, [seg(0, 10.5, 3.0)])
    assert p.slack(c, ctx(), 11.0, running=True) == pytest.approx(13.5 - 11.0 - 6 * TOKEN_S)


def test_segment_lengths_are_learned_online_per_robot_type_and_position():
    p = Default(len_weight=0.5)
    g = gen("a", 0.0)
    assert p.predicted_tokens(g, ctx()) == 6.0  # half of tello's 12-token worst case
    p.observe(g, seg(0, 1.0, 1.0, tokens=10))
    p.observe(g, seg(0, 1.0, 1.0, tokens=4))
    assert p.predicted_tokens(g, ctx()) == pytest.approx(7.0)  # 10, then 0.5*10 + 0.5*4
    later = gen("b", 0.0, segments=[seg(0, 1.0, 1.0)])
    assert p.predicted_tokens(later, ctx()) == 6.0  # later segments are learned apart


def test_gate_holds_deferrable_work_while_a_first_segment_is_critical():
    p = Default()
    urgent = gen("u", 10.0, URGENT)  # slack 0.06 <= lead: critical
    normal = gen("n", 10.0, NORMAL)  # slack 0.86: deferrable
    cont = gen("c", 5.0, NORMAL, [seg(0, 9.0, 5.0)], state=GenState.SUSPENDED)  # due 14.0
    sel = p.select([normal, cont, urgent], [], ctx(), 10.0)
    assert ids(sel.order) == ["u"] and sel.preempt == []
    # no critical first segment: spare time goes to deferrable work, least slack first
    sel = p.select([normal, cont], [], ctx(), 10.0)
    assert ids(sel.order) == ["n", "c"]
    # a critical *continuation* alone does not close the gate (only first segments decide responses)
    due = gen("d", 5.0, NORMAL, [seg(0, 9.95, 0.1)], state=GenState.SUSPENDED)  # due 10.05
    sel = p.select([normal, due], [], ctx(), 10.0)
    assert ids(sel.order) == ["d", "n"]
    # a running critical first segment closes it too
    running_urgent = gen("ru", 9.95, URGENT, state=GenState.RUNNING)
    sel = p.select([normal], [running_urgent], ctx(), 10.0)
    assert sel.order == []


def test_critical_segments_are_ordered_by_apparent_tardiness_cost():
    """Every critical segment — first ones and continuations alike, as Eq. 3 weighs them: ATC,
    |alpha| / p * exp(-max(0, slack) / (k * mean p)) over all of them — past the deadline
    weighted-shortest-processing-time (an urgent TUF loses 6.67 per second, a normal one 2; a
    continuation's TUF1 has the same slope).  The overdue urgent continuation is as late as the
    overdue urgent first segment and needs fewer tokens: it goes first."""
    p = Default()
    late = gen("late", 9.6, URGENT)  # overdue
    fresh = gen("fresh", 10.0, URGENT)
    near = gen("near", 9.3, NORMAL)  # due 10.3, slack 0.16 - ... critical
    cont = gen("cont", 5.0, URGENT, [seg(0, 9.0, 1.0)], state=GenState.SUSPENDED)  # robot idle since 10.0
    sel = p.select([fresh, cont, near, late], [], ctx(), 10.1)
    c = ctx()
    crit = [fresh, cont, near, late]
    ps = [(max(1.0, p.predicted_tokens(g, c)) + 1) * TOKEN_S for g in crit]
    slacks = [p.slack(g, c, 10.1, running=False) for g in crit]
    scale = sum(ps) / len(ps) * p.atc_k
    want = {g.gen_id: -g.request.tuf.alpha / q * math.exp(-max(0.0, s) / scale) for g, q, s in zip(crit, ps, slacks)}
    for g in crit:
        assert g.priority == pytest.approx(want[g.gen_id], rel=1e-12)
    arrival = {g.gen_id: g.request.arrival for g in crit}  # equal priorities: first come first
    assert ids(sel.order) == sorted(want, key=lambda k: (-want[k], arrival[k]))
    assert ids(sel.order)[:3] == ["cont", "late", "fresh"]  # past due: urgent before the normal one


def test_preemption_only_when_the_batch_is_full_and_victims_chosen_by_rule():
    p = Default()
    urgent = gen("u", 10.0, URGENT)
    idle = gen("idle", 5.0, NORMAL, [seg(0, 9.0, 20.0)], state=GenState.RUNNING)  # due 29: deferrable
    busy = gen("busy", 9.9, URGENT, state=GenState.RUNNING)  # critical first segment itself
    # not full: nobody is preempted (the newcomer simply joins the batch)
    assert p.select([urgent], [busy, idle], ctx(), 10.0).preempt == []
    # full: the deferrable running one makes room, not the critical one
    urgent.blocked = "batch full (2)"
    sel = p.select([urgent], [busy, idle], ctx(), 10.0)
    assert ids(sel.preempt) == ["idle"] and ids(sel.order) == ["u"]
    # full, only critical victims of similar density: no preemption (no churn)
    urgent.blocked = "batch full (1)"
    assert p.select([urgent], [busy], ctx(), 10.0).preempt == []
    # ...unless the waiting one's ATC priority is preempt_ratio times higher: an overdue urgent
    # (6.67 per second, 7 steps to go) vs an overdue normal (2 per second, 6 steps): 2.86x
    late = gen("late", 9.5, URGENT)
    late.blocked = "batch full (1)"
    normal = gen("nr", 9.1, NORMAL, state=GenState.RUNNING)  # due 10.1: critical
    assert p.select([late], [normal], ctx(), 10.0).preempt == []  # default ratio 4
    late.blocked = "batch full (1)"
    assert ids(Default(preempt_ratio=2.5).select([late], [normal], ctx(), 10.0).preempt) == ["nr"]
    # deferrable work never preempts
    waiting = gen("w", 10.0, NORMAL)
    waiting.blocked = "batch full (1)"
    assert p.select([waiting], [normal], ctx(), 10.0).preempt == []


def test_suspend_at_streams_unless_the_batch_is_full_and_the_next_segment_can_wait():
    p = Default()
    g = gen("g", 0.0, NORMAL, state=GenState.RUNNING)
    far = seg(0, 10.0, 5.0)  # robot busy until 15.0: the next segment can wait
    g.segments.append(far)
    p.select([], [g], ctx(), 10.0)  # not full
    assert p.suspend_at(g, far, ctx(), 10.0) is False  # stream on: nothing waits for the slot
    blocked = gen("w", 10.0, NORMAL)
    blocked.blocked = "batch full (1)"
    p.select([blocked], [g], ctx(), 10.0)
    assert p.suspend_at(g, far, ctx(), 10.0) is True  # full: free the slot
    h = gen("h", 0.0, NORMAL, state=GenState.RUNNING)
    soon = seg(0, 10.0, 0.05)  # robot done at 10.05: the next segment is due now
    h.segments.append(soon)
    assert p.suspend_at(h, soon, ctx(), 10.0) is False  # keep the slot: it is needed at once


def test_a_full_batch_prices_a_yield_where_a_re_add_is_dear():
    """Rule 5's price (`yield_price` 0.08, `yield_backlog_s` 30 s): on an engine where a re-add's
    re-prefill (half a KV block at the step-time model's seconds per prefilled token) costs more
    than 0.08 of a one-generation step, a full batch keeps its slots at statement ends while only
    continuations wait (a swap of one continuation for another is not worth a re-add); it yields
    as before where a critical first statement waits (behind a late backlog under 30 s) or rule
    10 protects a steeper first statement while critical work waits, and wherever a re-add is
    cheap.  Until the step-time model has seen 4 steps it yields."""
    def point(p, waiting, yield_backlog=None):
        g = gen("g", 0.0, NORMAL, state=GenState.RUNNING)
        far = seg(0, 10.0, 5.0)  # robot busy until 15.0: the next segment can wait
        g.segments.append(far)
        waiting.blocked = "batch full (1)"
        p.select([waiting], [g], ctx(), 10.0)
        return p.suspend_at(g, far, ctx(), 10.0)

    def cont():  # a waiting continuation, deferrable
        return gen("w", 0.0, NORMAL, segments=[seg(0, 9.0, 5.0)], state=GenState.SUSPENDED)

    assert (Default().yield_price, Default().yield_backlog_s) == (0.08, 30.0)
    assert point(Default(), cont()) is True  # no steps seen: yields
    dear, cheap = Default(), Default()
    _feed(dear._steps, a=0.022, b=0.004, d=0.001)  # 8 tokens x 1 ms = 8 ms > 0.08 x 26 ms
    _feed(cheap._steps, a=0.022, b=0.004, d=0.0001)  # 0.8 ms < 2.08 ms
    assert dear.readd_dear(ctx()) and not cheap.readd_dear(ctx())
    assert point(dear, cont()) is False and point(cheap, cont()) is True
    # due 10.2: slack 0.2 - 7 steps x 0.02 = 0.06 <= lead 0.08, critical
    assert point(dear, gen("f", 9.2, NORMAL)) is True  # a critical first statement waits, no backlog
    assert point(dear, gen("f", 10.0, NORMAL)) is False  # due 11.0: not critical yet, it can wait
    strict = Default(yield_backlog_s=0.0)  # no backlog is short enough: only rule 10's protection
    _feed(strict._steps, a=0.022, b=0.004, d=0.001)
    assert point(strict, gen("f", 9.2, NORMAL)) is False  # critical, but no steeper than the batch
    assert point(strict, gen("u", 10.0, URGENT)) is True  # a steeper first statement, critical
    lax = Default(yield_price=float("inf"))
    _feed(lax._steps, a=0.022, b=0.004, d=0.001)
    assert point(lax, cont()) is True  # inf: always the old rule
    for k, bad in (("yield_price", -0.1), ("yield_price", float("nan")), ("yield_price", True),
                   ("yield_backlog_s", "30"), ("yield_backlog_s", -1)):
        with pytest.raises(ValueError, match=k):
            Default(**{k: bad})


def test_a_suspension_keeps_its_kv_where_the_engine_can_and_memory_has_room():
    """Rule 13 (`keep_kv`, `keep_kv_min_free` 0.25): on an engine that honours "preserve" (an
    InferCept/LAMPS-style engine, the map's preserve column) a generation suspended at a
    statement end or preempted keeps its KV in place while at least a quarter of the KV memory is
    free — its re-add then recomputes one token, so rule 5's price sees no dear re-add there;
    on a stock engine (vLLM: "cache" only), with memory short, or with `keep_kv=false` it goes
    to the prefix cache as before."""
    pres = dataclasses.replace(ctx(), kv_modes=frozenset({"cache", "preserve"}))  # 1000 of 1000 blocks free
    short = dataclasses.replace(pres, stats=EngineStats(1000, 240, 16, 0, 45.0))  # 24 % free
    g = gen("g", 0.0, NORMAL, [seg(0, 9.0, 5.0)], state=GenState.RUNNING)
    p = Default()
    assert (p.keep_kv, p.keep_kv_min_free) == (True, 0.25)
    assert p.kv_mode(g, g.segments[-1], pres) == "preserve" and p.kv_mode(g, None, pres) == "preserve"
    assert p.kv_mode(g, g.segments[-1], ctx()) == "cache"  # stock vLLM cannot keep it
    assert p.kv_mode(g, g.segments[-1], short) == "cache"
    edge = dataclasses.replace(pres, stats=EngineStats(1000, 250, 16, 0, 45.0))  # exactly 25 %
    assert p.kv_mode(g, None, edge) == "preserve"
    assert Default(keep_kv=False).kv_mode(g, g.segments[-1], pres) == "cache"
    assert Default(keep_kv_min_free=0.0).kv_mode(g, None, short) == "preserve"
    dear = Default()
    _feed(dear._steps, a=0.022, b=0.004, d=0.001)  # a re-prefill dear on this engine (see rule 5's test)
    assert dear.readd_dear(ctx()) and dear.readd_dear(short) and not dear.readd_dear(pres)
    assert dear.params()["keep_kv"] is True and dear.params()["keep_kv_min_free"] == 0.25
    for k, bad in (("keep_kv", 1), ("keep_kv", "true"), ("keep_kv_min_free", 1.5), ("keep_kv_min_free", -0.1),
                   ("keep_kv_min_free", float("nan")), ("keep_kv_min_free", True)):
        with pytest.raises(ValueError, match=k):
            Default(**{k: bad})


def test_overload_preempts_only_victims_that_can_be_back_in_time():
    """Rule 11: when more ready generations are past their deadlines than the batch holds, a
    generation that leaves the batch now waits behind them (their estimated times summed over
    the batch: `queue_wait`); a deferrable running one is then preempted only if its slack
    exceeds that wait — else it would be back after its robot idles, and the swap would only
    decide who is late at the price of a re-add."""
    def setup(n_late, **kw):
        p = Default(**kw)
        # robot busy until 10.3: slack 0.3 - 6 tokens x 0.02 = 0.18 > lead 0.08, deferrable
        v = gen("v", 0.0, NORMAL, [seg(0, 9.0, 1.3)], state=GenState.RUNNING)
        late = [gen(f"u{i}", 9.0 + 0.1 * i, URGENT) for i in range(n_late)]  # due 9.2, 9.3, ...: late
        for g in late:
            g.blocked = "batch full (1)"
        return p, p.select(late, [v], ctx(), 10.0)

    p, sel = setup(3)  # 3 late > 1 running: each waits 7 steps, 0.42 s in all > 0.18 s of slack
    assert p.queue_wait(3, [7 * TOKEN_S] * 3, 1) == pytest.approx(0.42)
    assert sel.preempt == [] and ids(sel.order) == ["u0", "u1", "u2"]
    p, sel = setup(3, overload=False)  # rule 7 alone: the deferrable one makes room
    assert ids(sel.preempt) == ["v"]
    p, sel = setup(1, back_factor=0.0)  # 1 late, 1 running: no backlog, rule 7 as before
    assert p.queue_wait(1, [7 * TOKEN_S], 1) == 0.0 and ids(sel.preempt) == ["v"]
    # a victim with more slack than the backlog's wait is still preempted
    p = Default()
    far = gen("far", 0.0, NORMAL, [seg(0, 9.0, 20.0)], state=GenState.RUNNING)  # due 29
    late = [gen(f"u{i}", 9.0 + 0.1 * i, URGENT) for i in range(3)]
    for g in late:
        g.blocked = "batch full (1)"
    assert ids(p.select(late, [far], ctx(), 10.0).preempt) == ["far"]


def test_a_generation_leaves_the_batch_only_if_it_can_be_back_before_the_critical_queue_lets_it():
    """Rule 11's critical queue (opt-in: `back_factor` 4, here where the load factor is at least
    `back_rho` 1): a generation that leaves the batch now — a deferrable victim of rule 7, or a yield at a
    statement end (rule 5) — comes back only after the critical work waiting now (their estimated
    times summed over the running batch, `back_wait`), and more turns critical meanwhile; it
    leaves only if its slack exceeds the lead plus `back_factor` times that.  Without a late
    backlog (rule 11's `queue_wait` is 0) too; off below the load factor (a queue that drains),
    with back_factor 0 or overload off, and where KV memory is short."""
    def setup(n_late, victim_due=1.3, stats=None, rho=1.0, **kw):
        kw.setdefault("back_factor", 4.0)
        kw.setdefault("back_rho", 1.0)
        p = Default(**kw)
        p.load_factor = lambda ctx, now, effective=False: rho  # (the offered load's reading: `offered_load.py`)
        v = gen("v", 0.0, NORMAL, [seg(0, 9.0, victim_due)], state=GenState.RUNNING)
        late = [gen(f"u{i}", 9.0 + 0.1 * i, URGENT) for i in range(n_late)]
        for g in late:
            g.blocked = "batch full (1)"
        c = ctx() if stats is None else dataclasses.replace(ctx(), stats=stats)
        return p, p.select(late, [v], c, 10.0)

    # one critical generation waits: 7 steps (0.14 s) over 1 running, x 4 = 0.56 s > 0.18 s of slack
    p, sel = setup(1)
    assert p.queue_wait(1, [7 * TOKEN_S], 1) == 0.0  # no late backlog
    assert p._back_s == pytest.approx(4 * 7 * TOKEN_S) and sel.preempt == [] and ids(sel.order) == ["u0"]
    assert p.back_wait([7 * TOKEN_S, 7 * TOKEN_S], 2, ctx(), 10.0) == pytest.approx(4 * 7 * TOKEN_S)
    assert p.back_wait([], 1, ctx(), 10.0) == 0.0
    for kw in ({"back_factor": 0.0}, {"overload": False}, {"rho": 0.99}, {"rho": 0.0},
               {"rho": 1.2, "back_rho": 1.5}):  # rule 7 alone: the deferrable one makes room
        p, sel = setup(1, **kw)
        assert p._back_s == 0.0 and ids(sel.preempt) == ["v"]
    p, sel = setup(1, rho=0.0, back_rho=0.0)  # back_rho 0 (its default): whatever the load
    assert sel.preempt == []
    p, sel = setup(1, stats=EngineStats(1000, 240, 16, 0, 45.0))  # memory short (24 % free): rule 7
    assert p._back_s == 0.0 and ids(sel.preempt) == ["v"]
    p, sel = setup(1, back_factor=0.5)  # 0.08 + 0.07 s < 0.18 s of slack: back in time, preempted
    assert ids(sel.preempt) == ["v"]
    p, sel = setup(1, victim_due=2.0)  # slack 0.88 s > 0.08 + 0.56: preempted
    assert ids(sel.preempt) == ["v"]
    # rule 5: at a statement end in a full batch, the same wait keeps the slot
    p, _ = setup(1)
    p._full = True
    v = gen("w", 0.0, NORMAL, [seg(0, 9.0, 1.3)], state=GenState.RUNNING)
    assert not p.suspend_at(v, v.segments[-1], ctx(), 10.0)
    p, _ = setup(1, back_factor=0.0)
    p._full = True
    assert p.suspend_at(v, v.segments[-1], ctx(), 10.0)
    assert Default().params()["back_factor"] == 0.0 and Default().params()["back_rho"] == 0.0  # (opt-in)
    for k in ("back_factor", "back_rho"):
        for bad in (-1.0, float("nan"), True, "4"):
            with pytest.raises(ValueError, match=k):
                Default(**{k: bad})


def test_a_deferrable_victim_covers_its_readd_where_memory_is_short():
    """Rule 11 (`victim_readd`): where less than `keep_kv_min_free` of KV memory is free, a
    preempted generation's KV is not kept (rule 13) and its freed blocks are soon evicted, so its
    re-add re-prefills its whole context in one step that holds up the running batch; a
    deferrable victim's slack must then also exceed that prefill time (the step-time model's
    seconds per prefilled token) times the running batch.  Where memory has room, with too few
    steps seen, or with `victim_readd=false`, rule 11 as before."""
    room = ctx()  # 1000 of 1000 blocks free
    short = dataclasses.replace(room, stats=EngineStats(1000, 240, 16, 0, 45.0))  # 24 % free

    def point(c, context_tokens, steps=True, **kw):
        kw.setdefault("back_factor", 0.0)  # (the re-add's price alone: the critical queue has its own test)
        p = Default(**kw)
        if steps:
            _feed(p._steps, a=0.022, b=0.004, d=0.001)  # 1 ms per prefilled token
        # robot busy until 10.3: slack 0.3 - 6 tokens x 0.02 = 0.18 s, lead 0.08 s: deferrable
        v = gen("v", 0.0, NORMAL, [seg(0, 9.0, 1.3)], state=GenState.RUNNING)
        v.prompt_ids = list(range(context_tokens - 10))
        v.output_ids = list(range(10))
        u = gen("u", 9.0, URGENT)  # due 9.2: late, critical
        u.blocked = "batch full (1)"
        return p, v, p.select([u], [v], c, 10.0)

    p, v, sel = point(short, 200)  # re-add 200 tokens x ~1 ms x 1 running: 0.08 + ~0.2 > 0.18
    assert p.readd_stall_per_token(short, 1) * (len(v.prompt_ids) + len(v.output_ids)) == pytest.approx(0.2, rel=0.05)
    assert sel.preempt == []
    assert p.readd_stall_per_token(short, 3) == pytest.approx(3 * p.readd_stall_per_token(short, 1))  # the batch held up
    p, v, sel = point(short, 50)  # ~0.05 s: still back in time
    assert ids(sel.preempt) == ["v"]
    p, v, sel = point(room, 200)  # memory has room: a re-add re-prefills half a block, as before
    assert p.readd_stall_per_token(room, 1) == 0.0 and ids(sel.preempt) == ["v"]
    edge = dataclasses.replace(room, stats=EngineStats(1000, 250, 16, 0, 45.0))  # exactly 25 %: room
    assert point(edge, 200)[2].preempt != []
    assert ids(point(short, 200, steps=False)[2].preempt) == ["v"]  # no step model yet: no price
    assert ids(point(short, 200, victim_readd=False)[2].preempt) == ["v"]
    assert ids(point(short, 200, keep_kv_min_free=0.2)[2].preempt) == ["v"]  # 24 % counts as room then
    assert Default().params()["victim_readd"] is True
    for bad in (1, "true", None):
        with pytest.raises(ValueError, match="victim_readd"):
            Default(victim_readd=bad)


def test_plan_order_ranks_late_work_by_the_whole_replys_wsrpt_and_keeps_slots_nobody_outranks():
    """Rule 12 (opt-in `plan_order`): under rule 11's backlog (more late ready generations than
    the batch holds) critical generations rank by |TUF slope| / (the reply's predicted remaining
    tokens x time per token) instead of ATC on the next segment; a generation at a statement end
    keeps its slot unless a waiting one outranks it; rule 7 skips deferrable victims that rule 11
    keeps instead of stopping there.  No backlog or the rule off: as before.  (The learned
    predictor is swapped for the oracle here so that the remaining lengths are known.)"""
    from timelyllm_ros.core.length_predictor import OraclePredictor

    def req_gen(rid, arrival, plan, tuf=NORMAL, segments=(), state=GenState.QUEUED):
        g = gen(rid, arrival, tuf, segments, state)
        g.request = dataclasses.replace(g.request, reference_plan=plan)
        return g

    def setup(plan_order=True, n_late=3):
        p = Default(plan_order=plan_order, plan_depth_s=0.0)  # (the depth gate: its own test below)
        p._lenpred = OraclePredictor()
        run = req_gen("run", 0.0, "mf(50); tl(90); mf(30); tl(90);", state=GenState.RUNNING,
                      segments=[seg(0, 9.0, 20.0)])  # its robot busy until 29: deferrable
        long_ = req_gen("long", 9.0, "mf(50); tl(90); " * 12)  # due 10.0: late at 10.5
        short = req_gen("short", 9.1, "mf(50);")
        late = [long_, short] + [req_gen(f"x{i}", 9.2, "mf(50); tl(90); " * 6) for i in range(n_late - 2)]
        for g in late:
            g.blocked = "batch full (1)"
        return p, run, late, p.select(late, [run], ctx(), 10.5)

    p, run, late, sel = setup()
    assert p._plan and p._queue_s > 0.0
    assert ids(sel.order)[:2] == ["short", "x0"] and ids(sel.order)[-1] == "long"  # shortest reply first
    want = [-NORMAL.alpha / (p._lenpred.remaining(g) * TOKEN_S) for g in late]
    assert [g.priority for g in late] == want
    assert p._head_pri == max(want)
    # ATC without the rule: the next segment's length decides, the same for all three here
    q, _, late_q, sel_q = setup(plan_order=False)
    assert not q._plan and ids(sel_q.order) == ["long", "short", "x0"]
    # no backlog (2 late for 1 running... here 1 late beside 1 running): rule 12 stays off
    r = Default(plan_order=True, plan_depth_s=0.0)
    r._lenpred = OraclePredictor()
    one = req_gen("one", 9.0, "mf(50);")
    r.select([one], [run], ctx(), 10.5)
    assert not r._plan
    # rule 5 under rule 12: the batch is full (a ready one was refused) and g's next segment is
    # far off, so rule 5 alone would suspend it; it keeps its slot unless a waiting one outranks it
    p._full = True
    nearly_done = req_gen("nd", 0.0, "mf(50);", segments=[seg(0, 10.0, 20.0)], state=GenState.RUNNING)
    nearly_done.output_ids.extend([1] * 6)
    assert p.suspend_at(nearly_done, nearly_done.segments[0], ctx(), 10.5) is False
    far = req_gen("far", 0.0, "mf(50); tl(90); " * 20, segments=[seg(0, 10.0, 20.0)], state=GenState.RUNNING)
    assert p.suspend_at(far, far.segments[0], ctx(), 10.5) is True  # "short" waits and outranks it
    q._full = True
    assert q.suspend_at(nearly_done, nearly_done.segments[0], ctx(), 10.5) is True  # rule off: rule 5
    # rule 7 under rule 12: the deferrable running one that rule 11 keeps does not stop the walk
    crit_run = req_gen("cr", 8.0, "mf(50); tl(90); " * 30, URGENT, state=GenState.RUNNING)  # late, long
    crit_run.output_ids.extend([1] * 2)
    p2, q2 = Default(plan_order=True, plan_depth_s=0.0), Default(plan_order=False)
    for pol in (p2, q2):
        pol._lenpred = OraclePredictor()
    for pol, want_pre in ((p2, ["cr"]), (q2, [])):
        near = req_gen("near", 0.0, "mf(50); tl(90);", segments=[seg(0, 9.0, 1.8)],
                       state=GenState.RUNNING)  # robot busy until 10.8: deferrable, but rule 11 keeps it
        runs = [near,
                dataclasses.replace(crit_run, output_ids=list(crit_run.output_ids), policy=PolicyState())]
        lates = [req_gen("s1", 9.0, "mf(50);", URGENT), req_gen("s2", 9.0, "mf(50);", URGENT),
                 req_gen("s3", 9.0, "mf(50);", URGENT)]
        for g in lates:
            g.blocked = "batch full (2)"
        assert ids(pol.select(lates, runs, ctx(), 10.5).preempt) == want_pre


def test_plan_order_waits_for_a_deep_lasting_backlog():
    """Rule 12's gate: it applies only while rule 11's backlog wait, averaged over time
    (exponentially, time constant 10 s), is at least `plan_depth_s` (8 s) — not in a burst
    that drains within seconds; the average decays while there is no backlog."""
    from timelyllm_ros.core.policies.default import _PLAN_TAU_S

    p = Default(plan_order=True)
    assert p.plan_depth_s == 8.0 and _PLAN_TAU_S == 10.0
    seen = []
    for k in range(60):  # a backlog wait of 20 s, seen every 0.5 s: the average reaches 8 s at ~5.1 s
        p._queue_s = 20.0
        seen.append(p.plan_applies(0.5 * k))
    first = seen.index(True)
    assert 0.5 * first == pytest.approx(10.0 * math.log(20.0 / 12.0), abs=0.5) and all(seen[first:])
    assert p._depth == pytest.approx(20.0 * (1.0 - math.exp(-29.5 / 10.0)))
    p._queue_s = 0.0
    assert p.plan_applies(30.0) is False  # no backlog now: off at once
    p._queue_s = 3.0
    assert p.plan_applies(60.0) is False  # a moderate burst 30 s later: the old average has decayed
    q = Default(plan_order=True)
    q._queue_s = 3.0  # a moderate backlog that lasts: its average never reaches 8 s
    assert not any(q.plan_applies(0.5 * k) for k in range(400))
    off = Default(plan_order=False, plan_depth_s=0.0)
    off._queue_s = 50.0
    assert off.plan_applies(0.0) is False  # the rule off: never
    for bad in (-1.0, math.inf, math.nan, True, "8"):
        with pytest.raises(ValueError, match="plan_depth_s"):
            Default(plan_depth_s=bad)
    for flag in ("plan_order", "pace", "overload", "preempt", "kv_budget", "memory_full", "speculate"):
        for bad in ("maybe", "false", 1, None):  # a switch is a bool: a typo is an error, not "on"
            with pytest.raises(ValueError, match=f"{flag} must be true or false"):
                Default(**{flag: bad})


def test_plan_order_without_the_length_predictor_model_is_a_clear_error(monkeypatch, tmp_path):
    import timelyllm_ros.core.length_predictor as L
    import timelyllm_ros.core.policies.default as D

    monkeypatch.setattr(L, "DEFAULT_MODEL_DIR", tmp_path / "missing")
    D._learned_predictor.cache_clear()
    try:
        for kw in ({}, {"plan_order": True}):  # (on by default)
            with pytest.raises(ValueError, match="plan_order .* needs the learned length predictor.*plan_order=false"):
                Default(**kw)
        assert Default(plan_order=False).plan_order is False  # the rule off needs no model
    finally:
        D._learned_predictor.cache_clear()


def _decisions(workload, perturb_after=None, **kw):
    """Run `default` and record every scheduling decision (time, admitted order, preempted; with
    rule 12, whether it applied).  `kw`: run_simulation's (policy_params, max_batch)."""
    log = []

    def setup(planner, arrivals):
        pol = planner.policy
        inner = pol.select

        def select(ready, running, ctx, now):
            sel = inner(ready, running, ctx, now)
            log.append((now, ids(sel.order), ids(sel.preempt), pol._plan))
            return sel

        pol.select = select
        if perturb_after is None:
            return arrivals
        # the plans (hence lengths) of requests that have not arrived yet are changed: twice as long
        return [dataclasses.replace(a, reference_plan=a.reference_plan + a.reference_plan)
                if a.time >= perturb_after else a for a in arrivals]

    r = run_simulation(workload, "default", setup=setup, **kw)
    return log, r


@pytest.mark.parametrize("small", [False, True], ids=["numpy", "plain"])
@pytest.mark.parametrize("workload, kw", [
    ("mixed_small", dict(max_batch=4)),  # preemptions, blocking statements under speculation
    ("chat_mixed", dict(max_batch=8, faults=FaultConfig(abort_p=0.1, reject_p=0.05, timeout_p=0.02, timeout_s=2.0))),
    ("WID1", dict(engines=2)),  # behind an engine pool
    ("drones:2000", dict(max_batch=4, profile_path="profiles/vllm_cpu_tiny.yaml",
                         policy_params=dict(plan_order=True, plan_depth_s=0.0))),  # rule 12, a backlog
])
def test_select_reads_again_whatever_the_planner_changed(workload, kw, small):
    """`select` keeps whether a generation has segments, its current segment's tokens and its
    next due time (the numpy path; the plain path, `small`, whether it has segments, its next due
    time, the predicted segment length from the prediction table it was read from, its TUF slope
    and its prompt tokens, in its `DefaultState.terms`, until its `seg_rev` moves, its token counts
    read at every point), and rule 12 the predicted remaining reply, until its `sched_rev` moves
    (`Generation.touch`; `touch_tokens` moves `sched_rev` alone).  Over whole runs (tokens,
    statements cut and suspended, speculation, executor results and faults, preemptions), at
    every scheduling point what it used equals what the generations hold then: a planner path
    that changed one of them without `touch` (or with `touch_tokens` only) fails here."""
    checked = []
    plan = []
    if workload.startswith("drones:"):
        workload = scaled_drones(int(workload.split(":")[1]), duration_s=5.0)

    def setup(planner, arrivals):
        pol = planner.policy
        pol._small_below = math.inf if small else 0  # each path on its own
        inner = pol.select

        def select(ready, running, ctx, now):
            sel = inner(ready, running, ctx, now)
            a = pol._table.a
            for g in [*running, *ready]:
                j = pol._table.slot(g)
                fresh = (bool(g.segments), float(g.seg_tokens), g.next_due(now))
                if small:
                    t = g.policy.default.terms
                    mag = -g.request.tuf.alpha
                    assert t[1] is pol._pred_by, g.gen_id  # (read from this point's prediction table)
                    assert t[:1] + t[2:] == (g.seg_rev, fresh[0],
                                             pol._pred_by[0 if g.segments else 1].get(g.request.robot_type, 8.0),
                                             fresh[2], mag, mag if mag > 0.0 else 1e-12, len(g.prompt_ids)), g.gen_id
                else:
                    assert (bool(a["has"][j]), float(a["tok"][j]), float(a["due"][j])) == fresh, g.gen_id
                if j is not None and a["prev"][j] == g.sched_rev:  # (its text did not grow: asking changes nothing)
                    assert float(a["rem"][j]) == float(pol._lenpred.remaining(g)), g.gen_id
                    plan.append(g.gen_id)
            checked.append(len(ready) + len(running))
            return sel

        pol.select = select
        return arrivals

    r = run_simulation(workload, "default", setup=setup, **kw)
    assert len(r.generations) > 10 and len(checked) > 100 and sum(checked) > 1000
    assert (len(plan) > 1000) == bool(kw.get("policy_params"))  # rule 12 applied and its kept predictions were checked


def test_decisions_are_online_future_plans_do_not_change_the_past():
    wl = scaled_drones(100, duration_s=20.0)
    t_cut = 10.0
    base, r0 = _decisions(wl)
    pert, r1 = _decisions(wl, perturb_after=t_cut)
    before = [d for d in base if d[0] < t_cut]
    assert len(before) > 100
    assert [d for d in pert if d[0] < t_cut] == before
    assert base != pert  # the perturbation did change what happened later (the test is not vacuous)
    late = [g for g in r1.generations if g.request.arrival >= t_cut]
    assert late and all(g.state is GenState.FINISHED for g in r0.generations + r1.generations)


def test_plan_order_is_online_too():
    """Rule 12 ranks by a reply-length prediction from the prompt and the text generated so far:
    under an overloaded cap (so that it applies) future plans still do not change the past."""
    wl = scaled_drones(400, duration_s=20.0)
    t_cut = 12.0
    kw = dict(policy_params={"plan_order": True, "plan_depth_s": 0.0}, max_batch=4)
    base, _ = _decisions(wl, **kw)
    pert, _ = _decisions(wl, perturb_after=t_cut, **kw)
    before = [d for d in base if d[0] < t_cut]
    assert sum(d[3] for d in before) > 20  # rule 12 applied before the cut (not vacuous)
    assert [d for d in pert if d[0] < t_cut] == before
    assert base != pert


def test_default_streams_uncontended_and_suspends_only_blocking_statements():
    r = run_simulation(scaled_drones(50, duration_s=20.0), "default", policy_params={"speculate": False})
    blocking_resumes = sum(sum(1 for s in g.segments[:-1] if s.blocking) for g in r.generations)
    assert sum(g.resumes for g in r.generations) == blocking_resumes  # nothing else was cut
    assert r.batcher == "fixed(256)"


def test_every_request_ends_terminal_with_a_reason_under_overload():
    """A capped, overloaded run: default never sheds; every request finishes or fails with a
    reason, and the metrics count all of them."""
    r = run_simulation(scaled_drones(400, duration_s=10.0), "default", max_batch=4)
    assert r.generations and all(g.state.terminal and g.reason for g in r.generations)
    assert r.metrics["overall"]["count"] == len(r.generations)
    assert sum(g.num_preemptions for g in r.generations) > 0  # the cap binds


def test_bench_without_policy_runs_default(tmp_path, capsys):
    out = tmp_path / "r.json"
    wl = tmp_path / "w.yaml"
    wl.write_text("name: tiny\nduration_s: 5\nseed: 3\nevents: {rate_per_s: 1.0, max_tasks_per_event: 2}\n"
                  "agents: {tello: 2}\ntraces: [T1, T6]\ntuf:\n  normal: {ert: 1.0, alpha: -2.0, beta: 1.0}\n"
                  "  urgent: {ert: 0.2, alpha: -6.67, beta: 2.0}\n")
    assert main(["bench", "--workload", str(wl), "--out", str(out), "--no-progress"]) == 0
    import json

    doc = json.loads(out.read_text())
    assert list(doc["policies"]) == ["default"] and doc["policies"]["default"]["policy"] == "default"


def test_admission_fits_free_kv_memory_counting_uncached_prefixes():
    """A robot type with nobody in the batch brings its whole prompt; the order is cut where the
    free blocks run out (strict order: later ones wait), so the engine does not thrash."""
    p = Default()
    c = PolicyContext(estimator=ExecTimeEstimator(ROBOTS), robots=ROBOTS,
                      stats=EngineStats(1000, 30, 16, 1, 45.0), seg_gen_s=0.1, token_s=TOKEN_S)
    running = gen("r", 9.0, URGENT, state=GenState.RUNNING)
    a = gen("a", 10.0, URGENT)  # tello, like the running one: own tokens + 12 -> 1 block
    b = Generation(request=PlanRequest("b", "arm1", "arm", "t", "s", URGENT, 10.0), prompt_ids=[1] * 400)
    b.ready_since = 10.0  # arm: nobody in the batch -> 400 prompt tokens + segment -> 27 blocks
    d = gen("d", 10.0, URGENT)
    order = p._fit_memory([a, b, d], [running], c)
    assert ids(order) == ["a", "b", "d"]  # 1 + 27 + 1 <= 30
    b.prompt_ids = [1] * 480  # 32 blocks: does not fit; d waits behind it
    assert ids(p._fit_memory([a, b, d], [running], c)) == ["a"]
    # an empty engine always takes the first one (it may still fit once the cache is reused)
    assert ids(p._fit_memory([b], [], c)) == ["b"]


def test_first_statements_and_continuations_are_weighed_alike():
    """Eq. 3 scores a robot idling mid-plan (TUF1 of the wait) with the same slope as one
    waiting for its first action: an overdue urgent continuation goes before a normal first
    statement near its ERT, full batch or not; when the batch is full it may preempt that first
    statement (ATC priority preempt_ratio times higher), never the other way round."""
    p = Default()
    first = gen("first", 9.5, NORMAL)  # due 10.5: critical at 10.45
    cont = gen("cont", 5.0, URGENT, [seg(0, 9.0, 1.4)], state=GenState.SUSPENDED)  # robot done 10.4
    sel = p.select([cont, first], [], ctx(), 10.45)
    assert ids(sel.order) == ["cont", "first"] and sel.preempt == []  # not full
    first.blocked = "batch full (1)"
    assert ids(p.select([cont, first], [], ctx(), 10.45).order) == ["cont", "first"]
    running_cont = gen("rc", 5.0, URGENT, [seg(0, 9.0, 1.4)], state=GenState.RUNNING)
    assert p.select([first], [running_cont], ctx(), 10.45).preempt == []
    waiting_cont = gen("wc", 5.0, URGENT, [seg(0, 9.0, 1.4)], state=GenState.SUSPENDED)
    waiting_cont.blocked = "batch full (1)"
    running_first = gen("rf", 9.5, NORMAL, state=GenState.RUNNING)
    assert ids(Default(preempt_ratio=2.5).select([waiting_cont], [running_first], ctx(), 10.45).preempt) == ["rf"]


def test_demo_ros_node_and_config_default_to_default():
    import yaml

    from timelyllm_ros.cli import build_parser
    from timelyllm_ros.nodes import wiring

    assert build_parser().parse_args(["demo"]).policy == DEFAULT_POLICY
    assert wiring.PLANNER_DEFAULTS["policy"] == DEFAULT_POLICY
    from pathlib import Path

    cfg = yaml.safe_load((Path(__file__).resolve().parents[1] / "config" / "planner.yaml").read_text())
    assert cfg["/**/planner"]["ros__parameters"]["policy"] == DEFAULT_POLICY



_SIZES = [1, 3, 8, 8, 6, 5, 12, 20, 20, 17, 9, 4, 2, 30, 30, 25, 11, 40, 33, 7] * 3


def _feed(model, a, b, c=0.0, d=0.0):
    """Engine steps of varied batch sizes taking a + b·n + c·new + d·prefill seconds."""
    for i, n in enumerate(_SIZES):
        new, prefill = i % 3, (i % 3) * (20 + 7 * (i % 5))
        model.observe(a + b * n + c * new + d * prefill, n, new, prefill)


def test_step_model_least_squares_learns_the_per_generation_cost():
    """step = a + b·n (+ new requests' tokenising, + prefill) is recovered from measured steps
    alone; the prefill term keeps a cold prompt's seconds out of a and b."""
    from timelyllm_ros.core.policies.step_time import StepTimeModel

    m = StepTimeModel()
    assert m.least_squares() == (0.0, 0.0)  # nothing seen
    _feed(m, a=0.022, b=0.004, c=0.005, d=0.001)
    a, b = m.least_squares()
    assert a == pytest.approx(0.022) and b == pytest.approx(0.004)
    flat = StepTimeModel()
    for _ in range(30):
        flat.observe(0.05, 8, 0)  # one batch size: b cannot be told apart
    assert flat.least_squares() == (0.0, 0.0)


def test_step_cap_ratio_is_roomy_unless_kv_memory_binds_first():
    """Rule 10's opt-in ratio: roomy_ratio (here 10) while KV memory has room; step_ratio (3) at a
    point where the KV budget (rule 6) admits fewer than the roomy cap would (memory is short: a
    wider batch would only fill it), and roomy again as soon as memory admits the cap's room.
    Memory then counts as short (rule 8's `_mem_cut`) only where it cuts within the cap that
    applies.  The default since 2026-11-28 (session 15): roomy_ratio 10, step_ratio 3."""
    assert (Default().roomy_ratio, Default().step_ratio) == (10.0, 3.0)
    p = Default(roomy_ratio=10.0, steep_cap=False)  # (every generation here is urgent: one slope)
    _feed(p._steps, a=0.022, b=0.004)
    roomy = p.step_cap(ctx(), 0)
    assert roomy == int((10 * 0.026 - 0.022) / 0.004 + 1e-9) == 59
    assert p.step_cap(ctx(), 0, short=True) == 14
    running = [gen(f"r{i}", 9.0, URGENT, state=GenState.RUNNING) for i in range(12)]
    ready = [gen(f"q{i:02d}", 10.0, URGENT) for i in range(80)]
    assert len(p.select(ready, running, ctx(), 10.0).order) == roomy - 12 and p._capped  # room: 10 x
    base = ctx()
    ref = Default(roomy_ratio=10.0, steep_cap=False)
    ref._small_below = math.inf  # the plain path (default_small.py) gets the whole order
    _feed(ref._steps, a=0.022, b=0.004)
    for free, short in ((20, True), (3, True), (1, True), (60, False)):  # 60 blocks: memory admits 60 > 47
        tight = dataclasses.replace(base, stats=dataclasses.replace(base.stats, kv_free_blocks=free))
        order = p.select(ready, running, tight, 10.1).order
        kv_only = len(p._fit_memory(list(ready), running, tight))
        assert (kv_only < roomy - 12) is short  # memory binds before the roomy cap: 3 x (or less)
        assert len(order) == (min(kv_only, 14 - 12) if short else roomy - 12)
        assert p._mem_cut is (kv_only < 14 - 12)  # short against the 3 x cap that applies, not the roomy one
        assert ids(ref.select(ready, running, tight, 10.1).order) == ids(order)
    assert len(p.select(ready, running, base, 10.2).order) == roomy - 12  # room again
    assert Default(step_ratio=float("inf")).step_cap(ctx(), 0) is None
    assert Default(roomy_ratio=float("inf")).step_cap(ctx(), 0) is None  # no cap while memory has room
    assert Default(roomy_ratio=2.0).roomy_ratio == 2.0  # below step_ratio: step_ratio applies
    for bad in (1.0, 0, float("nan"), True, "10"):
        with pytest.raises(ValueError, match="roomy_ratio"):
            Default(roomy_ratio=bad)


def test_step_cap_cuts_admission_and_counts_as_a_full_batch():
    """The step-time cap: past the largest batch whose step is at most step_ratio (3) times a
    one-generation step the order is cut (the rest waits), and the next point treats the batch as
    full for preemption (a waiting critical first segment takes a deferrable one's slot); it does
    not make continuations yield at statement boundaries.  (`steep_cap=False`: the cap protects
    every first segment — here all of them urgent, one slope.)"""
    p = Default(steep_cap=False, roomy_ratio=3.0)  # (3 x: the cap where memory is short)
    assert p.step_cap(ctx(), 5) == 10 and p.step_cap(ctx(), 1) == 8  # slow start: 2 x running, >= 8
    _feed(p._steps, a=0.022, b=0.004)
    cap = p.step_cap(ctx(), 0)
    assert cap == int((3 * 0.026 - 0.022) / 0.004 + 1e-9) == 14
    assert Default(step_ratio=float("inf")).step_cap(ctx(), 0) is None
    with pytest.raises(ValueError, match="step_ratio"):
        Default(step_ratio=1.0)
    running = [gen(f"r{i}", 9.0, URGENT, state=GenState.RUNNING) for i in range(12)]
    ready = [gen(f"q{i}", 10.0, URGENT) for i in range(5)]
    sel = p.select(ready, running, ctx(), 10.0)
    assert len(sel.order) == cap - len(running) == 2 and p._capped
    idle = gen("idle", 5.0, NORMAL, [seg(0, 9.0, 20.0)], state=GenState.RUNNING)  # due 29: deferrable
    sel = p.select(ready, running[:11] + [idle], ctx(), 10.02)
    assert ids(sel.preempt) == ["idle"]  # the cut counts as a full batch at the next point
    g = gen("g", 0.0, NORMAL, [seg(0, 10.0, 30.0)], state=GenState.RUNNING)
    # ...but at a statement boundary a continuation streams on: suspending it would trade a
    # re-add (prefill) per statement for a slot this policy itself withholds
    assert not p.suspend_at(g, g.segments[0], ctx(), 10.03)
    g.blocked = "batch full (12)"
    p.select([g], running, ctx(), 10.04)  # a refusal by the batch cap / KV memory does suspend it
    assert p.suspend_at(g, g.segments[0], ctx(), 10.05)


def test_step_cap_holds_per_engine_of_a_pool():
    """Behind an engine pool the step-time cap bounds each member's step, not the pool's: k
    usable members (`PolicyContext.engines`) run up to k times one engine's cap side by side
    (capped pool-wide, 8 engines ran one engine's batch and preempted continuations for it)."""
    p = Default(steep_cap=False, roomy_ratio=3.0)  # (every generation here is urgent: one slope)
    _feed(p._steps, a=0.022, b=0.004)
    assert p.step_cap(ctx(), 0) == 14
    running = [gen(f"r{i}", 9.0, URGENT, state=GenState.RUNNING) for i in range(12)]
    ready = [gen(f"q{i:02d}", 10.0, URGENT) for i in range(60)]
    assert len(p.select(ready, running, ctx(), 10.0).order) == 14 - 12
    pool = dataclasses.replace(ctx(), engines=4)
    sel = p.select(ready, running, pool, 10.0)
    assert len(sel.order) == 4 * 14 - 12 and p._capped


def test_step_cap_protects_only_steeper_first_segments_and_shrinks_the_batch_for_them():
    """Rule 10 with `steep_cap` (the default): the cap protects a first segment only when its TUF
    is steeper than the flattest live generation's — where every generation has one slope (an
    arm fleet, a chat flood without robots) nobody's utility falls faster than the work the cap
    would hold back, and throughput decides; when a steeper first segment runs or waits, the
    running batch shrinks to the cap at once: running continuations of the flattest slope beyond
    it are preempted (deferrable ones first), first segments and steeper work stay."""
    p = Default(roomy_ratio=3.0)
    assert p.steep_cap
    _feed(p._steps, a=0.022, b=0.004)
    cap = p.step_cap(ctx(), 0)
    assert cap == 14
    # one slope everywhere: normal first segments waiting, normal continuations running — no cap
    running = [gen(f"r{i:02d}", 0.0, NORMAL, [seg(0, 1.0, 9.0)], state=GenState.RUNNING) for i in range(20)]
    ready = [gen(f"q{i:02d}", 10.0, NORMAL) for i in range(10)]
    sel = p.select(ready, running, ctx(), 10.0)
    assert len(sel.order) == 10 and not sel.preempt and not p._capped
    # an urgent first segment waits: the batch shrinks to the cap, deferrable continuations first
    late = [gen(f"r{i:02d}", 0.0, NORMAL, [seg(0, 1.0, 9.0)], state=GenState.RUNNING) for i in range(14)]
    idle = [gen(f"s{i:02d}", 0.0, NORMAL, [seg(0, 1.0, 40.0)], state=GenState.RUNNING) for i in range(6)]  # due 40
    urgent = gen("u", 10.0, URGENT)
    sel = p.select([urgent], late + idle, ctx(), 10.0)
    assert len(late + idle) - len(sel.preempt) == cap - 1 and ids(sel.order) == ["u"]  # room for it, now
    assert ids(sel.preempt[:6]) == sorted(ids(idle))  # the deferrable ones first (most slack first: all equal)
    assert sel.preempt[6].gen_id.startswith("r")  # then the lowest-priority late continuation
    # the batch at the cap already: one continuation makes room for the urgent first segment
    sel = p.select([urgent], late, ctx(), 10.02)
    assert ids(sel.order) == ["u"] and len(sel.preempt) == 1
    # a steeper *continuation* protects nothing: no cap for it
    q = Default(roomy_ratio=3.0)
    _feed(q._steps, a=0.022, b=0.004)
    steep_cont = gen("uc", 0.0, URGENT, [seg(0, 1.0, 9.0)], state=GenState.RUNNING)
    sel = q.select(ready, running[:19] + [steep_cont], ctx(), 10.0)
    assert len(sel.order) == 10 and not sel.preempt
    with pytest.raises(ValueError, match="steep_cap"):
        Default(steep_cap=1)


def test_step_cap_is_lifted_while_only_continuations_are_left():
    """Rule 10 protects response times: once no first segment has run or waited for drain_after_s
    (5 s) the cap no longer cuts admissions (late continuations: throughput decides); a new
    request brings it back at the next point."""
    p = Default(roomy_ratio=3.0)
    _feed(p._steps, a=0.022, b=0.004)
    cap = p.step_cap(ctx(), 0)
    assert cap == 14
    running = [gen(f"r{i}", 9.0, URGENT, state=GenState.RUNNING) for i in range(12)]  # first segments
    conts = [gen(f"c{i:02d}", 0.0, NORMAL, [seg(0, 1.0, 2.0)]) for i in range(20)]  # robots idle since 2 s
    assert len(p.select(conts, running, ctx(), 10.0).order) == cap - 12  # a first segment runs: capped
    busy = [gen(f"b{i}", 0.0, NORMAL, [seg(0, 1.0, 2.0)], state=GenState.RUNNING) for i in range(12)]
    assert len(p.select(conts, busy, ctx(), 14.9).order) == cap - 12  # 4.9 s after the last first segment
    sel = p.select(conts, busy, ctx(), 15.0)  # 5 s: lifted
    assert len(sel.order) == 20 and not p._capped
    new = gen("new", 15.01, URGENT)
    assert len(p.select(conts + [new], busy, ctx(), 15.02).order) == cap - 12  # back at once
    assert p._capped
    assert Default(drain_after_s=float("inf")).drain_after_s == float("inf")
    for bad in (0, -1.0, float("nan"), True, "5"):
        with pytest.raises(ValueError, match="drain_after_s"):
            Default(drain_after_s=bad)


def test_memory_cut_counts_as_a_full_batch_only_with_memory_full():
    """memory_full=True: a ready generation held back by the KV budget (rule 6) makes the batch
    full at the next point, as a refusal by a batch cap does; by default (False) only the planner's
    refusals (and, for preemption only, the step-time cap) count: the memory cut alone suspends nobody."""
    c = PolicyContext(estimator=ExecTimeEstimator(ROBOTS), robots=ROBOTS,
                      stats=EngineStats(1000, 0, 16, 1, 45.0), seg_gen_s=0.1, token_s=TOKEN_S)
    for on in (True, False):
        p = Default(memory_full=on)
        running = [gen("r", 9.0, URGENT, state=GenState.RUNNING)]
        assert p.select([gen("a", 10.0, URGENT)], running, c, 10.0).order == []
        assert p._capped is on
        p.select([], running, ctx(), 10.02)
        assert p._full is on


def test_step_time_model_fits_the_engine_online():
    from timelyllm_ros.core.policies.step_time import StepTimeModel
    m = StepTimeModel()
    assert m.max_seqs(0.035, 0, 0.02) is None  # nothing seen: no batch limit
    for b in range(1, 41):
        for new in (0, 2):
            m.observe(0.02 + 0.0005 * b + 0.003 * new, b, new)
    a, slope, c = m.coefficients(0.02)
    assert a == pytest.approx(0.02, rel=0.02) and slope == pytest.approx(0.0005, rel=0.02)
    assert c == pytest.approx(0.003, rel=0.05)
    assert m.max_seqs(0.0351, 0, 0.02) == 30 and m.max_seqs(0.0381, 1, 0.02) == 30
    flat = StepTimeModel()
    for b in range(1, 41):
        flat.observe(0.03, b, 0)
    assert flat.max_seqs(0.035, 0, 0.03) is None  # the batch does not cost time: no limit
    m.observe(float("nan"), 3, 0)  # bad observations are ignored
    m.observe(0.01, 0, 0)
    assert m.max_seqs(0.0351, 0, 0.02) == 30


def _paced_setup(kv_modes=frozenset({"cache", "preserve"}), **kw):
    """A policy that has seen 1 ms per extra generation, 20 running continuations whose robots are
    busy for 2-4 s (deferrable) and an urgent request that just arrived (tello: 6 tokens predicted,
    so its budget is 0.2 s / 6 = 33 ms per step: 13 generations at 20 ms + 1 ms each)."""
    p = Default(**{"pace": True, **kw})  # pacing is opt-in (rule 9)
    for b in range(1, 41):
        p.on_step(0.02 + 0.001 * b, b)
    c = dataclasses.replace(ctx(), kv_modes=kv_modes)
    running = [gen(f"c{i:02d}", 9.0, NORMAL, [seg(0, 9.9, 2.0 + 0.1 * i)], state=GenState.RUNNING)
               for i in range(20)]
    return p, c, running, gen("u", 10.0, URGENT)


def test_pacing_pauses_deferrable_work_while_an_urgent_first_segment_is_generated():
    p, c, running, u = _paced_setup()
    sel = p.select([u], running, c, 10.0)
    assert ids(sel.order) == ["u"]
    # 20 running + u = 21 > 13: the 8 with the most slack (robots busy longest) are paused
    assert ids(sel.preempt) == [f"c{i:02d}" for i in range(19, 11, -1)]
    assert {p.kv_mode(g, None, c) for g in sel.preempt} == {"preserve"}  # KV kept in place
    assert p.kv_mode(running[0], None, c) == "preserve"  # rule 13 keeps any other suspension's too here
    assert Default(keep_kv=False).kv_mode(running[0], None, c) == "cache"  # without it: the prefix cache
    # the paused ones wait while the urgent one runs (the gate, rule 4) and come back after it
    for g in sel.preempt:
        g.state = GenState.SUSPENDED
    rest = [g for g in running if g.state is GenState.RUNNING]
    u.state, u.seg_tokens = GenState.RUNNING, 2  # 50 ms later, 2 of its 6 tokens: 37.5 ms per step left
    u.touch()  # (as the planner does when it counts tokens)
    again = p.select(sel.preempt, rest + [u], c, 10.05)
    assert again.order == [] and again.preempt == []
    u.segments.append(seg(0, 10.2, 1.0))
    u.touch()  # (a segment cut)
    u.state = GenState.SUSPENDED
    assert set(ids(p.select(sel.preempt + [u], rest, c, 10.2).order)) >= set(ids(sel.preempt))


def test_pacing_needs_preserve_memory_and_a_critical_first_segment():
    p, c, running, u = _paced_setup(kv_modes=frozenset({"cache"}))  # vLLM: a resume re-prefills
    assert p.select([u], running, c, 10.0).preempt == []
    p, c, running, u = _paced_setup(pace=False)
    assert p.select([u], running, c, 10.0).preempt == []
    p, c, running, u = _paced_setup()
    tight = dataclasses.replace(c, stats=EngineStats(1000, 200, 16, 20, 45.0))  # 20 % free < 25 %
    assert p.select([u], running, tight, 10.0).preempt == []
    assert p.select([], running, c, 10.0).preempt == []  # nothing urgent: no pause
    late = gen("late", 9.5, URGENT)  # past its deadline: a step budget cannot save it
    assert p.select([late], running, c, 10.0).preempt == []
    # step times the batch size does not explain (uncached prefills of a memory-starved engine):
    # the model's one-step-ahead error is large, so it is not trusted with a batch limit
    p, c, running, u = _paced_setup()
    for b in range(1, 41):
        p.on_step(0.02 + 0.001 * b + (0.3 if b % 3 == 0 else 0.0), b)
    assert p._steps.relative_error() > p.pace_max_error
    assert p.select([u], running, c, 10.0).preempt == []
    with pytest.raises(ValueError, match="pace_min_free"):
        Default(pace_min_free=2.0)
    with pytest.raises(ValueError, match="pace_max_error"):
        Default(pace_max_error=0)
    with pytest.raises(ValueError, match="pace_kv"):
        Default(pace_kv="swap")


def test_speculated_results_never_reach_a_robot_before_they_are_confirmed():
    """Value speculation (rule 8): the statement after a blocking one is generated under the
    predicted result and dispatched only once the robot's real result equals it; a wrong
    prediction throws that statement away and regenerates it (the simulator's script is
    generated again).  Same plans as without speculation, every request finished, and the
    robots wait less after blocking calls."""
    wl = "WID1"
    spec = run_simulation(wl, "default")
    plain = run_simulation(wl, "default", policy_params={"speculate": False})
    hits = sum(g.spec_hits for g in spec.generations)
    misses = sum(g.spec_misses for g in spec.generations)
    assert hits > 0 and misses > 0  # both paths ran (results are True with p = 0.8)
    assert {g.gen_id: [s.text for s in g.segments] for g in spec.generations} == \
        {g.gen_id: [s.text for s in g.segments] for g in plain.generations}
    assert all(g.state is GenState.FINISHED for g in spec.generations)
    waits = {}
    for name, r in (("spec", spec), ("plain", plain)):
        w = []
        for g in r.generations:
            for prev, nxt in zip(g.segments, g.segments[1:]):
                if prev.blocking:
                    # nothing generated under a guess is dispatched before the guess is confirmed
                    assert nxt.dispatched_at >= prev.exec_end
                    w.append(nxt.exec_start - prev.exec_end)
        waits[name] = sum(w) / len(w)
    assert waits["spec"] < waits["plain"]
    assert make_policy("fcfs").speculates(spec.generations[0], spec.generations[0].segments[0], ctx()) is False


def test_speculation_streams_past_a_blocking_statement_instead_of_a_re_add():
    """Rule 8 without a re-add (``stream_past``, the default): where the predicted result is the one
    the model goes on under untold (True, the simulated perception's majority) and rule 5 keeps
    the slot, the generation streams on past the blocking statement instead of being aborted
    and re-added with the result appended; what follows is held and checked the same way.  Same
    plans, every request finished, nothing generated under a guess dispatched before the robot
    confirmed it, and fewer re-adds than the same run with ``stream_past=false``."""
    wl = "WID1"
    past = run_simulation(wl, "default")
    readd = run_simulation(wl, "default", policy_params={"stream_past": False})
    assert {g.gen_id: [s.text for s in g.segments] for g in past.generations} == \
        {g.gen_id: [s.text for s in g.segments] for g in readd.generations}
    assert all(g.state is GenState.FINISHED for g in past.generations)
    for r in (past, readd):
        assert sum(g.spec_hits for g in r.generations) > 0 and sum(g.spec_misses for g in r.generations) > 0
        for g in r.generations:
            for prev, nxt in zip(g.segments, g.segments[1:]):
                if prev.blocking:
                    assert nxt.dispatched_at >= prev.exec_end
    resumes = {name: sum(g.resumes for g in r.generations) for name, r in (("past", past), ("readd", readd))}
    assert resumes["past"] < resumes["readd"]
    g = gen("r1", 0.0, segments=[seg(0, 0.1, 1.0, blocking=True)], state=GenState.RUNNING)
    assert Default().streams_past(g, g.segments[0], ctx(), 0.2) is True  # nothing waits for its slot
    assert Default(stream_past=False).streams_past(g, g.segments[0], ctx(), 0.2) is False
    assert Default(speculate=False).streams_past(g, g.segments[0], ctx(), 0.2) is False
    assert make_policy("timelyllm").streams_past(g, g.segments[0], ctx(), 0.2) is False
    with pytest.raises(ValueError, match="stream_past"):
        Default(stream_past="yes")


def test_a_heavy_load_makes_every_generation_critical_until_its_backlog_is_gone():
    """Rule 12's heavy load (`heavy_rho`): where the load factor — offered tokens/s over the
    engine's full-batch tokens/s (core/policies/offered_load.py; read once the batch has reached
    its limit) — is at least `heavy_rho`, every
    generation is critical (the lead is infinite: no deferral) and rule 12 applies at any backlog;
    it lasts while the late backlog of the last point is not gone and ρ is at least 1.  Off with
    `heavy_rho=inf` or without `plan_order`."""
    c = ctx()

    def loaded(rho_arrivals, saturated=True, **kw):
        p = Default(**kw)
        p.on_step(0.08, 8)  # a full batch of 8, decode only: 100 tokens/s
        if saturated:
            p._load.saturate()
        for i in range(rho_arrivals):  # 50 replies of 20 tokens each over 5 s: ~2 x the capacity
            p._load.arrive("tello", 5.0 + 0.1 * i, 20.0)
        return p

    urgent = gen("u", 10.0, URGENT)  # a critical first segment waits
    cont = gen("c", 5.0, NORMAL, [seg(0, 9.0, 5.0)], state=GenState.SUSPENDED)  # due 14.0: deferrable
    calm = loaded(10)
    sel = calm.select([cont, urgent], [], c, 10.0)
    assert not calm._heavy and ids(sel.order) == ["u"]  # rule 4: the deferrable one waits
    assert calm.lead(c) == pytest.approx(0.08)
    heavy = loaded(50)
    assert heavy._load.full_tps == pytest.approx(100.0) and heavy._load.rho(10.0) >= 1.6
    sel = heavy.select([cont, urgent], [], c, 10.0)
    assert heavy._heavy and heavy.lead(c) == math.inf
    assert set(ids(sel.order)) == {"u", "c"}  # every generation critical: nothing deferred
    # it lasts while the backlog of the last point lasts and the load factor is at least 1
    heavy._queue_s = 3.0
    assert 1.0 <= heavy._load.rho(12.0) < 1.6 and heavy.heavy_load(c, 12.0)  # under heavy_rho, over 1
    assert not heavy.heavy_load(c, 300.0)  # five minutes later the arrivals have faded
    heavy._queue_s = 0.0
    assert not heavy.heavy_load(c, 12.0)  # the backlog is gone
    assert heavy.heavy_load(c, 10.0)  # ... and back at once over heavy_rho
    assert not loaded(50, saturated=False).heavy_load(c, 10.0)  # the batch never filled: no heavy load
    assert heavy.plan_applies(10.0) is False  # no backlog: rule 12 idle even under a heavy load
    for kw in ({"heavy_rho": math.inf}, {"plan_order": False}):
        p = loaded(50, **kw)
        p.select([cont, urgent], [], c, 10.0)
        assert not p._heavy, kw
    assert not loaded(50, heavy_rho=3.0).heavy_load(c, 10.0)
    assert Default().params()["heavy_rho"] == 1.6 and Default().params()["rho_tau_s"] == 60.0
    for bad in (0, -1.0, math.nan, "2", True, None):
        with pytest.raises(ValueError, match="heavy_rho"):
            Default(heavy_rho=bad)
    with pytest.raises(ValueError, match="rho_tau_s"):
        Default(rho_tau_s=0.0)


def test_a_saturation_on_an_engine_whose_adds_are_dear_serves_without_churn():
    """Rule 14: where the effective load factor — offered tokens/s over the tokens/s of every
    full-batch step, prefills and re-adds included — is at least `sat_rho` (1.0; it lasts down
    to `sat_rho_off`, 0.7), on an engine whose added request costs at least `sat_add_price`
    (0.5) of a one-generation step (the step-time model's c against a + b, priced once after
    `sat_min_steps` steps, where a re-add is dear), nothing churns: no preemption, no yield, no
    shrink, every generation critical, and every blocking statement is streamed past whatever
    its predicted result.  Not on an engine whose adds are cheap, not below the load."""
    c = ctx()

    def loaded(c_add, arrivals=50, **kw):
        p = Default(sat_min_steps=4, **kw)
        _feed(p._steps, a=0.005, b=0.0007, c=c_add, d=0.0001)  # re-add: 8 tokens x 0.1 ms > 0.08 x 5.7 ms
        p._load.step(0.08, 8, False)  # a full batch of 8 that also took work in: 100 tokens/s effective
        p._load.saturate()
        for i in range(arrivals):  # 50 replies of 20 tokens each over 5 s: ~2 x that capacity
            p._load.arrive("tello", 5.0 + 0.1 * i, 20.0)
        return p

    def full_point(p):
        urgent = gen("u", 10.0, URGENT)
        urgent.blocked = "batch full (2)"
        idle = gen("idle", 5.0, NORMAL, [seg(0, 9.0, 20.0)], state=GenState.RUNNING)  # due 29: deferrable
        busy = gen("busy", 9.9, URGENT, state=GenState.RUNNING)
        return p.select([urgent], [busy, idle], c, 10.0)

    dear = loaded(c_add=0.006)  # an add costs about a one-generation step (6 ms against 5.7 ms; the fit reads 0.65)
    assert dear._load.rho(10.0) == 0.0 and dear._load.rho(10.0, effective=True) >= 1.0  # (no heavy load)
    assert dear.readd_dear(c, kept=False)
    sel = full_point(dear)
    assert dear._saturated and dear._adds_dear is True and dear.lead(c) == math.inf
    assert sel.preempt == []  # rule 7 would take "idle" (the next test's setting)
    assert dear.streams_unpredicted(c)
    g = gen("g", 0.0, NORMAL, [seg(0, 10.0, 5.0)], state=GenState.RUNNING)
    assert dear.suspend_at(g, g.segments[0], c, 10.0) is False  # a full batch, g not due: no yield
    assert dear.streams_past(g, g.segments[0], c, 10.0) is True
    cheap = loaded(c_add=0.001)  # 1 ms: under half a step (the fit: 0.05)
    sel = full_point(cheap)
    assert not cheap._saturated and cheap._adds_dear is False and ids(sel.preempt) == ["idle"]
    assert not cheap.streams_unpredicted(c)
    light = loaded(c_add=0.006, arrivals=10)
    assert ids(full_point(light).preempt) == ["idle"] and not light._saturated and light._adds_dear is None
    # it lasts down to sat_rho_off, and the engine's price stays as first read
    assert 0.7 <= dear._load.rho(17.0, effective=True) < 1.0 and dear._load.rho(20.0, effective=True) < 0.7
    assert dear.saturation(c, 17.0)  # on at the last point, still at least 0.7
    dear._saturated = dear.saturation(c, 20.0)
    assert not dear._saturated and not dear.saturation(c, 17.0)  # off: back only from 1.0
    assert dear._adds_dear is True
    assert not loaded(c_add=0.006, sat_rho=math.inf).saturation(c, 10.0)
    assert Default().params()["sat_rho"] == 1.0 and Default().params()["sat_add_price"] == 0.5
    assert make_policy("timelyllm").streams_unpredicted(c) is False
    for k, bad in (("sat_rho", 0), ("sat_rho", math.nan), ("sat_rho_off", -1.0), ("sat_add_price", "1"),
                   ("sat_min_steps", 2), ("sat_min_steps", 10.0), ("sat_rho_off", 2.0)):
        with pytest.raises(ValueError, match=k):
            Default(**{k: bad})


def test_a_deep_load_ranks_steep_first_statements_before_every_reply_where_re_adds_are_cheap():
    """Rule 12's deep load (`steep_first_rho`, 3.5): under the heavy load, where the load factor is
    at least `steep_first_rho` and a re-add is cheap (`readd_dear` false), a first statement
    steeper than the flattest live slope ranks before every whole-reply rank (its weight x 1e6,
    so it also preempts); flatter first statements and continuations keep their reply rank.  Not
    below the threshold, not where a re-add is dear, never with `steep_first_rho=inf`."""
    c = ctx()

    def loaded(n, **kw):
        p = Default(**kw)
        p.on_step(0.08, 8)  # a full batch of 8, decode only: 100 tokens/s
        p._load.saturate()
        for i in range(n):  # n replies of 20 tokens over 5 s
            p._load.arrive("tello", 5.0 + 0.1 * i, 20.0)
        return p

    def pri(p):
        gs = [gen("u", 10.0, URGENT), gen("n", 1.0, NORMAL),  # (n is late: a backlog, so rule 12 applies)
              gen("c", 5.0, NORMAL, [seg(0, 9.0, 5.0)], state=GenState.SUSPENDED)]
        p.select(gs, [], c, 10.0)
        return {g.gen_id: g.priority for g in gs}, p

    deep, p = pri(loaded(150))  # rho ~6
    assert p._heavy and p._plan and p._steep_first and p._load.rho(10.0) >= 3.5
    plain, q = pri(loaded(150, steep_first_rho=math.inf))
    assert q._heavy and not q._steep_first
    assert deep["u"] == pytest.approx(plain["u"] * 1e6)  # the urgent first statement first
    assert deep["n"] == plain["n"] and deep["c"] == plain["c"]  # the flattest, and a continuation: as they were
    assert deep["u"] > max(deep["n"], deep["c"]) and plain["u"] < 1e4
    _, r = pri(loaded(50))  # rho ~2: heavy, not deep
    assert r._heavy and not r._steep_first
    dear = loaded(150)
    dear.readd_dear = lambda ctx, **kw: True  # (an engine whose re-add re-prefills dearly: the edge board)
    _, d = pri(dear)
    assert d._heavy and not d._steep_first
    assert Default().params()["steep_first_rho"] == 3.5
    for bad in (0, -1.0, math.nan, "2", True, None):
        with pytest.raises(ValueError, match="steep_first_rho"):
            Default(steep_first_rho=bad)


def test_the_load_factor_counts_each_accepted_request_and_learns_ended_replies():
    """The planner tells the policy of every accepted request (`on_arrival`) and of every reply
    the engine ended (`on_reply_end`); the default's load factor counts the first and learns the
    robot type's reply length from the second."""
    from tests.test_planner import make, req, run_until

    planner, disp, clock = make("default")
    p = planner.policy
    assert planner.submit(req("a", "mf(50);tc(90);")).accepted
    assert planner.submit(req("b", "tp;", t=0.0, robot="d2")).accepted
    assert not planner.submit(req("a", "tp;")).accepted  # a duplicate: not an arrival
    assert p._load.arrivals["tello"].count == pytest.approx(2.0) and p._load.knows("tello")
    run_until(planner, lambda: all(g.engine_finished for g in planner.generations.values()))
    lens = [len(planner.generations[r].output_ids) for r in ("a", "b")]
    assert min(lens) > 0 and lens[0] != lens[1]
    # the first reply that ended, then a running mean with weight 0.1 (either may end first)
    assert p._load.reply_len["tello"] in (pytest.approx(0.9 * lens[0] + 0.1 * lens[1]),
                                          pytest.approx(0.9 * lens[1] + 0.1 * lens[0]))

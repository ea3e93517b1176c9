"""Policy formulas against hand-computed values and decisions on small constructed queues."""

import pytest

from timelyllm_ros.core.exec_time import ExecTimeEstimator
from timelyllm_ros.core.policies import DispatchMode, PolicyContext, make_policy, policy_names
from timelyllm_ros.core.robots import load_robots
from timelyllm_ros.core.tuf import NORMAL, URGENT
from timelyllm_ros.core.types import Generation, GenState, PlanRequest, Segment
from timelyllm_ros.engines.base import EngineStats

ROBOTS = load_robots()


def ctx(G=0.1):
    return PolicyContext(estimator=ExecTimeEstimator(ROBOTS), robots=ROBOTS,
                         stats=EngineStats(1000, 1000, 16, 0, 45.0), seg_gen_s=G, token_s=0.022)


def gen(rid, arrival, tuf=NORMAL, segments=()):
    g = Generation(request=PlanRequest(rid, "d1", "tello", "t", "s", tuf, arrival))
    g.segments.extend(segments)
    g.ready_since = arrival
    return g


def seg(index, gen_end, est, exec_start=None, exec_end=None):
    return Segment(index=index, text="mf(50);", calls=(), blocking=False, token_count=5,
                   gen_start=gen_end - 0.1, gen_end=gen_end, est_exec_s=est, dispatched_at=gen_end,
                   exec_start=exec_start, exec_end=exec_end)


def test_eq4_initial_segment_hand_computed():
    p = make_policy("timelyllm")
    g = gen("a", arrival=10.0, tuf=NORMAL)
    # t = 10.2, G = 0.1: W = 0.3 -> TUF0 = 1; L = (10 + 1) - 10.3 = 0.7; Pri = 1 / (0.1 * 0.7)
    assert p.priority(g, ctx(), 10.2) == pytest.approx(1 / (0.1 * 0.7))
    # overdue: t = 11.1, W = 1.2 -> TUF0 = 1 - 2*0.2 = 0.6; slack floored at G = 0.1
    paper = make_policy("timelyllm", rescue_late=False)
    assert paper.priority(g, ctx(), 11.1) == pytest.approx(0.6 / (0.1 * 0.1))
    # rescue_late (default): numerator = beta + utility already lost = 1 + 0.4
    assert p.priority(g, ctx(), 11.1) == pytest.approx(1.4 / (0.1 * 0.1))
    # the inlined select() computes the same numbers as priority()
    p.select([g], [], ctx(), 11.1)
    assert g.priority == pytest.approx(1.4 / (0.1 * 0.1))


def test_late_generations_are_rescued_not_starved():
    """Eq. 4 ranks a hopelessly late urgent request below a fresh normal one (its utility is
    negative); rescue_late serves it first, weighted by how fast it is still losing utility."""
    late_urgent = gen("lu", arrival=0.0, tuf=URGENT)  # at t = 1.0: W = 1.1 -> TUF0 = 2 - 6.67*0.9 < 0
    fresh_normal = gen("fn", arrival=0.95, tuf=NORMAL)
    order = make_policy("timelyllm", rescue_late=False).select([late_urgent, fresh_normal], [], ctx(), 1.0).order
    assert [g.gen_id for g in order] == ["fn", "lu"]
    order = make_policy("timelyllm").select([late_urgent, fresh_normal], [], ctx(), 1.0).order
    assert [g.gen_id for g in order] == ["lu", "fn"]


def test_eq4_suspended_segment_uses_tuf1_and_exec_estimate():
    p = make_policy("timelyllm")
    # previous segment generated at 5.0, estimated to run 3 s -> due at 8.0
    g = gen("b", arrival=4.0, tuf=URGENT, segments=[seg(0, 5.0, 3.0)])
    # t = 6.0: W = 6.1 - 8 < 0 -> TUF1 = beta = 2; L = 8 - 6.1 = 1.9
    assert p.priority(g, ctx(), 6.0) == pytest.approx(2 / (0.1 * 1.9))
    # t = 8.05: W = 0.15 -> TUF1 = 2 - 6.67*0.15; L floored at G
    paper = make_policy("timelyllm", rescue_late=False)
    assert paper.priority(g, ctx(), 8.05) == pytest.approx((2 - 6.67 * 0.15) / (0.1 * 0.1))
    assert p.priority(g, ctx(), 8.05) == pytest.approx((2 + 6.67 * 0.15) / (0.1 * 0.1))
    # a measured start replaces the generation-end guess: started at 6.0 -> due at 9.0
    g.segments[0].exec_start = 6.0
    assert p.priority(g, ctx(), 6.0) == pytest.approx(2 / (0.1 * 2.9))


def test_timelyllm_prefers_urgent_then_tight_suspended_over_fresh_normal():
    p = make_policy("timelyllm")
    normal = gen("n", arrival=0.0, tuf=NORMAL)
    urgent = gen("u", arrival=0.05, tuf=URGENT)
    relaxed = gen("r", arrival=-5.0, tuf=NORMAL, segments=[seg(0, -0.5, 10.0)])  # robot busy ~9.5 s
    sel = p.select([normal, relaxed, urgent], [], ctx(), 0.1)
    assert [g.gen_id for g in sel.order] == ["u", "n", "r"]


def test_fcfs_and_edf_orders():
    a = gen("a", arrival=1.0, tuf=NORMAL)
    b = gen("b", arrival=2.0, tuf=URGENT)
    c = gen("c", arrival=0.5, tuf=NORMAL, segments=[seg(0, 1.0, 1.0)])  # suspended keeps initial prio
    fcfs = make_policy("fcfs").select([a, b, c], [], ctx(), 3.0)
    assert [g.gen_id for g in fcfs.order] == ["c", "a", "b"]
    edf = make_policy("edf").select([a, b, c], [], ctx(), 3.0)  # deadlines 2.0, 2.2, 1.5
    assert [g.gen_id for g in edf.order] == ["c", "a", "b"]
    b2 = gen("b2", arrival=1.2, tuf=URGENT)  # deadline 1.4 beats c's 1.5
    assert make_policy("edf").select([a, b2, c], [], ctx(), 3.0).order[0].gen_id == "b2"


def test_modes_and_registry():
    assert make_policy("vllm").mode is DispatchMode.WHOLE
    assert make_policy("vllm-stream").mode is DispatchMode.STREAM
    assert make_policy("timelyllm").mode is DispatchMode.SUSPEND
    assert {"timelyllm", "fcfs", "edf", "vllm", "vllm-stream"} <= set(policy_names())
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("nope")
    with pytest.raises(ValueError, match="bad parameters"):
        make_policy("fcfs", c=0.3)


def test_every_policy_name_has_a_factory():
    """The explicit factory covers every `PolicyName`: each builds with its defaults (LAMPS's with
    a cost model) and names the engine scheduling it needs."""
    from timelyllm_ros.core.kv_handling import KVCostModel
    from timelyllm_ros.core.policies import PolicyName, engine_scheduling, policy_class

    cost = KVCostModel(prefill_s_per_token=1e-4)
    for kind in PolicyName:
        kw = {"cost": cost} if kind.value in ("lamps", "infercept", "timelyllm-lamps", "hybrid") else {}
        p = make_policy(kind.value, **kw)
        assert isinstance(p, policy_class(kind))
        assert engine_scheduling(kind.value) == ("priority" if kind is PolicyName.VLLM_PRIORITY else "fcfs")
    assert make_policy("fcfs-swap").name == "fcfs-swap" and make_policy("infercept", cost=cost).name == "infercept"


def test_prev_exec_end_chains_queued_segments():
    g = gen("q", arrival=0.0, segments=[seg(0, 1.0, 2.0), seg(1, 1.5, 4.0)])
    # segment 1 cannot start before segment 0 ends at 3.0 -> ends at 7.0
    assert g.prev_exec_end_estimate() == pytest.approx(7.0)
    g.segments[0].exec_end = 2.5
    assert g.prev_exec_end_estimate() == pytest.approx(6.5)
    assert GenState.FINISHED.terminal and not GenState.WAITING.terminal


def test_each_policy_declares_the_optional_hooks_it_implements():
    """The planner calls on_token / on_step / suspend_at only where the policy class declares them
    (`Policy.observes_tokens` / `observes_steps` / `chooses_suspension`): each flag says exactly
    whether the class overrides the hook."""
    from timelyllm_ros.core.policies import Policy, make_policy, policy_names

    for name in policy_names():
        cls = type(make_policy(name))
        assert cls.observes_tokens == (cls.on_token is not Policy.on_token), name
        assert cls.observes_steps == (cls.on_step is not Policy.on_step), name
        assert cls.chooses_suspension == (cls.suspend_at is not Policy.suspend_at), name

"""The scheduling core's fast paths must give exactly what the plain code gives.

priority_order vs sorting by the (-priority, ready_since, arrival, gen_id) tuple; TimelyLLM's
vectorised Eq. 4 vs the formula written out; the simulated engine's resume validation (only what
follows the validated prompt is re-checked, but bad ids there are still refused); each policy's
`select` vs its reference written out plainly (tests/policy_oracles.py).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timelyllm_ros.core.clock import VirtualClock
from timelyllm_ros.core.policies.base import PolicyContext, priority_order
from timelyllm_ros.core.policies.timelyllm import TimelyLLM
from timelyllm_ros.core.tuf import NORMAL, TUF, URGENT
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
    from timelyllm_ros.core.policies.default_small import _order  # (the default's plain path: its small sort)
    gens = [_gen(i, priority=p, ready_since=rs, arrival=a) for i, (p, rs, a) in enumerate(items)]
    assert [g.gen_id for g in priority_order(gens)] == [g.gen_id for g in _plain(gens)]
    assert [g.gen_id for g in _order(gens)] == [g.gen_id for g in _plain(gens)]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_PRI, st.sampled_from([0.0, 1.0, 2.0])), max_size=25))
def test_priority_order_with_another_tie_key(items):
    gens = [_gen(i, priority=p, arrival=a) for i, (p, a) in enumerate(items)]
    key = lambda g: (g.request.arrival, g.gen_id)  # noqa: E731 - Hybrid's order
    plain = sorted(gens, key=lambda g: (-g.priority,) + key(g))
    assert [g.gen_id for g in priority_order(gens, key)] == [g.gen_id for g in plain]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.0, -0.0, 1, 1.0, 2.5, -3.0, math.inf, -math.inf])
                          | st.floats(-100.0, 100.0),
                          st.sampled_from([0.0, 1.0, 2.0]), st.sampled_from([0.0, 1.0]), st.integers(0, 400)),
                max_size=200, unique_by=lambda t: t[3]),
       st.booleans(), st.randoms(use_true_random=False))
def test_priority_order_long_tie_runs(items, fcfs_like, rnd):
    """Long runs of equal priorities (FCFS-like priorities, -arrival, tie over a whole arrival
    event) or a few ties among distinct priorities, in any input order, ids not in numeric order:
    the multi-pass sort = the tuple sort; vllm-priority's key likewise."""
    from timelyllm_ros.core.policies.basic import _vllm_tie
    gens = [_gen(i, priority=-a if fcfs_like else p, ready_since=rs, arrival=a) for p, rs, a, i in items]
    rnd.shuffle(gens)
    assert [g.gen_id for g in priority_order(gens)] == [g.gen_id for g in _plain(gens)]
    plain = sorted(gens, key=lambda g: (-g.priority, g.request.arrival, g.request.request_id))
    assert [g.gen_id for g in priority_order(gens, _vllm_tie)] == [g.gen_id for g in plain]


@pytest.mark.parametrize("seed", range(20))
def test_priority_order_few_ties_among_many(seed):
    """A few runs of ties among mostly distinct priorities (the path that re-sorts each run of
    ties alone, by the C-level tie tuple): the tuple sort's order."""
    import random

    from timelyllm_ros.core.policies.basic import _vllm_tie
    rnd = random.Random(seed)
    n = rnd.randrange(20, 300)
    pri = [rnd.uniform(-50.0, 50.0) for _ in range(n)]
    for _ in range(rnd.randrange(1, max(2, n // 10))):  # fewer than a quarter of the pairs tie
        pri[rnd.randrange(n)] = pri[rnd.randrange(n)]
    gens = [_gen(i, priority=p, ready_since=rnd.choice([0.0, 1.0]), arrival=rnd.choice([0.0, 1.0, 2.0]))
            for i, p in enumerate(pri)]
    rnd.shuffle(gens)
    assert [g.gen_id for g in priority_order(gens)] == [g.gen_id for g in _plain(gens)]
    plain = sorted(gens, key=lambda g: (-g.priority, g.request.arrival, g.request.request_id))
    assert [g.gen_id for g in priority_order(gens, _vllm_tie)] == [g.gen_id for g in plain]


def test_priority_order_keeps_input_order_of_full_ties():
    """Generations equal in every key (a duplicated id) keep their input order, as the stable
    tuple sort keeps them."""
    a, b, c = _gen(1, priority=1.0), _gen(1, priority=1.0), _gen(0, priority=1.0)
    assert [id(g) for g in priority_order([a, b, c])] == [id(g) for g in _plain([a, b, c])] == [id(c), id(a), id(b)]
    assert [id(g) for g in priority_order([b, a, c])] == [id(c), id(b), id(a)]


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


# --- the seed papers' policies: fast select() vs the plain code kept as oracle -------------------
# A scenario: ready + running generations of mixed robot types (shared prompt prefixes, output,
# dispatched / executed / blocking segments, KV handlings, ties in arrival and ready time), then a
# few scheduling points with mutations in between (tokens generated, a preemption's KV handling,
# generations moving between ready and running, iteration gaps).  Both policies get their own
# copies and must give the same order, preemptions, priorities and counters at every point.
import copy  # noqa: E402
import dataclasses  # noqa: E402

from timelyllm_ros.core.exec_time import ExecTimeEstimator  # noqa: E402
from timelyllm_ros.core.robots import load_robots  # noqa: E402
from timelyllm_ros.core.types import GenState  # noqa: E402
from timelyllm_ros.engines.base import EngineStats  # noqa: E402
from policy_oracles import andes_select_reference, hybrid_select_reference, lamps_ref_wait, lamps_select_reference  # noqa: E402

ROBOTS = load_robots()
_TYPES = ("tello", "arm", "chat", "tello")
_SEG = st.tuples(st.integers(0, 12), st.booleans(), st.sampled_from([0.0, 0.5, 2.0, 7.5]),
                 st.sampled_from([None, 0.5, 3.0]), st.sampled_from([None, 1.0, 9.0]))
_GEN = st.tuples(st.integers(0, 3), st.integers(0, 40), st.integers(0, 30), st.lists(_SEG, max_size=3),
                 st.sampled_from([0.0, 1.0, 2.0]), st.sampled_from([0.0, 0.5, 1.0]),
                 st.sampled_from([None, "preserve", "discard", "swap"]), st.booleans())
_STEP = st.tuples(st.sampled_from([1, 1, 2]), st.floats(0, 12), st.sampled_from([0.0, 0.01, 0.02, 0.05]),
                  st.lists(st.tuples(st.integers(0, 20), st.integers(-3, 4),
                                     st.sampled_from([None, "preserve", "discard", "swap"]),
                                     st.booleans()), max_size=4),
                  st.integers(0, 80))


def _scenario(specs, urgent_every: int = 0):
    """Generations from `specs`; with `urgent_every`, every such one (the first included) has the
    urgent TUF (a steeper slope), the others the normal one."""
    gens = []
    for i, (t, own, out, segs, arrival, rs, kv, run) in enumerate(specs):
        rt = _TYPES[t]
        tuf = URGENT if urgent_every and i % urgent_every == 0 else NORMAL
        req = PlanRequest(request_id=f"g{i:02d}", robot_id="x", robot_type=rt, task="t", scene="", tuf=tuf,
                          arrival=arrival, reference_plan="mf(50); tl(90);" * (1 + i % 3))
        g = Generation(request=req, ready_since=rs)
        g.prompt_ids = [7] * (16 * (t + 1)) + [100 + i] * own
        g.output_ids = [3] * out
        for j, (tok, blocking, est, start, end) in enumerate(segs):
            g.segments.append(Segment(index=j, text="mf(50);", calls=(), blocking=blocking, token_count=tok,
                                      gen_start=0.0, gen_end=0.5 * j, est_exec_s=est, dispatched_at=0.5 * j,
                                      exec_start=start, exec_end=end))
        if kv is not None:
            g.policy.lamps.kv = kv
        g.state = GenState.RUNNING if run else (GenState.SUSPENDED if g.segments else GenState.QUEUED)
        gens.append(g)
    return gens


def _copy(gens):
    return [dataclasses.replace(g, prompt_ids=list(g.prompt_ids), output_ids=list(g.output_ids),
                                segments=[dataclasses.replace(s) for s in g.segments], policy=copy.deepcopy(g.policy))
            for g in gens]


def _ctx(gens, it, token_s, free, kv_modes=frozenset({"cache"}), engines=1):
    running = [g for g in gens if g.state is GenState.RUNNING]
    return PolicyContext(estimator=ExecTimeEstimator(ROBOTS), robots=ROBOTS,
                         stats=EngineStats(400, free, 16, len(running), 45.0), seg_gen_s=0.1,
                         token_s=token_s, running=running, iteration=it, kv_modes=kv_modes, engines=engines)


def _run(policy, gens, steps, blocked, kv_via_policy=False, kv_modes=frozenset({"cache"}), engines=1):
    """Scheduling points of `policy` over `gens`; returns what each point decided."""
    seen = []
    it = 0
    for k, (gap, now, token_s, muts, free) in enumerate(steps):
        it += gap
        for idx, n_new, kv, flip in muts:
            if not gens:
                break
            g = gens[idx % len(gens)]
            if n_new >= 0:
                g.output_ids.extend([4] * n_new)
            else:  # a suspension drops tokens past the statement end
                del g.output_ids[n_new:]
            g.touch()  # (as the planner marks every change of the token record)
            if kv is not None:  # a KV handling picked for it (as at a preemption)
                if kv_via_policy:
                    policy.kv_mode(g, None, _ctx(gens, it, token_s, free))
                else:
                    g.policy.lamps.kv = kv
            if flip:
                g.state = (GenState.RUNNING if g.state is not GenState.RUNNING
                           else GenState.SUSPENDED if g.segments else GenState.QUEUED)
                g.ready_since = float(k)
        ready = [g for g in gens if g.state is not GenState.RUNNING]
        running = [g for g in gens if g.state is GenState.RUNNING]
        if blocked and ready:
            ready[0].blocked = "batch full"
        sel = policy.select(ready, running, _ctx(gens, it, token_s, free, kv_modes, engines), now)
        seen.append(([g.gen_id for g in sel.order], [g.gen_id for g in sel.preempt],
                     [repr(g.priority) for g in gens],
                     sorted((g.gen_id, g.policy.lamps.starving) for g in gens)))
    return seen


_SCEN = dict(specs=st.lists(_GEN, max_size=12), steps=st.lists(_STEP, min_size=1, max_size=4))


@settings(max_examples=300, deadline=None)
@given(**_SCEN, threshold=st.integers(1, 3), allowed=st.sampled_from(
    [("preserve", "discard", "swap"), ("discard",), ("preserve", "swap"), ("swap", "discard")]),
       jit=st.booleans(), admission=st.booleans(), interval=st.sampled_from([1, 1, 3]), small=st.booleans())
def test_lamps_fast_select_matches_reference(specs, steps, threshold, allowed, jit, admission, interval, small):
    """`interval`: LAMPS's score_interval (a score kept for that many iterations); `small`: the
    few-generations path (`LAMPS._select_small`) or the numpy one."""
    from timelyllm_ros.core.kv_handling import KVCostModel
    from timelyllm_ros.core.policies.lamps import LAMPS

    class Reference(LAMPS):
        def select(self, ready, running, ctx, now):
            return lamps_select_reference(self, ready, running, ctx, now)

    cost = KVCostModel(prefill_s_per_token=1e-4, prefill_base_s=0.01, swap_s_per_block=3e-4, block_size=16)
    kw = dict(cost=cost, starvation_threshold=threshold, allowed=allowed, jit_resume=jit,
              memory_admission=admission, score_interval=interval)
    fast, ref = LAMPS(**kw), Reference(**kw)
    if not small:
        fast.small_n = 0
    gens = _scenario(specs)
    a, b = _copy(gens), _copy(gens)
    assert _run(fast, a, steps, False, True) == _run(ref, b, steps, False, True)
    assert [fast.wait_count(g) for g in a] == [lamps_ref_wait(ref, g) for g in b]


def _trail_reference(p, ready, running):
    """Trail's select as first written: one tuple sort by `rank`, victims paired in rank order."""
    from timelyllm_ros.core.policies.base import Selection
    full = False
    for g in ready:
        if g.blocked is not None:
            g.blocked = None
            full = True
    keyed = sorted(((p.rank(g), g) for g in ready), key=lambda kg: kg[0])
    preempt = []
    if full and keyed:
        victims = sorted(((p.rank(g), g) for g in running if not p.pinned(g)), key=lambda kg: kg[0], reverse=True)
        for (rk, _), (vk, v) in zip(keyed, victims):
            if rk[:2] < vk[:2]:
                preempt.append(v)
            else:
                break
    return Selection(order=[g for _, g in keyed], preempt=preempt)


@settings(max_examples=200, deadline=None)
@given(**_SCEN, predictor=st.sampled_from(["oracle", "noisy", "learned"]), c=st.sampled_from([0.3, 0.8, 1.0, math.inf]),
       blocked=st.booleans())
def test_trail_fast_select_matches_reference(specs, steps, predictor, c, blocked):
    from timelyllm_ros.core.policies.trail import Trail

    class Reference(Trail):
        def select(self, ready, running, ctx, now):
            return _trail_reference(self, ready, running)

    gens = _scenario(specs)
    a, b = _copy(gens), _copy(gens)
    fast, ref = Trail(c=c, predictor=predictor), Reference(c=c, predictor=predictor)
    assert _run(fast, a, steps, blocked) == _run(ref, b, steps, blocked)


def test_trail_fast_select_sees_predictor_state_kept_across_a_suspension():
    """Found by the property above: ranked at age 0 while ready, ranked again as a victim at age 3,
    cut back to age 0 by a suspension: the learned predictor keeps what it saw of the dropped
    tokens, so the cached rank of age 0 is stale (it was -48.1173 vs -48.0009)."""
    from timelyllm_ros.core.policies.trail import Trail

    class Reference(Trail):
        def select(self, ready, running, ctx, now):
            return _trail_reference(self, ready, running)

    specs = [(0, 0, 0, [], 0.0, 0.0, None, False), (0, 1, 10, [], 0.0, 0.0, None, True),
             (1, 2, 3, [], 0.0, 0.0, None, False)]
    steps = [(1, 0.0, 0.02, [], 100), (1, 0.0, 0.02, [(0, 0, None, True)], 100),
             (1, 0.0, 0.02, [(0, 3, None, False)], 100), (1, 0.0, 0.02, [(0, -3, None, True)], 100)]
    gens = _scenario(specs)
    a, b = _copy(gens), _copy(gens)
    got = _run(Trail(c=0.3, predictor="learned"), a, steps, True)
    want = _run(Reference(c=0.3, predictor="learned"), b, steps, True)
    assert got == want
    assert got[0][2][0] != got[-1][2][0]  # the rank did change: the case is exercised


@settings(max_examples=200, deadline=None)
@given(**_SCEN, pd_rule=st.booleans())
def test_hybrid_fast_select_matches_reference(specs, steps, pd_rule):
    from timelyllm_ros.core.policies.hybrid import Hybrid

    class Reference(Hybrid):
        def select(self, ready, running, ctx, now):
            return hybrid_select_reference(self, ready, running, ctx, now)

    gens = _scenario(specs)
    a, b = _copy(gens), _copy(gens)
    fast, ref = Hybrid(pd_rule=pd_rule, profile=None), Reference(pd_rule=pd_rule, profile=None)
    assert _run(fast, a, steps, False) == _run(ref, b, steps, False)
    assert (fast.held, fast.decode_since_prefill) == (ref.held, ref.decode_since_prefill)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_PRI, st.sampled_from([0.0, 1.0, 2.0, math.inf]), st.sampled_from([0.0, 1.0, -math.inf])),
                max_size=25))
def test_longest_first_and_ascending_perm_equal_tuple_sorts(items):
    import numpy as np

    from timelyllm_ros.core.policies.base import ascending_perm
    from policy_oracles import longest_first
    gens = [_gen(i, priority=p, ready_since=rs, arrival=a) for i, (p, rs, a) in enumerate(items)]
    plain = sorted(gens, key=lambda g: (-g.priority, g.request.arrival, g.gen_id))
    assert [g.gen_id for g in longest_first(gens)] == [g.gen_id for g in plain]
    keys = np.array([-g.priority for g in gens], dtype=float)
    if np.isfinite(keys).all():  # NaN orders are not defined; ±inf are
        idx = ascending_perm(gens, keys)
        assert [gens[i].gen_id for i in idx] == [g.gen_id for g in _plain(gens)]
        idx = ascending_perm(gens, keys, ready_since=False)
        assert [gens[i].gen_id for i in idx] == [g.gen_id for g in plain]
        first = np.array([i % 3 == 0 for i in range(len(gens))], dtype=bool)
        idx = ascending_perm(gens, keys, first=first)
        grouped = sorted(gens, key=lambda g: (int(g.gen_id[1:]) % 3 != 0, -g.priority, g.ready_since,
                                              g.request.arrival, g.gen_id))
        assert [gens[i].gen_id for i in idx] == [g.gen_id for g in grouped]
        arrival = np.array([g.request.arrival for g in gens], dtype=float)  # the caller's own arrivals
        assert ascending_perm(gens, keys, first=first, arrival=arrival) == idx
        assert [gens[i].gen_id for i in ascending_perm(gens, keys, arrival=arrival)] == [g.gen_id for g in _plain(gens)]


@settings(max_examples=300, deadline=None)
@given(**_SCEN, blocked=st.booleans(), net=st.sampled_from([0.0, 0.008, 0.6, 5.0]), tpw=st.sampled_from([None, 1.3, 2.0]),
       mode=st.sampled_from(["stream", "suspend"]), solve_every=st.sampled_from([1, 2]),
       kv_trigger=st.sampled_from([0.05, 0.9]), max_batch=st.sampled_from([None, 3]), refine=st.booleans(),
       speaking=st.booleans(), lat_per_seq=st.sampled_from([2e-4, 0.05]), compiled=st.booleans(),
       small=st.booleans(), tail=st.booleans())
def test_andes_fast_select_matches_reference(specs, steps, blocked, net, tpw, mode, solve_every, kv_trigger,
                                             max_batch, refine, speaking, lat_per_seq, compiled, small, tail):
    """`small`: the few-requests path (`Andes._select_small`, compiled) or the numpy one; on the
    small path, `tail` False: the compiled best row and proposal (`qoe_kernel._small_best`,
    `_small_tail`) are set aside, as where they decline, for the Python steps (`Andes._best_row`,
    `Andes._small_proposal`)."""
    from timelyllm_ros.core import qoe_kernel
    from timelyllm_ros.core.policies.andes import Andes

    class Reference(Andes):
        def select(self, ready, running, ctx, now):
            return andes_select_reference(self, ready, running, ctx, now)

    kw = dict(network_latency_s=net, tokens_per_word=tpw, mode=mode, solve_every=solve_every, kv_trigger=kv_trigger,
              max_batch=max_batch, refine=refine, speaking_types=("chat",) if speaking else (),
              lat_per_seq_s=lat_per_seq)
    steps = [(gap, now, token_s * 8, muts, free) for gap, now, token_s, muts, free in steps]  # up to 0.4 s/token
    gens = _scenario(specs)
    a, b = _copy(gens), _copy(gens)
    warm = qoe_kernel.warm
    solve = qoe_kernel._small_solve if warm() else None
    if not compiled:  # the numpy / Python fallbacks, as without numba
        qoe_kernel.warm = lambda: False
    elif not tail:
        qoe_kernel._small_solve = lambda *args: (solve(*args), (-1, 0, 0, 0, False))[1]
    try:
        fast, ref = Andes(**kw), Reference(**kw)
        if not small:
            fast.small_n = 0
        assert _run(fast, a, steps, blocked) == _run(ref, b, steps, blocked)
    finally:
        qoe_kernel.warm = warm
        qoe_kernel._small_solve = solve
    assert (fast.solves, fast.last_decision, repr(fast._tpw)) == (ref.solves, ref.last_decision, repr(ref._tpw))


_RUNS = st.lists(st.tuples(st.floats(0, 20), st.integers(1, 6)), max_size=4)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(_RUNS, st.floats(0, 10), st.sampled_from([0.5, 2.0, 4.8, 12.0])), min_size=1, max_size=6),
       st.floats(0, 30), st.one_of(st.none(), st.tuples(st.floats(0, 3), st.integers(0, 30),
                                                         st.sampled_from([0.01, 0.08, 0.3, 1.0]))))
def test_qoe_batch_equals_qoe_of_runs(reqs, at, stream):
    """QoEBatch against the scalar QoE, for requests whose delivered runs all start by `at`."""
    import numpy as np

    from timelyllm_ros.core.qoe import QoEBatch, Run, fold_runs, qoe_of_runs
    rows = []
    for runs, start, rate in reqs:
        rs = sorted((Run(t, c) for t, c in runs if t <= at), key=lambda r: r.start)
        rows.append((rs, start, rate))
    folded = [fold_runs(rs, 1.0 / rate, start) + (sum(r.count for r in rs),) for rs, start, rate in rows]
    f = np.array(folded, dtype=float).reshape(-1, 4).T
    qb = QoEBatch(f[0], f[1], f[2], f[3], np.array([r[1] for r in rows]), 1.0 / np.array([r[2] for r in rows]))
    if stream is None:
        got = qb.at(at)
        want = [qoe_of_runs(rs, ideal_start=st_, rate=r, now=at, complete=False).qoe for rs, st_, r in rows]
    else:
        s0, count, iv = stream
        s0 = max(s0, max((r.start for rs, _, _ in rows for r in rs), default=0.0))  # after every delivered run
        got = qb.at(at, (s0, np.full(len(rows), float(count)), iv))
        want = [qoe_of_runs(rs + [Run(s0, count, iv)], ideal_start=st_, rate=r, now=at, complete=False).qoe
                for rs, st_, r in rows]
    assert [repr(float(x)) for x in got] == [repr(x) for x in want]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.5, math.inf, -math.inf, math.nan]) | st.floats(allow_nan=True),
                min_size=1, max_size=60), st.integers(1, 60))
def test_andes_stable_head_is_the_stable_argsort_prefix(xs, k):
    """Andes packs each batch size from the first B by priority: partition + sort of the head
    must equal the head of the full stable sort (ties in index order, NaN last)."""
    import numpy as np

    from timelyllm_ros.core.policies.andes import _stable_head
    x = np.array(xs, dtype=float)
    k = min(k, len(x))
    assert _stable_head(x, k).tolist() == np.argsort(x, kind="stable")[:k].tolist()


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(_RUNS, st.floats(0, 10), st.sampled_from([0.5, 2.0, 4.8, 12.0]), st.integers(0, 3)),
                min_size=1, max_size=6),
       st.floats(0, 30), st.lists(st.tuples(st.floats(0, 3), st.integers(0, 30),
                                            st.sampled_from([0.01, 0.08, 0.3, 1.0, 7.0])), min_size=1, max_size=4))
def test_qoe_batch_streams_equal_at_and_qoe_of_runs(reqs, at, streams):
    """QoEBatch.at_streams (Andes' Q_serve: one projected stream per candidate batch size; the
    compiled loop when numba is there) against QoEBatch.at and the scalar QoE, bit for bit."""
    import numpy as np

    from timelyllm_ros.core.qoe import QoEBatch, Run, fold_runs, qoe_of_runs
    from timelyllm_ros.core.qoe_kernel import stream_rows
    rows = []
    for runs, start, rate, pending in reqs:
        rs = sorted((Run(t, c) for t, c in runs if t <= at), key=lambda r: r.start)
        rows.append((rs, start, rate, pending))
    folded = [fold_runs(rs, 1.0 / rate, start) + (sum(r.count for r in rs),) for rs, start, rate, _ in rows]
    f = np.array(folded, dtype=float).reshape(-1, 4).T
    qb = QoEBatch(f[0], f[1], f[2], f[3], np.array([r[1] for r in rows]), 1.0 / np.array([r[2] for r in rows]))
    first = max((r.start for rs, *_ in rows for r in rs), default=0.0)
    s0 = [max(s, first) for s, _, _ in streams]  # after every delivered run
    cnt = [c for _, c, _ in streams]
    iv = [v for _, _, v in streams]
    pending = np.array([float(r[3]) for r in rows])
    got = qb.at_streams(at, s0, pending, cnt, iv)
    col = lambda xs: np.array(xs, dtype=float)[:, None]  # noqa: E731
    want = qb.at(at, (col(s0), pending + col(cnt), col(iv)))
    assert got.shape == (len(streams), len(rows))
    assert [repr(float(x)) for x in got.ravel()] == [repr(float(x)) for x in want.ravel()]
    kernel = stream_rows(qb, at, s0, pending, cnt, iv)
    if kernel is not None:
        assert [repr(float(x)) for x in kernel.ravel()] == [repr(float(x)) for x in want.ravel()]
    scalar = [qoe_of_runs(rs + [Run(s, p + c, v)], ideal_start=st_, rate=rate, now=at, complete=False).qoe
              for s, c, v in zip(s0, cnt, iv) for rs, st_, rate, p in rows]
    assert [repr(float(x)) for x in got.ravel()] == [repr(x) for x in scalar]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.floats(-5, 5) | st.sampled_from([0.0, -0.0, 1.0, -1.0, math.inf, -math.inf, math.nan]),
                         min_size=40, max_size=40), min_size=1, max_size=4), st.integers(1, 40))
def test_andes_stable_heads_are_the_stable_argsort_prefixes(rows, k):
    """All rows at once (ties at the k-th value and NaN go the row-wise way) = each row's stable sort."""
    import numpy as np

    from timelyllm_ros.core.policies.andes import _stable_heads
    x = np.array(rows, dtype=float)
    assert _stable_heads(x, k).tolist() == np.argsort(x, axis=1, kind="stable")[:, :k].tolist()


def _default_paths(**kw):
    """`Default(**kw)` three times: the numpy path forced, the plain path (default_small.py)
    forced, and one that alternates between them point by point (the caches either keeps for the
    other must hold)."""
    from timelyllm_ros.core.policies.default import Default

    class Alternating(Default):
        def select(self, ready, running, ctx, now):
            self._small_below = 0 if self._small_below else math.inf
            return super().select(ready, running, ctx, now)

    paths = (Default(**kw), Default(**kw), Alternating(**kw))
    paths[0]._small_below, paths[1]._small_below = 0, math.inf
    return paths


def _same_on_each_path(paths, gens, run):
    """`run(policy, its own copy of gens)` decides alike on each of `paths` (orders, preemptions,
    priorities at every point), and leaves the same policy state and rule 9's pause marks."""
    copies = [_copy(gens) for _ in paths]
    seen = [run(p, c) for p, c in zip(paths, copies)]
    state = [(p._full, p._capped, p._mem_held, p._mem_cut, p._queue_s, p._plan, p._head_pri, p._depth,
              p._first_seen, p._first_waits, p._first_crit, p._heavy, p._steep_first, p._back_s) for p in paths]  # (rules 5-7, 10's verdicts, 11's backlog wait and critical queue, 12's)
    marks = [[g.policy.default.pause_kv for g in c] for c in copies]
    assert seen[1] == seen[0] and seen[2] == seen[0]
    assert state[1] == state[0] and state[2] == state[0]
    assert marks[1] == marks[0] and marks[2] == marks[0]


@settings(max_examples=300, deadline=None)
@given(**_SCEN, blocked=st.booleans(), lead_steps=st.sampled_from([0.0, 4.0, 50.0]),
       min_lead_s=st.sampled_from([0.0, 0.05, 3.0]), kv_budget=st.booleans(), pace=st.booleans(),
       seen=st.lists(st.tuples(st.integers(0, 3), st.booleans(), st.integers(1, 30)), max_size=4),
       slope=st.sampled_from([None, 0.0, 0.001, 0.05, 1.0, 10.0]), preserve=st.booleans(),
       min_free=st.sampled_from([0.0, 0.1, 0.25]), plan_order=st.booleans(),
       plan_depth=st.sampled_from([0.0, 0.1, 8.0]), steep_cap=st.booleans(), urgent_every=st.sampled_from([0, 3]),
       heavy=st.booleans(), deep=st.booleans(), back_rho=st.sampled_from([None, 0.0, 1.0]))
def test_default_fast_select_matches_reference(specs, steps, blocked, lead_steps, min_lead_s, kv_budget, pace,
                                               seen, slope, preserve, min_free, plan_order, plan_depth, steep_cap,
                                               urgent_every, heavy, deep, back_rho):
    """`slope`: the engine steps the policies saw (rule 9's step-time model: None: none, else
    steps of 1..40 generations at 20 ms + slope per generation); `preserve`: the engine keeps a
    paused generation's KV, so rule 9 may pause running generations; `plan_order`: rule 12 (under
    rule 11's backlog, the whole reply's WSRPT by the learned length predictor); `steep_cap`: rule
    10 protects only first segments steeper than the flattest live generation and shrinks the batch
    (`urgent_every`: every third generation urgent, so that some are steeper); `heavy`: rule 12's
    heavy load (every generation critical) wherever the policy saw a step and plan_order is on;
    `deep`: its deep load too (steep first statements rank first) where a re-add is cheap;
    `back_rho`: rule 11's critical queue (opt-in, `back_factor` 4; None: off) where the load factor
    is at least that (0: at any load)."""
    kw = dict(lead_steps=lead_steps, min_lead_s=min_lead_s, kv_budget=kv_budget, pace_min_free=min_free, pace=pace,
              plan_order=plan_order, plan_depth_s=plan_depth, steep_cap=steep_cap,
              heavy_rho=1e-9 if heavy else math.inf, steep_first_rho=1e-9 if deep else math.inf,
              back_factor=0.0 if back_rho is None else 4.0, back_rho=back_rho or 0.0)
    paths = _default_paths(**kw)
    gens = _scenario(specs, urgent_every)
    for p in paths:
        for t, first, tok in seen:  # learned segment lengths (some robot types still unseen)
            g = Generation(request=PlanRequest(request_id="o", robot_id="x", robot_type=_TYPES[t], task="t",
                                               scene="", tuf=NORMAL, arrival=0.0))
            p.observe(g, Segment(index=0 if first else 1, text="", calls=(), blocking=False, token_count=tok,
                                 gen_start=0.0, gen_end=0.0, est_exec_s=0.0))
        if slope is not None:
            for n in (1, 5, 12, 40, 3):
                p.on_step(0.02 + slope * n, n)
        for g in gens:
            p.on_arrival(g)
        p._load.saturate()  # (as once the batch reached its limit)
    modes = frozenset({"cache", "preserve"} if preserve else {"cache"})
    _same_on_each_path(paths, gens, lambda p, gs: _run(p, gs, steps, blocked, kv_modes=modes))
    assert paths[0]._heavy == (heavy and plan_order and slope is not None and bool(specs))  # (reached)


_FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                    st.floats(-1e3, 1e3), st.sampled_from([0.0, -0.0, 1e-12, 1e-9, 5e-324, math.inf, math.nan]))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6) | _FLOATS, max_size=300))
def test_pairwise_sum_is_numpy_sum(xs):
    """The Python replica of numpy's pairwise summation gives np.sum's bits (sizes across its
    8-value and 128-value blocks)."""
    import numpy as np

    from timelyllm_ros.core.policies.default_small import pairwise_sum
    assert repr(pairwise_sum(xs)) == repr(float(np.sum(np.asarray(xs, dtype=float))))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.lists(st.tuples(_FLOATS | st.floats(-10.0, 0.0), _FLOATS | st.floats(0.0, 3.0),
                                   _FLOATS | st.floats(-5.0, 5.0)), max_size=70), min_size=1, max_size=3),
       st.sampled_from([0.5, 2.0, 3.0]))
def test_default_atc_lists_equal_numpy_atc(groups, k):
    """The oracle's ATC written in Python (numpy's exp) = the default's numpy function, bit for
    bit, per group, with late (slack <= 0), not yet late and non-finite terms mixed."""
    import numpy as np

    from timelyllm_ros.core.policies.default_small import atc_priority_lists

    from timelyllm_ros.core.policies.default import atc_priorities
    cols = [tuple(map(list, zip(*g))) if g else ([], [], []) for g in groups]
    got = atc_priority_lists(cols, k)
    with np.errstate(all="ignore"):
        want = [atc_priorities(*c, k).tolist() if c[0] else [] for c in cols]
    assert [[repr(x) for x in r] for r in got] == [[repr(x) for x in r] for r in want]


_FIT_TYPES = ("tello", "arm", "chat", "no-such-robot")  # (an unknown type: the worst segment's fallback, 17)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 60), st.integers(0, 60)), max_size=8),
       st.lists(st.integers(0, 3), max_size=5), st.integers(-5, 40), st.sampled_from([0, 1, 16]),
       st.sampled_from([0, 400, 400]))
def test_default_fit_memory_bound_admits_as_the_walk(order_spec, running_spec, extra, block, total):
    """Rule 6 with the plain path's token sum (`_fit_memory(tokens=...)`: where its bound shows
    that all of the order fits, the walk is skipped) = the walk, generation by generation, at
    every memory level (`extra`: free blocks beyond the order's own tokens, around its bound):
    the same generations, in order."""
    from timelyllm_ros.core.policies.default import Default

    def gen(i, t, prompt, out):
        req = PlanRequest(request_id=f"m{i}", robot_id="x", robot_type=_FIT_TYPES[t], task="t", scene="",
                          tuf=NORMAL, arrival=0.0)
        return Generation(request=req, prompt_ids=[1] * prompt, output_ids=[2] * out)

    order = [gen(i, *spec) for i, spec in enumerate(order_spec)]
    running = [gen(100 + i, t, 5, 5) for i, t in enumerate(running_spec)]
    tokens = sum(len(g.prompt_ids) + len(g.output_ids) for g in order)
    free = max(0, tokens // max(1, block) + extra)
    ctx = PolicyContext(estimator=ExecTimeEstimator(ROBOTS), robots=ROBOTS, stats=EngineStats(total, free, block, 0, 45.0),
                        seg_gen_s=0.1, token_s=0.02, running=running)
    walk = Default(plan_order=False)._fit_memory(list(order), running, ctx)
    bound = Default(plan_order=False)._fit_memory(list(order), running, ctx, tokens)
    assert [g.gen_id for g in bound] == [g.gen_id for g in walk]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.0, 1.0, 2.0, 2.5, -1.0, 5e-324]) | st.floats(-3, 3),
                          st.sampled_from([0.0, 1.0, 2.0]), st.sampled_from([0.0, 1.0])), max_size=200),
       st.integers(0, 60), st.booleans())
def test_priority_head_is_the_priority_order_prefix(items, k, unknown):
    """The partial order (the k first by a partition, ties at the k-th value included) is the
    full order's prefix; `unknown`: no k (the full order)."""
    import numpy as np

    from timelyllm_ros.core.policies.base import priority_head_at
    gens = [_gen(i, priority=-key, ready_since=rs, arrival=a) for i, (key, rs, a) in enumerate(items)]
    pool = [_gen(100 + i, priority=1e9) for i in range(3)] + gens  # (`at` picks gens out of it)
    pri = np.array([g.priority for g in pool], dtype=float)
    want = priority_order(gens) if unknown else priority_order(gens)[:k]
    at = priority_head_at(pool, np.arange(3, len(pool)), pri, None if unknown else k)
    assert [pool[i] for i in at.tolist()] == want


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_FLOATS | st.floats(-10.0, 0.0), _FLOATS | st.floats(0.0, 3.0),
                          _FLOATS | st.floats(-5.0, 5.0)), max_size=40), st.integers(-2, 42),
       st.sampled_from([0.5, 2.0, 3.0]))
def test_default_atc_groups_equal_separate_calls(terms, cut, k):
    """`atc_priorities` with a group boundary (the running batch and the ready generations in
    one call) = one call per group, bit for bit."""
    import numpy as np

    from timelyllm_ros.core.policies.default import atc_priorities
    cut = min(max(cut, 0), len(terms))
    cols = [list(c) for c in zip(*terms)] if terms else [[], [], []]
    with np.errstate(all="ignore"):
        got = atc_priorities(*cols, k, (cut,)).tolist() if terms else []
        want = [x for lo, hi in ((0, cut), (cut, len(terms))) if hi > lo
                for x in atc_priorities(*(c[lo:hi] for c in cols), k).tolist()]
    assert [repr(x) for x in got] == [repr(x) for x in want]


@settings(max_examples=100, deadline=None)
@given(specs=st.lists(_GEN, min_size=30, max_size=90), steps=st.lists(_STEP, min_size=1, max_size=3),
       blocked=st.booleans(), slope=st.sampled_from([0.001, 0.01, 0.05]), running_n=st.integers(0, 6),
       drain=st.sampled_from([5.0, 0.001]), memory_full=st.booleans(), engines=st.sampled_from([1, 3]),
       roomy=st.sampled_from([3.0, 10.0]), plan_order=st.booleans(), plan_depth=st.sampled_from([0.0, 8.0]),
       steep_cap=st.booleans(), urgent_every=st.sampled_from([0, 3, 11]), heavy=st.booleans(), deep=st.booleans())
def test_default_fast_select_matches_reference_at_many_ready(specs, steps, blocked, slope, running_n, drain,
                                                             memory_full, engines, roomy, plan_order, plan_depth,
                                                             steep_cap, urgent_every, heavy, deep):
    """Many ready generations and a step-time cap that binds: the numpy path orders only the
    head the cap can admit (`_head_needed`) and must still decide exactly as the plain path —
    orders, preemptions, priorities, the cap's and the KV budget's verdicts; behind an engine
    pool too, where the cap holds per engine; with rule 10's opt-in `roomy_ratio`, whose ratio
    depends on whether the KV budget (each step's free blocks) cuts before the cap; with rule 12's
    opt-in `plan_order`, and its heavy load (`heavy`: every generation critical) and deep load
    (`deep`: steep first statements first; re-adds are cheap here, no prefill was seen)."""
    kw = dict(drain_after_s=drain, memory_full=memory_full, roomy_ratio=roomy, plan_order=plan_order,
              plan_depth_s=plan_depth, steep_cap=steep_cap, heavy_rho=1e-9 if heavy else math.inf,
              steep_first_rho=1e-9 if deep else math.inf)
    paths = _default_paths(**kw)
    gens = _scenario(specs, urgent_every)
    for p in paths:
        for n in (1, 5, 12, 40, 3):
            p.on_step(0.02 + slope * n, n)
        for g in gens:
            p.on_arrival(g)
        p._load.saturate()  # (as once the batch reached its limit)
    for i, g in enumerate(gens):  # a few running, the rest ready
        g.state = GenState.RUNNING if i < running_n else (GenState.SUSPENDED if g.segments else GenState.QUEUED)
    _same_on_each_path(paths, gens, lambda p, gs: _run(p, gs, steps, blocked, engines=engines))
    assert paths[0]._heavy == (heavy and plan_order)
    assert paths[0]._steep_first == (heavy and plan_order and deep)  # (reached)


@settings(max_examples=800, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.5, 1.0, 2.0, -1.0]), st.sampled_from([0.0, 1.0, 2.0]),
                          st.sampled_from([0.0, 1.0]), st.integers(1, 4), st.booleans()), min_size=1, max_size=60),
       st.integers(0, 30), st.integers(0, 200), st.booleans(), st.randoms(use_true_random=False))
def test_lazy_head_answers_rule_6_as_the_whole_order(items, h, free, running, rnd):
    """`LazyHead` (default_head.py) = ordering the whole head and cutting it by prefix sums of the
    blocks: `fits(m)` for every m, `fitted(k)` for every k, with few distinct priorities (long tie
    runs broken by ready time, arrival and id), two groups (critical, then deferrable), any h."""
    import numpy as np

    from timelyllm_ros.core.policies.default_head import LazyHead

    gens = [_gen(i, priority=p, ready_since=rs, arrival=a) for i, (p, rs, a, _, _) in enumerate(items)]
    rnd.shuffle(gens)  # (ids not in order)
    blocks = np.array([float(b) for _, _, _, b, _ in items])[[int(g.gen_id[1:]) for g in gens]]
    pri = np.array([g.priority for g in gens])
    arr = np.array([g.request.arrival for g in gens])
    grp = [item[4] for item in items]
    groups = [np.array([i for i, g in enumerate(gens) if grp[int(g.gen_id[1:])]], dtype=np.intp),
              np.array([i for i, g in enumerate(gens) if not grp[int(g.gen_id[1:])]], dtype=np.intp)]
    n = rnd.randrange(0, len(gens) + 1)
    whole = [g for at in groups for g in priority_order([gens[i] for i in at.tolist()])][:n]
    used = np.cumsum([blocks[gens.index(g)] for g in whole])
    fit = int(np.searchsorted(used, free, side="right")) if n else 0
    if fit == 0 and not running and n:
        fit = 1
    lazy = LazyHead(gens, groups, pri, arr, n, h, blocks, free, running)
    assert [lazy.fits(m) for m in range(n + 2)] == [m <= fit for m in range(n + 2)]
    assert lazy.head() == whole[:min(fit, max(h, 0))]
    for k in (0, 1, h, h + 1, n, None):
        assert lazy.fitted(k) == whole[:min(fit, n if k is None else k)]


def test_default_lazy_head_matches_reference_at_deep_queues():
    """A deep queue whose robot types all run, behind a step-time cap well under the queue: the
    numpy path orders only the short cap's head and answers rule 6 beyond it from set sums
    (default_head.py) — it must decide exactly as the plain path, at KV levels that cut inside
    the ordered part, past it, past the roomy cap, or not at all; with ties in priority (rule
    12's whole-reply ranks, equal slacks) broken by ready time and arrival.  Seeded scenarios; at
    the end every branch of the lazy head must have been taken."""
    import random
    from collections import Counter

    from timelyllm_ros.core.policies import default_head

    hits: Counter = Counter()
    real_init, real_fits, real_fitted, real_set = (default_head.LazyHead.__init__, default_head.LazyHead.fits,
                                                   default_head.LazyHead.fitted, default_head.LazyHead._set_blocks)

    def init(self, *a, **k):
        hits["built"] += 1
        real_init(self, *a, **k)

    def fits(self, m):
        beyond = m > self._h
        r = real_fits(self, m)
        hits[f"fits beyond={beyond} {r}"] += 1
        return r

    def fitted(self, k):
        h = self._h
        r = real_fitted(self, k)
        hits["ordered all" if self._h != h else "fitted"] += 1
        return r

    def set_blocks(self, m):
        before = default_head.ascending_perm_array
        calls = []
        default_head.ascending_perm_array = lambda *a, **k: calls.append(1) or before(*a, **k)
        try:
            return real_set(self, m)
        finally:
            default_head.ascending_perm_array = before
            hits["ties ordered"] += bool(calls)

    mp = pytest.MonkeyPatch()
    mp.setattr(default_head.LazyHead, "__init__", init)
    mp.setattr(default_head.LazyHead, "fits", fits)
    mp.setattr(default_head.LazyHead, "fitted", fitted)
    mp.setattr(default_head.LazyHead, "_set_blocks", set_blocks)
    try:
        for seed in range(60):
            rnd = random.Random(seed)
            n = rnd.randrange(40, 160)
            run_types = [0, 1, 2] + [rnd.randrange(3) for _ in range(rnd.randrange(0, 4))]
            specs = []
            for i in range(n + len(run_types)):
                running = i < len(run_types)
                t = run_types[i] if running else rnd.randrange(3)
                segs = [(rnd.randrange(0, 12), rnd.random() < 0.3, rnd.choice([0.0, 0.5, 2.0]),
                         rnd.choice([None, 0.5]), rnd.choice([None, 1.0]))
                        for _ in range(rnd.choice([0, 0, 1, 2]))]
                specs.append((t, rnd.randrange(0, 40), rnd.choice([0, 3, 3, 17, 30]), segs,
                              rnd.choice([0.0, 1.0, 2.0]), rnd.choice([0.0, 0.5, 1.0]), None, running))
            heavy, plan = rnd.random() < 0.5, rnd.random() < 0.7
            kw = dict(plan_order=plan, plan_depth_s=0.0, heavy_rho=1e-9 if heavy else math.inf,
                      steep_first_rho=math.inf, roomy_ratio=rnd.choice([10.0, 40.0]))
            paths = _default_paths(**kw)
            gens = _scenario(specs, rnd.choice([0, 3, 11]))
            for p in paths:
                for k in (1, 5, 12, 40, 3):
                    p.on_step(0.02 + 0.05 * k, k)  # (a steep step time: the short cap is 4)
                for g in gens:
                    p.on_arrival(g)
                p._load.saturate()
            free_levels = [rnd.choice([0, 3, 8, 20, 60, 150, 400, 2000]) for _ in range(4)]

            def run(policy, gs):
                seen = []
                for k, free in enumerate(free_levels):
                    ready = [g for g in gs if g.state is not GenState.RUNNING]
                    running = [g for g in gs if g.state is GenState.RUNNING]
                    if k % 2:
                        ready[0].blocked = "batch full"
                    ctx = PolicyContext(estimator=ExecTimeEstimator(ROBOTS), robots=ROBOTS,
                                        stats=EngineStats(4000, free, 16, len(running), 45.0), seg_gen_s=0.1,
                                        token_s=0.02, running=running, iteration=k)
                    sel = policy.select(ready, running, ctx, 1.0 + 0.5 * k)
                    seen.append(([g.gen_id for g in sel.order], [g.gen_id for g in sel.preempt],
                                 [repr(g.priority) for g in gs]))
                    g = running[k % len(running)]  # a running generation's token, as after a step
                    g.output_ids.append(4)
                    g.touch()
                return seen

            _same_on_each_path(paths, gens, run)
    finally:
        mp.undo()
    for branch in ("built", "fits beyond=True True", "fits beyond=True False", "fits beyond=False True",
                   "fits beyond=False False", "fitted", "ordered all", "ties ordered"):
        assert hits[branch], (branch, dict(hits))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(_RUNS, st.floats(0, 10), st.floats(0.5, 12)), min_size=1, max_size=8),
       st.lists(st.floats(0, 40) | st.sampled_from([0.0, 5.0, 1e-10]), min_size=1, max_size=5))
def test_compiled_at_times_equals_qoe_batch_at(reqs, times):
    """Andes' compiled Q(t) without a stream (q_wait, the refiner's stalls) = QoEBatch.at at
    every time, bit for bit, with delivered runs before and after it (late runs included: the
    arithmetic must match even where Andes takes the scalar formula instead)."""
    import numpy as np

    from timelyllm_ros.core import qoe_kernel
    from timelyllm_ros.core.qoe import QoEBatch, Run, fold_runs
    if not qoe_kernel.warm():
        pytest.skip("numba not installed")
    rows = [(sorted((Run(t, c) for t, c in runs), key=lambda r: r.start), start, rate) for runs, start, rate in reqs]
    folded = [fold_runs(rs, 1.0 / rate, start) + (sum(r.count for r in rs),) for rs, start, rate in rows]
    f = np.array(folded, dtype=float).reshape(-1, 4).T
    start, u = np.array([r[1] for r in rows]), 1.0 / np.array([r[2] for r in rows])
    got = qoe_kernel.at_times(f[0], f[1], f[2], f[3], start, u, times)
    for j, t in enumerate(times):
        want = QoEBatch(f[0], f[1], f[2], f[3], start, u).at(t)
        assert [repr(float(x)) for x in got[:, j]] == [repr(float(x)) for x in want]
    k_ = np.arange(len(rows))[:, None]  # the refiner's broadcast form: rows x times at once
    both = QoEBatch(f[0][k_], f[1][k_], f[2][k_], f[3][k_], start[k_], u[k_]).at(np.array(times, dtype=float))
    assert [repr(float(x)) for x in got.ravel()] == [repr(float(x)) for x in both.ravel()]


def test_slot_table_without_output_tracking_fills_once_and_after_invalidate():
    """`SlotTable(track_output=False)` (the default's request constants): a slot is filled when
    its generation is first seen and after `invalidate` (one made during a fill included), never
    because the generation's output grew."""
    from timelyllm_ros.core.policies.slots import SlotTable
    table = SlotTable({"x": (float, 0.0)}, track_output=False)
    gens = [_gen(i) for i in range(3)]
    filled: list[str] = []

    def fill(g, slot):
        filled.append(g.gen_id)
        table.a["x"][slot] = float(len(filled))

    sl = table.lookup(gens, fill)
    assert filled == [g.gen_id for g in gens]
    gens[1].output_ids.extend([1, 2, 3])
    assert table.lookup(gens, fill).tolist() == sl.tolist() and len(filled) == 3
    table.invalidate(gens[2])
    table.lookup(gens, fill)
    assert filled[3:] == [gens[2].gen_id]

    def fill_and_drop(g, slot):  # a fill that invalidates its own slot: refilled at the next lookup
        fill(g, slot)
        table.invalidate(g)

    table.invalidate(gens[0])
    table.lookup(gens, fill_and_drop)
    table.lookup(gens, fill)
    assert filled[4:] == [gens[0].gen_id, gens[0].gen_id]
    more = gens + [_gen(9)]
    table.lookup(more, fill)
    assert filled[6:] == [more[3].gen_id]


def test_slot_table_with_output_tracking_refills_what_changed():
    """`SlotTable` (output tracked: LAMPS', Andes' terms): looked up with the same list again, a
    slot is refilled only when its generation's output length changed or it was invalidated;
    a new list gives new generations slots and keeps the old ones'; the slots returned are the
    caller's own copy."""
    from timelyllm_ros.core.policies.slots import SlotTable
    table = SlotTable({"x": (float, 0.0)})
    gens = [_gen(i) for i in range(3)]
    filled: list[str] = []

    def fill(g, slot):
        filled.append(g.gen_id)

    sl = table.lookup(gens, fill)
    assert filled == ["r0", "r1", "r2"]
    sl[:] = -5  # the caller's copy: the table's own record is untouched
    assert table.lookup(gens, fill).tolist() == [0, 1, 2] and len(filled) == 3
    gens[1].output_ids.extend([1, 2])
    assert table.lookup(gens, fill).tolist() == [0, 1, 2] and filled[3:] == ["r1"]
    assert table.lookup(gens, fill).tolist() == [0, 1, 2] and len(filled) == 4
    table.invalidate()
    table.lookup(gens, fill)
    assert filled[4:] == ["r0", "r1", "r2"]
    more = [gens[2], _gen(7), gens[0]]
    assert table.lookup(more, fill).tolist() == [2, 3, 0] and filled[7:] == ["r7"]
    assert table.lookup(more, fill).tolist() == [2, 3, 0] and len(filled) == 8


_TABLE_OP = st.tuples(st.sampled_from(["same", "same", "same", "other", "step", "grow", "shrink", "invalidate",
                                       "invalidate_all"]), st.integers(0, 7), st.integers(1, 3))


@settings(max_examples=400, deadline=None)
@given(st.lists(_TABLE_OP, max_size=40), st.booleans(), st.booleans(), st.booleans())
def test_slot_table_same_list_lookups_equal_the_general_path(ops, many, observe, matrix):
    """`SlotTable.lookup` of the last lookup's generations again, with output tracking
    (`_lookup_same`: Python lists, memoryview writes) against the same steps with every lookup on
    the general path (the table marked dirty before each lookup), with `fill` or `fill_many`
    (`many`), with and without `before_fill`, with fills that invalidate their own slot, and with
    the fields as one matrix's rows (`matrix`): the same fills (generation, slot, output length),
    the same slots, the same columns (also once grown: the values carried over)."""
    import numpy as np

    from timelyllm_ros.core.policies.slots import SlotTable
    pool = [_gen(i) for i in range(8)]
    tables = {name: SlotTable({"x": (float, 0.0), "y": (float, math.nan)}, matrix=matrix) for name in ("fast", "ref")}
    logs: dict[str, list] = {name: [] for name in tables}

    def fills(name):
        table, log = tables[name], logs[name]

        def fill(g, slot):
            log.append(("fill", g.gen_id, slot, len(g.output_ids)))
            table.a["x"][slot] = len(log)
            if len(g.output_ids) % 9 == 8:  # a fill that invalidates its own slot: refilled next time
                table.invalidate(g)

        def fill_many(gs, slots, outs):
            assert outs == [len(g.output_ids) for g in gs]
            for g, slot in zip(gs, slots):
                fill(g, slot)

        def before(gs):
            log.append(("before", [g.gen_id for g in gs]))
        return fill, fill_many, (before if observe else None)

    cur = pool[:4]
    for op, i, k in ops:
        if op == "step":  # every generation of the list one token longer (an engine step)
            for g in cur:
                g.output_ids.append(1)
        elif op == "grow":  # k generations from i, k tokens each
            for j in range(k):
                pool[(i + j) % 8].output_ids.extend([1] * k)
        elif op == "shrink":
            del pool[i].output_ids[-k:]
        elif op in ("invalidate", "invalidate_all"):
            for table in tables.values():
                table.invalidate(pool[i] if op == "invalidate" else None)
        else:
            if op == "other":
                cur = [pool[(i + j * k) % 8] for j in range(i % 6 + 1)]
            got = {}
            for name, table in tables.items():
                if name == "ref":
                    table._dirty = True  # (the general path)
                fill, fill_many, before = fills(name)
                gens = list(cur)  # (a new list of the same generations, as each point builds)
                got[name] = (table.lookup(gens, None, before, fill_many=fill_many) if many
                             else table.lookup(gens, fill, before)).tolist()
            assert got["fast"] == got["ref"]
            assert logs["fast"] == logs["ref"]
    for k in tables["ref"].a:
        assert np.array_equal(tables["fast"].a[k], tables["ref"].a[k], equal_nan=True), k
    before = tables["ref"].a
    tables["fast"]._grow(len(before["_out"]) + 1)
    for k, v in tables["fast"].a.items():
        assert len(v) == max(1024, 2 * len(before[k]))
        assert np.array_equal(v[:len(before[k])], before[k], equal_nan=True)
        assert np.array_equal(v[len(before[k]):], np.full(len(v) - len(before[k]), tables["fast"].fields[k][1]),
                              equal_nan=True)
    for table in tables.values():
        if matrix:  # every field a view of its row
            assert all(table.a[k].base is table.m and table.a[k].ctypes.data == table.m[i].ctypes.data
                       for i, k in enumerate(table.fields))
    with pytest.raises(TypeError):
        tables["fast"].lookup(cur, None)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                                   st.floats(-1, 1), st.sampled_from([0.0, -0.0, 1e308, -1e308, 1e-300, 0.1])),
                         min_size=3, max_size=3), min_size=1, max_size=12), st.data())
def test_compiled_fsum_rows_equal_math_fsum(cols, data):
    """Andes' small path sums its packing values and stall losses with qoe_kernel.fsum_rows (a
    compiled port of math.fsum): the same floats (inf / NaN / overflow rows: math.fsum itself)."""
    import numpy as np

    from timelyllm_ros.core import qoe_kernel
    if not qoe_kernel.warm():
        pytest.skip("numba is not installed")
    x = np.array(cols, dtype=float).T.copy()  # 3 rows
    m = [data.draw(st.integers(0, x.shape[1])) for _ in range(3)]
    want = []
    for r in range(3):
        try:
            want.append(repr(math.fsum(x[r, :m[r]].tolist())))
        except OverflowError:
            want.append("overflow")
    try:
        got = [repr(v) for v in qoe_kernel.fsum_rows(x, m)]
    except OverflowError:
        got = None
    if "overflow" in want:
        assert got is None
    else:
        assert got == want


@pytest.mark.parametrize("small", [True, False])
def test_andes_fast_select_prices_a_late_delivery_of_a_kept_request_by_the_scalar_formula(small):
    """Running requests whose delivered runs start after `now` (a large network latency) and
    ready ones to admit: the refiner prices their stall by the scalar `loss` (the closed form
    does not cover them), in both paths, as the oracle does."""
    from timelyllm_ros.core.policies.andes import Andes

    class Reference(Andes):
        def select(self, ready, running, ctx, now):
            return andes_select_reference(self, ready, running, ctx, now)

    class Counted(Andes):
        scalar = 0

        def loss(self, it, overhead_s, now):
            Counted.scalar += 1
            return super().loss(it, overhead_s, now)

    seg = (6, False, 0.5, None, None)
    specs = [(2, 3, 10, [seg, seg], 0.0, 0.0, None, True), (2, 4, 12, [seg], 0.0, 0.0, None, True),
             (1, 5, 8, [seg], 0.5, 0.0, None, True), (2, 6, 0, [], 1.0, 1.0, None, False),
             (2, 7, 0, [], 1.5, 1.5, None, False), (0, 8, 0, [], 2.0, 2.0, None, False)]
    steps = [(1, 1.0, 0.4, [], 300), (1, 1.5, 0.4, [(0, 2, None, False)], 300)]
    kw = dict(network_latency_s=5.0, lat_per_seq_s=2e-4)
    fast, ref = Counted(**kw), Reference(**kw)
    if not small:
        fast.small_n = 0
    gens = _scenario(specs)
    a, b = _copy(gens), _copy(gens)
    assert _run(fast, a, steps, False) == _run(ref, b, steps, False)
    assert fast.last_decision == ref.last_decision
    assert fast.last_decision["proposed_admit"] > 0 and Counted.scalar > 0  # the case is exercised

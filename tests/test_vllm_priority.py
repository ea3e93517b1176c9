"""vllm-priority: vLLM's own priority scheduling, in the simulator (engine + planner + policy).

The expected behaviour is hand-traced from vLLM 0.32's scheduler (the version the shared venv
pins: vllm/v1/core/sched/scheduler.py, request_queue.py, request.py):
- `PriorityRequestQueue` is a heap of `Request`s, whose `__lt__` orders by (priority,
  arrival_time, request_id): lower priority values first;
- `Scheduler.schedule` serves `self.running` first; a running request that cannot get a block
  (`allocate_slots` returns None) preempts `max(self.running, key=lambda r: (r.priority,
  r.arrival_time))` under SchedulingPolicy.PRIORITY (FCFS: `self.running.pop()`), itself
  included (then it stops); `_preempt_request` puts it back in the waiting queue (recompute);
- the waiting queue is read only `if not preempted_reqs`, and stops at `len(self.running) >=
  self.max_num_active_reqs` (max_num_seqs): a waiting request never displaces a running one;
  a waiting request whose `allocate_slots` fails stops the loop (`break`).
"""

from __future__ import annotations

import pytest

from timelyllm_ros.core.clock import VirtualClock
from timelyllm_ros.core.exec_time import ExecTimeEstimator
from timelyllm_ros.core.planner import Planner, PlannerConfig
from timelyllm_ros.core.policies import make_policy, policy_names
from timelyllm_ros.core.policies.basic import VLLM_PRIORITIES, parse_priorities
from timelyllm_ros.core.robots import load_robots
from timelyllm_ros.core.tuf import NORMAL, URGENT
from timelyllm_ros.core.types import GenState, PlanRequest
from timelyllm_ros.engines.simulated import LatencyProfile, SimulatedEngine
from timelyllm_ros.inputs import InputError, check_policy_params
from timelyllm_ros.sim.prompts import SimPromptSource
from timelyllm_ros.core.tokenizer import SimTokenizer

PLAN = "s('cat');g('cat');tp;"
SMALL = dict(prefill_s_per_token=0.001, prefill_base_s=0.01, decode_base_s=0.02,
             decode_s_per_extra_seq=0.005, decode_s_per_context_token=0.0001,
             kv_block_size=4, kv_capacity_blocks=12)
ROBOTS = load_robots()


def engine(policy: str = "priority", **over) -> SimulatedEngine:
    e = SimulatedEngine(VirtualClock(), LatencyProfile(**{**SMALL, **over}), scheduling_policy=policy)
    for g in ("n1", "n2", "n3", "u", "u2"):
        e.set_script(g, PLAN)
    return e


def ids(start: int, n: int = 15) -> list[int]:
    return list(range(start, start + n))


def stepped(e: SimulatedEngine) -> list[str]:
    return [o.gen_id for o in e.step()]


def test_registered_with_the_documented_mapping() -> None:
    assert "vllm-priority" in policy_names()
    p = make_policy("vllm-priority")
    assert p.engine_scheduling == "priority" and p.mode.value == "stream"
    assert p.params() == {"priorities": {"urgent": 0, "normal": 1, "chat": 1}} == {"priorities": VLLM_PRIORITIES}
    assert parse_priorities("urgent=0,normal=2") == {"urgent": 0, "normal": 2, "chat": 1}
    assert parse_priorities({"chat": 5}) == {"urgent": 0, "normal": 1, "chat": 5}


@pytest.mark.parametrize("value, message", [
    ("urgent=x", "'urgent' needs an integer"),
    ("robot=0", "unknown category 'robot'"),
    ({"urgent": True}, "needs an integer"),
    ("urgent", "expected category=int"),
    (3, "must be a mapping"),
])
def test_bad_priorities_are_one_line_input_errors(value, message) -> None:
    with pytest.raises(InputError, match=message):
        check_policy_params("vllm-priority", {"priorities": value})
    with pytest.raises(InputError, match="unknown parameter 'c'"):
        check_policy_params("vllm-priority", {"c": 1})


def test_engine_refuses_a_priority_without_priority_scheduling() -> None:
    e = engine("fcfs")
    with pytest.raises(ValueError, match="needs scheduling_policy='priority'"):
        e.add("u", ids(100), 8, priority=1)
    with pytest.raises(ValueError, match="scheduling_policy must be"):
        SimulatedEngine(VirtualClock(), LatencyProfile(**SMALL), scheduling_policy="edf")


def test_hand_traced_preemption_follows_priority_not_age() -> None:
    """12 blocks of 4 tokens; prompts of 15 tokens (4 blocks).
    step 1: n1, n2 (priority 1) leave the waiting heap and run: 8 blocks, 4 free.
    step 2: running n1, n2 need no block (16 tokens); then the waiting heap: u (priority 0,
            added last) gets the 4 free blocks.  0 free.
    step 3: n1 (17 tokens) needs a 5th block: none free, victim max(running, key=(priority,
            arrival)) = n2 (1, 2nd) — not u, the latest arrival, which FCFS's running.pop() would
            take; preempted_reqs is not empty, so no waiting request is admitted in this step.
    """
    e = engine()
    e.add("n1", ids(100), 8, priority=1)
    e.add("n2", ids(200), 8, priority=1)
    assert e.preempted == {"n1", "n2"}  # both in the waiting queue until the step
    assert stepped(e) == ["n1", "n2"] and e.stats().kv_free_blocks == 4
    e.add("u", ids(300), 8, priority=0)
    assert stepped(e) == ["n1", "n2", "u"] and e.stats().kv_free_blocks == 0
    assert sorted(stepped(e)) == ["n1", "u"]
    assert e.preempted == {"n2"} and e.counters.preemptions == 1
    e.check_invariants()

    f = engine("fcfs")  # the same trace under FCFS preempts the youngest: u
    f.add("n1", ids(100), 8)
    f.add("n2", ids(200), 8)
    f.step()
    f.add("u", ids(300), 8)
    f.step()
    f.step()
    assert f.preempted == {"u"}


def test_hand_traced_waiting_heap_order_and_no_overtaking() -> None:
    """8 blocks.  n1 runs (17 tokens: 5 blocks); then n3 (priority 1, 19 tokens: 5 blocks) and
    u2 (priority 0, 15 tokens: 4 blocks) are added while 3 blocks are free: neither fits, both
    wait.  When n1 finishes its 5 blocks come back (8 free): the heap gives u2 (added later)
    first, which takes 4; n3 needs 5 of the 4 left and the loop breaks, so u2 runs alone first
    (in arrival order n3 would have run alone first)."""
    e = engine(kv_capacity_blocks=8)
    e.set_script("n1", "ab")  # a short plan: finishes after a few tokens
    e.add("n1", ids(100, 17), 8, priority=1)
    assert stepped(e) == ["n1"] and e.stats().kv_free_blocks == 3
    e.add("n3", ids(300, 19), 8, priority=1)
    e.add("u2", ids(400), 8, priority=0)
    firsts: list[list[str]] = []
    for _ in range(60):
        out = [g for g in stepped(e) if g != "n1"]
        if out:
            firsts.append(out)
        if not e.has_unfinished():
            break
    assert firsts[0] == ["u2"] and {g for f in firsts for g in f} == {"u2", "n3"}
    e.check_invariants()


# -------------------------------------------------------------------------------- planner level

class _Dispatcher:
    def __init__(self) -> None:
        self.goals: list = []

    def dispatch(self, goal) -> None:
        self.goals.append(goal)

    def cancel(self, request_id) -> None:
        pass


def _planner(max_num_seqs: int) -> tuple[Planner, SimulatedEngine, VirtualClock]:
    clock = VirtualClock()
    tok = SimTokenizer()
    policy = make_policy("vllm-priority")
    eng = SimulatedEngine(clock, tokenizer=tok, scheduling_policy=policy.engine_scheduling)
    planner = Planner(clock=clock, engine=eng, dispatcher=_Dispatcher(), robots=ROBOTS, policy=policy,
                      estimator=ExecTimeEstimator(ROBOTS), prompts=SimPromptSource(eng, tok, robots=ROBOTS),
                      config=PlannerConfig())
    planner.use_batching(None, max_num_seqs)
    return planner, eng, clock


# No blocking statement: what follows one is held until the robot answers (the planner's rule for
# results the model was not given, core/speculation.py), and this test's dispatcher never answers.
STREAMED_PLAN = "g('cat');mf(50);tp;"


def _req(rid: str, tuf, category: str, t: float, n: int = 3) -> PlanRequest:
    return PlanRequest(rid, f"r-{rid}", "tello", "find the cat", "cat, sofa", tuf, t, category=category,
                       reference_plan=STREAMED_PLAN * n)


def test_full_batch_is_not_displaced_and_urgent_goes_first_in_the_queue() -> None:
    """max_num_seqs 2: a, b (normal) run; c (normal) then u (urgent, later) wait.  u does not
    displace a or b (the waiting loop stops at max_num_seqs), and takes the first free slot
    before c, which arrived earlier (heap order).  The engine got each request's priority."""
    p, eng, clock = _planner(2)
    for rid, n in (("a", 2), ("b", 8)):  # a ends first: one slot frees
        assert p.submit(_req(rid, NORMAL, "normal", clock.now(), n)).accepted
    p.step()
    assert {g.gen_id for g in p.live() if g.state is GenState.RUNNING} == {"a", "b"}
    assert p.submit(_req("c", NORMAL, "normal", clock.now())).accepted
    clock.advance(0.001)
    assert p.submit(_req("u", URGENT, "urgent", clock.now())).accepted
    p.step()
    running = {g.gen_id for g in p.live() if g.state is GenState.RUNNING}
    assert running == {"a", "b"}  # not displaced
    assert {s.gen_id: s.priority for s in eng._seqs.values()} == {"a": 1, "b": 1}
    started: list[str] = []
    for _ in range(5000):
        p.step()
        for g in p.live():
            if g.state is not GenState.QUEUED and g.gen_id in ("c", "u") and g.gen_id not in started:
                started.append(g.gen_id)
        if len(started) == 2:
            break
    assert started[0] == "u" and p.generations["b"].state is GenState.RUNNING  # u took a's slot; c waits for b's
    assert p.generations["u"].num_preemptions == 0


def test_planner_refuses_an_fcfs_engine_for_vllm_priority() -> None:
    clock = VirtualClock()
    eng = SimulatedEngine(clock)
    with pytest.raises(ValueError, match="scheduling_policy='priority'"):
        Planner(clock=clock, engine=eng, dispatcher=_Dispatcher(), robots=ROBOTS,
                policy=make_policy("vllm-priority"), estimator=ExecTimeEstimator(ROBOTS),
                prompts=SimPromptSource(eng, robots=ROBOTS))

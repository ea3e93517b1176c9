"""Several engines behind one planner, in the simulator (engines/sim_pool.py over engines/pool.py).

- a pool of one engine is that engine: byte-identical results, policies with preemption included;
- N engines: deterministic, every request terminal, work spread over the engines, and each
  generation's text is the one a single engine produces (resumes elsewhere continue the script);
- the default policy's step-time model learns one member's iterations (not the pool's steps, in
  which members run side by side), so its step-time cap holds per engine;
- an engine lost mid-run: its generations are re-queued on the others (counted), nothing is lost.
"""

from __future__ import annotations

import pytest

from timelyllm_ros.core.engine import EngineError
from timelyllm_ros.core.metrics import to_json
from timelyllm_ros.core.types import GenState
from timelyllm_ros.engines.sim_pool import SimulatedPool
from timelyllm_ros.sim.runner import run_simulation


def texts(result) -> dict[str, tuple[str, str]]:
    return {g.gen_id: (g.state.value, g.text) for g in result.generations}


@pytest.mark.parametrize("workload,policy", [("WID1", "timelyllm"), ("WID2", "lamps"), ("WID3", "vllm"),
                                             ("drones:200", "default")])
def test_a_pool_of_one_engine_is_that_engine(workload, policy):
    alone = run_simulation(workload, policy)
    pooled = run_simulation(workload, policy, pooled=True)
    assert to_json(pooled.metrics) == to_json(alone.metrics)
    assert pooled.virtual_end_s == alone.virtual_end_s
    assert pooled.engine["steps"] == alone.engine["steps"]
    assert pooled.engine["generations_lost"] == 0


@pytest.mark.parametrize("policy", ["timelyllm", "lamps"])
def test_n_engines_deterministic_spread_and_same_texts(policy):
    one = run_simulation("drones:150", policy)
    a = run_simulation("drones:150", policy, engines=3)
    b = run_simulation("drones:150", policy, engines=3)
    assert to_json(a.metrics) == to_json(b.metrics)
    adds = a.engine["adds_per_engine"]
    assert sorted(adds) == ["e0", "e1", "e2"] and min(adds.values()) > 0, adds
    assert sum(adds.values()) > len(a.generations)  # resumes happened
    assert a.engine["generations_lost"] == 0
    assert texts(a) == texts(one)  # every generation says what it says on one engine
    # three engines serve the same arrivals no later than one (urgent utility, % of max)
    u1 = one.metrics["by_category"]["urgent"]["utility_pct_of_max"]
    u3 = a.metrics["by_category"]["urgent"]["utility_pct_of_max"]
    assert u3 >= u1


def test_the_step_time_model_learns_one_members_iterations_behind_a_pool():
    """A pool step ends when the first member's iteration ends, with that member's outputs: fed
    to the step-time model it made the model's per-generation cost meaningless (fitted negative
    at drones:1000 on 4 engines: no cap, or one engine's cap over the whole pool).  Fed each
    member iteration (`EnginePool.member_steps`), the model of a pool is that of one engine."""
    def run(n, engines):
        box = {}

        def keep(planner, arrivals):
            box["planner"] = planner
            return arrivals

        run_simulation(f"drones:{n}", "default", engines=engines, engine_kind="stock", setup=keep)
        return box["planner"]

    one, pool = run(200, 1), run(600, 3)
    a1, b1 = one.policy._steps.least_squares()
    a3, b3 = pool.policy._steps.least_squares()
    assert b1 > 0 and b3 == pytest.approx(b1, rel=0.1) and a3 == pytest.approx(a1, rel=0.1)
    assert pool.context().engines == 3 and one.context().engines == 1
    assert pool.policy.step_cap(pool.context(), 0) == one.policy.step_cap(one.context(), 0)


def test_a_pool_reports_each_member_iteration():
    """`EnginePool.member_steps` (the path of real engines: members stepped one after another):
    one (duration, outputs) per member that stepped, timed on the pool's clock."""
    from timelyllm_ros.core.clock import VirtualClock
    from timelyllm_ros.engines.pool import EnginePool
    from timelyllm_ros.engines.simulated import SimulatedEngine

    clock = VirtualClock()
    a, b = SimulatedEngine(clock), SimulatedEngine(clock)
    pool = EnginePool({"a": a, "b": b}, clock=clock)
    a.set_script("g1", "tp;")
    b.set_script("g2", "tp;")
    b.set_script("g3", "tp;")
    pool.assign("g1", "a")
    pool.add("g1", [1, 2, 3], 4)
    pool.assign("g2", "b")
    pool.add("g2", [1, 2, 3], 4)
    pool.assign("g3", "b")
    pool.add("g3", [4, 5, 6], 4)
    t0 = clock.now()
    outs = pool.step()
    steps = pool.member_steps()
    assert [n for _, n in steps] == [1, 2] and len(outs) == 3
    assert all(dt > 0 for dt, _ in steps) and sum(dt for dt, _ in steps) == pytest.approx(clock.now() - t0)


def test_a_lost_engine_moves_its_generations_to_the_others():
    crash_at = 20.0

    def crash_e1_later(planner, arrivals):
        pool = planner.engine
        assert isinstance(pool, SimulatedPool)
        sim = pool.member("e1")
        real_step = sim.step

        def step():
            if sim.clock.now() >= crash_at:
                raise EngineError("simulated GPU failure")
            return real_step()

        sim.step = step
        return arrivals

    ok = run_simulation("WID1", "timelyllm", engines=2)
    hit = run_simulation("WID1", "timelyllm", engines=2, setup=crash_e1_later)
    assert hit.engine["generations_lost"] >= 1
    lost = [g for g in hit.generations if g.engine_lost]
    assert len(lost) == hit.engine["generations_lost"]
    assert all(g.state is GenState.FINISHED for g in lost)
    assert texts(hit) == texts(ok)  # every request ends as it does without the failure
    after = {k: v for k, v in hit.engine["adds_per_engine"].items()}
    assert after["e0"] > ok.engine["adds_per_engine"]["e0"]  # e0 took over e1's work


def test_engine_count_is_validated():
    with pytest.raises(ValueError, match="engine count must be an int >= 1"):
        run_simulation("WID1", "timelyllm", engines=0)

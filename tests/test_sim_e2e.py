"""End-to-end simulation: invariants for every policy, exact timings of a lone request, robot
lanes vs exclusive agents, determinism of the JSON, and the runaway guard."""

from __future__ import annotations

import textwrap

import pytest

from timelyllm_ros.core.metrics import to_json
from timelyllm_ros.core.policies import policy_names
from timelyllm_ros.core.robots import load_robots
from timelyllm_ros.workloads.format import load_workload
from timelyllm_ros.workloads.catalog import load_tasks
from timelyllm_ros.sim.runner import EventLoop, SimulationError, run_simulation

SHORT = """
name: short
duration_s: 16
seed: 11
events: {rate_per_s: 0.4, max_tasks_per_event: 4}
agents: {tello: 6, arm: 2, chat: 2}
traces: [T1, T2, T4, T6, T7, T8, T10, T11, C1]
tuf:
  normal: {ert: 1.0, alpha: -2.0, beta: 1.0}
  urgent: {ert: 0.2, alpha: -6.67, beta: 2.0}
  chat: {ert: 1.0, alpha: -2.0, beta: 1.0}
requests:
  - {time: 0.5, task: T9, scene: 1}
  - {time: 0.5, task: T6, scene: 0}
"""


# Trail's default predictor is a trained model built by a script (models/length-predictor); the
# oracle predictor exercises the same scheduling path without that artifact.
PARAMS = {"trail": {"predictor": "oracle"}}


@pytest.fixture(scope="module")
def robots():
    return load_robots()


@pytest.fixture(scope="module")
def catalog(robots):
    return load_tasks(robots=robots)


@pytest.fixture(scope="module")
def short(tmp_path_factory):
    p = tmp_path_factory.mktemp("wl") / "short.yaml"
    p.write_text(textwrap.dedent(SHORT))
    return load_workload(p)


def _check_invariants(r, n_expected):
    assert len(r.generations) == n_expected
    assert all(g.state.terminal for g in r.generations)
    rows = r.metrics["requests"]
    assert len(rows) == n_expected
    for m in rows:
        assert m["state"] in ("finished", "failed", "cancelled")
        if m["response_s"] is not None:
            assert m["response_s"] >= 0
            assert m["waiting_s"] >= 0
            assert m["execution_s"] > 0
            assert m["completion_s"] == pytest.approx(m["waiting_s"] + m["execution_s"])
            assert m["waiting_s"] >= m["response_s"] - 1e-12
    for g in r.generations:
        prev_end = None
        for s in g.segments:
            assert s.gen_end >= s.gen_start >= g.request.arrival - 1e-12
            if s.exec_start is not None:
                assert s.dispatched_at is not None and s.exec_start >= s.dispatched_at + 0.008 - 1e-9
                if prev_end is not None:
                    assert s.exec_start >= prev_end - 1e-12  # a robot runs one segment at a time
                prev_end = s.exec_end


def test_every_policy_finishes_with_sane_metrics(short, robots, catalog):
    from timelyllm_ros.workloads.format import expand

    n = len(expand(short, catalog, robots))
    assert n >= 8
    names = policy_names()
    assert {"timelyllm", "fcfs", "edf", "vllm", "vllm-stream"} <= set(names)
    for name in names:
        r = run_simulation(short, name, robots=robots, catalog=catalog, policy_params=PARAMS.get(name))
        _check_invariants(r, n)
        finished = sum(g.state.value == "finished" for g in r.generations)
        assert finished == n, (name, [(g.gen_id, g.reason) for g in r.generations if g.state.value != "finished"])


def test_same_seed_same_bytes_other_seed_differs(short, robots, catalog):
    a = to_json(run_simulation(short, "timelyllm", robots=robots, catalog=catalog).to_dict())
    b = to_json(run_simulation(short, "timelyllm", robots=robots, catalog=catalog).to_dict())
    assert a == b
    c = to_json(run_simulation(short, "timelyllm", seed=12, robots=robots, catalog=catalog).to_dict())
    assert c != a


def test_lone_request_timings_are_exact(tmp_path, robots, catalog):
    p = tmp_path / "one.yaml"
    p.write_text("name: one\nagents: {tello: 1}\ntuf: {urgent: {ert: 0.2, alpha: -6.67, beta: 2}}\n"
                 "network_latency_s: 0.008\nrequests:\n  - {time: 3.0, task: T6, scene: 0}\n")
    r = run_simulation(p, "timelyllm", robots=robots, catalog=catalog)
    (g,) = r.generations
    s0 = g.segments[0]
    assert g.state.value == "finished"
    assert s0.gen_start == pytest.approx(3.0)  # admitted the moment it arrives: the engine was idle
    assert s0.dispatched_at == pytest.approx(s0.gen_end)
    assert s0.exec_start == pytest.approx(s0.gen_end + 0.008)  # only the network latency
    m = r.metrics["requests"][0]
    assert m["response_s"] == pytest.approx(s0.exec_start - 3.0)
    # one prefill step (the prompt) + one decode step per further token of the first statement
    assert 0.02 < m["response_s"] < 0.6
    assert len(g.segments) == len([x for x in catalog["T6"].scenes[0].plan.split(";") if x])


def test_exclusive_agents_queue_behind_each_other(tmp_path, robots, catalog):
    p = tmp_path / "two.yaml"
    p.write_text("name: two\nagents: {tello: 1}\ntuf: {normal: {ert: 1, alpha: -2, beta: 1}}\n"
                 "requests:\n  - {time: 0, task: T1, scene: 3}\n  - {time: 1, task: T1, scene: 3}\n")
    lanes = run_simulation(p, "timelyllm", robots=robots, catalog=catalog)
    excl = run_simulation(p, "timelyllm", robots=robots, catalog=catalog, exclusive_agents=True)
    r_l = {m["request_id"]: m for m in lanes.metrics["requests"]}
    r_e = {m["request_id"]: m for m in excl.metrics["requests"]}
    first, second = sorted(r_l)
    assert r_l[second]["response_s"] < 1.0  # its own lane: starts right after planning
    assert r_e[second]["response_s"] > 2.0  # waits for the robot's first task (a scan of >= 2.8 s)
    assert excl.planner["agent_conflicts"] == 1 and excl.planner["exclusive_agents"] is True
    assert r_l[first]["response_s"] == pytest.approx(r_e[first]["response_s"])


def test_fixed_batch_cap_is_respected(short, robots, catalog):
    r = run_simulation(short, "vllm", max_batch=1, robots=robots, catalog=catalog)
    assert r.batcher == "fixed(1)"
    # one sequence at a time: no two statements are ever generated at the same time (a whole plan
    # waits at a blocking statement for the robot's result, core/speculation.py: another one runs then)
    spans = sorted((x.gen_start, x.gen_end) for g in r.generations for x in g.segments)
    assert all(b[0] >= a[1] - 1e-9 for a, b in zip(spans, spans[1:]))
    wide = run_simulation(short, "vllm", robots=robots, catalog=catalog)
    spans = sorted((x.gen_start, x.gen_end) for g in wide.generations for x in g.segments)
    assert any(b[0] < a[1] - 1e-9 for a, b in zip(spans, spans[1:]))  # default batching does overlap them
    with pytest.raises(ValueError):
        run_simulation(short, "vllm", max_batch=0, robots=robots, catalog=catalog)


def test_runaway_guard_raises_clear_error(short, robots, catalog):
    with pytest.raises(SimulationError, match="virtual time passed"):
        run_simulation(short, "timelyllm", robots=robots, catalog=catalog, max_overrun_s=0.5)


def test_unknown_policy_is_a_value_error(short, robots, catalog):
    with pytest.raises(ValueError, match="unknown policy"):
        run_simulation(short, "nope", robots=robots, catalog=catalog)


def test_event_loop_orders_by_time_then_insertion():
    from timelyllm_ros.core.clock import VirtualClock

    clock = VirtualClock()
    loop = EventLoop(clock)
    seen = []
    loop.schedule(2.0, lambda: seen.append(("b", loop.view.now())))
    loop.schedule(1.0, lambda: seen.append(("a", loop.view.now())))
    loop.schedule(2.0, lambda: seen.append(("c", loop.view.now())))
    clock.advance_to(5.0)
    assert loop.fire_due() == 3
    assert seen == [("a", 1.0), ("b", 2.0), ("c", 2.0)]  # robots see the event's own time
    assert loop.view.now() == 5.0


def test_custom_tokenizer_and_prompts_drive_the_simulation(short, robots, catalog):
    """run_simulation(tokenizer=, prompts=): the given prompt source decides what each request's
    simulated LLM generates (`timelyllm profile check` replays a real model's plans this way)."""
    from timelyllm_ros.sim.prompts import SimPromptSource
    from timelyllm_ros.core.tokenizer import SimTokenizer

    tok, asked = SimTokenizer(), []

    def prompts(engine):
        base = SimPromptSource(engine, tok, robots=robots)

        class OnlyTakeoff:
            def prompt_ids(self, request):
                asked.append(request.request_id)
                ids = base.prompt_ids(request)  # registers the reference plan ...
                engine.set_script(request.request_id, "tc(90);" if request.robot_type == "tello"
                                  else request_plan(request))  # ... which we replace for drones
                return ids

            def result_ids(self, request, segment, value):
                return base.result_ids(request, segment, value)

        return OnlyTakeoff()

    plans = {}

    def request_plan(request):
        return plans.setdefault(request.request_id, next(a.reference_plan for a in arrivals
                                                         if a.request_id == request.request_id))

    arrivals = []

    def setup(planner, arr):
        arrivals.extend(arr)
        return arr

    r = run_simulation(short, "timelyllm", robots=robots, catalog=catalog, tokenizer=tok, prompts=prompts,
                       setup=setup)
    _check_invariants(r, len(arrivals))
    assert sorted(asked) == sorted(a.request_id for a in arrivals)
    drones = [g for g in r.generations if g.request.robot_type == "tello"]
    assert drones and all(g.text == "tc(90);" for g in drones if g.state.value == "finished")


def test_replay_simulates_the_stock_engine_the_real_runs_were_served_on(short, robots, catalog):
    """`sim.replay` re-simulates runs of vLLM as users run it (spot checks, `timelyllm profile
    check`, the demo's comparison): its simulated engine is stock (abort frees the KV, a resume goes
    through the prefix cache), so no policy keeps KV the real run could not; a preserve-capable
    engine only when asked for."""
    from pathlib import Path

    from timelyllm_ros.core.tokenizer import SimTokenizer
    from timelyllm_ros.sim.replay import replay
    from timelyllm_ros.workloads.format import expand

    arrivals = expand(short, catalog, robots, seed=short.seed)
    plans = {a.request_id: a.reference_plan for a in arrivals}
    profile = Path(__file__).resolve().parents[1] / "profiles" / "vllm_cpu_tiny.yaml"
    args = dict(profile_path=profile, robots=robots, policy="default")
    stock = replay(short, plans, tokenizer=SimTokenizer(), **args)  # the default
    preserve = replay(short, plans, tokenizer=SimTokenizer(), engine_kind="preserve", **args)
    for r in (stock, preserve):
        _check_invariants(r, len(arrivals))
    assert (stock.engine["kind"], "preserve" in stock.engine["kv_modes"]) == ("stock", False)
    assert (preserve.engine["kind"], "preserve" in preserve.engine["kv_modes"]) == ("preserve", True)

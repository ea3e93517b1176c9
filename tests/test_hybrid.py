"""Hybrid offline-online (Pang et al.): P||Cmax planner against brute force, the lower bounds,
and the PD-competition simulator's rules on small hand-checked batches."""

import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timelyllm_ros.offline.batch import (BatchRequest, PDLatency, PlanError, fit_clipped_normal,
                                         generate_requests, parse_batch)
from timelyllm_ros.offline.makespan import branch_and_bound, improve, lower_bound, lpt, solve
from timelyllm_ros.offline.pd_sim import STRATEGIES, Strategy, lower_bounds, simulate


def brute_force(ts, J):
    best = math.inf
    for a in itertools.product(range(J), repeat=len(ts)):
        loads = [0] * J
        for i, j in enumerate(a):
            loads[j] += ts[i]
        best = min(best, max(loads))
    return best


# ------------------------------------------------------------------ P||Cmax
def test_lpt_hand_example():
    # Graham's classic LPT worst case for J=2: 3,3,2,2,2 -> LPT 7, optimum 6 (3+3 | 2+2+2)
    a = lpt([3, 3, 2, 2, 2], 2)
    assert a.makespan == 7
    assert a.slot[:2] == (0, 1)  # two longest on different slots
    assert brute_force([3, 3, 2, 2, 2], 2) == 6
    assert solve([3, 3, 2, 2, 2], 2).makespan == 6
    assert solve([3, 3, 2, 2, 2], 2).optimal


def test_lower_bound_terms():
    assert lower_bound([5, 1, 1], 3) == 5  # longest job
    assert lower_bound([2, 2, 2, 1], 2) == 4  # ceil(7 / 2)
    assert lower_bound([4, 4, 4], 2) == 8  # two of the J+1 = 3 longest share a slot
    assert lower_bound([1.5, 1.5], 2) == 1.5


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 30), min_size=1, max_size=7), st.integers(1, 4))
def test_lpt_bnb_and_bound_against_brute_force(ts, J):
    opt = brute_force(ts, J)
    a = lpt(ts, J)
    assert opt <= a.makespan <= (4 / 3 - 1 / (3 * J)) * opt + 1e-9  # Graham's bound
    assert lower_bound(ts, J) <= opt
    b = branch_and_bound(ts, J)
    assert b.makespan == opt and b.optimal
    s = solve(ts, J)
    assert s.makespan == opt
    assert improve(a, ts).makespan <= a.makespan
    for x in (a, b, s):  # every job on exactly one slot, loads consistent
        assert len(x.slot) == len(ts) and all(0 <= j < J for j in x.slot)
        assert sum(x.loads) == sum(ts)


def test_bnb_node_limit_returns_incumbent_unproven():
    rng = random.Random(3)
    ts = [rng.randint(10, 99) for _ in range(24)]
    b = branch_and_bound(ts, 5, node_limit=5)
    assert b.nodes <= 5 and sum(b.loads) == sum(ts)
    assert b.makespan >= lower_bound(ts, 5)
    # proven only when the incumbent meets the bound (5 nodes cannot exhaust the search)
    assert b.optimal == (b.makespan <= lower_bound(ts, 5))
    full = branch_and_bound(ts, 5)
    assert full.optimal and full.makespan <= b.makespan


def test_large_instance_certified_by_bound():
    reqs = generate_requests(1319, 0, {"mean": 68.43, "std": 25.04, "min": 1},
                             {"mean": 344.83, "std": 187.99, "min": 1, "max": 512})
    a = solve([r.output_tokens for r in reqs], 200)
    lb = lower_bound([r.output_tokens for r in reqs], 200)
    assert lb <= a.makespan <= lb + 1  # within one token round of the bound
    assert a.makespan < lpt([r.output_tokens for r in reqs], 200).makespan


@pytest.mark.parametrize("bad", [([1, -1], 2), ([1, float("nan")], 2), ([1], 0), ([True], 1)])
def test_bad_instances_rejected(bad):
    with pytest.raises(PlanError):
        lpt(*bad)


# ------------------------------------------------------------------ batch files
def test_clipped_normal_fit_matches_moments():
    reqs = generate_requests(20000, 1, {"mean": 68.43, "std": 25.04, "min": 1},
                             {"mean": 344.83, "std": 187.99, "min": 1, "max": 512})
    out = [r.output_tokens for r in reqs]
    mean = sum(out) / len(out)
    std = math.sqrt(sum((x - mean) ** 2 for x in out) / len(out))
    assert abs(mean - 344.83) < 4 and abs(std - 187.99) < 4
    assert max(out) == 512 and min(out) >= 1
    with pytest.raises(PlanError):
        fit_clipped_normal(300, 400, 1, 512)  # impossible spread


def test_parse_batch_validates():
    b = parse_batch({"slots": 2, "requests": [{"id": "a", "input_tokens": 3, "output_tokens": 4}]})
    assert b.requests[0].est_output_tokens == 4 and b.latency.decode(200) == pytest.approx(0.071)
    for bad in ({"slots": 0, "requests": [{"input_tokens": 1, "output_tokens": 1}]},
                {"slots": 2},
                {"slots": 2, "requests": [{"id": "a", "input_tokens": 0, "output_tokens": 1}]},
                {"slots": 2, "requests": [{"id": "a", "input_tokens": 1, "output_tokens": 1},
                                          {"id": "a", "input_tokens": 1, "output_tokens": 1}]},
                {"slots": 2, "bogus": 1, "generate": {"n": 1}},
                "not a mapping"):
        with pytest.raises(PlanError):
            parse_batch(bad)


# ------------------------------------------------------------------ PD-competition simulator
LAT = PDLatency(prefill_s_per_token=0.001, prefill_base_s=0.01, decode_s_per_token=0.002,
                decode_base_s=0.02)


def test_baseline_hand_computed():
    # 2 slots, 3 requests: prefill(a,b) = 0.01 + 0.001*20 = 0.03; a decodes 2, b 3 tokens.
    reqs = [BatchRequest("a", 10, 2, 2), BatchRequest("b", 10, 3, 3), BatchRequest("c", 5, 1, 1)]
    r = simulate(reqs, 2, LAT, STRATEGIES["baseline"])
    d2 = 0.02 + 0.002 * 2
    p_ab, p_c = 0.01 + 0.020, 0.01 + 0.005
    # a ends after 2 rounds; prefill-first: c is prefilled at once, then b and c decode together
    expected = p_ab + 2 * d2 + p_c + d2
    assert r.total_s == pytest.approx(expected)
    assert r.prefill_stages == 2 and r.decode_rounds == 3 and r.finished == 3
    busy = p_ab * 2 + 2 * d2 * 2 + p_c * 1 + d2 * 2
    assert r.utilisation == pytest.approx(busy / (2 * expected))
    assert r.end["a"] == pytest.approx(p_ab + 2 * d2)


def test_online_iteration_rule_defers_prefill():
    # With the rule, c's prefill (0.015 s) waits until accumulated decode time exceeds it.
    reqs = [BatchRequest("a", 10, 1, 1), BatchRequest("b", 10, 5, 5), BatchRequest("c", 5, 1, 1)]
    base = simulate(reqs, 2, LAT, STRATEGIES["baseline"])
    rule = simulate(reqs, 2, LAT, Strategy(online_iteration=True))
    # after the first prefill, C_d = one round (0.024) >= C_p (0.015): a prefill would run, so
    # both run c right after a's single round; check the C_p >= C_d branch on a bigger prompt:
    big = [BatchRequest("a", 10, 1, 1), BatchRequest("b", 10, 5, 5), BatchRequest("c", 50, 1, 1)]
    rule_big = simulate(big, 2, LAT, Strategy(online_iteration=True))
    base_big = simulate(big, 2, LAT, STRATEGIES["baseline"])
    assert rule.total_s == pytest.approx(base.total_s)
    # C_p = 0.06: after round 1 (a, b: 0.024 s) C_d < C_p, so b decodes alone twice (0.022 s
    # each) until C_d = 0.068 > 0.06; then c is prefilled
    assert rule_big.start["c"] > base_big.start["c"]
    assert rule_big.start["c"] == pytest.approx(0.03 + 0.024 + 2 * 0.022)


def test_online_requests_sorts_and_steals():
    # offline plan puts both long jobs on slot 0 (forced), online stealing moves one to slot 1
    reqs = [BatchRequest("a", 1, 10, 10), BatchRequest("b", 1, 10, 10), BatchRequest("c", 1, 1, 1)]
    from timelyllm_ros.offline.makespan import Assignment
    plan = Assignment(slot=(0, 0, 1), loads=(20, 1), method="forced", lower_bound=10, optimal=False)
    off = simulate(reqs, 2, LAT, Strategy(offline=True), plan=plan)
    both = simulate(reqs, 2, LAT, Strategy(offline=True, online_requests=True), plan=plan)
    assert both.steals == 1 and off.steals == 0
    assert both.total_s < off.total_s


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_request_terminal_and_bounds_hold(name):
    reqs = generate_requests(300, 5, {"mean": 68.43, "std": 25.04, "min": 1},
                             {"mean": 344.83, "std": 187.99, "min": 1, "max": 512})
    lat = PDLatency()
    r = simulate(reqs, 40, lat, STRATEGIES[name])
    assert r.finished == len(reqs) == len(r.end) == len(r.start)
    assert all(r.end[q.id] > r.start[q.id] for q in reqs)
    lb = lower_bounds(reqs, 40, lat)
    assert r.total_s >= lb.strict_s - 1e-9
    assert 0 < r.utilisation <= 1


# ------------------------------------------------------------------ the planner policy
def _pctx(running=()):
    from timelyllm_ros.core.exec_time import ExecTimeEstimator
    from timelyllm_ros.core.policies import PolicyContext
    from timelyllm_ros.core.robots import load_robots
    from timelyllm_ros.engines.base import EngineStats
    robots = load_robots()
    return PolicyContext(estimator=ExecTimeEstimator(robots), robots=robots,
                         stats=EngineStats(1000, 1000, 16, 0, 45.0), seg_gen_s=0.1, token_s=0.02,
                         running=running)


def _g(rid, prompt, state="queued", arrival=0.0):
    from timelyllm_ros.core.tuf import NORMAL
    from timelyllm_ros.core.types import Generation, GenState, PlanRequest
    g = Generation(request=PlanRequest(rid, "d1", "tello", "t", "s", NORMAL, arrival))
    g.prompt_ids = [7] * 32 + [len(rid) * 1000 + prompt] * (prompt - 32)  # 32 shared tokens
    g.state = GenState(state)
    return g


def test_hybrid_policy_longest_first_and_pd_rule():
    from timelyllm_ros.core.kv_handling import KVCostModel
    from timelyllm_ros.core.policies import make_policy
    cost = KVCostModel(prefill_s_per_token=1e-3, prefill_base_s=0.01, block_size=16)
    p = make_policy("hybrid", cost=cost)
    short, long_, resumed = _g("s", 100), _g("ll", 300), _g("rrr", 200, state="suspended")
    # nothing running: new generations go at once, longest total length first
    sel = p.select([short, long_, resumed], [], _pctx(), 0.0)
    assert [g.gen_id for g in sel.order] == ["ll", "rrr", "s"]
    # running batch: C_p = 0.01 + 1e-3 * (private 68 + 268) = 0.346 s of prefill stall
    run = [_g("x", 50, state="running")]
    sel = p.select([short, long_, resumed], run, _pctx(run), 0.0)
    assert [g.gen_id for g in sel.order] == ["rrr"] and p.held == 1  # new ones held, resumed one runs
    sel = p.select([short, long_], run, _pctx(run), 0.3)  # C_d = 0.3 < 0.346: still held
    assert sel.order == []
    sel = p.select([short, long_], run, _pctx(run), 0.35)  # C_d = 0.35 > C_p: prefill all together
    assert [g.gen_id for g in sel.order] == ["ll", "s"] and p.decode_since_prefill == 0.0
    # without the rule nothing is held
    q = make_policy("hybrid", cost=cost, pd_rule=False)
    q.select([short], [], _pctx(), 0.0)
    assert q.select([short, long_], run, _pctx(run), 0.0).order == [long_, short]


def test_hybrid_policy_in_simulator_every_request_terminal():
    """The hybrid policy drives the planner on a short LRTrace replay: nothing is held forever."""
    import dataclasses

    from timelyllm_ros.workloads.format import load_workload
    from timelyllm_ros.sim.runner import run_simulation

    wl = dataclasses.replace(load_workload("WID1"), duration_s=20.0)
    r = run_simulation(wl, "hybrid", max_batch=16)
    assert r.generations and all(g.state.terminal for g in r.generations)
    assert sum(g.state.value == "finished" for g in r.generations) == len(r.generations)


def test_plan_offline_cli(tmp_path, capsys):
    import json

    import yaml

    from timelyllm_ros.cli import main
    f = tmp_path / "b.yaml"
    f.write_text(yaml.safe_dump({"slots": 2, "requests": [
        {"id": f"r{i}", "input_tokens": 10, "output_tokens": t} for i, t in enumerate([3, 3, 2, 2, 2])]}))
    out = tmp_path / "plan.json"
    assert main(["plan-offline", str(f), "--simulate", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "makespan 6 decode rounds" in text and "proven optimal" in text and "offline+online" in text
    plan = json.loads(out.read_text())
    loads = [0, 0]
    for rid, slot in plan["assignment"].items():
        loads[slot] += [3, 3, 2, 2, 2][int(rid[1:])]
    assert sorted(loads) == [6, 6] and plan["optimal"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("slots: 0\nrequests: []\n")
    assert main(["plan-offline", str(bad)]) == 2
    assert "slots" in capsys.readouterr().err

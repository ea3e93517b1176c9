"""Trail policy: SPRPT order, limited-preemption thresholds, preemption decisions on small queues."""

import math
import statistics

import pytest

from timelyllm_ros.core.exec_time import ExecTimeEstimator
from timelyllm_ros.core.length_predictor import NoisyOraclePredictor, OraclePredictor
from timelyllm_ros.core.policies import DispatchMode, PolicyContext, make_policy, policy_names
from timelyllm_ros.core.policies.trail import Trail
from timelyllm_ros.core.robots import load_robots
from timelyllm_ros.core.tuf import NORMAL
from timelyllm_ros.core.types import Generation, GenState, PlanRequest
from timelyllm_ros.engines.base import EngineStats

ROBOTS = load_robots()
WORDS = lambda s: len(s.split())  # noqa: E731  hand-countable "tokenizer": one token per word


def ctx():
    return PolicyContext(estimator=ExecTimeEstimator(ROBOTS), robots=ROBOTS,
                         stats=EngineStats(1000, 1000, 16, 0, 45.0), seg_gen_s=0.1, token_s=0.022)


def gen(rid, words, age=0, arrival=0.0, state=GenState.QUEUED):
    """A chat generation whose reference reply has `words` tokens (+1 EOS) and `age` generated."""
    req = PlanRequest(rid, "u", "chat", "t", "", NORMAL, arrival, category="chat",
                      reference_plan=" ".join(["w"] * words))
    g = Generation(request=req, state=state, ready_since=arrival)
    g.output_ids = list(range(age))
    return g


def trail(c=0.8):
    return Trail(c=c, predictor=OraclePredictor(WORDS))


def test_registry_and_parameters():
    assert "trail" in policy_names()
    p = make_policy("trail", c=0.5, predictor="oracle")
    assert p.c == 0.5 and p.mode is DispatchMode.STREAM
    assert make_policy("trail", predictor="oracle", mode="suspend").mode is DispatchMode.SUSPEND
    for bad in ({"c": 0}, {"c": -1}, {"mode": "x"}, {"predictor": "psychic"}, {"kv": "lost"}):
        with pytest.raises(ValueError):
            make_policy("trail", **{"predictor": "oracle", **bad})


def test_sprpt_order_over_ready_with_fcfs_ties():
    p = trail()
    a, b, c = gen("a", 30, arrival=0.0), gen("b", 5, arrival=1.0), gen("c", 10, arrival=2.0)
    d = gen("d", 10, arrival=1.5)  # same remaining as c, earlier
    sel = p.select([a, b, c, d], [], ctx(), 3.0)
    assert [g.gen_id for g in sel.order] == ["b", "d", "c", "a"]
    assert sel.preempt == []
    # remaining = total (words + EOS) - age
    assert p.remaining(gen("x", 30, age=12)) == 31 - 12


def test_limited_preemption_threshold():
    # r0 = 101 (100 words + EOS); c = 0.5 -> preemptable while age < 50.5
    p = trail(c=0.5)
    assert not p.pinned(gen("x", 100, age=50))
    assert p.pinned(gen("x", 100, age=51))
    # c = 0.2 -> threshold 20.2; c = 1 -> 101
    assert trail(0.2).pinned(gen("x", 100, age=21)) and not trail(0.2).pinned(gen("x", 100, age=20))
    assert not trail(1.0).pinned(gen("x", 100, age=100)) and trail(1.0).pinned(gen("x", 100, age=101))
    assert not Trail(c=math.inf, predictor=OraclePredictor(WORDS)).pinned(gen("x", 100, age=10_000))


def _blocked(g):
    g.blocked = "batch full (2)"
    return g


def test_preempts_longest_preemptable_when_batch_full():
    p = trail(c=0.8)
    long_young = gen("long", 200, age=10, state=GenState.RUNNING)  # remaining 191, threshold 160.8
    pinned = gen("pinned", 300, age=250, state=GenState.RUNNING)  # remaining 51 but pinned
    short = _blocked(gen("short", 4))  # remaining 5
    sel = p.select([short], [long_young, pinned], ctx(), 1.0)
    assert [g.gen_id for g in sel.preempt] == ["long"]
    assert [g.gen_id for g in sel.order] == ["short"]
    assert short.blocked is None  # the flag is consumed


def test_no_preemption_without_full_batch_or_better_rank():
    p = trail()
    running = [gen("r", 200, age=10, state=GenState.RUNNING)]
    assert p.select([gen("s", 4)], running, ctx(), 1.0).preempt == []  # batch not full
    worse = _blocked(gen("w", 500))  # remaining 501 > 191
    assert p.select([worse], running, ctx(), 1.0).preempt == []
    equal = _blocked(gen("e", 190))  # remaining 191 == 191: strict, no preemption
    assert p.select([equal], running, ctx(), 1.0).preempt == []


def test_pairs_one_for_one_in_rank_order():
    p = trail()
    r1 = gen("r1", 100, age=5, state=GenState.RUNNING)  # 96
    r2 = gen("r2", 60, age=5, state=GenState.RUNNING)  # 56
    r3 = gen("r3", 20, age=1, state=GenState.RUNNING)  # 20
    q1, q2, q3 = _blocked(gen("q1", 9)), gen("q2", 70), gen("q3", 3)  # 10, 71, 4
    sel = p.select([q1, q2, q3], [r1, r2, r3], ctx(), 1.0)
    # ready by rank: q3 (4), q1 (10), q2 (71); victims by rank desc: r1 (96), r2 (56), r3 (20)
    # q3 < r1 -> preempt r1; q1 < r2 -> preempt r2; q2 (71) > r3 (20) -> stop
    assert [g.gen_id for g in sel.preempt] == ["r1", "r2"]
    assert [g.gen_id for g in sel.order] == ["q3", "q1", "q2"]


def test_c_changes_who_can_be_preempted():
    running = gen("r", 100, age=30, state=GenState.RUNNING)  # remaining 71
    short = gen("s", 3)
    assert trail(c=0.8).select([_blocked(short)], [running], ctx(), 0).preempt == [running]
    assert trail(c=0.2).select([_blocked(short)], [running], ctx(), 0).preempt == []  # pinned at 20.2


def test_pinned_ready_generation_ranks_first():
    p = trail(c=0.2)
    resumed = gen("old", 100, age=40)  # pinned (40 >= 20.2), remaining 61
    fresh = gen("new", 5)
    assert [g.gen_id for g in p.select([fresh, resumed], [], ctx(), 0).order] == ["old", "new"]


def test_noisy_oracle_is_seeded_and_has_the_configured_spread():
    a = NoisyOraclePredictor(p=0.3, seed=7, count_tokens=WORDS)
    b = NoisyOraclePredictor(p=0.3, seed=7, count_tokens=WORDS)
    c = NoisyOraclePredictor(p=0.3, seed=8, count_tokens=WORDS)
    gs = [gen(f"g{i}", 99) for i in range(2000)]  # true total 100
    ra = [a.initial(g) for g in gs]
    gs2 = [gen(f"g{i}", 99) for i in range(2000)]
    assert ra == [b.initial(g) for g in gs2]
    assert ra != [c.initial(gen(f"g{i}", 99)) for i in range(2000)]
    rel = [(x - 100) / 100 for x in ra]
    assert abs(statistics.mean(rel)) < 0.03 and 0.27 < statistics.pstdev(rel) < 0.33
    exact = NoisyOraclePredictor(p=0.0, count_tokens=WORDS)
    assert exact.initial(gen("z", 99)) == 100


def test_oracle_without_reference_ranks_last_and_says_why():
    req = PlanRequest("x", "u", "chat", "t", "", NORMAL, 0.0)
    p = trail()
    g = Generation(request=req)
    short = gen("s", 4)
    sel = p.select([g, short], [], ctx(), 0)
    assert [x.gen_id for x in sel.order] == ["s", "x"]  # ranked as a 256-token reply
    assert "reference_plan" in g.policy.trail.error
    g.output_ids.append(1)
    p.on_token(g, 1, ctx())  # no exception from the token hook either


def test_on_token_records_pinning_age():
    p = trail(c=0.5)
    g = gen("g", 10, state=GenState.RUNNING)  # r0 = 11, pinned at age 5.5 -> 6
    for _ in range(8):
        g.output_ids.append(1)
        p.on_token(g, 1, ctx())
    assert g.policy.trail.pinned_at == 6 and g.policy.trail.r0 == 11

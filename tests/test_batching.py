"""Batch-size decisions of the latency-guided controller (§4.4) and the fixed cap."""

import pytest

from timelyllm_ros.core.batching import FixedBatch, LatencyGuidedBatch, kv_blocks_needed
from timelyllm_ros.core.tuf import NORMAL, URGENT
from timelyllm_ros.core.types import Generation, PlanRequest
from timelyllm_ros.engines.base import EngineStats


def gen(rid, arrival, tuf=NORMAL, seg_tokens=0):
    g = Generation(request=PlanRequest(rid, "d", "tello", "t", "s", tuf, arrival))
    g.seg_tokens = seg_tokens
    return g


def budget(g, now):
    return g.request.arrival + g.request.tuf.ert - now


def stats(free=1000, tps=40.0):
    return EngineStats(kv_total_blocks=1000, kv_free_blocks=free, block_size=16, running=1, tokens_per_s=tps)


def controller(**kw):
    return LatencyGuidedBatch(budget=budget, max_segment_tokens=lambda g: 12, **kw)


def test_admits_only_if_the_tightest_feasible_generation_keeps_its_budget():
    c = controller()  # slowdown margin 10 %
    running = [gen("u", arrival=0.0, tuf=URGENT, seg_tokens=4)]  # budget at t=0: 0.2 s
    # 8 tokens left at 45 tok/s: WCET 0.178 s <= 0.2 (feasible), but 0.178 * 1.1 = 0.196 <= 0.2 -> admit
    assert c.can_admit(running, gen("n", 0.0), stats(tps=45.0), now=0.0) == (True, "")
    # at 42 tok/s: WCET 0.190 <= 0.2 (feasible), 0.190 * 1.1 = 0.210 > 0.2 -> refuse
    ok, why = c.can_admit(running, gen("n", 0.0), stats(tps=42.0), now=0.0)
    assert not ok and "miss its budget" in why
    # later in the segment fewer tokens remain: 2 / 42 = 0.048 -> admit
    running[0].seg_tokens = 10
    assert c.can_admit(running, gen("n", 0.0), stats(tps=42.0), now=0.0)[0]


def test_generation_that_cannot_make_it_anyway_does_not_block_admission():
    c = controller()
    late = [gen("u", arrival=-1.0, tuf=URGENT)]  # budget negative
    assert c.can_admit(late, gen("n", 0.0), stats(tps=10.0), now=0.0)[0]
    # budget 0.2 s but 12 tokens at 40 tok/s need 0.3 s even now: refusing newcomers cannot save it
    hopeless = [gen("u", arrival=0.0, tuf=URGENT)]
    assert c.can_admit(hopeless, gen("n", 0.0), stats(tps=40.0), now=0.0)[0]


def test_most_urgent_is_the_least_slack():
    c = controller()
    # n1: budget 1.0, WCET 12/50 = 0.24 (slack 0.76); u: budget 0.2, 4 tokens left -> 0.08 (slack 0.12)
    running = [gen("n1", 0.0, NORMAL), gen("u", 0.0, URGENT, seg_tokens=8)]
    assert c.can_admit(running, gen("x", 0.0), stats(tps=50.0), now=0.115)[0] is False  # u: 0.088 > 0.085
    assert c.can_admit(running, gen("x", 0.0), stats(tps=50.0), now=0.0)[0]  # 0.088 <= 0.2


def test_kv_memory_and_caps():
    c = controller(max_batch=2)
    g = gen("x", 0.0)
    assert kv_blocks_needed(g, 12, 16) == 1
    assert not c.can_admit([], g, stats(free=5), now=0.0)[0]  # below the 1 % watermark
    assert c.can_admit([], g, stats(free=20), now=0.0)[0]
    assert not c.can_admit([gen("a", 0), gen("b", 0)], g, stats(tps=1e6), now=0.0)[0]
    f = FixedBatch(max_batch=1)
    assert f.can_admit([], g, stats(), 0.0)[0]
    assert f.can_admit([gen("a", 0)], g, stats(), 0.0) == (False, "batch full (1)")
    with pytest.raises(ValueError):
        FixedBatch(max_batch=0)

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


def test_admits_when_most_urgent_still_meets_budget():
    c = controller()
    running = [gen("u", arrival=0.0, tuf=URGENT, seg_tokens=2)]  # budget at t=0: 0.2 s
    # WCET = (12 - 2) / 40 = 0.25 s > 0.2 s -> refuse
    ok, why = c.can_admit(running, gen("n", 0.0), stats(tps=40.0), now=0.0)
    assert not ok and "miss its budget" in why
    # at 100 tok/s WCET = 0.1 s <= 0.2 s -> admit
    assert c.can_admit(running, gen("n", 0.0), stats(tps=100.0), now=0.0) == (True, "")
    # later in the segment fewer tokens remain: (12 - 10) / 40 = 0.05 <= 0.2
    running[0].seg_tokens = 10
    assert c.can_admit(running, gen("n", 0.0), stats(tps=40.0), now=0.0)[0]


def test_already_late_generation_does_not_block_admission():
    c = controller()
    running = [gen("u", arrival=-1.0, tuf=URGENT)]  # budget negative: cannot be saved
    assert c.can_admit(running, gen("n", 0.0), stats(tps=10.0), now=0.0)[0]


def test_most_urgent_is_the_least_budget():
    c = controller()
    running = [gen("n1", 0.0, NORMAL), gen("u", 0.0, URGENT)]
    assert not c.can_admit(running, gen("x", 0.0), stats(tps=50.0), now=0.0)[0]  # 0.24 > 0.2
    assert c.can_admit(running[:1], gen("x", 0.0), stats(tps=50.0), now=0.0)[0]  # 0.24 <= 1.0


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

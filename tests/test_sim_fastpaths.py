"""The simulator's speed-ups must give exactly what the plain code gives.

Each shortcut is checked against the plain version it replaced: the workload expansion's agent
choice (heaps vs scanning the pool), a generation's estimated previous-action end (from the last
measured segment vs the forward loop; TimelyLLM's inlined copy of it is checked against the formula
in test_scheduling_fastpaths.py), the latency-guided batch
controller's scan carried over between candidates, and the simulated engine's shared-prefix keys
for a new request (vs hashing its prompt block by block).
"""

from __future__ import annotations

import dataclasses
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from timelyllm_ros.workloads import format as workload_format
from timelyllm_ros.core.batching import LatencyGuidedBatch
from timelyllm_ros.core.clock import VirtualClock
from timelyllm_ros.core.engine import EngineStats
from timelyllm_ros.core.tuf import NORMAL, TUF
from timelyllm_ros.core.types import Generation, PlanRequest, Segment
from timelyllm_ros.core.latency_profile import LatencyProfile
from timelyllm_ros.engines.simulated import SimulatedEngine


def _gen(i: int, *, arrival: float = 0.0, tuf: TUF = NORMAL) -> Generation:
    req = PlanRequest(request_id=f"r{i}", robot_id="x", robot_type="tello", task="t", scene="", tuf=tuf,
                      arrival=arrival)
    return Generation(request=req)


def _forward_prev_end(g: Generation) -> float | None:
    """The plain forward loop over every segment (the code before the shortcut)."""
    end = None
    for seg in g.segments:
        if seg.exec_end is not None:
            end = seg.exec_end
            continue
        start = seg.exec_start if seg.exec_start is not None else (seg.dispatched_at or seg.gen_end)
        if end is not None:
            start = max(start, end)
        end = start + seg.est_exec_s
    return end


_F = st.floats(min_value=-50, max_value=50)
_T = st.one_of(st.none(), st.sampled_from([0.0, 1.0, 2.5]), _F)
_SEGS = st.lists(st.tuples(_F, _T, _T, _T, st.sampled_from([0.0, 0.5, 3.0])), max_size=6)


def _with_segments(i: int, segs, **kw) -> Generation:
    g = _gen(i, **kw)
    for j, (t, disp, start, end, est) in enumerate(segs):
        g.segments.append(Segment(index=j, text="", calls=(), blocking=False, token_count=1, gen_start=t,
                                  gen_end=t, est_exec_s=est, dispatched_at=disp, exec_start=start, exec_end=end))
    return g


@settings(max_examples=400, deadline=None)
@given(_SEGS)
def test_prev_exec_end_estimate_equals_the_forward_loop(segs):
    g = _with_segments(0, segs)
    assert repr(g.prev_exec_end_estimate()) == repr(_forward_prev_end(g))  # bit for bit


def _plain_pick_expand(monkeypatch, wl, catalog, robots, seed):
    class Scan:
        def __init__(self, pool, index):
            self.pool, self.index = list(pool), index

        def touched(self, robot_id, busy_until):
            pass

        def pick(self, t, busy_until, last_used):  # the pool scan expand used before
            idle = [a for a in self.pool if busy_until[a.robot_id] <= t]
            return min(idle or self.pool, key=lambda a: (last_used[a.robot_id], self.index[a.robot_id])).robot_id

    with monkeypatch.context() as m:
        m.setattr(workload_format, "_AgentPicker", Scan)
        return workload_format.expand(wl, catalog, robots, seed=seed)


def test_expand_agent_choice_equals_the_pool_scan(monkeypatch):
    from timelyllm_ros.core.robots import load_robots

    robots = load_robots()
    catalog = workload_format.default_catalog(robots)
    # busy agents (a high rate over few agents: the all-busy fallback), idle ones, fixed robots
    for wl in (workload_format.scaled_drones(3, duration_s=40.0), workload_format.scaled_drones(200, duration_s=20.0),
               workload_format.load_workload("WID2"), workload_format.load_workload("chat_mixed")):
        for seed in (1, 7):
            fast = workload_format.expand(wl, catalog, robots, seed=seed)
            assert fast == _plain_pick_expand(monkeypatch, wl, catalog, robots, seed)
    # requests for fixed agents (they make agents busy outside the pick) mixed with the traces
    wl = workload_format.scaled_drones(4, duration_s=30.0)
    task = wl.traces[0]
    fixed = tuple(workload_format.ExplicitRequest(time=float(t), task=task, scene=0, robot_id=f"tello{t % 4}",
                                          request_id=f"fixed{t}", path=("requests", t)) for t in range(0, 30, 3))
    wl = dataclasses.replace(wl, requests=fixed)
    assert workload_format.expand(wl, catalog, robots, seed=3) == _plain_pick_expand(monkeypatch, wl, catalog, robots, 3)


def _stats(tps: float) -> EngineStats:
    return EngineStats(kv_total_blocks=10_000, kv_free_blocks=10_000, block_size=16, running=0, tokens_per_s=tps,
                       healthy=True)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(-1, 2), st.integers(0, 20)), min_size=1, max_size=30),
       st.lists(st.booleans(), min_size=1, max_size=30), st.sampled_from([5.0, 40.0, 400.0]))
def test_can_admit_carried_scan_equals_a_fresh_one(items, admit, tps):
    gens, budgets = [], {}
    for i, (budget, seg_tokens) in enumerate(items):
        g = _gen(i)
        g.seg_tokens = seg_tokens
        budgets[g.gen_id] = budget
        gens.append(g)

    def budget(g, now):
        return budgets[g.gen_id] - now

    def make():
        return LatencyGuidedBatch(budget=budget, max_segment_tokens=lambda g: 16, slowdown=0.3)

    carried = make()
    running: list[Generation] = []
    for g, take in zip(gens, admit * len(gens)):
        got = carried.can_admit(running, g, _stats(tps), 0.1)
        assert got == make().can_admit(list(running), g, _stats(tps), 0.1)
        if take:
            running.append(g)
    # a different list with the same generations, or a changed one, starts afresh
    if running:
        other = list(reversed(running))
        assert carried.can_admit(other, gens[0], _stats(tps), 0.1) == make().can_admit(other, gens[0], _stats(tps), 0.1)
        running.pop(0)
        assert carried.can_admit(running, gens[0], _stats(tps), 0.1) == make().can_admit(running, gens[0], _stats(tps), 0.1)


def test_shared_prefix_keys_leave_the_engine_as_hashing_does():
    """A run of adds / steps / aborts with prompts sharing prefixes of varied length: the engine
    that reuses the last prompt's chain hashes and one that hashes every prompt block by block end
    in the same state at every step (outputs, counters, block tables, prefix cache)."""
    prof = LatencyProfile(prefill_s_per_token=1e-4, decode_base_s=0.01, kv_block_size=4, kv_capacity_blocks=120)
    rng = random.Random(5)
    system = [rng.randrange(1, 500) for _ in range(41)]

    def run(shortcut: bool):
        e = SimulatedEngine(VirtualClock(), profile=prof)
        if not shortcut:
            e._shared_keys = lambda prompt: None  # type: ignore[method-assign]
        r = random.Random(11)
        trace = []
        for i in range(60):
            gid = f"g{i}"
            cut = r.choice([0, 3, 4, 17, 40, 41])
            prompt = system[:cut] + [r.randrange(1, 500) for _ in range(r.randrange(1, 12))]
            e.set_script(gid, "mf(10); tl(90);")
            try:
                e.add(gid, prompt, r.randrange(1, 6))
            except ValueError as err:
                trace.append(("refused", str(err)))
            for _ in range(r.randrange(0, 3)):
                trace.append([(o.gen_id, o.token_ids, o.finished, o.num_cached_tokens) for o in e.step()])
            if r.random() < 0.4 and gid in e._seqs:
                e.abort(gid, r.choice(["cache", "preserve", "discard", "swap"]))
            e.check_invariants()
            trace.append((dataclasses.astuple(e.counters), sorted((g, tuple(s.blocks), tuple(s.hashes))
                                                                  for g, s in e._seqs.items()),
                          sorted(e._pool.by_hash.items())))
        return trace

    assert run(True) == run(False)

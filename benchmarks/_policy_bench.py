"""Shared instrumentation for the Trail / Andes / mixed-policy benchmarks (simulator).

``Probe`` wraps the planner's engine through ``run_simulation``'s setup hook and records, on the
virtual clock, what the planner's metrics do not: first and last token time of every generation
(TTFT and Trail's request latency = last token − arrival) and the KV memory held by started but
not running generations (preempted ones in stream mode), integrated over time.
"""

from __future__ import annotations

import os

# Small matrices: multi-threaded BLAS only adds contention (178 ms vs 9 ms per step on 2 shared cores).
for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import math
import statistics
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

ROOT = Path(__file__).resolve().parents[1]

from timelyllm_ros.core.qoe import qoe_summary, request_qoe  # noqa: E402
from timelyllm_ros.core.types import GenState  # noqa: E402
from timelyllm_ros.workloads.catalog import load_tasks  # noqa: E402

CHAT_TASKS = ROOT / "workloads" / "chat_tasks.yaml"


def catalog(with_robots: bool = False) -> dict:
    cat = dict(load_tasks(CHAT_TASKS))
    if with_robots:
        cat.update(load_tasks())
    return cat


class _Engine:
    """Delegating engine wrapper: records token times and preempted-KV occupancy per step."""

    def __init__(self, inner, probe: "Probe") -> None:
        self._inner = inner
        self._probe = probe

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def step(self):
        p = self._probe
        clock = p.planner.clock
        t0 = clock.now()
        held = p.held_tokens()
        outs = self._inner.step()
        t1 = clock.now()
        p.kv_area += held * (t1 - t0)
        p.kv_peak = max(p.kv_peak, held)
        p.busy_s += t1 - t0
        for o in outs:
            if o.token_ids:
                p.first.setdefault(o.gen_id, t1)
                p.last[o.gen_id] = t1
        return outs


class Probe:
    def __init__(self) -> None:
        self.planner = None
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.kv_area = 0.0
        self.kv_peak = 0
        self.busy_s = 0.0
        self.select_s: list[float] = []

    def setup(self, planner, arrivals):
        self.planner = planner
        planner.engine = _Engine(planner.engine, self)
        select = planner.policy.select

        def timed(*a, **kw):  # wall time of the policy's decision (scheduling overhead)
            t0 = time.perf_counter()
            try:
                return select(*a, **kw)
            finally:
                self.select_s.append(time.perf_counter() - t0)

        planner.policy.select = timed
        return arrivals

    def held_tokens(self) -> int:
        """Generated tokens of preempted generations waiting to resume: KV that must be kept or
        recomputed (Trail's memory overhead of preemption).  The prompt is left out: it is mostly
        the robot type's shared prefix, cached once for everyone."""
        n = 0
        for g in self.planner.live():
            if g.state in (GenState.QUEUED, GenState.SUSPENDED) and g.output_ids and g.num_preemptions:
                n += len(g.output_ids)
        return n


def _stats(xs: Sequence[float]) -> dict[str, float | None]:
    if not xs:
        return {"mean": None, "median": None, "p99": None}
    s = sorted(xs)
    return {"mean": statistics.fmean(s), "median": statistics.median(s),
            "p99": s[min(len(s) - 1, math.ceil(0.99 * len(s)) - 1)]}


def latency_metrics(result, probe: Probe) -> dict[str, Any]:
    gens = result.generations
    lat = [probe.last[g.gen_id] - g.request.arrival for g in gens
           if g.state is GenState.FINISHED and g.gen_id in probe.last]
    ttft = [probe.first[g.gen_id] - g.request.arrival for g in gens if g.gen_id in probe.first]
    span = max(result.virtual_end_s, 1e-9)
    return {"latency": _stats(lat), "ttft": _stats(ttft), "finished": len(lat), "requests": len(gens),
            "policy_preemptions": sum(g.num_preemptions for g in gens),
            "engine_preemptions": result.engine["preemptions"],
            "preempted_kv_tokens_mean": probe.kv_area / span, "preempted_kv_tokens_peak": probe.kv_peak,
            "select_ms_mean": 1e3 * statistics.fmean(probe.select_s) if probe.select_s else None,
            "select_ms_p99": 1e3 * sorted(probe.select_s)[int(0.99 * (len(probe.select_s) - 1))] if probe.select_s else None}


def qoe_metrics(result, robots=None, categories: Iterable[str] = ("chat",), now: float | None = None) -> dict:
    cats = set(categories)
    vals = [request_qoe(g, now if now is not None else result.virtual_end_s,
                        robot=(robots or {}).get(g.request.robot_type)).qoe
            for g in result.generations if g.request.category in cats]
    return dict(qoe_summary(vals))


def fmt(x, nd=2) -> str:
    return "—" if x is None else f"{x:.{nd}f}"

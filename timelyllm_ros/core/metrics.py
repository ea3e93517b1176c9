"""Per-request and aggregate metrics of TimelyLLM (paper Fig. 3 and §7.1), pure and JSON-ready.

Definitions (times on the planner clock, seconds):

* response time  W(s0) = exec_start(s0) - arrival            (request received -> first action starts)
* segment wait   W(sk) = max(0, exec_start(sk) - exec_end(s_{k-1})), k > 0
* waiting time   = sum_k W(sk)                                (time the robot spent waiting on planning)
* execution time = sum_k (exec_end(sk) - exec_start(sk))
* completion     = waiting + execution                        (C(r) = sum_k W(sk) + E(sk))
* time utility   = TUF0(response time)                        (Eq. 1)

Only segments that actually executed count; the walk stops at the first segment without measured
execution times (a failed or cancelled request).

A request whose first action never started (failed, cancelled, rejected, shed) has no response
time.  It counts as if answered at the **end of the run**, and never above 0:

    utility = min(0, TUF0(max(run_end, end) - arrival))        run_end: the run's last event

``summarize`` takes the run end from its caller (the simulator passes its final virtual time) and
never uses less than the latest time recorded in any of the run's generations (arrivals, segment
generation and execution times, endings), so it is never earlier than any response of the run.
TUFs are non-increasing, so within a run dropping a request scores at most what answering it at
any time of that run would have: **dropping or failing work never raises a run's aggregate**
(property-tested: tests/test_metrics.py).  The bound is the run's own horizon: a counterfactual
answer later than the run's end is not known.  Utilities may be negative, as in the paper.
``request_metrics`` on a single generation without a run end (e.g. a live status) falls back to
the generation's own end (``finished_at``), ``min(0, TUF0(end - arrival))``: it never earns
credit, but is not a bound against late answers; aggregates always use a run end.
**The whole plan (Eq. 3).**  The paper's objective is Σ_r [TUF0(W(s0)) + Σ_{k≥1} TUF1(W(s_k))],
TUF1(t) = min(β, α·max(t, 0) + β) on W(s_k) = exec_start(s_k) − exec_end(s_{k−1}) (≤ 0 counts as 0,
an action starts no earlier than its predecessor ends).  Per request (``plan_terms``):

* accrued utility = TUF0(W(s0)) + Σ_{k≥1} TUF1(W(s_k)) over the segments that executed;
* its maximum     = β·(1 + continuations): every executed action can earn at most β;
* a request that **ends early** (failed, cancelled, or still running at the end of the run)
  accrues ``min(0, TUF1(end − previous action end))`` for the continuation it never got, and that
  continuation keeps its β in the maximum; its wait ``end − previous action end`` is one of the
  continuation waits (the robot waited that long and got nothing);
* a request whose **first action never started** (rejected, shed, failed before acting) accrues
  its first-action term ``min(0, TUF0(end − arrival))`` as above and has maximum β (no
  continuation is charged: its plan is unknown, and the first-action term already decays over
  the whole run, which bounds what any continuation of it could have earned).

``end`` is the same as for first actions: the end of the run in aggregates (never earlier than
the request's own ending), the request's own ending for a single generation without a run end.
With the run end, **failing, shedding or delaying never raises the accrued aggregate**: ending a
request early removes at least as much utility as maximum (each continuation it never gets would
have earned ≤ β, and the one charged term decays over the whole remaining run, which is at least
the sum of the waits the real continuations would have had), and removing equal amounts from a
ratio ≤ 100 % never raises it; the sum never rises, and neither does the % of max while it is
≥ 0 (below 0, a continuation charged 0 — an end within β/|α| of the run's end — adds β of maximum
and moves the % towards 0; property-tested: tests/test_metrics.py).  A request that finishes
normally is never charged a missing continuation.  ``accrued_utility_pct_of_max`` = Σ accrued /
Σ maximum; ``utility_pct_of_max`` stays the first action's (Eq. 1) score;
``continuation_wait_s`` = {mean, median, p99, max} of every W(s_k), k ≥ 1, of the group.

Aggregates are reported per task type, per category and overall; the JSON form has sorted keys
and rounded floats so a seeded simulation always produces byte-identical output.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping, Sequence

from .types import Generation, GenState

ROUND_DIGITS = 6
TIME_FIELDS = ("response_s", "waiting_s", "execution_s", "completion_s")


@dataclass(frozen=True, slots=True)
class RequestMetrics:
    """What one request achieved; None where it never got that far."""

    request_id: str
    robot_id: str
    task_type: str
    category: str
    arrival: float
    state: str  # terminal GenState value (or the current one if not terminal)
    reason: str
    segments: int  # generated segments
    segments_executed: int
    response_s: float | None
    waiting_s: float | None
    execution_s: float | None
    completion_s: float | None
    utility: float  # first action (Eq. 1)
    max_utility: float  # TUF beta
    accrued_utility: float  # the whole plan (Eq. 3; module docstring)
    accrued_max_utility: float  # beta * (1 + continuations)
    continuations: int  # continuations counted (executed, plus the one an early end never got)
    continuation_waits_s: tuple[float, ...]  # W(s_k), k >= 1, clipped at 0


def run_end_of(gens: Iterable[Generation]) -> float | None:
    """The latest time recorded in any of `gens` (arrival, segment generation / dispatch /
    execution times, ending); None for no generations.  Never earlier than any response."""
    end: float | None = None
    for g in gens:
        ts = [g.request.arrival]
        if g.finished_at is not None:
            ts.append(g.finished_at)
        for seg in g.segments:
            ts.extend(t for t in (seg.gen_start, seg.gen_end, seg.dispatched_at, seg.exec_start, seg.exec_end)
                      if t is not None)
        m = max(ts)
        if end is None or m > end:
            end = m
    return end


@dataclass(frozen=True, slots=True)
class PlanTerms:
    """One request's walk over its executed segments (Eq. 3 terms; module docstring)."""

    response_s: float | None  # W(s0); None: no action ever started
    first_utility: float  # TUF0(W(s0)), or min(0, TUF0(end - arrival)) without a response
    accrued: float  # first + sum of TUF1 terms (+ the missing continuation of an early end)
    accrued_max: float  # beta * (1 + continuations)
    continuations: int  # executed continuations, plus the one an early end never got
    continuation_waits_s: tuple[float, ...]  # clipped at 0, incl. the missing continuation's wait
    waiting_s: float  # W(s0) clipped + executed continuation waits
    execution_s: float
    executed: int  # segments with measured execution times (the walk's length)


def plan_terms(gen: Generation, end: float | None = None) -> PlanTerms:
    """THE walk of Eq. 3 over a generation.  ``end``: the run's end (aggregates), or None: the
    generation's own ending; a generation that has not ended and has no ``end`` (a live status)
    is scored on what it has executed so far, without a missing-continuation term."""
    req = gen.request
    tuf = req.tuf
    response: float | None = None
    first = accrued = waiting = execution = 0.0
    waits: list[float] = []
    executed = 0
    prev_end: float | None = None
    for seg in gen.segments:
        if seg.exec_start is None or seg.exec_end is None:
            break
        if prev_end is None:
            response = seg.exec_start - req.arrival
            first = tuf(response)
            accrued = first
            waiting += max(0.0, response)
        else:
            w = seg.exec_start - prev_end
            accrued += tuf.suspended(w)
            waits.append(max(0.0, w))
            waiting += max(0.0, w)
        execution += max(0.0, seg.exec_end - seg.exec_start)
        prev_end = seg.exec_end
        executed += 1
    ended = gen.state.terminal or end is not None
    at = end
    if at is None or (gen.finished_at is not None and gen.finished_at > at):
        at = gen.finished_at
    conts = max(0, executed - 1)
    if response is None:
        t = at if at is not None else req.arrival
        first = accrued = min(0.0, tuf(max(t, req.arrival) - req.arrival))
    elif ended and not (gen.state is GenState.FINISHED and executed == len(gen.segments)):
        # ended early: the continuation it never got (module docstring)
        t = prev_end if at is None or at < prev_end else at
        accrued += min(0.0, tuf.suspended(t - prev_end))
        waits.append(t - prev_end)
        conts += 1
    return PlanTerms(response_s=response, first_utility=first, accrued=accrued,
                     accrued_max=tuf.beta * (1 + conts), continuations=conts, continuation_waits_s=tuple(waits),
                     waiting_s=waiting, execution_s=execution, executed=executed)


def request_metrics(gen: Generation, run_end: float | None = None) -> RequestMetrics:
    """Metrics of one generation from its segments' measured execution times.  `run_end`: the end
    of the run it belongs to (scores a request that ended early; see the module docstring)."""
    req = gen.request
    p = plan_terms(gen, run_end)
    if p.response_s is None:
        waiting_s = execution_s = completion_s = None
    else:
        waiting_s, execution_s = p.waiting_s, p.execution_s
        completion_s = p.waiting_s + p.execution_s
    return RequestMetrics(
        request_id=req.request_id, robot_id=req.robot_id, task_type=req.task_type or req.robot_type,
        category=req.category, arrival=req.arrival, state=gen.state.value, reason=gen.reason,
        segments=len(gen.segments), segments_executed=p.executed, response_s=p.response_s,
        waiting_s=waiting_s, execution_s=execution_s, completion_s=completion_s, utility=p.first_utility,
        max_utility=req.tuf.beta, accrued_utility=p.accrued, accrued_max_utility=p.accrued_max,
        continuations=p.continuations, continuation_waits_s=p.continuation_waits_s,
    )


def _percentile(sorted_xs: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default), without numpy for exact reproducibility."""
    if len(sorted_xs) == 1:
        return sorted_xs[0]
    pos = (len(sorted_xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def _stats(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"mean": None, "median": None, "p99": None, "max": None}
    s = sorted(xs)
    return {"mean": math.fsum(s) / len(s), "median": _percentile(s, 50), "p99": _percentile(s, 99),
            "max": s[-1]}


def aggregate(rows: Sequence[RequestMetrics]) -> dict[str, Any]:
    """Summary of a group of requests: first-action utility (mean, % of max), the whole plan's
    accrued utility (Eq. 3: sum, max, % of max), continuation waits and time statistics."""
    n = len(rows)
    states: dict[str, int] = {}
    for r in rows:
        states[r.state] = states.get(r.state, 0) + 1
    util = math.fsum(r.utility for r in rows)
    max_util = math.fsum(r.max_utility for r in rows)
    acc = math.fsum(r.accrued_utility for r in rows)
    acc_max = math.fsum(r.accrued_max_utility for r in rows)
    out: dict[str, Any] = {
        "count": n,
        "states": states,
        "utility_mean": util / n if n else None,
        "utility_sum": util,
        "utility_pct_of_max": 100.0 * util / max_util if max_util > 0 else None,
        "accrued_utility_sum": acc,
        "accrued_utility_max": acc_max,
        "accrued_utility_pct_of_max": 100.0 * acc / acc_max if acc_max > 0 else None,
        "continuation_wait_s": _stats([w for r in rows for w in r.continuation_waits_s]),
        "no_response": sum(1 for r in rows if r.response_s is None),
        "segments_mean": (math.fsum(r.segments for r in rows) / n) if n else None,
    }
    for f in TIME_FIELDS:
        out[f] = _stats([getattr(r, f) for r in rows if getattr(r, f) is not None])
    return out


PLAN_FIELDS = ("accrued_utility_pct_of_max", "utility_pct_of_max", "completion_s", "continuation_wait_s")


def plan_fields(agg: Mapping[str, Any]) -> dict[str, Any]:
    """The whole-plan figures of one aggregate, under the names outside tools read (issue 25):
    ``accrued_utility_pct_of_max`` (Eq. 3), ``utility_pct_of_max`` (first action),
    ``completion_s`` {mean, p99}, ``continuation_wait_s`` {mean, p99, max}."""
    return {"accrued_utility_pct_of_max": agg["accrued_utility_pct_of_max"],
            "utility_pct_of_max": agg["utility_pct_of_max"],
            "completion_s": {k: agg["completion_s"][k] for k in ("mean", "p99")},
            "continuation_wait_s": {k: agg["continuation_wait_s"][k] for k in ("mean", "p99", "max")}}


def plan_summary(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """``plan_fields`` of a ``summarize`` result: overall, by_category, by_task_type."""
    return {"overall": plan_fields(metrics["overall"]),
            "by_category": {k: plan_fields(v) for k, v in metrics["by_category"].items()},
            "by_task_type": {k: plan_fields(v) for k, v in metrics["by_task_type"].items()}}


def summarize(gens: Iterable[Generation], run_end: float | None = None) -> dict[str, Any]:
    """Per-request rows plus per-task-type, per-category and overall aggregates.  `run_end`: when
    the run ended (e.g. the simulator's final time); the latest time recorded in `gens` is used if
    later or if none is given.  Requests without a response are scored at it (module docstring)."""
    gens = list(gens)
    recorded = run_end_of(gens)
    end = recorded if run_end is None or (recorded is not None and recorded > run_end) else run_end
    rows = sorted((request_metrics(g, end) for g in gens), key=lambda r: (r.arrival, r.request_id))
    by_type: dict[str, list[RequestMetrics]] = {}
    by_cat: dict[str, list[RequestMetrics]] = {}
    for r in rows:
        by_type.setdefault(r.task_type, []).append(r)
        by_cat.setdefault(r.category, []).append(r)
    return {
        "overall": aggregate(rows),
        "by_task_type": {k: aggregate(v) for k, v in by_type.items()},
        "by_category": {k: aggregate(v) for k, v in by_cat.items()},
        "requests": [asdict(r) for r in rows],
        # --- Andes QoE hook (policies helper, additive): QoE of every chat request (core/qoe.py);
        # only present when the run has chat requests, so robot-only outputs are unchanged.
        **_chat_qoe(gens),
    }


def _chat_qoe(gens: Sequence[Generation]) -> dict[str, Any]:
    """{"qoe": {"count", "qoe_mean", "share_ge", "threshold", "per_request"}} over chat requests."""
    from .qoe import qoe_summary, request_qoe

    chat = sorted((g for g in gens if g.request.category == "chat"), key=lambda g: (g.request.arrival, g.gen_id))
    if not chat:
        return {}
    vals = {g.gen_id: request_qoe(g, g.finished_at if g.finished_at is not None else g.request.arrival).qoe
            for g in chat}
    return {"qoe": {**qoe_summary(list(vals.values())), "per_request": vals}}


def terminal_count(gens: Iterable[Generation]) -> tuple[int, int]:
    """(terminal, total) generations: the simulation's stopping condition."""
    total = term = 0
    for g in gens:
        total += 1
        term += g.state.terminal
    return term, total


def rounded(obj: Any, digits: int = ROUND_DIGITS) -> Any:
    """Deep copy with floats rounded (and -0.0 / non-finite normalised) for stable JSON."""
    if isinstance(obj, float):
        if not math.isfinite(obj):
            return None
        r = round(obj, digits)
        return 0.0 if r == 0 else r
    if isinstance(obj, Mapping):
        return {str(k): rounded(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [rounded(v, digits) for v in obj]
    if isinstance(obj, GenState):
        return obj.value
    return obj


def to_json(obj: Any, digits: int = ROUND_DIGITS) -> str:
    """Canonical JSON: sorted keys, rounded floats, fixed separators, trailing newline."""
    return json.dumps(rounded(obj, digits), sort_keys=True, indent=1, allow_nan=False) + "\n"


def timeline_records(gens: Iterable[Generation]) -> list[dict[str, Any]]:
    """Per request, per segment: generation and execution intervals (Fig. 6 traces), JSON-ready."""
    out = []
    for g in sorted(gens, key=lambda g: (g.request.arrival, g.gen_id)):
        req = g.request
        out.append({
            "request_id": req.request_id, "robot_id": req.robot_id, "task_type": req.task_type,
            "category": req.category, "arrival": req.arrival, "ert": req.tuf.ert, "state": g.state.value,
            "finished_at": g.finished_at,
            "segments": [{"index": s.index, "text": s.text, "tokens": s.token_count, "gen_start": s.gen_start,
                          "gen_end": s.gen_end, "dispatched_at": s.dispatched_at, "exec_start": s.exec_start,
                          "exec_end": s.exec_end, "est_exec_s": s.est_exec_s} for s in g.segments],
        })
    return out

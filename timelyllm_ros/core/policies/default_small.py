"""The default policy's scheduling point for a handful of live generations, in plain Python.

`Default.select` (default.py) comes here while the running and ready generations together are
fewer than `SMALL_BELOW`: at 8 + 8 of them numpy's per-call overhead (~1 µs a call, ~40 calls)
was most of the point (60 µs against fcfs's 7 µs), and one Python pass per generation costs less.
At hundreds the numpy pass wins (measured: docs/results/2026-11-28-cost.md, session 15).

Contract: the same decisions and the same bits as the numpy path, at any size — the Selection
(order, preemptions), every generation's priority, the policy's state (`_full`, `_queue_s`,
`_plan`, `_head_pri`, `_depth`, `_capped`, `_mem_held`, `_mem_cut`, `_first_seen`, `_first_waits`,
`_first_crit`) and rule 9's
pause marks.  The arithmetic is the numpy path's, operation for operation, on Python floats:
numpy's float64 + - * / are IEEE's, as Python's; the mean of `atc_priority_lists` is numpy's
pairwise summation (`pairwise_sum`); exp stays numpy's (its SIMD exp differs from libm's in the
last bit on ~5 % of arguments).  The rules are stated once, in default.py's docstring; this path
computes their per-generation terms and hands over to the same `Default._finish` (rules 6, 7, 10)
and `Default._paced` (rule 9).  Its per-generation terms are read afresh at every point but one:
the next due time of a generation with segments (`Generation.next_due`, its robot's dispatched
actions' estimated end) is kept in the generation's `DefaultState.due` with its `sched_rev`, as the numpy
path keeps it in its SlotTable (`Default._table`) — both read it again once the planner marked
a change (`Generation.touch`); rule 12's predictions are that SlotTable's, shared.
tests/test_scheduling_fastpaths.py forces each path on the same scenarios (hypothesis, at every
size, and a policy that alternates point by point) and compares everything above.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..types import Generation
from .base import PolicyContext, Selection, priority_order

if TYPE_CHECKING:
    from .default import Default

SMALL_BELOW = 64  # live generations (running + ready) under which `Default.select` takes this path


def pairwise_sum(xs: Sequence[float]) -> float:
    """``float(np.sum(np.asarray(xs, dtype=float)))`` in Python, the same bits: numpy's pairwise
    summation (8 accumulators per block of up to 128, blocks halved above that; under 8 values
    one running sum).  Python's own sum() is not it (3.12 compensates its rounding)."""
    return _pairwise(xs, 0, len(xs))


def _pairwise(a: Sequence[float], lo: int, n: int) -> float:
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    if n <= 128:
        r0, r1, r2, r3, r4, r5, r6, r7 = a[lo:lo + 8]
        end = lo + n - n % 8
        i = lo + 8
        while i < end:
            r0 += a[i]
            r1 += a[i + 1]
            r2 += a[i + 2]
            r3 += a[i + 3]
            r4 += a[i + 4]
            r5 += a[i + 5]
            r6 += a[i + 6]
            r7 += a[i + 7]
            i += 8
        res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        for j in range(end, lo + n):
            res += a[j]
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return _pairwise(a, lo, n2) + _pairwise(a, lo + n2, n - n2)


def atc_priority_lists(groups: Sequence[tuple[Sequence[float], Sequence[float], Sequence[float]]],
                       k: float) -> list[list[float]]:
    """``default.atc_priorities(alphas, ps, slacks, k).tolist()`` for each (alphas, ps, slacks)
    of `groups` (an empty group: []), the same bits, in Python: |alpha| / p, times exp of the
    discounted slack — the mean by numpy's pairwise summation (`pairwise_sum`), exp numpy's, one
    call for all groups and only where the argument is not 0 (exp(0) = 1 exactly: a group all
    late needs none)."""
    out: list[list[float]] = []
    todo = None  # groups with a generation not yet late: (out index, exp arguments)
    for alphas, ps, slacks in groups:
        for s in slacks:
            if not s <= 0.0:  # (NaN too) exp of -np.maximum(s, 0.0) / scale != 0
                break
        else:  # all late (or none): exp(0) = 1
            out.append([w if (w := (-a if a < 0.0 else 1e-12) / (p if not p < 1e-9 else 1e-9)) > 0.0 else 5e-324
                        for a, p in zip(alphas, ps)])
            continue
        n = len(ps)
        if n < 8:  # (pairwise_sum's first case)
            tot = 0.0
            for p in ps:
                tot += p
        else:
            tot = pairwise_sum(ps)
        scale = tot / n * k
        scale = scale if scale > 1e-9 else 1e-9
        if todo is None:
            todo = []
        todo.append((len(out), [-(s if not s <= 0.0 else 0.0) / scale for s in slacks]))
        out.append([])
    if todo is not None:
        e = iter(np.exp([x for _, args in todo for x in args if x != 0.0]).tolist())
        for gi, args in todo:
            alphas, ps, _ = groups[gi]
            out[gi] = [w if (w := (-a if a < 0.0 else 1e-12) / (p if not p < 1e-9 else 1e-9)
                             * (next(e) if x != 0.0 else 1.0)) > 0.0 else 5e-324  # (exp underflow: still critical)
                       for a, p, x in zip(alphas, ps, args)]
    return out


def _key(g: Generation) -> tuple:
    return (-g.priority, g.ready_since, g.request.arrival, g.request.request_id)  # (`base._order_key`)


def _order(gens: list[Generation]) -> list[Generation]:
    """`priority_order(gens)`: under 32 generations the plain tuple sort it is defined by (its
    shortcuts pay only at hundreds; equal priorities are common here: critical ones all late, of
    one robot type and length, have one ATC priority)."""
    return sorted(gens, key=_key) if len(gens) < 32 else priority_order(gens)


def select_small(self: Default, ready: Sequence[Generation], running: Sequence[Generation], ctx: PolicyContext,
                 now: float, full: bool, token_s: float, lead: float) -> Selection:
    """`Default.select` (`self`: the policy) past its common start (`_full`, the point's terms,
    no live generation handled): the running and the ready generations' terms one Python pass
    each, then rules 11, 12, 3, 4 and the hand-over to `_finish` and `_paced`."""
    get_cont, get_first = self._pred_by[0].get, self._pred_by[1].get  # (`_point_terms`: the table by type)
    flat = math.inf  # rule 10's steep cap: the flattest live slope, the steepest first segment's
    steepest_first = -math.inf
    some_first = False
    split = []  # per group (running, ready): critical, deferrable, a critical first segment, ATC terms
    for enter, gens in ((0.0, running), (token_s, ready)):  # +1 step to (re)enter the batch: the ready ones
        crit: list[Generation] = []
        defer: list[Generation] = []
        alphas: list[float] = []
        ps: list[float] = []
        slacks: list[float] = []
        add_crit, add_defer = crit.append, defer.append
        add_alpha, add_p, add_s = alphas.append, ps.append, slacks.append
        crit_first = False
        for g in gens:
            req = g.request
            alpha = req.tuf.alpha
            if g.segments:
                left = get_cont(req.robot_type, 8.0) - g.seg_tokens
                seg = True
                # `DefaultState.due`: (sched_rev, next_due) — the robot's dispatched actions' end
                # moves only with sched_rev
                st = g.policy.default
                kept = st.due
                if kept is not None and kept[0] == g.sched_rev:
                    due = kept[1]
                else:
                    due = g.next_due(now)
                    st.due = (g.sched_rev, due)
            else:
                left = get_first(req.robot_type, 8.0) - g.seg_tokens
                seg = False
                some_first = True
                if -alpha > steepest_first:
                    steepest_first = -alpha
                due = g.next_due(now)
            if -alpha < flat:
                flat = -alpha
            p = (left if left > 1.0 else 1.0) * token_s
            s = due - now - p - enter
            if s <= lead:
                add_crit(g)
                add_alpha(alpha)
                add_p(p + enter)
                add_s(s)
                if not seg:
                    crit_first = True
            else:
                g.priority = -1.0 - s  # deferrable: least slack first
                add_defer(g)
        split.append((crit, defer, crit_first, alphas, ps, slacks))
    (run_crit, run_def, run_first, *atc_w), (crit_r, defer_r, waits_first, *atc_r) = split
    self._first_waits = waits_first  # (rule 5's price)
    late_ps = [q for q, x in zip(atc_r[1], atc_r[2]) if x < 0.0]  # rule 11: the ready ones past their deadlines
    self._queue_s = self.queue_wait(len(late_ps), late_ps, len(running))
    self._plan = self.plan_applies(now)
    if run_crit or crit_r:  # critical segments: ATC, the running batch and the ready ones each a group
        pw, pr = atc_priority_lists((atc_w, atc_r), self.atc_k)
        if self._plan:  # rule 12: the whole reply's WSRPT instead, predictions kept per slot
            self._table.lookup([*running, *ready], self._fill)
            both = self.plan_priorities([*run_crit, *crit_r], token_s)
            pw, pr = both[:len(run_crit)], both[len(run_crit):]
        for g, v in zip(run_crit, pw):  # (a plain loop: `base.set_priorities` pays at hundreds)
            g.priority = v
        for g, v in zip(crit_r, pr):
            g.priority = v
        self._head_pri = max(pr) if self._plan and pr else 0.0
    else:
        self._head_pri = 0.0
    protect = run_first or waits_first  # a critical first segment runs or waits
    if self.steep_cap:  # rule 10 protects first segments steeper than the flattest live generation
        first = steepest_first > flat * (1 + 1e-9)  # (`_steeper`, for the steepest of them)
    else:
        first = some_first
    order = _order(crit_r)
    if not protect:
        order += _order(defer_r)
    sel = self._finish(order, bool(crit_r), run_crit, full, running, ctx, now, first=first)
    if not protect or not self.pace:  # (rule 9 off: `_paced` returns sel as it is)
        return sel
    budget = math.inf  # rule 9's tightest per-token budget of the waiting critical first segments
    if waits_first and self._pacing(ctx):
        for g in crit_r:
            if not g.segments:
                left = get_first(g.request.robot_type, 8.0) - g.seg_tokens
                t = (g.next_due(now) - now) / (left if left > 1.0 else 1.0)
                if 0.0 < t < budget:
                    budget = t
    return self._paced(sel, run_crit, run_def, running, ctx, now, budget)

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
numpy's float64 + - * / are IEEE's, as Python's; ATC's mean p (`atc_discounts`) is numpy's
pairwise summation (`pairwise_sum`); exp stays numpy's (its SIMD exp differs from libm's in the
last bit on ~5 % of arguments) and is asked only for the critical generations not yet late (a late
one's discount is exp(0) = 1 exactly, so its priority is |alpha| / p as it is).  The rules are
stated once, in default.py's docstring; this path computes their per-generation terms and hands
over to the same `Default._finish` (rules 6, 7, 10) and `Default._paced` (rule 9).

What it keeps between points: a generation's terms — whether it has segments, its next segment's
predicted length, its next due time (`Generation.next_due`: arrival + ERT, or its robot's
dispatched actions' estimated end), its TUF slope and ATC's numerator, its prompt tokens (rule 6;
fixed when the generation is made) — in its `DefaultState.terms`, with the `seg_rev` and the
prediction table (`Default._pred_by`) they were read at: read again once the planner marked a
change of its segments (`Generation.touch`: a segment cut, dispatched or executed) or the policy
learned a segment length, as the numpy path keeps its terms in its SlotTable (`Default._table`).
Its token counts (the current segment's, hence its predicted tokens left, and its output tokens
for rule 6) are read at every point: an engine step changes them for every running generation
(`Generation.touch_tokens`), and reading two counts costs less than reading the terms again.
A first segment's due time never moves (arrival + ERT): it is kept across
changes.  Rule 12's predictions are that SlotTable's, shared.  Rule 6 gets the order's tokens
summed, so that where all of it fits by a bound `_fit_memory` skips its walk (the same verdict).
tests/test_scheduling_fastpaths.py forces each path on the same scenarios (hypothesis, at every
size, and a policy that alternates point by point) and compares everything above.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..types import Generation
from .base import _PRIORITY, _TIES, PolicyContext, Selection, priority_order

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


def atc_discounts(groups: Sequence[tuple[Sequence[float], Sequence[float]]], k: float) -> list[float]:
    """ATC's slack discounts, for each (ps, slacks) of `groups` in turn, one per slack: exp of
    -s / scale, scale = `k` × the mean of ps (numpy's pairwise summation, `pairwise_sum`), at
    least 1e-9 — `ps`: every critical generation's estimated time in the group (late ones too),
    `slacks`: the slacks of those not yet late (s > 0, or NaN; a group without any: none).  exp
    is numpy's, one call for all groups and only where the argument is not 0 (exp(0) = 1
    exactly)."""
    args: list[float] = []
    for ps, slacks in groups:
        if not slacks:
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
        args += [-s / scale for s in slacks]  # (= -max(s, 0.0) / scale: s is not <= 0)
    e = iter(np.exp([x for x in args if x != 0.0]).tolist())
    return [next(e) if x != 0.0 else 1.0 for x in args]


def atc_priority_lists(groups: Sequence[tuple[Sequence[float], Sequence[float], Sequence[float]]],
                       k: float) -> list[list[float]]:
    """``default.atc_priorities(alphas, ps, slacks, k).tolist()`` for each (alphas, ps, slacks)
    of `groups` (an empty group: []), the same bits, in Python: |alpha| / p, times the discount
    of the slack of one not yet late (`atc_discounts`: the mean p by numpy's pairwise summation,
    exp numpy's; a late one's is exactly 1, so its weight is |alpha| / p as it is).  `select_small`
    computes the same terms inline, generation by generation, and hands `atc_discounts` only the
    generations not yet late."""
    out: list[list[float]] = []
    live: list[list[int]] = []  # per group: the positions not yet late
    for alphas, ps, slacks in groups:
        out.append([(-a if a < 0.0 else 1e-12) / (p if not p < 1e-9 else 1e-9) for a, p in zip(alphas, ps)])
        live.append([i for i, s in enumerate(slacks) if not s <= 0.0])  # (NaN too: exp of NaN)
    f = iter(atc_discounts([(ps, [slacks[i] for i in at]) for (_, ps, slacks), at in zip(groups, live)], k))
    for ws, at in zip(out, live):
        for i in at:
            ws[i] *= next(f)
    return [[w if w > 0.0 else 5e-324 for w in ws] for ws in out]  # (exp underflow: still critical)


def _read_terms(g: Generation, t: tuple, pred_by: tuple[dict, dict], now: float) -> tuple:
    """g's `DefaultState.terms` read again (its segments changed, or the prediction table; `t`:
    the kept ones): has segments, its next segment's predicted tokens, its next due time, its TUF
    slope and ATC's numerator, its prompt tokens."""
    req = g.request
    if g.segments:
        pl = pred_by[0].get(req.robot_type, 8.0)
        due = g.next_due(now)
    else:
        pl = pred_by[1].get(req.robot_type, 8.0)
        # a first segment's due time is arrival + ERT, whatever changed: kept
        due = t[4] if t[1] is not None and not t[2] else g.next_due(now)
    mag = -req.tuf.alpha
    t = g.policy.default.terms = (g.seg_rev, pred_by, not not g.segments, pl, due, mag,
                                  mag if mag > 0.0 else 1e-12, len(g.prompt_ids))
    return t


def _key(g: Generation) -> tuple:
    return (-g.priority, g.ready_since, g.request.arrival, g.request.request_id)  # (`base._order_key`)


def _order(gens: list[Generation]) -> list[Generation]:
    """`priority_order(gens)`: under 32 generations the tuple sort it is defined by (its
    shortcuts pay only at hundreds; equal priorities are common here: critical ones all late, of
    one robot type and length, have one ATC priority), as two stable sorts with keys read at C
    level — by the tie-breakers, then by priority, highest first (a stable sort keeps equal keys
    in their order, reversed too) — the same order unless a priority is NaN (then the tuples)."""
    if len(gens) >= 32:
        return priority_order(gens)
    pri = sum(map(_PRIORITY, gens))  # (NaN where one is NaN; inf - inf too: the tuples then, alike)
    if pri != pri:
        return sorted(gens, key=_key)
    out = sorted(gens, key=_TIES)
    out.sort(key=_PRIORITY, reverse=True)
    return out


def _left(g: Generation) -> float:
    """g's predicted tokens left at this point, at least 1, as `select_small`'s pass computed it
    (the predicted segment length kept in `DefaultState.terms`, less the current segment's)."""
    lt = g.policy.default.terms[3] - g.seg_tokens
    return lt if lt > 1.0 else 1.0


def _atc_ps(crit: list[Generation], token_s: float, enter: float) -> list[float]:
    """ATC's p of each of `crit` at this point, as `select_small`'s pass computed it: predicted
    tokens left (`_left`) x time per token, + `enter`."""
    ps = []
    for g in crit:
        p = _left(g) * token_s
        p += enter
        ps.append(p)
    return ps


def select_small(self: Default, ready: Sequence[Generation], running: Sequence[Generation], ctx: PolicyContext,
                 now: float, full: bool, token_s: float, lead: float) -> Selection:
    """`Default.select` (`self`: the policy) past its common start (`_full`, the point's terms,
    no live generation handled): the running and the ready generations' terms one Python pass
    each — a critical one's ATC priority set there where it is late (its discount is 1), the
    others' after the pass (`atc_discounts`, one exp for all) — then rules 11, 12, 3, 4 and the
    hand-over to `_finish` and `_paced`."""
    pred_by = self._pred_by  # (`_point_terms`: predicted tokens by robot type, continuations and first segments)
    flat = math.inf  # rule 10's steep cap: the flattest live slope, the steepest first segment's
    steepest_first = -math.inf
    some_first = False
    # Two passes, running then ready, whose last eight lines (the slopes rule 10 reads) are the same:
    # one pass over both groups with the ready-only terms behind a branch cost ~2 µs more a point at
    # 8 + 8 (20.6-22.0 against 22.9-23.8 µs, benchmarks/bench_scheduling.py's state, 2026-11-30).
    # the running ones: critical, deferrable, a critical first segment, ATC terms (g, |alpha| / p, slack)
    run_crit: list[Generation] = []
    run_def: list[Generation] = []
    wait_w: list[tuple[Generation, float, float]] = []
    run_first = False
    add_crit, add_defer = run_crit.append, run_def.append
    for g in running:  # (the ready ones' pass below, without the step to re-enter the batch — `enter`,
        t = g.policy.default.terms  # x - 0.0 is x — and without rule 6's tokens and rule 11's late ones)
        if t[0] != g.seg_rev or t[1] is not pred_by:
            t = _read_terms(g, t, pred_by, now)
        _, _, seg, lt, due, mag, num, _ = t
        lt -= g.seg_tokens  # predicted tokens left, at least 1 (the token counts: read at every point)
        if not lt > 1.0:
            lt = 1.0
        p = lt * token_s
        s = due - now - p
        if s <= lead:
            add_crit(g)
            w = num / (p if not p < 1e-9 else 1e-9)
            if s <= 0.0:
                g.priority = w if w > 0.0 else 5e-324
            else:
                wait_w.append((g, w, s))
        else:
            g.priority = -1.0 - s
            add_defer(g)
        if mag < flat:
            flat = mag
        if not seg:
            some_first = True
            if mag > steepest_first:
                steepest_first = mag
            if s <= lead:
                run_first = True
    # the ready ones: the same, +1 step to (re)enter the batch
    crit_r: list[Generation] = []
    defer_r: list[Generation] = []
    wait_r: list[tuple[Generation, float, float]] = []  # critical, not yet late: (g, |alpha| / p, slack)
    late_ps: list[float] = []  # estimated times of those past their deadlines (rule 11)
    tokens = tok_d = 0  # prompt and output tokens of the critical ones, of the deferrable ones (rule 6)
    add_crit, add_defer, add_late = crit_r.append, defer_r.append, late_ps.append
    waits_first = False
    enter = token_s
    for g in ready:
        t = g.policy.default.terms  # `DefaultState.terms`, kept while seg_rev and the prediction table hold
        if t[0] != g.seg_rev or t[1] is not pred_by:
            t = _read_terms(g, t, pred_by, now)
        _, _, seg, lt, due, mag, num, ntok = t
        lt -= g.seg_tokens
        if not lt > 1.0:
            lt = 1.0
        ntok += len(g.output_ids)
        p = lt * token_s
        s = due - now - p - enter
        if s <= lead:
            add_crit(g)
            tokens += ntok
            p += enter  # (ATC's p: `_atc_ps`)
            w = num / (p if not p < 1e-9 else 1e-9)  # ATC's |alpha| / p (`atc_priority_lists`)
            if s <= 0.0:  # late: exp(-max(0, s) / scale) = 1
                g.priority = w if w > 0.0 else 5e-324
                if s < 0.0:
                    add_late(p)
            else:  # (NaN too)
                wait_r.append((g, w, s))
        else:
            g.priority = -1.0 - s  # deferrable: least slack first
            add_defer(g)
            tok_d += ntok
        if mag < flat:
            flat = mag
        if not seg:
            some_first = True
            if mag > steepest_first:
                steepest_first = mag
            if s <= lead:
                waits_first = True
    self._first_waits = waits_first  # (rule 5's price)
    # rule 11: the ready ones past their deadlines (`queue_wait` is 0 unless they outnumber the batch)
    self._queue_s = self.queue_wait(len(late_ps), late_ps, len(running)) if len(late_ps) > len(running) else 0.0
    self._back_s = (self.back_wait(_atc_ps(crit_r, token_s, enter), len(running), ctx, now)
                    if self.back_factor else 0.0)  # (rule 11's critical queue: opt-in, off the pass when off)
    self._plan = self.plan_applies(now)
    if self._plan and (run_crit or crit_r):  # rule 12: the whole reply's WSRPT instead of ATC, predictions kept per slot
        self._table.lookup([*running, *ready], self._fill)
        both = self.plan_priorities([*run_crit, *crit_r], token_s)
        for g, v in zip([*run_crit, *crit_r], both):  # (a plain loop: `base.set_priorities` pays at hundreds)
            g.priority = v
        self._head_pri = max(both[len(run_crit):]) if crit_r else 0.0
    else:
        self._head_pri = 0.0
        if wait_w or wait_r:  # ATC's discount of the critical ones not yet late
            f = iter(atc_discounts(((_atc_ps(run_crit, token_s, 0.0), [s for _, _, s in wait_w]),
                                    (_atc_ps(crit_r, token_s, token_s), [s for _, _, s in wait_r])), self.atc_k))
            for g, w, _ in (*wait_w, *wait_r):
                w *= next(f)
                g.priority = w if w > 0.0 else 5e-324  # (exp underflow: still critical)
    protect = run_first or waits_first  # a critical first segment runs or waits
    if self.steep_cap:  # rule 10 protects first segments steeper than the flattest live generation
        first = steepest_first > flat * (1 + 1e-9)  # (`_steeper`, for the steepest of them)
    else:
        first = some_first
    order = _order(crit_r)
    if not protect:
        order += _order(defer_r)
        tokens += tok_d
    sel = self._finish(order, bool(crit_r), run_crit, full, running, ctx, now, first=first, tokens=tokens)
    if not protect or not self.pace:  # (rule 9 off: `_paced` returns sel as it is)
        return sel
    budget = math.inf  # rule 9's tightest per-token budget of the waiting critical first segments
    if waits_first and self._pacing(ctx):
        for g in crit_r:
            if not g.segments:
                t = (g.policy.default.terms[4] - now) / _left(g)  # (this point's due time and tokens left)
                if 0.0 < t < budget:
                    budget = t
    return self._paced(sel, run_crit, run_def, running, ctx, now, budget)

"""Reference implementations of the policies' scheduling decisions: the rules as written, one
Python pass per generation.  Production keeps one `select` per policy (numpy where a scheduling
point at 1,000 ready generations needs it); these are the oracles the property tests hold it
to, bit for bit (tests/test_scheduling_fastpaths.py, test_andes.py, test_lamps.py)."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from timelyllm_ros.core.policies.base import (PolicyContext, Selection, _order_key, batch_was_full, priority_order,
                                              set_priorities)
from timelyllm_ros.core.policies.default import atc_priorities
from timelyllm_ros.core.types import Generation


# --- the default policy (core/policies/default.py) -----------------------------------------------
def pairwise_sum(xs: Sequence[float]) -> float:
    """``float(np.sum(np.asarray(xs, dtype=float)))`` in Python, the same bits: numpy's pairwise
    summation (8 accumulators per block of up to 128, blocks halved above that; under 8 values
    one running sum).  Python's own sum() is not it (3.12 compensates its rounding).  The mean of
    `atc_priority_lists` (tests/test_scheduling_fastpaths.py checks it against np.sum)."""
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



_ATC_PY_MAX = 64  # below this many values `atc_priority_lists` skips numpy but for exp


def atc_priority_lists(groups: Sequence[tuple[Sequence[float], Sequence[float], Sequence[float]]],
                       k: float) -> list[list[float]]:
    """``atc_priorities(alphas, ps, slacks, k).tolist()`` for each (alphas, ps, slacks) of
    `groups` (an empty group: []), the same bits: groups under `_ATC_PY_MAX` values in Python
    (numpy's per-call overhead is most of the work at a handful), the mean by numpy's pairwise
    summation (`pairwise_sum`) and exp still numpy's (its SIMD exp is not libm's: they differ in
    the last bit on ~5 % of arguments) — one call for all groups, only where the argument is not 0
    (exp(0) = 1 exactly).  tests/test_scheduling_fastpaths.py checks it against `atc_priorities`."""
    out: list[list[float]] = []
    todo = None  # small groups with a generation not yet late: (out index, exp arguments)
    for alphas, ps, slacks in groups:
        n = len(ps)
        if not n or n >= _ATC_PY_MAX:
            out.append(atc_priorities(alphas, ps, slacks, k).tolist() if n else [])
            continue
        res: list[float] = []
        out.append(res)
        for s in slacks:
            if not s <= 0.0:  # (NaN too) exp of -np.maximum(s, 0.0) / scale != 0
                break
        else:  # all late: exp(0) = 1
            put = res.append
            for a, p in zip(alphas, ps):
                w = (-a if a < 0.0 else 1e-12) / (p if not p < 1e-9 else 1e-9)
                put(w if w > 0.0 else 5e-324)
            continue
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
        todo.append((len(out) - 1, [-(s if not s <= 0.0 else 0.0) / scale for s in slacks]))
    if todo is None:
        return out
    nz = [x for _, args in todo for x in args if x != 0.0]
    e = iter(np.exp(nz).tolist())
    for gi, args in todo:
        alphas, ps, _ = groups[gi]
        put = out[gi].append
        for a, p, x in zip(alphas, ps, args):
            w = (-a if a < 0.0 else 1e-12) / (p if not p < 1e-9 else 1e-9) * (next(e) if x != 0.0 else 1.0)
            put(w if w > 0.0 else 5e-324)
    return out


def _small_order(gens: list[Generation]) -> list[Generation]:
    """`priority_order(gens)`: under 32 generations the plain tuple sort it is defined by (its
    float-first shortcut pays only at hundreds)."""
    return sorted(gens, key=_order_key) if len(gens) < 32 else priority_order(gens)


def default_select_reference(self, ready: Sequence[Generation], running: Sequence[Generation], ctx: PolicyContext,
                             now: float) -> Selection:
    """`Default.select` (`self`: the policy) as its rules read: two Python passes over the ready
    list, ATC in Python (`atc_priority_lists`), a plain sort below 32."""
    self._full = batch_was_full(ready) or self._mem_held  # a cap or KV memory binds (suspend_at)
    full = self._full or self._capped
    terms = self._point_terms(ctx)
    critical, deferrable, protect, *atc_r, some_first = self._split(ready, now, False, terms)
    run_crit, run_def, run_first, *atc_w, _ = self._split(running, now, True, terms)
    if critical or run_crit:  # ATC priorities, each list on its own (one exp call for both)
        pr, pw = atc_priority_lists((atc_r, atc_w), self.atc_k)
        set_priorities(critical, pr)
        set_priorities(run_crit, pw)
    protect = protect or run_first  # a critical first segment is running or waiting
    order = _small_order(critical)  # ATC (> 0), best first
    if not protect:
        order += _small_order(deferrable)
    sel = self._finish(order, bool(critical), run_crit, full, running, ctx, now, ready_first=some_first)
    if not protect or not self.pace:  # (rule 5 off: `_paced` returns sel as it is)
        return sel
    budget = math.inf  # rule 5's tightest per-token budget of the waiting critical first segments
    if self._pacing(ctx):
        _, _, pred = terms
        for g in critical:
            if not g.segments:
                req = g.request
                left = pred.get((req.robot_type, True), 8.0) - g.seg_tokens
                t = (g.next_due(now) - now) / (left if left > 1.0 else 1.0)
                if 0.0 < t < budget:
                    budget = t
    return self._paced(sel, run_crit, run_def, running, ctx, now, budget)

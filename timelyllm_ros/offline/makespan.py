"""Minimise makespan on identical parallel slots (P||Cmax): the Hybrid paper's offline model.

Eqs. (26)-(30) of Pang et al.: assign each request i (processing time T_i, e.g. its decode rounds)
to exactly one slot j so that max_j sum_{i on j} T_i is minimal.  The paper solves it with SCIP in
~20 min; we use

* LPT (longest processing time first onto the least-loaded slot, Graham: <= 4/3 - 1/(3J) of OPT),
* a local search (move, swap, 2-for-1 and 1-for-2 exchanges off the most-loaded slot) that stops
  as soon as the solution meets the lower bound, which then *certifies* optimality,
* an exact depth-first branch-and-bound for small instances (symmetry breaking over slots with
  equal load, pruning with the running best), node-limited so it always returns.

For integer T_i (token counts) the bound max(max_i T_i, ceil(sum T / J), T_(J) + T_(J+1)) is tight
on large, many-small-job instances such as GSM8K on 200 slots, so the local search usually proves
optimality there without any MIP solver.  Pure and deterministic (ties broken by index).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Sequence


class PlanError(ValueError):
    """The instance is malformed (no slots, negative or non-finite processing times)."""


@dataclass(frozen=True, slots=True)
class Assignment:
    """slot[i] = slot of job i; loads[j] = total processing time on slot j."""

    slot: tuple[int, ...]
    loads: tuple[float, ...]
    method: str
    lower_bound: float
    optimal: bool  # proven: equals the lower bound, or branch-and-bound finished
    nodes: int = 0  # branch-and-bound nodes explored (0 for heuristics)

    @property
    def makespan(self) -> float:
        return max(self.loads) if self.loads else 0.0

    @property
    def gap(self) -> float:
        """Relative distance to the lower bound (0 = proven optimal by the bound)."""
        lb = self.lower_bound
        return (self.makespan - lb) / lb if lb > 0 else 0.0

    def queues(self, order: Sequence[int] | None = None) -> list[list[int]]:
        """Jobs per slot, in `order` (default: job index)."""
        out: list[list[int]] = [[] for _ in self.loads]
        for i in (order if order is not None else range(len(self.slot))):
            out[self.slot[i]].append(i)
        return out


def _check(times: Sequence[float], slots: int) -> list[float]:
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
        raise PlanError(f"need at least one slot, got {slots!r}")
    out = []
    for i, t in enumerate(times):
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise PlanError(f"processing time of job {i} must be a finite number >= 0, got {t!r}")
        out.append(float(t))
    return out


def lower_bound(times: Sequence[float], slots: int) -> float:
    """max(longest job, average load, two of the J+1 longest jobs share a slot).

    The average is rounded up when every time is an integer (loads are then integers too)."""
    ts = _check(times, slots)
    if not ts:
        return 0.0
    total = math.fsum(ts)
    avg = total / slots
    if all(t == int(t) for t in ts):
        avg = math.ceil(avg - 1e-9)
    lb = max(max(ts), avg)
    if len(ts) > slots:
        s = sorted(ts, reverse=True)
        lb = max(lb, s[slots - 1] + s[slots])
    return lb


def _sorted_jobs(ts: Sequence[float]) -> list[int]:
    return sorted(range(len(ts)), key=lambda i: (-ts[i], i))


def lpt(times: Sequence[float], slots: int) -> Assignment:
    """Graham's LPT: longest job first onto the currently least-loaded slot (lowest index on ties)."""
    ts = _check(times, slots)
    heap = [(0.0, j) for j in range(slots)]
    slot = [0] * len(ts)
    for i in _sorted_jobs(ts):
        load, j = heapq.heappop(heap)
        slot[i] = j
        heapq.heappush(heap, (load + ts[i], j))
    return _make(ts, slot, slots, "lpt")


def _make(ts: Sequence[float], slot: Sequence[int], slots: int, method: str, *, optimal: bool = False,
          nodes: int = 0) -> Assignment:
    loads = [0.0] * slots
    for i, j in enumerate(slot):
        loads[j] += ts[i]
    lb = lower_bound(ts, slots)
    ms = max(loads) if loads else 0.0
    return Assignment(slot=tuple(slot), loads=tuple(loads), method=method, lower_bound=lb,
                      optimal=optimal or ms <= lb + 1e-9, nodes=nodes)


def improve(a: Assignment, times: Sequence[float], max_rounds: int = 100_000) -> Assignment:
    """Local search from `a`: move a job off the most-loaded slot, or swap one of its jobs with a
    shorter job elsewhere, whenever that lowers the pair's maximum.  Stops at the lower bound."""
    ts = _check(times, len(a.loads))
    slots = len(a.loads)
    slot = list(a.slot)
    loads = list(a.loads)
    members: list[set[int]] = [set() for _ in range(slots)]
    for i, j in enumerate(slot):
        members[j].add(i)
    lb = a.lower_bound
    eps = 1e-9
    for _ in range(max_rounds):
        top = max(range(slots), key=lambda j: (loads[j], -j))
        if loads[top] <= lb + eps:
            break
        improved = False
        # 1) move: a job p from top to slot k with p < loads[top] - loads[k]
        order = sorted(range(slots), key=lambda j: (loads[j], j))
        jobs_top = sorted(members[top], key=lambda i: (ts[i], i))
        for k in order:
            if k == top:
                continue
            room = loads[top] - loads[k]
            # best move: the largest job that still lowers the pair's max
            best = None
            for i in jobs_top:
                if 0 < ts[i] < room - eps:
                    best = i
            if best is not None:
                _move(best, top, k, ts, slot, loads, members)
                improved = True
                break
        if not improved:
            # 2) swap: p on top, q on k with 0 < p - q < loads[top] - loads[k]
            for k in order:
                if k == top:
                    continue
                room = loads[top] - loads[k]
                pair = None
                for i in jobs_top:
                    for q in members[k]:
                        d = ts[i] - ts[q]
                        if eps < d < room - eps and (pair is None or d > pair[2]):
                            pair = (i, q, d)
                if pair is not None:
                    i, q, _ = pair
                    _move(i, top, k, ts, slot, loads, members)
                    _move(q, k, top, ts, slot, loads, members)
                    improved = True
                    break
        if not improved:
            # 3) exchange two jobs of top with one of k, or one of top with two of k
            improved = _pair_exchange(top, order, ts, slot, loads, members, eps)
        if not improved:
            break
    return _make(ts, slot, slots, a.method + "+ls")


def _pair_exchange(top: int, order: list[int], ts, slot, loads, members, eps: float) -> bool:
    """2-for-1 / 1-for-2 exchanges between the most-loaded slot and another that lower the pair's
    maximum (first improving exchange, least-loaded partner first)."""
    jt = sorted(members[top])
    for k in order:
        if k == top:
            continue
        room = loads[top] - loads[k]
        jk = sorted(members[k])
        for a_i in range(len(jt)):
            for b_i in range(a_i + 1, len(jt)):
                a, b = jt[a_i], jt[b_i]
                for q in jk:
                    d = ts[a] + ts[b] - ts[q]
                    if eps < d < room - eps:
                        for i in (a, b):
                            _move(i, top, k, ts, slot, loads, members)
                        _move(q, k, top, ts, slot, loads, members)
                        return True
        for i in jt:
            for q_i in range(len(jk)):
                for r_i in range(q_i + 1, len(jk)):
                    q, r = jk[q_i], jk[r_i]
                    d = ts[i] - ts[q] - ts[r]
                    if eps < d < room - eps:
                        _move(i, top, k, ts, slot, loads, members)
                        for j in (q, r):
                            _move(j, k, top, ts, slot, loads, members)
                        return True
    return False


def _move(i: int, src: int, dst: int, ts, slot, loads, members) -> None:
    members[src].discard(i)
    members[dst].add(i)
    loads[src] -= ts[i]
    loads[dst] += ts[i]
    slot[i] = dst


def branch_and_bound(times: Sequence[float], slots: int, node_limit: int = 2_000_000,
                     initial: Assignment | None = None) -> Assignment:
    """Exact P||Cmax by depth-first search over jobs in decreasing size.

    Pruning: a partial load reaching the incumbent is cut; slots with equal current load are
    interchangeable so only the first is tried (this covers the empty-slot symmetry).  Returns the
    incumbent with optimal=False if `node_limit` is reached."""
    ts = _check(times, slots)
    start = initial or improve(lpt(ts, slots), ts)
    lb = lower_bound(ts, slots)
    if not ts or start.makespan <= lb + 1e-9:
        return _make(ts, start.slot, slots, "bnb", optimal=True)
    jobs = _sorted_jobs(ts)
    n = len(jobs)
    suffix = [0.0] * (n + 1)
    for k in range(n - 1, -1, -1):
        suffix[k] = suffix[k + 1] + ts[jobs[k]]
    best = [start.makespan, list(start.slot)]
    loads = [0.0] * slots
    cur = [0] * len(ts)
    nodes = 0
    exhausted = True

    def dfs(k: int) -> bool:
        nonlocal nodes, exhausted
        if nodes >= node_limit:
            exhausted = False
            return True
        nodes += 1
        if k == n:
            ms = max(loads)
            if ms < best[0] - 1e-9:
                best[0], best[1] = ms, list(cur)
            return best[0] <= lb + 1e-9
        # the remaining work must fit below the incumbent on average
        if (math.fsum(loads) + suffix[k]) / slots >= best[0] - 1e-9:
            return False
        i = jobs[k]
        seen: set[float] = set()
        for j in sorted(range(slots), key=lambda j: (loads[j], j)):
            if loads[j] in seen:
                continue
            seen.add(loads[j])
            if loads[j] + ts[i] >= best[0] - 1e-9:
                break  # slots are tried in increasing load: all later ones are worse
            loads[j] += ts[i]
            cur[i] = j
            stop = dfs(k + 1)
            loads[j] -= ts[i]
            if stop:
                return True
        return False

    dfs(0)
    optimal = exhausted or best[0] <= lb + 1e-9
    return _make(ts, best[1], slots, "bnb", optimal=optimal, nodes=nodes)


def solve(times: Sequence[float], slots: int, *, exact_max_jobs: int = 40,
          node_limit: int = 2_000_000) -> Assignment:
    """LPT + local search; if that does not meet the lower bound and the instance is small,
    branch-and-bound from it.  `optimal` says whether the result is proven."""
    ts = _check(times, slots)
    a = improve(lpt(ts, slots), ts)
    if a.optimal or len(ts) > exact_max_jobs:
        return a
    return branch_and_bound(ts, slots, node_limit=node_limit, initial=a)

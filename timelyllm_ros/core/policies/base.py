"""Policy interface: how ready generations are ordered (and, for some, preempted).

A policy is refreshed at every scheduling point because priorities depend on time.  It never
touches the engine: it returns an order (and optional preemptions) and the planner acts.
"""

from __future__ import annotations

import abc
import enum
import math
import operator
from dataclasses import dataclass, field
from itertools import islice
from typing import Callable, Sequence

import numpy as np

from ..engine import EngineStats
from ..exec_time import ExecTimeEstimator
from ..robots import RobotSpec
from ..types import Generation, Segment


class DispatchMode(enum.Enum):
    SUSPEND = "suspend"  # TimelyLLM: cut, suspend (free the slot), dispatch, resume later
    STREAM = "stream"  # vLLM-stream: dispatch each statement at once, keep generating
    WHOLE = "whole"  # vLLM: generate the whole plan, then dispatch its statements


@dataclass
class PolicyContext:
    """What policies may read at a scheduling point (owned by the planner)."""

    estimator: ExecTimeEstimator
    robots: dict[str, RobotSpec]
    stats: EngineStats
    seg_gen_s: float  # G: average generation time of one segment (profiled, updated online)
    token_s: float  # average time per decoded token (1 / tokens_per_s), for length-based policies
    running: Sequence[Generation] = ()
    iteration: int = 0
    kv_modes: frozenset[str] = frozenset({"cache"})  # KV modes the engine honours on abort (`Engine.kv_modes`)
    engines: int = 1  # engines serving the batch (an engine pool's usable members): a policy's batch limit is per engine


@dataclass
class Selection:
    order: list[Generation]  # ready generations, best first; the planner admits in this order
    preempt: list[Generation] = field(default_factory=list)  # running ones to suspend now


_PRIORITY = operator.attrgetter("priority")
_BLOCKED = operator.attrgetter("blocked")
_READY_SINCE = operator.attrgetter("ready_since")
_ARRIVAL = operator.attrgetter("request.arrival")
_ID = operator.attrgetter("request.request_id")
_TIES = operator.attrgetter("ready_since", "request.arrival", "request.request_id")  # `_tie_key`, at C level


def arrival_order(gens: Sequence[Generation]) -> list[Generation]:
    """`gens` sorted by (arrival, gen_id) (vLLM's FCFS): by the C-level arrival key, then runs of
    equal arrivals by gen_id; the same order as the tuple sort, without building the tuples."""
    order = sorted(gens, key=_ARRIVAL)
    keys = list(map(_ARRIVAL, order))
    if len(set(keys)) < len(keys):
        i, n = 0, len(order)
        while i < n:
            j = i + 1
            while j < n and keys[j] == keys[i]:
                j += 1
            if j - i > 1:
                order[i:j] = sorted(order[i:j], key=_ID)
            i = j
    return order


def set_priorities(gens: Sequence[Generation], values: Sequence[float]) -> None:
    """g.priority = value for each pair (a plain loop: Python 3.11 specialises the slot store,
    measured faster than a C-level ``map(setattr, ...)`` at 16 and at 1,000 generations)."""
    for g, v in zip(gens, values):
        g.priority = v


def _order_key(g: Generation) -> tuple:
    return (-g.priority, g.ready_since, g.request.arrival, g.gen_id)


def _tie_key(g: Generation) -> tuple:  # priority_order's tie-break, as one tuple (ascending_perm's fallback)
    return (g.ready_since, g.request.arrival, g.gen_id)


def priority_order(gens: Sequence[Generation],
                   tie_key: Callable[[Generation], tuple] = _tie_key) -> list[Generation]:
    """`gens` sorted by (-priority, ready_since, arrival, gen_id): highest priority first, FCFS
    among equals (`tie_key`, if given, replaces the part after -priority; it must order totally,
    as times and ids do).

    Why not `sorted(key=that tuple)`: building and comparing the tuples (or calling a Python key
    per generation) is most of a scheduling point at hundreds of ready generations.  Sorted on the
    float priority alone first; then, where priorities tie, by the whole key, two ways that give
    the same order: when at least a quarter of neighbours tie (FCFS-like priorities, -arrival,
    tie over whole arrival events) all of them again, as stable sorts with C-level keys, least
    significant first (gen_id, arrival, ready_since, then priority descending: a reversed sort
    keeps equal elements in order; linear on a ready queue already in order, the simulator's
    common case); otherwise each run of equal priorities alone, by the tie-break tuple built at C
    level (few short runs: a few small sorts).  Non-finite priorities (NaN compares
    inconsistently) take the plain tuple sort.
    """
    order = sorted(gens, key=_PRIORITY, reverse=True)
    n = len(order)
    if n < 2:
        return order
    keys = list(map(_PRIORITY, order))
    try:
        finite = math.isfinite(sum(keys))
    except TypeError:
        finite = False
    if not finite:
        if tie_key is _tie_key:
            return sorted(gens, key=_order_key)
        return sorted(gens, key=lambda g: (-g.priority,) + tie_key(g))
    ties = list(map(operator.eq, keys, islice(keys, 1, None)))  # ties[i]: order[i] == order[i + 1]
    t = ties.count(True)
    if not t:
        return order
    if 4 * t >= n:  # mostly ties: re-sort them all
        _sort_by_whole_key(order, tie_key)
        return order
    key = _TIES if tie_key is _tie_key else tie_key
    last = len(ties)
    i = ties.index(True)
    while i < last:
        j = i + 1
        while j < last and ties[j]:
            j += 1
        order[i:j + 1] = sorted(order[i:j + 1], key=key)  # a run of equal priorities
        try:
            i = ties.index(True, j + 1)
        except ValueError:
            break
    return order


def _sort_by_whole_key(gens: list[Generation], tie_key: Callable[[Generation], tuple]) -> None:
    """Sort `gens` in place by (-priority,) + tie_key (finite priorities): stable passes with
    C-level keys, the least significant first."""
    if tie_key is _tie_key:
        gens.sort(key=_ID)
        gens.sort(key=_ARRIVAL)
        gens.sort(key=_READY_SINCE)
    else:
        gens.sort(key=tie_key)
    gens.sort(key=_PRIORITY, reverse=True)


def batch_was_full(ready: Sequence[Generation]) -> bool:
    """Whether the planner's batch-size controller refused a ready generation at the previous
    scheduling point (its ``Generation.blocked`` mark, which this clears): the batch is full."""
    marks = list(map(_BLOCKED, ready))  # (read at C level: at hundreds most points find no mark)
    if marks.count(None) == len(marks):
        return False
    full = False
    for g in ready:
        if g.blocked is not None:
            g.blocked = None
            full = True
    return full


def _sort_runs_by_gen_id(idx: list[int], ties: list[int], gens: Sequence[Generation]) -> None:
    """Re-sort by gen_id each run of `idx` whose neighbours tie in everything else (`ties`: the
    ascending positions i where idx[i] and idx[i + 1] tie)."""
    k = 0
    while k < len(ties):
        i = ties[k]
        j = i + 1
        k += 1
        while k < len(ties) and ties[k] == j:
            j += 1
            k += 1
        idx[i:j + 1] = sorted(idx[i:j + 1], key=lambda x: gens[x].gen_id)


def _break_ties(gens: Sequence[Generation], perm: "np.ndarray", eq: "np.ndarray", arrival: "np.ndarray | None",
                ready_since: bool) -> list[int] | None:
    """`perm` (sorted by the primary keys; eq[i]: positions i and i + 1 tie on them) with each run
    of ties ordered by (ready_since, arrival, gen_id), reading those only for the tied
    generations; None when one of them is not finite (the caller's full sort handles that)."""
    n = len(perm)
    in_run = np.zeros(n, dtype=bool)
    in_run[:-1] |= eq
    in_run[1:] |= eq
    pos = np.flatnonzero(in_run)  # positions (in perm) of tied generations; each run contiguous
    run = np.cumsum(np.concatenate(([True], ~eq)))[pos]
    members = perm[pos]
    mem = members.tolist()
    cols = [arrival[members] if arrival is not None else np.array([gens[i].request.arrival for i in mem], dtype=float)]
    if ready_since:
        cols.append(np.array([gens[i].ready_since for i in mem], dtype=float))
    if not all(np.isfinite(c).all() for c in cols):
        return None
    sub = np.lexsort(cols + [run])  # run first (keeps the runs where they are), then the tie-breakers
    perm = perm.copy()
    perm[pos] = members[sub]
    same = run[sub][1:] == run[sub][:-1]
    for c in cols:
        cs = c[sub]
        same &= cs[1:] == cs[:-1]
    idx = perm.tolist()
    if same.any():
        _sort_runs_by_gen_id(idx, pos[:-1][same].tolist(), gens)
    return idx


def ascending_perm(gens: Sequence[Generation], keys: "np.ndarray", ready_since: bool = True,
                   first: "np.ndarray | None" = None, arrival: "np.ndarray | None" = None) -> list[int]:
    """`ascending_perm_array`'s indices as a list."""
    perm = ascending_perm_array(gens, keys, ready_since, first, arrival)
    return perm if isinstance(perm, list) else perm.tolist()


def ascending_perm_array(gens: Sequence[Generation], keys: "np.ndarray", ready_since: bool = True,
                         first: "np.ndarray | None" = None,
                         arrival: "np.ndarray | None" = None) -> "np.ndarray | list[int]":
    """Indices of `gens` sorted by (keys[i], ready_since, arrival, gen_id) — the order
    `priority_order` gives with priority = -keys[i] — or, with ready_since False, by (keys[i],
    arrival, gen_id); with `first` (bools), those marked True come first, each group in that
    order.  For policies that computed their keys as a numpy array: one numpy lexsort; only runs
    equal in everything but gen_id (rare: same arrival and ready time) are re-sorted by gen_id in
    Python.  `arrival`: the generations' arrival times, if the caller has them.  Non-finite values
    take the plain tuple sort.  An index array, or a list where the order was finished in Python
    (`ascending_perm`: always a list)."""
    n = len(gens)
    if n < 2:
        return list(range(n))
    # distinct keys (within each group): the tie-breakers are never read.  (A finite sum: all
    # finite, the cheap test; ndarray methods and count_nonzero: numpy's per-call overhead is most
    # of the work at a handful of generations.)
    if math.isfinite(np.add.reduce(keys)) or np.isfinite(keys).all():
        if first is None:
            ks = np.sort(keys)  # (the values alone first: mostly ties skip the argsort, below)
            if 4 * int(np.count_nonzero(ks[1:] == ks[:-1])) >= n:
                eq = None
            else:
                perm = keys.argsort(kind="stable")
                kp = keys[perm]
                eq = kp[1:] == kp[:-1]
        else:
            perm = np.lexsort((keys, ~first))
            kp, fp = keys[perm], first[perm]
            eq = (kp[1:] == kp[:-1]) & (fp[1:] == fp[:-1])
        ties = n if eq is None else int(np.count_nonzero(eq))
        if not ties:
            return perm
        if 4 * ties < n:  # a few ties: their tie-breakers only (mostly ties: one sort of all, below)
            idx = _break_ties(gens, perm, eq, arrival, ready_since)
            if idx is not None:
                return idx
    if arrival is None:
        arrival = np.array([g.request.arrival for g in gens], dtype=float)  # (list comprehensions beat np.fromiter)
    cols = [arrival]
    if ready_since:
        cols.append(np.fromiter(map(_READY_SINCE, gens), dtype=float, count=n))
    cols.append(keys)
    if first is not None:
        cols.append(~first)
    if not all(np.isfinite(c).all() for c in cols if c.dtype != bool):
        tie = _tie_key if ready_since else (lambda g: (g.request.arrival, g.gen_id))
        grp = (lambda i: (not first[i],)) if first is not None else (lambda i: ())
        return sorted(range(n), key=lambda i: grp(i) + (float(keys[i]),) + tie(gens[i]))
    if ready_since:  # (ready_since, arrival) as one complex key: numpy orders complex numbers by
        fcfs = np.empty(n, dtype=complex)  # real part, then imaginary part — one sort pass fewer
        fcfs.real, fcfs.imag = cols[1], cols[0]
        perm = np.lexsort([fcfs, *cols[2:]])  # last key primary; stable
    else:
        perm = np.lexsort(cols)
    same = np.ones(n - 1, dtype=bool)
    for c in cols:
        cp = c[perm]
        same &= cp[1:] == cp[:-1]
    tie = np.flatnonzero(same)
    if not tie.size:
        return perm
    idx = perm.tolist()
    _sort_runs_by_gen_id(idx, tie.tolist(), gens)
    return idx


def priority_head_at(pool: Sequence[Generation], at: "np.ndarray", pri: "np.ndarray", k: int | None,
                     arrival: "np.ndarray | None" = None) -> "np.ndarray":
    """The indices into `pool` of ``priority_order([pool[i] for i in at])[:k]`` (all of it for
    None; `at`: indices into `pool`, `pri`: the pool's priorities, as set; `arrival`: the
    pool's arrival times, if the caller has them), in that order: `ascending_perm` on -pri (one
    numpy sort; only tied generations' tie-breakers read), ordering only the head when it is
    under a quarter of them: the k-th highest priority by a partition, then only the generations
    at or above it (its ties included) — the same total order on a subset, so the same head.
    Non-finite priorities: the full order (the tuple sort)."""
    n = len(at)
    if k is not None and k <= 0:
        return at[:0]
    sub = at
    if k is not None and 4 * k < n:
        p = pri[at]
        if np.isfinite(p).all():
            v = np.partition(p, n - k)[n - k]  # the k-th highest
            sub = at[p >= v]
    gens = list(map(pool.__getitem__, sub.tolist()))  # (map: half a list comprehension's time)
    perm = ascending_perm_array(gens, -pri[sub], arrival=None if arrival is None else arrival[sub])
    out = sub[perm if not isinstance(perm, list) else np.array(perm, dtype=np.intp)]
    return out if k is None else out[:k]


class Policy(abc.ABC):
    """Base of every scheduling policy: priority-ordered, non-preemptive, suspend mode, vLLM's
    cache-style KV on suspend.  The planner calls each method below at the point its docstring
    names (it never probes for them); a policy overrides what it decides differently.  Policies
    are built by name (`policies.make_policy`, `PolicyName`)."""

    name = "base"  # the policy's name in results (`PolicyName` value)
    mode = DispatchMode.SUSPEND  # how statements reach the robots (read once, at planner construction)
    # The engine's own scheduler: "fcfs" (vLLM's default; the planner owns the order) or
    # "priority" (vLLM's priority scheduling: engines are started with it and every add carries
    # `engine_priority(g)`, which orders the engine's waiting queue and chooses its preemption victims).
    engine_scheduling = "fcfs"
    # Which optional hooks this policy implements: the planner calls `on_token` (after every
    # engine output), `on_step` (after every engine step) and `suspend_at` (at every non-blocking
    # statement) only where the class declares it here, so a policy without them costs nothing
    # per token.  A policy that overrides one of them sets its flag (tests/test_policies.py
    # checks every registered policy).
    observes_tokens: bool = False
    observes_steps: bool = False
    chooses_suspension: bool = False

    def priority(self, g: Generation, ctx: PolicyContext, now: float) -> float:
        """g's priority at `now` (higher runs first), for the base `select`; policies that
        override `select` need not give one."""
        raise NotImplementedError

    def select(self, ready: Sequence[Generation], running: Sequence[Generation], ctx: PolicyContext,
               now: float) -> Selection:
        """At every scheduling point: the ready generations in admission order (the planner admits
        from the head while its batch-size controller and the engine take them) and the running
        ones to suspend now.  Sets each ready generation's `priority` (status, ties).  Pure with
        respect to the engine: it reads `ctx`, never acts."""
        for g in ready:
            g.priority = self.priority(g, ctx, now)
        return Selection(order=priority_order(ready))

    def engine_priority(self, g: Generation) -> int:
        """The engine priority of g (lower first, vLLM's convention); read only when
        `engine_scheduling` is "priority"."""
        return 0

    def suspend_at(self, g: Generation, seg: Segment, ctx: PolicyContext, now: float) -> bool:
        """SUSPEND mode, at each complete statement `seg` (already appended to g.segments, about
        to be dispatched): True = cut here, free the slot and resume later (the paper); False =
        dispatch it and keep generating in the slot (streaming).  A blocking statement always
        suspends (the plan needs its value); STREAM/WHOLE policies are never asked."""
        return True

    def speculates(self, g: Generation, seg: Segment, ctx: PolicyContext) -> bool:
        """SUSPEND mode, at blocking statement `seg` (dispatched; g waits for its result): True =
        let g generate its next statement under the predicted result, held until the real one
        arrives (core/speculation.py; the planner predicts, and rolls back on a miss).  False
        (the paper): g waits for the result before generating anything."""
        return False

    def streams_past(self, g: Generation, seg: Segment, ctx: PolicyContext, now: float) -> bool:
        """SUSPEND mode, at blocking statement `seg` (appended to g.segments, about to be
        dispatched) whose result the planner predicts to be the one the model goes on under when
        it is not given any (True for a bool skill, `PlannerConfig.unwritten_result`): True = g
        keeps its slot and streams on past it, as a STREAM policy's generation does — the next
        statement is held and checked against the robot's result exactly like a speculation (a
        different result rolls it back), and no abort and re-add with the predicted result
        appended is paid.  False (the default): suspend, and `speculates` decides what follows."""
        return False

    def streams_unpredicted(self, ctx: PolicyContext) -> bool:
        """SUSPEND mode: True = `streams_past` is asked at every blocking statement, also where
        the predicted result is another one or none (what follows is held and checked against the
        robot's result all the same: a different one rolls it back).  False (the default): only
        where the prediction is the result the model goes on under untold."""
        return False

    def batching(self) -> str:
        """Batch-size controller the planner uses when no fixed cap is given:
        "latency-guided" (TimelyLLM §4.4) or "continuous" (vLLM-style, capped at max_num_seqs)."""
        return "latency-guided" if self.mode is DispatchMode.SUSPEND else "continuous"

    def kv_mode(self, g: Generation, seg: Segment | None, ctx: PolicyContext) -> str:
        """KV handling when g is suspended after `seg` (None: preempted mid-segment)."""
        return "cache"

    def on_token(self, g: Generation, n_new: int, ctx: PolicyContext) -> None:
        """Hook for policies that refine predictions as tokens arrive (Trail)."""

    def on_step(self, duration_s: float, outputs: int) -> None:
        """Hook: one engine step took `duration_s` (clock time) and gave `outputs` outputs (one
        per generation in it); called after their `on_token` calls (the default's step-time model)."""

    def on_arrival(self, g: Generation) -> None:
        """Hook: the planner accepted request g (`Planner.submit`), before any scheduling point
        sees it (the default's load factor counts arrivals here)."""

    def on_reply_end(self, g: Generation) -> None:
        """Hook: the engine ended g's reply (its plan is generated; dispatched segments may still
        run), once per request."""

    def on_kv_released(self, g: Generation) -> None:
        """The planner turned suspended g's preserved KV into cached KV (`Planner._release_pinned`:
        pinned memory stalled the engine); policies that track handlings update here."""

    def params(self) -> dict:
        """The policy's parameters as built (results record them)."""
        return {}

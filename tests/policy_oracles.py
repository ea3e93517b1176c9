"""Reference implementations of the policies' scheduling decisions: the rules as written, one
Python pass per generation.  Production keeps one `select` per policy (numpy where a scheduling
point at 1,000 ready generations needs it); these are the oracles the property tests hold it
to, bit for bit (tests/test_scheduling_fastpaths.py, test_andes.py, test_lamps.py)."""

from __future__ import annotations

import math
import operator
from typing import Sequence

import numpy as np

from timelyllm_ros.core.kv_handling import other_context, private_context
from timelyllm_ros.core.policies.andes import _INF, _Item, _idle_engine_order, _paying_pairs
from timelyllm_ros.core.policies.base import (DispatchMode, PolicyContext, Selection, _order_key, arrival_order,
                                              batch_was_full, priority_order, set_priorities)
from timelyllm_ros.core.policies.default import atc_priorities
from timelyllm_ros.core.policies.lamps import _SCORE, _STARVE
from timelyllm_ros.core.qoe import consume_rate, delivery_runs, measured_tokens_per_word, qoe_of_runs, ttft_target
from timelyllm_ros.core.types import Generation, GenState


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


def default_split(self, gens: Sequence[Generation], now: float, running: bool, terms: tuple[float, float, dict]
           ) -> tuple[list[Generation], list[Generation], bool, list[float], list[float], list[float], bool]:
    """The rules 1-3 terms of `gens` for `Default` `self`, one Python pass (the reference select
    below reads them; `Default.select` computes the same with numpy): (critical, deferrable, a critical
    one is a first segment, their TUF slopes, estimated times and slacks for ATC, some
    generation is a first segment); deferrable ones get −1 − slack (`Generation.next_due` minus
    the estimated time, with the per-point terms hoisted)."""
    token_s, lead, pred = terms
    enter = 0.0 if running else token_s
    critical: list[Generation] = []
    deferrable: list[Generation] = []
    crit = critical.append
    defer = deferrable.append
    alphas: list[float] = []
    ps: list[float] = []
    slacks: list[float] = []
    first_critical = some_first = False
    if pred is self._pred:  # by robot type: continuations, first segments
        get_cont, get_first = self._pred_by[0].get, self._pred_by[1].get
    else:
        get_cont = lambda t, d: pred.get((t, False), d)  # noqa: E731
        get_first = lambda t, d: pred.get((t, True), d)  # noqa: E731
    for g in gens:
        req = g.request
        segs = g.segments
        due = g.next_due(now)
        if segs:
            left = get_cont(req.robot_type, 8.0) - g.seg_tokens
        else:
            some_first = True
            left = get_first(req.robot_type, 8.0) - g.seg_tokens
        p = (left if left > 1.0 else 1.0) * token_s
        s = due - now - p - enter
        if s <= lead:
            crit(g)
            if not segs:
                first_critical = True
            alphas.append(req.tuf.alpha)
            ps.append(p + enter)
            slacks.append(s)
        else:
            g.priority = -1.0 - s
            defer(g)
    return critical, deferrable, first_critical, alphas, ps, slacks, some_first


def default_select_reference(self, ready: Sequence[Generation], running: Sequence[Generation], ctx: PolicyContext,
                             now: float) -> Selection:
    """`Default.select` (`self`: the policy) as its rules read: two Python passes over the ready
    list, ATC in Python (`atc_priority_lists`), a plain sort below 32."""
    self._full = batch_was_full(ready) or self._mem_held  # a cap or KV memory binds (suspend_at)
    full = self._full or self._capped
    terms = self._point_terms(ctx)
    critical, deferrable, protect, *atc_r, some_first = default_split(self, ready, now, False, terms)
    run_crit, run_def, run_first, *atc_w, _ = default_split(self, running, now, True, terms)
    late_ps = [q for q, x in zip(atc_r[1], atc_r[2]) if x < 0.0]  # rule 11: the late backlog
    self._queue_s = self.queue_wait(len(late_ps), late_ps, len(running))
    self._plan = self.plan_applies(now)  # rule 12
    if critical or run_crit:  # ATC priorities, each list on its own (one exp call for both)
        pr, pw = atc_priority_lists((atc_r, atc_w), self.atc_k)
        set_priorities(critical, pr)
        set_priorities(run_crit, pw)
        if self._plan:  # rule 12: the whole reply's WSRPT instead
            set_priorities(critical, self.plan_priorities(critical, terms[0]))
            set_priorities(run_crit, self.plan_priorities(run_crit, terms[0]))
    self._head_pri = max((g.priority for g in critical), default=0.0) if self._plan else 0.0
    protect = protect or run_first  # a critical first segment is running or waiting
    order = _small_order(critical)  # ATC (> 0), best first
    if not protect:
        order += _small_order(deferrable)
    live = [*running, *ready]
    if self.steep_cap and live:  # rule 10 protects first segments steeper than the flattest live generation
        flat = min(-g.request.tuf.alpha for g in live)
        first = any(not g.segments and -g.request.tuf.alpha > flat * (1 + 1e-9) for g in live)
    else:
        first = any(not g.segments for g in live)
    sel = self._finish(order, bool(critical), run_crit, full, running, ctx, now, first=first)
    if not protect or not self.pace:  # (rule 9 off: `_paced` returns sel as it is)
        return sel
    budget = math.inf  # rule 9's tightest per-token budget of the waiting critical first segments
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


# --- Andes (core/policies/andes.py) ---------------------------------------------------------------
def greedy_pack(items: Sequence[int], priority: Sequence[float], mem: Sequence[int], M: float,
                B: int) -> list[int]:
    """Algorithm 1: by priority descending, take while count < B and memory fits; stop at the
    first request that does not fit.  Returns indices."""
    out: list[int] = []
    used = 0.0
    for i in sorted(items, key=lambda i: -priority[i]):
        if len(out) >= B or used + mem[i] > M:
            break
        out.append(i)
        used += mem[i]
    return out


def andes_rate(self, g: Generation, ctx: PolicyContext) -> float:
    """Consumption speed in this engine's tokens: reading/listening speeds are per word, so they
    are rescaled by tokens per word — fixed by ``tokens_per_word``, else measured on the
    request's delivered text, else the running average over requests seen so far."""
    tpw = self.tokens_per_word
    if tpw is None:
        own = measured_tokens_per_word(g)
        if own is not None:
            self._tpw = 0.9 * self._tpw + 0.1 * own
        tpw = own or self._tpw
    return consume_rate(g.request, ctx.robots.get(g.request.robot_type), speaking_types=self.speaking_types,
                        action_rate=self.action_rate, tokens_per_word=tpw)


def andes_item(self, g: Generation, running: bool, ctx: PolicyContext, now: float) -> _Item:
    runs = delivery_runs(g, self.network_latency_s)
    start = g.request.arrival + ttft_target(g.request)
    r = andes_rate(self, g, ctx)
    pending = g.seg_tokens if self.mode is DispatchMode.STREAM else 0
    q_cur = qoe_of_runs(runs, ideal_start=start, rate=r, now=now, complete=False).qoe
    q_wait = qoe_of_runs(runs, ideal_start=start, rate=r, now=now + self.delta_t, complete=False).qoe
    return _Item(g, running, max(1, len(g.prompt_ids) + len(g.output_ids)), runs, start, r, pending,
                 q_cur, q_wait)


def andes_triggered(self, items: Sequence[_Item], full: bool, ctx: PolicyContext) -> tuple[bool, str]:
    st = ctx.stats
    kv = 1.0 - st.kv_free_blocks / st.kv_total_blocks if st.kv_total_blocks else 0.0
    if full:
        return True, "batch full"
    if kv > self.kv_trigger:
        return True, f"kv {kv:.2f}"
    if items and ctx.token_s > min(1.0 / it.rate for it in items):
        return True, "token latency"
    return False, ""


def andes_batch_sizes(self, items: Sequence[_Item], n_running: int, full: bool, ctx: PolicyContext,
                      M: float) -> list[int]:
    n = len(items)
    bmax = n
    if self.max_batch is not None:
        bmax = min(bmax, self.max_batch)
    if full:
        bmax = min(bmax, max(1, n_running))  # larger batches were refused: not realisable
    used = fit = 0
    for l in sorted(it.l for it in items):
        if used + l > M:
            break
        used += l
        fit += 1
    return self._b_candidates(max(1, min(bmax, fit)), max(it.rate for it in items), n_running, ctx)


def andes_select_reference(self, ready: Sequence[Generation], running: Sequence[Generation], ctx: PolicyContext,
                           now: float) -> Selection:
    """`Andes.select` (`self`: the policy) as the paper's steps read: per request and candidate
    batch size in Python (Algorithm 1's `greedy_pack`, the refiner pair by pair)."""
    full = batch_was_full(ready)
    fcfs = sorted(ready, key=lambda g: (-g.extra.get("andes_pri", _INF), g.request.arrival, g.gen_id))
    if not ready:
        return Selection(order=[])
    items = [andes_item(self, g, True, ctx, now) for g in running] + [andes_item(self, g, False, ctx, now) for g in ready]
    on, why = andes_triggered(self, items, full, ctx)
    if not on:
        for g in ready:
            g.extra.pop("andes_pri", None)
        return Selection(order=sorted(ready, key=lambda g: (g.request.arrival, g.gen_id)))
    self._triggered += 1
    if (self._triggered - 1) % self.solve_every:
        return Selection(order=fcfs)
    self.solves += 1
    st = ctx.stats
    M = float(st.kv_total_blocks * st.block_size) if st.kv_total_blocks else _INF
    n_run = len(running)
    idx = list(range(len(items)))
    mem = [it.l for it in items]
    best: tuple | None = None
    for B in andes_batch_sizes(self, items, n_run, full, ctx, M):
        lat = self.lat(B, ctx, n_run)
        gains = [self.q_serve(it, lat, now) - it.q_wait for it in items]
        pri = [gains[i] / mem[i] for i in idx]
        chosen = greedy_pack(idx, pri, mem, M, B)
        value = math.fsum(gains[i] for i in chosen)
        key = (round(value, 12), -abs(B - n_run))
        if best is None or key > best[0]:
            best = (key, B, chosen, gains, pri)
    assert best is not None
    _, B, chosen, gains, pri = best
    for i, it in enumerate(items):
        it.g.priority = pri[i]
        it.g.extra["andes_pri"] = pri[i]
    cs = set(chosen)
    admit = sorted((i for i in cs if not items[i].running), key=lambda i: -pri[i])
    victims = sorted((i for i in idx if items[i].running and i not in cs), key=lambda i: pri[i])
    acc_admit, acc_preempt = andes_refine(self, items, admit, victims, gains, cs, now)
    if not n_run and not acc_admit:
        acc_admit = _idle_engine_order(admit, pri)
    self.last_decision = {"B": B, "why": why, "admit": len(acc_admit), "preempt": len(acc_preempt),
                          "proposed_admit": len(admit), "proposed_preempt": len(victims)}
    return Selection(order=[items[i].g for i in acc_admit], preempt=[items[i].g for i in acc_preempt])


def andes_refine(self, items: list[_Item], admit: list[int], victims: list[int], gains: list[float],
                 chosen: set[int], now: float) -> tuple[list[int], list[int]]:
    """Overhead-aware refiner: keep admit/preempt pairs while they pay for the stall they
    cause the requests that keep running."""
    if not self.refine:
        return admit, victims
    kept = [it for i, it in enumerate(items) if it.running and i in chosen]
    return _paying_pairs(admit, victims, gains, lambda k, j: math.fsum(
        self.loss(it, self.prefill_s_per_token * items[j].l, now) for it in kept))


# --- LAMPS (core/policies/lamps.py) ---------------------------------------------------------------
_COUNT = "lamps_wait"
_SEEN = "lamps_seen"


def lamps_eligible(self, g: Generation, ctx: PolicyContext, now: float) -> bool:
    """Just-in-time resume: a non-blocking suspended generation waits until its robot's
    current action is about G from its end (nothing is gained by holding KV earlier)."""
    if not self.jit_resume or g.state is not GenState.SUSPENDED or not g.segments:
        return True
    if g.segments[-1].blocking:
        return True  # it came back from a result: run it
    end = g.prev_exec_end_estimate()
    return end is None or now >= end - ctx.seg_gen_s


def lamps_count(self, g: Generation, it: int) -> None:
    """Starvation counter: +1 per consecutive iteration spent ready; reset otherwise."""
    if g.extra.get(_SEEN) == it - 1:
        g.extra[_COUNT] = g.extra.get(_COUNT, 0) + 1
    else:
        g.extra[_COUNT] = 0  # newly ready: arrived, returned from a call, or was running
    g.extra[_SEEN] = it
    if g.extra[_COUNT] >= self.starvation_threshold and not g.extra.get(_STARVE):
        g.extra[_STARVE] = True
        g.extra["lamps_starved_at"] = it


def lamps_select_reference(self, ready: Sequence[Generation], running: Sequence[Generation], ctx: PolicyContext,
                           now: float) -> Selection:
    """`LAMPS.select` (`self`: the policy) per generation, as written; the starvation counters
    in each generation's extra (`_COUNT`)."""
    self.observe(running)
    self.observe(ready)
    it = ctx.iteration
    order = []
    # C_other of a generation outside the batch is the whole batch's private context, the
    # same for every ready one at this point (prefixes were observed above): computed once.
    run_ids = {o.gen_id for o in running}
    batch_ctx: int | None = None
    for g in ready:
        lamps_count(self, g, it)
        if not lamps_eligible(self, g, ctx, now):
            continue
        cached = g.extra.get(_SCORE)  # (policy, iteration, area, segments)
        if (cached is None or cached[0] != self._token or it - cached[1] >= self.score_interval
                or cached[3] != len(g.segments)):
            c_other = None
            if g.gen_id not in run_ids:
                if batch_ctx is None:
                    batch_ctx = other_context(g, running, self.prefix)
                c_other = batch_ctx
            g.extra[_SCORE] = (self._token, it, self.area(g, ctx, running, c_other), len(g.segments))
        g.priority = -g.extra[_SCORE][2]
        order.append(g)
    order.sort(key=lambda g: (not g.extra.get(_STARVE, False), -g.priority, g.ready_since,
                              g.request.arrival, g.gen_id))
    if self.memory_admission:
        order = self.admission_cut(order, running, ctx)
    return Selection(order=order)


# --- Hybrid (core/policies/hybrid.py) -------------------------------------------------------------
_PRIORITY = operator.attrgetter("priority")


def longest_first(gens: Sequence[Generation]) -> list[Generation]:
    """`gens` sorted by (-priority, arrival, gen_id).  Total lengths tie a lot, so instead of
    `priority_order` (which re-sorts every run of equal priorities by the tuple) this sorts by
    (arrival, gen_id), then stably by priority, descending — with C-level keys; the order is the
    same.  Non-finite priorities take the plain tuple sort."""
    try:
        finite = math.isfinite(sum(map(_PRIORITY, gens)))
    except TypeError:
        finite = False
    if not finite:
        return sorted(gens, key=lambda g: (-g.priority, g.request.arrival, g.gen_id))
    order = arrival_order(gens)
    order.sort(key=_PRIORITY, reverse=True)  # stable: equal priorities keep the arrival order
    return order


def hybrid_prefill_cost(self, new: Sequence[Generation]) -> float:
    """C_p: one prefill stage over the new generations' uncached (private) tokens."""
    prefix = self.prefix
    if not prefix.seen_all(new):  # observing changes the shared length: one at a time
        return self.cost.t_fwd(sum(private_context(g, prefix) for g in new))
    shared: dict[str, int] = {}
    total = 0
    for g in new:  # private_context(g, prefix), with the shared length looked up once per type
        rt = g.request.robot_type
        sh = shared.get(rt)
        if sh is None:
            sh = shared[rt] = prefix.shared(rt)
        n_prompt = len(g.prompt_ids)
        total += max(0, n_prompt + len(g.output_ids) - min(sh, n_prompt))
    return self.cost.t_fwd(total)


def hybrid_select_reference(self, ready: Sequence[Generation], running: Sequence[Generation], ctx: PolicyContext,
                            now: float) -> Selection:
    """`Hybrid.select` (`self`: the policy) per generation: `priority()` and C_p written out."""
    self.prefix.observe_all(list(running) + list(ready))
    if self._last_now is not None and running:
        self.decode_since_prefill += max(0.0, now - self._last_now)
    self._last_now = now
    for g in ready:
        g.priority = self.priority(g, ctx, now)
    order = longest_first(ready)  # = sorted by (-priority, arrival, gen_id)
    new = [g for g in order if g.state is GenState.QUEUED]
    if not new:
        return Selection(order=order)
    if self.pd_rule and running and hybrid_prefill_cost(self, new) >= self.decode_since_prefill:
        self.held += 1
        return Selection(order=[g for g in order if g.state is not GenState.QUEUED])
    self.decode_since_prefill = 0.0
    return Selection(order=order)

"""Reference implementations of the policies' scheduling decisions: the rules as written, one
Python pass per generation.  Production keeps one `select` per policy (numpy where a scheduling
point at 1,000 ready generations needs it); these are the oracles the property tests hold it
to, bit for bit (tests/test_scheduling_fastpaths.py, test_andes.py, test_lamps.py).  The
default policy's plain pass is production code itself (core/policies/default_small.py, taken
under 64 live generations): the property tests force each of its two paths and compare them."""

from __future__ import annotations

import math
import operator
from typing import Sequence

from timelyllm_ros.core.kv_handling import other_context, private_context
from timelyllm_ros.core.policies.andes import _INF, _Item, _idle_engine_order, _paying_pairs, _pri_or_inf
from timelyllm_ros.core.policies.base import DispatchMode, PolicyContext, Selection, arrival_order, batch_was_full
from timelyllm_ros.core.qoe import consume_rate, delivery_runs, measured_tokens_per_word, qoe_of_runs, ttft_target
from timelyllm_ros.core.types import Generation, GenState


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
    fcfs = sorted(ready, key=lambda g: (-_pri_or_inf(g.policy.andes_pri), g.request.arrival, g.gen_id))
    if not ready:
        return Selection(order=[])
    items = [andes_item(self, g, True, ctx, now) for g in running] + [andes_item(self, g, False, ctx, now) for g in ready]
    on, why = andes_triggered(self, items, full, ctx)
    if not on:
        for g in ready:
            g.policy.andes_pri = None
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
        it.g.policy.andes_pri = pri[i]
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


def lamps_eligible(self, g: Generation, ctx: PolicyContext, now: float) -> bool:
    """Just-in-time resume: a non-blocking suspended generation waits until its robot's
    current action is about G from its end (nothing is gained by holding KV earlier)."""
    if not self.jit_resume or g.state is not GenState.SUSPENDED or not g.segments:
        return True
    if g.segments[-1].blocking:
        return True  # it came back from a result: run it
    end = g.prev_exec_end_estimate()
    return end is None or now >= end - ctx.seg_gen_s


def lamps_counters(self) -> dict[str, tuple[int, int]]:
    """The reference's starvation counters (the fast path keeps them in its SlotTable): per
    generation id, (the last iteration it was seen ready, consecutive iterations ready)."""
    return self.__dict__.setdefault("_ref_counters", {})


def lamps_ref_wait(self, g: Generation) -> int:
    """The reference's starvation counter of g (`LAMPS.wait_count` on the fast path)."""
    return lamps_counters(self).get(g.gen_id, (None, 0))[1]


def lamps_count(self, g: Generation, it: int) -> None:
    """Starvation counter: +1 per consecutive iteration spent ready; reset otherwise."""
    counters = lamps_counters(self)
    seen, count = counters.get(g.gen_id, (None, 0))
    count = count + 1 if seen == it - 1 else 0  # 0: newly ready (arrived, returned from a call, or was running)
    counters[g.gen_id] = (it, count)
    if count >= self.starvation_threshold and not g.policy.lamps.starving:
        st = g.policy.lamps
        st.starving = True
        st.starved_at = it


def lamps_select_reference(self, ready: Sequence[Generation], running: Sequence[Generation], ctx: PolicyContext,
                           now: float) -> Selection:
    """`LAMPS.select` (`self`: the policy) per generation, as written; the starvation counters
    per generation id on the policy (`lamps_counters`)."""
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
        cached = g.policy.lamps.score  # (policy, iteration, area, segments)
        if (cached is None or cached[0] != self._token or it - cached[1] >= self.score_interval
                or cached[3] != len(g.segments)):
            c_other = None
            if g.gen_id not in run_ids:
                if batch_ctx is None:
                    batch_ctx = other_context(g, running, self.prefix)
                c_other = batch_ctx
            g.policy.lamps.score = (self._token, it, self.area(g, ctx, running, c_other), len(g.segments))
        g.priority = -g.policy.lamps.score[2]
        order.append(g)
    order.sort(key=lambda g: (not g.policy.lamps.starving, -g.priority, g.ready_since,
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

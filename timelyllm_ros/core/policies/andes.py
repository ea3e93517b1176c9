"""Andes: QoE-aware token-level preemptive scheduling (Andes §4).

At a *triggered* scheduling point, for every live generation i (running or ready):

  gain_i(B) = Q_serve,i(B) − Q_wait,i     (QoE at now + Δt if served in a batch of B / not served)
  priority_i = gain_i / l_i                (QoE gain per unit of KV memory, l_i = context tokens)

For each candidate batch size B in [B_min, B_max], greedy packing by priority (take while the count
stays <= B and memory <= M, stop at the first misfit; Algorithm 1) gives a set and its total gain;
the best B wins.  Admit = chosen − running (priority descending), preempt = running − chosen
(priority ascending).  The overhead-aware refiner walks the admit/preempt pairs in that order and
keeps a pair only while  gain(admit) − gain(victim) − Σ_kept-running QoE loss(overhead)  > 0; the
first pair that does not pay stops the rest (Andes §4.3).

Q_serve projects deliveries one token per lat(B) from now; Q_wait projects none; both are the QoE
"so far" at now + Δt (core/qoe.py).  lat(B) = measured time per token (ctx.token_s) +
``lat_per_seq_s``·(B − current batch): the measured speed anchors it, the slope is the engine's
marginal cost of one more sequence.  Consumption speed per request: request.consume_rate, else
reading 4.8 tok/s, or listening 3.3 tok/s for robot types in ``speaking_types`` (the paper's speeds
at 1.3 tokens per word, rescaled to this engine's tokens per word); action robots use
``action_rate``.  TTFT target = the request's TUF ERT.

Selective triggering: only when KV occupancy > ``kv_trigger`` (0.9), the measured token latency
exceeds the strictest 1/r, or the batch is full (the planner's batch-size controller refused a ready
generation at the previous point: ``extra["blocked"]``; in this planner the controller is where
vLLM's max_num_seqs / KV admission lives).  Otherwise it is FCFS (vLLM's default), no preemption.
The solver runs every ``solve_every`` triggered points (the authors' fork: every few iterations);
in between, ready generations are admitted by their last priority.

Values the paper leaves open and our choices (docs/policies.md): Δt = 10 s (authors' fork),
overhead of admitting/resuming j = ``prefill_s_per_token``·l_j (recompute, the upper bound; with
the prefix cache a resume is usually cheaper), ≤ ``max_b_candidates`` batch sizes spaced
geometrically in [B_min, B_max].
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

from ..qoe import (PAPER_TOKENS_PER_WORD, Run, consume_rate, delivery_runs, measured_tokens_per_word,
                   qoe_of_runs, ttft_target)
from ..types import Generation, Segment
from . import register
from .base import DispatchMode, Policy, PolicyContext, Selection

_MODES = {"stream": DispatchMode.STREAM, "suspend": DispatchMode.SUSPEND}
_INF = float("inf")


@dataclass
class _Item:
    g: Generation
    running: bool
    l: int  # context tokens (KV memory)
    runs: list[Run]
    start: float  # ideal start (arrival + TTFT target)
    rate: float
    pending: int  # generated, not yet delivered (current sentence)
    q_cur: float
    q_wait: float


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


class Andes(Policy):
    name = "andes"

    def __init__(self, delta_t: float = 10.0, kv_trigger: float = 0.9, solve_every: int = 1,
                 max_batch: int | None = None, lat_per_seq_s: float = 2e-4,
                 prefill_s_per_token: float = 1.06e-4, refine: bool = True,
                 speaking_types: Iterable[str] = (), action_rate: float = 5.0,
                 network_latency_s: float = 0.0, max_b_candidates: int = 8, mode: str = "stream",
                 kv: str = "cache", tokens_per_word: float | None = None) -> None:
        if not (delta_t > 0 and math.isfinite(delta_t)):
            raise ValueError(f"delta_t must be > 0 s, got {delta_t!r}")
        if not 0 < kv_trigger <= 1:
            raise ValueError(f"kv_trigger must be in (0, 1], got {kv_trigger!r}")
        if solve_every < 1 or max_b_candidates < 1:
            raise ValueError("solve_every and max_b_candidates must be >= 1")
        if max_batch is not None and max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if lat_per_seq_s < 0 or prefill_s_per_token < 0 or action_rate <= 0:
            raise ValueError("lat_per_seq_s and prefill_s_per_token must be >= 0, action_rate > 0")
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {sorted(_MODES)}, got {mode!r}")
        self.delta_t = float(delta_t)
        self.kv_trigger = float(kv_trigger)
        self.solve_every = int(solve_every)
        self.max_batch = max_batch
        self.lat_per_seq_s = float(lat_per_seq_s)
        self.prefill_s_per_token = float(prefill_s_per_token)
        self.refine = bool(refine)
        self.speaking_types = tuple(speaking_types)
        self.action_rate = float(action_rate)
        self.network_latency_s = float(network_latency_s)
        self.max_b_candidates = int(max_b_candidates)
        self.mode = _MODES[mode]
        self.kv = kv
        self._mode_name = mode
        if tokens_per_word is not None and not tokens_per_word > 0:
            raise ValueError(f"tokens_per_word must be > 0, got {tokens_per_word!r}")
        self.tokens_per_word = tokens_per_word  # None: learn it from delivered text
        self._tpw = tokens_per_word or PAPER_TOKENS_PER_WORD
        self._triggered = 0
        self.solves = 0
        self.last_decision: dict = {}

    # --- per-request QoE terms --------------------------------------------------------------------
    def rate(self, g: Generation, ctx: PolicyContext) -> float:
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

    def lat(self, B: int, ctx: PolicyContext, n_running: int) -> float:
        """Time per token at batch size B, anchored at the measured speed of the current batch."""
        return max(1e-4, ctx.token_s + self.lat_per_seq_s * (B - max(1, n_running)))

    def _item(self, g: Generation, running: bool, ctx: PolicyContext, now: float) -> _Item:
        runs = delivery_runs(g, self.network_latency_s)
        start = g.request.arrival + ttft_target(g.request)
        r = self.rate(g, ctx)
        pending = g.seg_tokens if self.mode is DispatchMode.STREAM else 0
        q_cur = qoe_of_runs(runs, ideal_start=start, rate=r, now=now, complete=False).qoe
        q_wait = qoe_of_runs(runs, ideal_start=start, rate=r, now=now + self.delta_t, complete=False).qoe
        return _Item(g, running, max(1, len(g.prompt_ids) + len(g.output_ids)), runs, start, r, pending,
                     q_cur, q_wait)

    def q_serve(self, it: _Item, lat: float, now: float) -> float:
        n = int(self.delta_t / lat)
        proj = Run(now + lat + self.network_latency_s, it.pending + n, lat)
        return qoe_of_runs(it.runs + [proj], ideal_start=it.start, rate=it.rate, now=now + self.delta_t,
                           complete=False).qoe

    def loss(self, it: _Item, overhead_s: float, now: float) -> float:
        """QoE an ongoing request loses when the whole batch stalls for overhead_s (computed like
        Q_wait with Δt = overhead)."""
        if overhead_s <= 0:
            return 0.0
        q = qoe_of_runs(it.runs, ideal_start=it.start, rate=it.rate, now=now + overhead_s, complete=False).qoe
        return max(0.0, it.q_cur - q)

    # --- triggering -----------------------------------------------------------------------------
    def triggered(self, items: Sequence[_Item], full: bool, ctx: PolicyContext) -> tuple[bool, str]:
        st = ctx.stats
        kv = 1.0 - st.kv_free_blocks / st.kv_total_blocks if st.kv_total_blocks else 0.0
        if full:
            return True, "batch full"
        if kv > self.kv_trigger:
            return True, f"kv {kv:.2f}"
        if items and ctx.token_s > min(1.0 / it.rate for it in items):
            return True, "token latency"
        return False, ""

    def batch_sizes(self, items: Sequence[_Item], n_running: int, full: bool, ctx: PolicyContext,
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
        bmax = max(1, min(bmax, fit))
        r_max = max(it.rate for it in items)
        bmin = 1
        while bmin < bmax and self.lat(bmin + 1, ctx, n_running) < 1.0 / r_max:
            bmin += 1
        if bmin >= bmax:
            return [bmax]
        k = self.max_b_candidates
        cands = {bmin, bmax}
        for j in range(1, k - 1):
            cands.add(int(round(bmin * (bmax / bmin) ** (j / (k - 1)))))
        return sorted(c for c in cands if bmin <= c <= bmax)

    # --- the decision ---------------------------------------------------------------------------
    def select(self, ready: Sequence[Generation], running: Sequence[Generation], ctx: PolicyContext,
               now: float) -> Selection:
        full = False
        for g in ready:
            if g.extra.pop("blocked", None) is not None:
                full = True
        fcfs = sorted(ready, key=lambda g: (-g.extra.get("andes_pri", _INF), g.request.arrival, g.gen_id))
        if not ready:
            return Selection(order=[])
        items = [self._item(g, True, ctx, now) for g in running] + [self._item(g, False, ctx, now) for g in ready]
        on, why = self.triggered(items, full, ctx)
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
        for B in self.batch_sizes(items, n_run, full, ctx, M):
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
        acc_admit, acc_preempt = self._refine(items, admit, victims, gains, cs, now)
        self.last_decision = {"B": B, "why": why, "admit": len(acc_admit), "preempt": len(acc_preempt),
                              "proposed_admit": len(admit), "proposed_preempt": len(victims)}
        return Selection(order=[items[i].g for i in acc_admit], preempt=[items[i].g for i in acc_preempt])

    def _refine(self, items: list[_Item], admit: list[int], victims: list[int], gains: list[float],
                chosen: set[int], now: float) -> tuple[list[int], list[int]]:
        """Overhead-aware refiner: keep admit/preempt pairs while they pay for the stall they
        cause the requests that keep running."""
        if not self.refine:
            return admit, victims
        kept = [it for i, it in enumerate(items) if it.running and i in chosen]
        acc_a: list[int] = []
        acc_v: list[int] = []
        for k, j in enumerate(admit):
            v = victims[k] if k < len(victims) else None
            overhead = self.prefill_s_per_token * items[j].l
            loss = math.fsum(self.loss(it, overhead, now) for it in kept)
            net = gains[j] - (gains[v] if v is not None else 0.0) - loss
            if net <= 0:
                break
            acc_a.append(j)
            if v is not None:
                acc_v.append(v)
        return acc_a, acc_v

    def kv_mode(self, g: Generation, seg: Segment | None, ctx: PolicyContext) -> str:
        return self.kv if seg is None else "cache"

    def params(self) -> dict:
        return {"delta_t": self.delta_t, "kv_trigger": self.kv_trigger, "solve_every": self.solve_every,
                "max_batch": self.max_batch, "lat_per_seq_s": self.lat_per_seq_s,
                "prefill_s_per_token": self.prefill_s_per_token, "refine": self.refine,
                "speaking_types": list(self.speaking_types), "action_rate": self.action_rate,
                "network_latency_s": self.network_latency_s, "max_b_candidates": self.max_b_candidates,
                "mode": self._mode_name, "kv": self.kv, "tokens_per_word": self.tokens_per_word}


register("andes", Andes)

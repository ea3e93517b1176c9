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
generation at the previous point: ``Generation.blocked``; in this planner the controller is where
vLLM's max_num_seqs / KV admission lives).  Otherwise it is FCFS (vLLM's default), no preemption.
The solver runs every ``solve_every`` triggered points (the authors' fork: every few iterations);
in between, ready generations are admitted by their last priority.

Values the paper leaves open and our choices (docs/policies.md): Δt = 10 s (authors' fork),
overhead of admitting/resuming j = ``prefill_s_per_token``·l_j (recompute, the upper bound; with
the prefix cache a resume is usually cheaper), ≤ ``max_b_candidates`` batch sizes spaced
geometrically in [B_min, B_max].

About 700 lines: the policy, its vectorised select for hundreds of live generations and its small
path for a handful (one compiled solve call, with the Python steps it falls back to where a
rounding, tie or NaN decides) — one rule, three speeds, kept together so that the tests' oracle
(tests/policy_oracles.py) is checked against each in one place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np

from .. import qoe_kernel
from ..qoe import (_EPS, PAPER_TOKENS_PER_WORD, READING_TOK_S, SPEAKING_TOK_S, Run, delivery_runs,
                   QoEBatch, fold_runs, measured_tokens_per_word, qoe_of_runs, ttft_target)
from ..types import Generation, Segment
from .base import (DispatchMode, Policy, PolicyContext, Selection, arrival_order, batch_was_full,
                   set_priorities)
from .slots import SlotTable

_MODES = {"stream": DispatchMode.STREAM, "suspend": DispatchMode.SUSPEND}
_STREAM = DispatchMode.STREAM
_INF = float("inf")


def _pri_or_inf(p: float | None) -> float:
    """A kept solve priority, or +inf for a generation no solve has ranked (it sorts first)."""
    return _INF if p is None else p


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


def _paying_pairs(admit: list[int], victims: list[int], gains: Sequence[float],
                  loss_of) -> tuple[list[int], list[int]]:
    """The refiner's walk: admit/preempt pairs in order while gain(admit) − gain(victim) − the
    stall loss of the kept requests (`loss_of(k, j)` for the k-th admission, j) stays > 0."""
    nv = len(victims)
    for k, j in enumerate(admit):
        if gains[j] - (gains[victims[k]] if k < nv else 0.0) - loss_of(k, j) <= 0:
            return admit[:k], victims[:k]
    return admit[:], victims[:len(admit)]


def _idle_engine_order(admit: list[int], pri: Sequence[float]) -> list[int]:
    """What an empty engine runs when the refiner kept no admission [ours; the paper leaves it
    open].  With nothing running no one stalls, so the refiner's only reason to refuse is a gain
    <= 0 — e.g. requests whose QoE is lost whether served or not — and an idle engine helps no
    one (it only postpones them further; in the simulator, waiting requests that nothing admits
    never end).  So: the packed set as proposed, or, if packing took nothing (the best request
    alone exceeds the memory bound M), every ready request by priority (stable), for the
    planner to admit what fits."""
    if admit:
        return list(admit)
    return sorted(range(len(pri)), key=lambda i: -pri[i])


def _stable_head(x: np.ndarray, k: int) -> np.ndarray:
    """The first k of np.argsort(x, kind="stable") without sorting everything: the k smallest by
    a partition, ties at the k-th value in index order (as the stable sort keeps them)."""
    if 4 * k >= len(x):
        return x.argsort(kind="stable")[:k]
    v = np.partition(x, k - 1)[k - 1]
    if v != v:  # NaN (sorted last) reaches the head: the plain sort
        return x.argsort(kind="stable")[:k]
    cand = np.flatnonzero(x <= v)
    return cand[np.argsort(x[cand], kind="stable")[:k]]


def _stable_heads(x: np.ndarray, k: int) -> np.ndarray:
    """`_stable_head` of every row of x (2-D), without a partition per row (~20 µs each at 1,000):
    a threshold per row from a sorted sample; where at least k values are <= it, the k smallest
    are among those (ties included), which one lexsort orders by value, then index, for all
    rows at once.  A row with fewer (or a NaN threshold) takes the row-wise path."""
    rows_n, n = x.shape
    if 4 * k >= n:
        return x.argsort(axis=1, kind="stable")[:, :k]
    step = max(1, n // (8 * k))
    sample = np.sort(x[:, ::step], axis=1)
    t = sample[:, min(sample.shape[1] - 1, (2 * k) // step + 1)]
    with np.errstate(invalid="ignore"):
        mask = x <= t[:, None]
    counts = np.count_nonzero(mask, axis=1)
    heads = np.empty((rows_n, k), dtype=np.intp)
    ok = counts >= k
    if ok.any():
        sub = mask[ok]
        r, c = np.nonzero(sub)
        order = np.lexsort((c, x[ok][r, c], r))  # by row, value, index
        first = np.concatenate(([0], np.cumsum(counts[ok])[:-1]))
        heads[ok] = c[order][first[:, None] + np.arange(k)]
    for row in np.flatnonzero(~ok).tolist():
        heads[row] = _stable_head(x[row], k)
    return heads


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
        qoe_kernel.warm()  # compile Q_serve's loop at construction, not at the first scheduling point
        self.last_decision: dict = {}
        self._pri_written = False  # a solve's priorities sit on the generations (`andes_pri`, solve_every > 1)
        # few-requests path (`_select_small`): memos keyed by what they are a function of, work arrays
        self._cands_memo: dict[tuple[int, int], tuple[int, ...]] = {}  # (bmin, bmax) -> candidate sizes
        self._small_memo: dict[tuple, tuple] = {}  # (B bounds, rates, token time, ...) -> sizes, latencies, arrays
        # live requests n -> a (12, n) work array; (rows, n, K) -> the packing's (`_select_small`)
        self._small_ws: dict[int | tuple[int, int, int], np.ndarray | tuple[np.ndarray, ...]] = {}
        self._small_rows: np.ndarray | None = None  # the rows of qoe_kernel.SMALL_TERM_ROWS in the slot table
        self._fill_mv: tuple | None = None  # `_fill`'s: the "l" column, memoryviews of "l", "pending", "nseg"

    # --- per-request QoE terms --------------------------------------------------------------------
    def lat(self, B: int, ctx: PolicyContext, n_running: int) -> float:
        """Time per token at batch size B, anchored at the measured speed of the current batch."""
        return max(1e-4, ctx.token_s + self.lat_per_seq_s * (B - max(1, n_running)))

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

    def _b_candidates(self, bmax: int, r_max: float, n_running: int, ctx: PolicyContext) -> list[int]:
        """At most max_b_candidates sizes spaced geometrically in [B_min, bmax]; B_min: the largest
        batch whose token latency still keeps up with the fastest reader."""
        bmin = 1
        limit = 1.0 / r_max
        if type(self).lat is Andes.lat:  # `lat` inlined (the same expression): ~0.4 µs a call
            tok, slope, cur = ctx.token_s, self.lat_per_seq_s, max(1, n_running)
            while bmin < bmax and max(1e-4, tok + slope * (bmin + 1 - cur)) < limit:
                bmin += 1
        while bmin < bmax and self.lat(bmin + 1, ctx, n_running) < limit:
            bmin += 1
        if bmin >= bmax:
            return [bmax]
        memo = self._cands_memo  # (a function of bmin and bmax alone)
        got = memo.get((bmin, bmax))
        if got is not None:
            return list(got)
        k = self.max_b_candidates
        cands = {bmin, bmax}
        for j in range(1, k - 1):
            cands.add(int(round(bmin * (bmax / bmin) ** (j / (k - 1)))))
        out = sorted(c for c in cands if bmin <= c <= bmax)
        if len(memo) < 4096:
            memo[(bmin, bmax)] = tuple(out)
        return out

    # --- the decision ---------------------------------------------------------------------------
    # Evaluated per request and candidate batch size in Python this is ~60-100 ms at 1,000 ready
    # generations; `select` computes it with numpy: a ready generation's delivery runs, context
    # length, TTFT target and measured tokens per word only change when it runs, so they are
    # folded once (a SlotTable) and every point evaluates Q_cur, Q_wait and Q_serve(B) for all
    # requests at once (qoe.QoEBatch; Q_serve of every candidate B in qoe_kernel's compiled
    # loop), packs every B from its first B by priority (`_stable_heads`: no full sort per
    # candidate; Algorithm 1's greedy packing), and prices the refiner's stalls for all
    # admissions at once.  The running tokens-per-word average keeps its sequential update.
    # Requests the closed form does not cover (a delivered run not yet started at `now`) take
    # the scalar formulas (`q_serve`, `loss`).  Bit for bit the paper's steps written out plainly
    # (tests/policy_oracles.py, the oracle of tests/test_scheduling_fastpaths.py).
    _ARRAYS = ("start", "l", "pending", "own", "fixed", "base", "fold_rate", "sa", "pn", "la", "dl", "last_start",
               "nseg")

    def _fill(self, gens: list[Generation], slots: list[int], outs: list[int], ctx: PolicyContext) -> None:
        """What Andes needs of each g of `gens` (its slot and output length: `slots`', `outs`') that
        only changes when g runs (`SlotTable.lookup`'s fill_many): context length and pending
        tokens, and where g's segments changed (`_fill_segments`) its delivery runs and speeds.
        Every running generation passes here at every point: one call, and the three columns it
        touches through memoryviews (an item read or write costs about half numpy's scalar one)."""
        a = self._table.a
        mv = self._fill_mv
        if mv is None or mv[0] is not a["l"]:  # (the table grew: new arrays)
            mv = self._fill_mv = (a["l"], memoryview(a["l"]), memoryview(a["pending"]), memoryview(a["nseg"]))
        _, col_l, col_pending, col_nseg = mv
        stream = self.mode is _STREAM
        for g, slot, out in zip(gens, slots, outs):
            l = len(g.prompt_ids) + out
            col_l[slot] = l if l > 1 else 1  # max(1, l)
            col_pending[slot] = g.seg_tokens if stream else 0
            if col_nseg[slot] != len(g.segments):  # (more tokens, same segments: runs and speeds unchanged)
                self._fill_segments(g, slot, ctx)

    def _fill_segments(self, g: Generation, slot: int, ctx: PolicyContext) -> None:
        """What Andes needs of g that only changes with its segments: delivery runs, ideal start,
        own tokens per word, and the consumption speed (fixed, or a reading / listening base
        scaled by tokens per word)."""
        table = self._table
        a = table.a
        a["nseg"][slot] = len(g.segments)
        req = g.request
        robot = ctx.robots.get(req.robot_type)
        if req.consume_rate is not None:
            fixed = float(req.consume_rate)
        elif robot is not None and robot.language != "sentence":
            fixed = self.action_rate
        else:
            fixed = math.nan
        runs = delivery_runs(g, self.network_latency_s)
        runs.sort(key=lambda r: r.start)
        own = measured_tokens_per_word(g) if self.tokens_per_word is None else None
        table.py[slot] = runs
        start = req.arrival + ttft_target(req)
        a["start"][slot] = start
        a["own"][slot] = math.nan if own is None else own
        a["fixed"][slot] = fixed
        a["base"][slot] = SPEAKING_TOK_S if req.robot_type in self.speaking_types else READING_TOK_S
        a["fold_rate"][slot] = math.nan
        if runs:
            a["last_start"][slot] = runs[-1].start
        else:
            a["last_start"][slot] = -_INF
            a["sa"][slot], a["pn"][slot], a["la"][slot], a["dl"][slot] = 0.0, start, start, 0

    def _slot_map(self, gens: list[Generation], ctx: PolicyContext) -> np.ndarray:
        """Slots of gens in the policy's SlotTable (new and changed ones filled)."""
        if self.__dict__.get("_table") is None or self._robots is not ctx.robots:
            self._table = SlotTable({k: (float, math.nan) for k in self._ARRAYS}, matrix=True)
            self._robots = ctx.robots
        return self._table.lookup(gens, None, fill_many=lambda gs, slots, outs: self._fill(gs, slots, outs, ctx))

    def _write_priorities(self, gens: Sequence[Generation], pri: list[float]) -> None:
        """A solve's priorities onto the generations; with `solve_every` > 1 also kept in their
        policy state (`PolicyState.andes_pri`: the last solve's order holds at the points between
        solves, `_trigger`)."""
        if self.solve_every > 1:
            for g, p in zip(gens, pri):
                g.priority = p
                g.policy.andes_pri = p
            self._pri_written = True
        else:
            set_priorities(gens, pri)

    def _trigger(self, full: bool, ctx: PolicyContext, u_min: float, ready: Sequence[Generation]
                 ) -> tuple[str, Selection | None]:
        """Andes' triggering (both paths of `select`): why the knapsack runs ("batch full", KV use
        above `kv_trigger`, or the token latency above the fastest reader's 1 / rate, `u_min`), and
        the Selection to return at once where it does not — not triggered: arrival order (stale
        priorities dropped); triggered between solves (`solve_every`): the last solve's priorities."""
        st = ctx.stats
        kv = 1.0 - st.kv_free_blocks / st.kv_total_blocks if st.kv_total_blocks else 0.0
        if full:
            why = "batch full"
        elif kv > self.kv_trigger:
            why = f"kv {kv:.2f}"
        elif ctx.token_s > u_min:  # min over requests of 1 / rate
            why = "token latency"
        else:
            if self._pri_written:
                for g in ready:
                    g.policy.andes_pri = None
            return "", Selection(order=arrival_order(ready))
        self._triggered += 1
        if (self._triggered - 1) % self.solve_every:
            return why, Selection(order=sorted(ready, key=lambda g: (-_pri_or_inf(g.policy.andes_pri),
                                                                     g.request.arrival, g.gen_id)))
        return why, None

    # At a handful of live requests the numpy calls above cost ~1 µs each, most of a point
    # (~140 µs at 8 ready + 8 running): up to `small_n` of them take `_select_small`, the same
    # steps on Python lists with the compiled loops of qoe_kernel (two calls where no scalar
    # formula is needed), the same bits (tests/test_scheduling_fastpaths.py runs both paths, and
    # the small path's Python steps on their own, against the plain oracle).
    small_n = 32

    def select(self, ready: Sequence[Generation], running: Sequence[Generation], ctx: PolicyContext,
               now: float) -> Selection:
        full = batch_was_full(ready)
        if not ready:
            return Selection(order=[])
        gens = list(running) + list(ready)
        n_run = len(running)
        n = len(gens)
        sl = self._slot_map(gens, ctx)
        if n <= self.small_n and qoe_kernel.warm():
            sel = self._select_small(gens, n_run, sl, full, ctx, now)
            if sel is not None:
                return sel
        a = self._table.a
        # consumption rates: the running tokens-per-word average is updated in item order
        fixed = a["fixed"][sl]
        if self.tokens_per_word is not None:
            tpw = np.full(n, self.tokens_per_word)
        else:
            own = a["own"][sl]
            has_own = ~np.isnan(own)
            trail = qoe_kernel.ema_trail(self._tpw, own[has_own])
            if trail is None:
                t = self._tpw
                trail_l = [t]
                put = trail_l.append
                for o in own[has_own].tolist():
                    t = 0.9 * t + 0.1 * o
                    put(t)
                trail = np.array(trail_l)
            self._tpw = float(trail[-1])
            tpw = np.where(has_own, own, trail[has_own.cumsum()])  # own or the average so far
        rate = np.where(np.isnan(fixed), a["base"][sl] * tpw / PAPER_TOKENS_PER_WORD, fixed)
        u = 1.0 / rate
        # delivered runs folded at the current rate (refolded when a request's rate moved)
        refold = ((a["last_start"][sl] > -_INF) & (a["fold_rate"][sl] != rate)).nonzero()[0]
        for i, r_ in zip(refold.tolist(), rate[refold].tolist()):
            slot = int(sl[i])
            runs = self._table.py[slot]
            a["sa"][slot], a["pn"][slot], a["la"][slot] = fold_runs(runs, 1.0 / r_, float(a["start"][slot]))
            a["dl"][slot] = sum(r.count for r in runs)
            a["fold_rate"][slot] = r_
        start = a["start"][sl]
        last_start = a["last_start"][sl]
        qb = QoEBatch(a["sa"][sl], a["pn"][sl], a["la"][sl], a["dl"][sl], start, u)
        T_wait = now + self.delta_t
        items: list[_Item | None] = [None] * n
        rates = rate.tolist()

        def item(i: int) -> _Item:  # the scalar terms, for requests the closed form does not cover
            it_ = items[i]
            if it_ is None:
                slot = int(sl[i])
                it_ = items[i] = _Item(gens[i], i < n_run, int(a["l"][slot]), list(self._table.py[slot]),
                                       float(a["start"][slot]), rates[i], int(a["pending"][slot]), 0.0, 0.0)
                it_.q_cur = qoe_of_runs(it_.runs, ideal_start=it_.start, rate=it_.rate, now=now, complete=False).qoe
                it_.q_wait = qoe_of_runs(it_.runs, ideal_start=it_.start, rate=it_.rate, now=T_wait,
                                         complete=False).qoe
            return it_

        q_wait = qoe_kernel.at_times(qb.sa, qb.pn, qb.la, qb.dl, qb.start, qb.u, (T_wait,))  # one compiled loop
        q_wait = qb.at(T_wait) if q_wait is None else q_wait[:, 0]
        odd_wait = (last_start > T_wait + _EPS).nonzero()[0].tolist()  # a delivered run not started yet
        for i in odd_wait:
            q_wait[i] = item(i).q_wait
        why, early = self._trigger(full, ctx, qb.u_min, ready)
        if early is not None:
            return early
        self.solves += 1
        M = self._mem_bound(ctx)
        mem = a["l"][sl]
        cands = self._batch_sizes(mem, rate, n_run, full, ctx, M)
        lats = [self.lat(B, ctx, n_run) for B in cands]
        s0 = [now + lat + self.network_latency_s for lat in lats]
        q_serve = qb.at_streams(T_wait, s0, a["pending"][sl], [int(self.delta_t / lat) for lat in lats], lats)
        late = float(last_start.max())
        for r, lat in enumerate(lats):  # a delivered run after the projected stream's start: scalar formula
            for i in (odd_wait + (last_start > s0[r]).nonzero()[0].tolist() if late > min(s0) else odd_wait):
                q_serve[r, i] = self.q_serve(item(i), lat, now)
        # greedy_pack for every B: by priority (stable), take while count < B and memory fits; only
        # the first B by priority can be taken, so only they are sorted
        gains = q_serve - q_wait
        pri_all = gains / mem
        neg_pri = -pri_all
        heads = _stable_heads(neg_pri, min(max(cands), n))  # per row: the first by priority
        over = mem[heads].cumsum(axis=1) > M
        fits = np.where(over.any(axis=1), over.argmax(axis=1), heads.shape[1]).tolist()
        head_gains = gains[np.arange(len(heads))[:, None], heads].tolist()  # (np.take_along_axis, without its wrapper)
        best: tuple | None = None
        for r, B in enumerate(cands):
            m = min(B, fits[r])
            key = (round(math.fsum(head_gains[r][:m]), 12), -abs(B - n_run))
            if best is None or key > best[0]:
                best = (key, B, m, r)
        assert best is not None
        _, B, m, r = best
        chosen = heads[r, :m]
        gains, pri = gains[r], pri_all[r]
        pri_l = pri.tolist()
        self._write_priorities(gens, pri_l)
        cs = set(chosen.tolist())
        admit = sorted((i for i in cs if i >= n_run), key=lambda i: -pri_l[i])
        victims = sorted((i for i in range(n_run) if i not in cs), key=lambda i: pri_l[i])
        acc_admit, acc_preempt = admit, victims
        if self.refine:
            acc_admit, acc_preempt = self._refine_fast(admit, victims, gains.tolist(), cs, n_run, mem, qb,
                                                       last_start, item, now)
        if not n_run and not acc_admit:
            acc_admit = _idle_engine_order(admit, pri_l)
        self.last_decision = {"B": B, "why": why, "admit": len(acc_admit), "preempt": len(acc_preempt),
                              "proposed_admit": len(admit), "proposed_preempt": len(victims)}
        return Selection(order=[gens[i] for i in acc_admit], preempt=[gens[i] for i in acc_preempt])

    def _select_small(self, gens: list[Generation], n_run: int, sl: np.ndarray, full: bool, ctx: PolicyContext,
                      now: float) -> Selection | None:
        """`select` after the slot lookup, for a few requests: the per-request terms, Q_wait /
        Q_serve, the packing of every candidate B (with math.fsum of its gains), the best B, the
        proposed admissions and victims and the refiner's stall losses in compiled loops
        (qoe_kernel's `_small_*`: the same operations, element by element), the rest on Python
        lists.  The best B and the proposal take Python steps (`_best_row`, `_small_proposal`)
        where the compiled ones decline: rounding could decide the best B, two admissions tie (the
        Python sort's order over a set), a kept request needs the scalar loss.  None (nothing
        changed yet): a rate that is not a finite non-zero number, left to the numpy path."""
        a = self._table.a
        n = len(gens)
        ws = self._small_ws  # work arrays by shape (read out before the next point)
        X = ws.get(n)
        if X is None:
            if len(ws) >= 64:
                ws.clear()
            X = ws[n] = np.empty((12, n))
        rows = self._small_rows
        if rows is None:
            fields = list(self._table.fields)
            rows = self._small_rows = np.array([fields.index(k) for k in qoe_kernel.SMALL_TERM_ROWS], dtype=np.intp)
        own_tpw = self.tokens_per_word is None
        M = self._mem_bound(ctx)
        ok, t, nref, u_min, r_max, late, fit = qoe_kernel._small_terms(
            own_tpw, float(self._tpw if own_tpw else self.tokens_per_word), PAPER_TOKENS_PER_WORD, M, sl, X,
            self._table.m, rows)
        if not ok:
            return None
        if own_tpw:
            self._tpw = t
        if nref:  # delivered runs folded at the current rate (refolded when a request's rate moved)
            py = self._table.py
            rates = X[9].tolist()
            for i, (ls, fr, r_) in enumerate(zip(X[8].tolist(), a["fold_rate"][sl].tolist(), rates)):
                if ls > -_INF and fr != r_:
                    slot = int(sl[i])
                    runs = py[slot]
                    a["sa"][slot], a["pn"][slot], a["la"][slot] = fold_runs(runs, 1.0 / r_, float(a["start"][slot]))
                    a["dl"][slot] = sum(r.count for r in runs)
                    a["fold_rate"][slot] = r_
            X[0], X[1], X[2], X[3] = a["sa"][sl], a["pn"][sl], a["la"][sl], a["dl"][sl]
        T_wait = now + self.delta_t
        ready = gens[n_run:]
        why, early = self._trigger(full, ctx, u_min, ready)
        if early is not None:
            return early
        self.solves += 1
        # _batch_sizes (fit: how many contexts fit M smallest first, from the compiled loop)
        bmax = n
        if self.max_batch is not None:
            bmax = min(bmax, self.max_batch)
        if full:
            bmax = min(bmax, max(1, n_run))
        bkey = (max(1, min(bmax, fit)), r_max, n_run, ctx.token_s, n, self.lat_per_seq_s, self.delta_t,
                self.max_b_candidates)
        memo = self._small_memo
        got = memo.get(bkey) if type(self).lat is Andes.lat else None  # (a function of bkey alone then)
        if got is None:
            cands = self._b_candidates(bkey[0], r_max, n_run, ctx)
            lats = [self.lat(B, ctx, n_run) for B in cands]
            k_rows, K = len(cands), min(max(cands), n)
            w = ws.get((k_rows, n, K))  # (by shape: the heads, G and the proposal's order of `_small_solve`)
            if w is None:
                if len(ws) >= 64:
                    ws.clear()
                w = ws[(k_rows, n, K)] = (np.empty((k_rows, K), dtype=np.intp), np.empty((4, k_rows, n)),
                                          np.empty(n, dtype=np.intp))
            S = np.empty((4, k_rows))  # (stream starts, token counts, token intervals, sums)
            S[1] = [float(int(self.delta_t / lat)) for lat in lats]
            S[2] = lats
            C = np.array([cands, cands], dtype=np.intp)  # (B, fits)
            got = (cands, lats, min(lats), S, C, w)
            if type(self).lat is Andes.lat:
                if len(memo) >= 256:
                    memo.clear()
                memo[bkey] = got
        cands, lats, lat_min, S, C, (heads, G, order) = got
        net = self.network_latency_s
        item = None  # the scalar terms (`_small_items`), made where needed
        odd = late > T_wait + _EPS or late > now + lat_min + net  # a delivered run not started yet: scalar formulas
        if odd:
            item = self._small_items(gens, n_run, sl, X, now, T_wait)
            s0 = [now + lat + net for lat in lats]
            S[0] = s0
            q_wait, q_serve = X[10], G[0]
            qoe_kernel._small_q(X[0], X[1], X[2], X[3], X[4], X[7], X[5], S[0], S[1], S[2], T_wait, q_wait, q_serve)
            last_l = X[8].tolist()
            odd_wait = [i for i, ls in enumerate(last_l) if ls > T_wait + _EPS]
            for i in odd_wait:
                q_wait[i] = item(i).q_wait
            for r, lat in enumerate(lats):
                for i in (odd_wait + [j for j, ls in enumerate(last_l) if ls > s0[r]] if late > min(s0)
                          else odd_wait):
                    q_serve[r, i] = self.q_serve(item(i), lat, now)
        r, na, nv, npay, done = qoe_kernel._small_solve(X, S, C, heads, G, order, T_wait, M, not odd, float(now),
                                                        net, n_run, self.refine, self.prefill_s_per_token)
        if r < 0:  # rounding decides the best row
            r = self._best_row(S[3], C[1], G[3, :, :heads.shape[1]], cands, n_run)
        B = cands[r]
        pri_l = G[2, r].tolist()
        self._write_priorities(gens, pri_l)
        if done:  # the compiled proposal and refiner walk
            proposal = order[:na + nv].tolist()
            admit, victims = proposal[:na], proposal[na:]
            acc_admit, acc_preempt = (admit[:npay], victims[:npay]) if self.refine else (admit, victims)
        else:
            admit, victims, loss_l = self._small_proposal(
                heads[r, :min(B, int(C[1, r]))].tolist(), pri_l, n_run, X,
                item or self._small_items(gens, n_run, sl, X, now, T_wait), now)
            acc_admit, acc_preempt = admit, victims
            if self.refine:
                acc_admit, acc_preempt = _paying_pairs(admit, victims, G[1, r].tolist(),
                                                       (lambda k, j: 0.0) if loss_l is None
                                                       else (lambda k, j: loss_l[k]))
        if not n_run and not acc_admit:
            acc_admit = _idle_engine_order(admit, pri_l)
        self.last_decision = {"B": B, "why": why, "admit": len(acc_admit), "preempt": len(acc_preempt),
                              "proposed_admit": len(admit), "proposed_preempt": len(victims)}
        return Selection(order=[gens[i] for i in acc_admit], preempt=[gens[i] for i in acc_preempt])

    def _small_items(self, gens: list[Generation], n_run: int, sl: np.ndarray, X: np.ndarray, now: float,
                     T_wait: float) -> Callable[[int], _Item]:
        """`item(i)`: request i's scalar terms (an `_Item`, made at its first call), for the small
        path's requests the closed form does not cover (X: `_select_small`'s per-request terms)."""
        a, py = self._table.a, self._table.py
        items: list[_Item | None] = [None] * len(gens)

        def item(i: int) -> _Item:
            it_ = items[i]
            if it_ is None:
                slot = int(sl[i])
                it_ = items[i] = _Item(gens[i], i < n_run, int(a["l"][slot]), list(py[slot]),
                                       float(a["start"][slot]), float(X[9, i]), int(a["pending"][slot]), 0.0, 0.0)
                it_.q_cur = qoe_of_runs(it_.runs, ideal_start=it_.start, rate=it_.rate, now=now, complete=False).qoe
                it_.q_wait = qoe_of_runs(it_.runs, ideal_start=it_.start, rate=it_.rate, now=T_wait,
                                         complete=False).qoe
            return it_
        return item

    @staticmethod
    def _best_row(sums: np.ndarray, fits: np.ndarray, hg: np.ndarray, cands: list[int], n_run: int) -> int:
        """The small path's best candidate row: the largest round(value, 12), then the batch size
        closest to the running batch, the first on ties (`select`'s key); value = the row's
        compiled fsum (`sums`), or math.fsum's own answer where that is NaN (not finite)."""
        sums_l = sums.tolist()
        total = sum(sums_l)
        if total != total:  # a value the compiled sum leaves to math.fsum (NaN: not finite)
            fits_l = fits.tolist()
            for r, v in enumerate(sums_l):
                if v != v:
                    sums_l[r] = math.fsum(hg[r, :min(cands[r], fits_l[r])].tolist())
        # round(v, 12) moves v by at most 0.5e-12 (and not at all where v's ulp exceeds that), so a
        # row more than 1e-11 below the largest value cannot round to the largest rounded value:
        # only the others are rounded
        top = max(sums_l)
        cut = top - 1e-11 if -1e6 < top < 1e6 else -_INF
        best: tuple | None = None
        for r, B in enumerate(cands):
            v = sums_l[r]
            if v < cut:
                continue
            key = (round(v, 12), -abs(B - n_run))
            if best is None or key > best[0]:
                best = (key, r)
        assert best is not None
        return best[1]

    def _small_proposal(self, chosen: list[int], pri_l: list[float], n_run: int, X: np.ndarray,
                        item: Callable[[int], _Item], now: float) -> tuple[list[int], list[int], list[float] | None]:
        """The small path's admissions (priority descending), victims (ascending) and, with the
        refiner, each admission's stall loss summed over the kept running requests (None: none
        kept or none admitted), as `select` computes them: where the compiled `_small_tail`
        leaves them (a tie, a NaN, a kept request's delivered run after now, a loss not finite)."""
        cs = set(chosen)
        neg = [-p for p in pri_l]  # (the same keys as `select`'s lambdas)
        admit = sorted([i for i in cs if i >= n_run], key=neg.__getitem__)
        victims = sorted([i for i in range(n_run) if i not in cs], key=pri_l.__getitem__)
        kept = [i for i in range(n_run) if i in cs]
        if not (self.refine and kept and admit):
            return admit, victims, None
        # every kept request's stall loss for every admission (`_refine_fast`)
        pf = self.prefill_s_per_token
        loss = np.empty((len(admit), len(kept)))
        kept_a = np.array(kept, dtype=np.intp)
        late_kept = [i for i in kept if X[8, i] > now + _EPS]
        if not late_kept:
            lsum = np.empty(len(admit))
            qoe_kernel._small_loss_sums(X, kept_a, np.array(admit, dtype=np.intp), pf, float(now), loss, lsum)
            loss_l = lsum.tolist()
            total = sum(loss_l)
            if total != total:  # (a NaN: math.fsum's own answer)
                loss_l = qoe_kernel.fsum_rows(loss, [len(kept)] * len(admit))
        else:
            over = [pf * a_ for a_ in X[6, admit].tolist()]
            times = np.array([now] + [now + o for o in over])
            qoe_kernel._small_loss(X[0], X[1], X[2], X[3], X[4], X[7], kept_a, times, np.array(over), loss)
            for row, i in enumerate(kept):  # a delivered run not started yet: the scalar formula
                if i in late_kept:
                    loss[:, row] = [self.loss(item(i), o, now) for o in over]
            loss_l = qoe_kernel.fsum_rows(loss, [len(kept)] * len(admit))
        return admit, victims, loss_l

    @staticmethod
    def _mem_bound(ctx: PolicyContext) -> float:
        """M: the engine's KV capacity in tokens (unbounded without one)."""
        st = ctx.stats
        return float(st.kv_total_blocks * st.block_size) if st.kv_total_blocks else _INF

    def _batch_sizes(self, mem: np.ndarray, rate: np.ndarray, n_running: int, full: bool, ctx: PolicyContext,
                     M: float) -> list[int]:
        """Candidate batch sizes: up to `max_batch`, up to the running batch when it is full (larger
        batches were refused: not realisable), up to what fits memory M smallest first."""
        bmax = len(mem)
        if self.max_batch is not None:
            bmax = min(bmax, self.max_batch)
        if full:
            bmax = min(bmax, max(1, n_running))
        fit = int(np.sort(mem).cumsum().searchsorted(M, side="right"))  # smallest first, while <= M
        return self._b_candidates(max(1, min(bmax, fit)), float(rate.max()), n_running, ctx)

    def _refine_fast(self, admit: list[int], victims: list[int], g_l: list[float], chosen: set[int], n_run: int,
                     mem: np.ndarray, qb: QoEBatch, last_start: np.ndarray, item,
                     now: float) -> tuple[list[int], list[int]]:
        """Overhead-aware refiner: keep admit/preempt pairs while they pay for the stall they cause
        the requests that keep running, with every kept request's stall loss for every admission
        priced at once."""
        kept = [i for i in range(n_run) if i in chosen]
        over = self.prefill_s_per_token * mem[admit] if admit else np.zeros(0)
        if kept and admit:  # loss(): the QoE a kept request loses if the whole batch stalls `overhead` s
            times = np.concatenate(([now], now + over))  # Q_cur, then Q at the end of each stall
            k1 = np.array(kept)
            q = qoe_kernel.at_times(qb.sa[k1], qb.pn[k1], qb.la[k1], qb.dl[k1], qb.start[k1], qb.u[k1], times)
            if q is None:
                k_ = k1[:, None]
                q = QoEBatch(qb.sa[k_], qb.pn[k_], qb.la[k_], qb.dl[k_], qb.start[k_], qb.u[k_]).at(times)
            d = q[:, :1] - q[:, 1:]  # kept x admitted
            loss = np.where(over > 0, np.where(d > 0.0, d, 0.0), 0.0)
            for row, i in enumerate(kept):  # a delivered run not started yet: the scalar formula
                if last_start[i] > now + _EPS:
                    loss[row] = [self.loss(item(i), o, now) for o in over.tolist()]
        else:
            loss = np.zeros((len(kept), len(admit)))
        return _paying_pairs(admit, victims, g_l, lambda k, j: math.fsum(loss[:, k].tolist()))

    def kv_mode(self, g: Generation, seg: Segment | None, ctx: PolicyContext) -> str:
        return self.kv if seg is None else "cache"

    def params(self) -> dict:
        return {"delta_t": self.delta_t, "kv_trigger": self.kv_trigger, "solve_every": self.solve_every,
                "max_batch": self.max_batch, "lat_per_seq_s": self.lat_per_seq_s,
                "prefill_s_per_token": self.prefill_s_per_token, "refine": self.refine,
                "speaking_types": list(self.speaking_types), "action_rate": self.action_rate,
                "network_latency_s": self.network_latency_s, "max_b_candidates": self.max_b_candidates,
                "mode": self._mode_name, "kv": self.kv, "tokens_per_word": self.tokens_per_word}

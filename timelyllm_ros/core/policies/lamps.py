"""LAMPS (Shahout et al., "Fast Inference for Augmented LLMs") as planner policies.

Robots executing skills are LAMPS's API calls.  Two ideas, both usable separately:

1. **Handling** (`kv_mode`): at every suspension pick preserve / discard / swap by InferCept's
   minimum memory waste (core/kv_handling.py), with T_INT = predicted idle time of the KV (the
   dispatched segment's estimated execution from the ExecTimeEstimator; minus G for non-blocking
   segments, which are resumed just in time), C from the generation's private context and the
   running batch, T_fwd / T_swap from the latency profile.

2. **Ranking** (`select`): smallest memory-over-time area of the remaining work first, with
   starvation prevention.  The paper gives no closed form; ours (M dropped, it is common):

       area(g) = resume + decode + call
       resume  = C * T_fwd(C)          if g's KV was discarded at its last suspension
                 C * T_swap(C)         if swapped (the swap-in)         (0 if preserved / new)
       decode  = tau * (n*C + n*(n+1)/2)      memory grows from C to C+n while n tokens decode
       call    = C' * {T | T_fwd(C') | 2*T_swap(C')}   the handling chosen for the call that ends
                 the next segment (C' = C + n, same waste rule as 1.)

   C = private context now, tau = measured time per decoded token (ctx.token_s), n = predicted
   tokens of the next segment (mean of g's past segments, else the robot's max_segment_tokens),
   T = predicted idle time of the next call (mean estimated execution of g's past segments, else
   the robot's mean nominal skill time).  As in LAMPS, each segment is scored as a new request
   ("each API call treated independently").  Without calls this is SJF on output length.

   Starvation (paper §4.4): a per-generation counter grows by one for every scheduling iteration
   in which it is ready but not running and resets when it runs or returns from a call; at
   `starvation_threshold` (100) the generation is marked starving and goes ahead of all
   non-starving ones (LAMPS order among the starving) until it completes.

Its policies, by name (`PolicyName` in core/policies/__init__.py):

    lamps            LAMPS ranking + waste-based handling (+ just-in-time resume of non-blocking)
    infercept        FCFS + waste-based handling (InferCept: dynamic handling, FCFS scheduling)
    fcfs-preserve    FCFS, preserve every suspension ("preserve everything")
    fcfs-discard     FCFS, discard every suspension (vLLM without prefix caching: API call =
                     end of request, recompute on return); plain `fcfs` is vLLM with prefix caching
    fcfs-swap        FCFS, swap every suspension
    timelyllm-lamps  TimelyLLM priority (Eq. 4) + waste-based handling, to report time utility

About 700 lines: the waste-based handling shared by five policies, LAMPS' ranking, its vectorised
select and its plain-Python path for a handful of generations (the same bits: the tests force and
compare both against tests/policy_oracles.py).
"""

from __future__ import annotations

import itertools
import math
import operator
from typing import Any, Sequence

import numpy as np

from ..kv_handling import (HANDLINGS, KVCostModel, SharedPrefix, choose, cost_model, other_context, predicted_idle,
                           private_context)
from ..types import Generation, GenState, Segment
from .base import Policy, PolicyContext, Selection, ascending_perm, set_priorities
from .slots import SlotTable
from .timelyllm import TimelyLLM

_INSTANCES = itertools.count()
_OUTPUT = operator.attrgetter("output_ids")


def _seg_blocks(robots: dict, robot_type: str, bs: int) -> int:
    """KV blocks of one worst-case segment of growth of a `robot_type` generation (its robot's
    max_segment_tokens; 16 tokens for a type not in `robots`), `bs` tokens a block."""
    robot = robots.get(robot_type)
    return math.ceil((robot.max_segment_tokens if robot else 16) / bs)


def _mark_starving(g: Generation, it: int) -> None:
    """g starts starving at iteration `it`: ready `starvation_threshold` iterations in a row."""
    st = g.policy.lamps
    st.starving = True
    st.starved_at = it


class WasteHandling:
    """Mixin: `kv_mode` by minimum memory waste, restricted to `allowed` handlings.

    Safety valve [ours]: preserved KV is pinned, and if suspended generations pin all of it no
    one can ever be admitted again (a deadlock we hit with "preserve everything").  Preserving is
    therefore only chosen while the blocks pinned by generations this policy preserved, plus this
    one, stay within `max_pinned_frac` of the KV capacity; otherwise the next best allowed
    handling is used, or vLLM's "cache" (freed, reusable until evicted) if preserve is the only one.
    """

    cost: KVCostModel
    allowed: tuple[str, ...]
    max_pinned_frac: float = 0.5
    _pinned: dict[str, Generation]

    @property
    def prefix(self) -> SharedPrefix:
        p = getattr(self, "_prefix", None)
        if p is None:
            self._prefix = p = SharedPrefix(self.cost.block_size)
        return p

    def private(self, g: Generation) -> int:
        return private_context(g, self.prefix)

    def observe(self, gens: Sequence[Generation]) -> None:
        self.prefix.observe_all(gens)

    def _pinned_blocks(self, block_size: int) -> int:
        pinned = getattr(self, "_pinned", None)
        if pinned is None:
            self._pinned = pinned = {}
        for gid in [gid for gid, g in pinned.items() if g.state is GenState.RUNNING or g.state.terminal]:
            del pinned[gid]
        return sum(math.ceil(self.private(g) / block_size) for g in pinned.values())

    def admission_cut(self, order: list[Generation], running: Sequence[Generation],
                      ctx: PolicyContext) -> list[Generation]:
        """Memory-aware admission (LAMPS Algorithm 1: add while the batch is "not full"): keep the
        longest prefix of `order` whose KV fits the free blocks after reserving one worst-case
        segment of growth for every running generation.  A candidate needs blocks for its private
        context unless its KV was preserved (pinned), plus one segment of growth.  The planner's
        batch-size controller assumes prompts are cached and would over-admit, leaving the engine
        to thrash with recompute preemptions (vLLM's own scheduler counts the whole prompt too)."""
        bs = max(1, ctx.stats.block_size)
        robots = ctx.robots
        free = self._batch_terms(running, ctx)[1]
        blocks: dict[str, int] = {}  # robot type -> `_seg_blocks`
        out = []
        for g in order:
            rt = g.request.robot_type
            k = blocks.get(rt)
            if k is None:
                k = blocks[rt] = _seg_blocks(robots, rt, bs)
            kept = g.segments and g.policy.lamps.kv == "preserve"
            need = k + (0 if kept else math.ceil(self.private(g) / bs))
            if need > free and (running or out):
                break  # strict order: nobody overtakes the head of the queue
            free -= need
            out.append(g)
        return out

    def _batch_terms(self, running: Sequence[Generation], ctx: PolicyContext) -> tuple[float, int, set[str]]:
        """The running batch's terms (its generations all observed by the caller):

        * C_other outside the batch: the summed `private_context` of the running generations, as
          a float — the prompts' private parts (prompt - min(shared, prompt), never below 0: its
          max(0, ...) is left out) plus the outputs (integers: exact in any order);
        * the free KV blocks once every running generation grew by one worst-case segment
          (`_seg_blocks`: the admission cut's budget);
        * the running generations' ids.

        All but the outputs and the free blocks depend on the batch's generations (their prompts,
        robot types and ids are fixed), the shared prefixes (`SharedPrefix.signature`), the robots
        and the block size alone: kept (`_batch`) while those stay, as between decode steps; else
        one pass, each robot type's shared prefix and segment blocks read once."""
        st = ctx.stats
        bs = max(1, st.block_size)
        key = (self.prefix.signature(), id(ctx.robots), bs)
        kept = self.__dict__.get("_batch")
        if (kept is not None and kept[1] == key and len(kept[0]) == len(running)
                and all(map(operator.is_, running, kept[0]))):
            private, growth, ids = kept[2]
        else:
            robots = ctx.robots
            per_type: dict[str, tuple[int, int]] = {}  # robot type -> (shared prefix, segment blocks)
            private = growth = 0
            ids = set()
            add = ids.add
            for o in running:
                req = o.request
                rt = req.robot_type
                add(req.request_id)
                t = per_type.get(rt)
                if t is None:
                    t = per_type[rt] = (self.prefix.shared(rt), _seg_blocks(robots, rt, bs))
                sh, k = t
                n_prompt = len(o.prompt_ids)
                private += n_prompt - (sh if sh < n_prompt else n_prompt)
                growth += k
            self._batch = (list(running), key, (private, growth, ids))
        return float(private + sum(map(len, map(_OUTPUT, running)))), st.kv_free_blocks - growth, ids

    def decide(self, g: Generation, seg: Segment | None, ctx: PolicyContext) -> tuple[str, Any]:
        # ctx.running: the batch at this suspension or preemption (the planner passes it)
        running = ctx.running
        t_int = predicted_idle(seg, ctx.seg_gen_s)
        return choose(t_int, self.private(g), other_context(g, running, self.prefix), self.cost, self.allowed)

    def kv_mode(self, g: Generation, seg: Segment | None, ctx: PolicyContext) -> str:
        if seg is None:
            mode, w = ("preserve" if "preserve" in self.allowed else self.allowed[0]), None
        else:
            mode, w = self.decide(g, seg, ctx)
        if mode == "preserve":
            bs = max(1, ctx.stats.block_size)
            need = math.ceil(self.private(g) / bs)
            if self._pinned_blocks(bs) + need > self.max_pinned_frac * ctx.stats.kv_total_blocks:
                rest = [h for h in self.allowed if h != "preserve"]
                mode = (w.best(rest) if w is not None else rest[0]) if rest else "cache"
                g.policy.lamps.pin_fallbacks += 1
            else:
                self._pinned[g.gen_id] = g
        st = g.policy.lamps
        st.kv = mode
        self._handling_changed(g)
        st.kv_modes[mode] = st.kv_modes.get(mode, 0) + 1
        return mode


    def on_kv_released(self, g: Generation) -> None:
        """The planner released g's preserved KV (pinned memory stalled the engine): from now on
        it is cached KV, neither pinned nor kept for admission."""
        if g.policy.lamps.kv == "preserve":
            g.policy.lamps.kv = "cache"
        pinned = self.__dict__.get("_pinned")
        if pinned is not None:
            pinned.pop(g.gen_id, None)
        self._handling_changed(g)

    def _handling_changed(self, g: Generation) -> None:
        """LAMPS's cached terms of g depend on its last handling: its slot is refilled at the next
        point (`LAMPS._ready_slots` looks it up)."""
        table = self.__dict__.get("_slots")
        if table is not None:
            table.invalidate(g)
            self._kept = None


def _frac(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
        raise ValueError(f"max_pinned_frac must be in [0, 1], got {v!r}")
    return float(v)


def _check_allowed(allowed: Sequence[str]) -> tuple[str, ...]:
    bad = [h for h in allowed if h not in HANDLINGS]
    if bad or not allowed:
        raise ValueError(f"allowed handlings must be a non-empty subset of {HANDLINGS}, got {list(allowed)}")
    return tuple(h for h in HANDLINGS if h in allowed)


class LAMPS(WasteHandling, Policy):
    """Memory-over-time ranking + waste-based handling + starvation prevention."""

    name = "lamps"

    def __init__(self, *, cost: Any = None, profile: Any = None,
                 allowed: Sequence[str] = HANDLINGS, starvation_threshold: int = 100,
                 score_interval: int = 1, jit_resume: bool = True, max_pinned_frac: float = 0.5,
                 memory_admission: bool = True) -> None:
        if isinstance(starvation_threshold, bool) or not isinstance(starvation_threshold, int) \
                or starvation_threshold < 1:
            raise ValueError(f"starvation_threshold must be an int >= 1, got {starvation_threshold!r}")
        if isinstance(score_interval, bool) or not isinstance(score_interval, int) or score_interval < 1:
            raise ValueError(f"score_interval must be an int >= 1, got {score_interval!r}")
        self.cost = cost_model(cost, profile)
        self.allowed = _check_allowed(allowed)
        self.starvation_threshold = starvation_threshold
        self.score_interval = score_interval
        self.jit_resume = jit_resume
        self.memory_admission = bool(memory_admission)
        self.max_pinned_frac = _frac(max_pinned_frac)
        self._token = next(_INSTANCES)  # cached scores belong to one policy instance (id() is reused)

    # ----------------------------------------------------------------- predictions
    def predict_tokens(self, g: Generation, ctx: PolicyContext) -> float:
        done = [s.token_count for s in g.segments if s.token_count > 0]
        if done:
            return sum(done) / len(done)
        robot = ctx.robots.get(g.request.robot_type)
        return float(robot.max_segment_tokens) if robot else 16.0

    def predict_call_s(self, g: Generation, ctx: PolicyContext) -> float:
        if g.segments:
            return sum(s.est_exec_s for s in g.segments) / len(g.segments)
        robot = ctx.robots.get(g.request.robot_type)
        if not robot or not robot.skills:
            return 0.0
        return sum(s.exec_time.nominal() for s in robot.skills.values()) / len(robot.skills)

    def area(self, g: Generation, ctx: PolicyContext, running: Sequence[Generation] = (),
             c_other: int | None = None) -> float:
        """Memory-over-time of g's next segment and the call after it (token-seconds)."""
        c = self.private(g)
        last = g.policy.lamps.kv if g.segments else None
        resume = 0.0
        if last == "discard":
            resume = c * self.cost.t_fwd(c)
        elif last == "swap":
            resume = c * self.cost.t_swap(c)
        n = self.predict_tokens(g, ctx)
        tau = max(ctx.token_s, 0.0)
        decode = tau * (n * c + n * (n + 1) / 2)
        c2 = c + n
        t_call = self.predict_call_s(g, ctx)
        if c_other is None:
            c_other = other_context(g, running, self.prefix)
        mode, _ = choose(t_call, c2, c_other, self.cost, self.allowed)
        call = c2 * (t_call if mode == "preserve" else
                     self.cost.t_fwd(c2) if mode == "discard" else 2 * self.cost.t_swap(c2))
        return resume + decode + call

    # ----------------------------------------------------------------- scheduling
    # At 1,000 ready generations the per-generation Python of the rule as written (area(),
    # counters on each generation) costs ~8 ms a scheduling point.  A generation's area differs between
    # points only through tau (the measured token time) and C_other (the running batch): the
    # rest (C, the resume term, n, T, the KV-growth term and the costs of the three handlings)
    # stays put while it is ready.  Those static terms, its admission need and the starvation
    # counters live in a SlotTable (refilled when its output, segments or last KV handling
    # change, all of them when the shared prompt prefixes change; looked up again only when the
    # ready list or one of its generations changed, `_ready_slots`); every point evaluates the
    # areas of all ready generations at once with the same operations in the same order as
    # `area`: bit for bit (tests/test_scheduling_fastpaths.py checks it against the plain code,
    # tests/policy_oracles.py).  Just-in-time resume (`jit_resume`): a non-blocking suspended
    # generation waits until its robot's current action is about G from its end (nothing is
    # gained by holding KV earlier), that end kept in its slot until its sched_rev moves
    # (`_renew_end`); starvation: a counter of consecutive iterations ready, kept as the iteration
    # its run of them started (`start`; the counter is `seen` - `start`, `seen` the last iteration
    # it was ready), so that a point writes only `seen` while no run restarts.
    _STATIC = ("c", "resume", "D", "c2", "t_call", "fwd2", "swp2", "wp", "wd0", "need")

    def _table(self) -> SlotTable:
        t = self.__dict__.get("_slots")
        if t is None:
            fields: dict = {k: (float, 0.0) for k in self._STATIC}
            fields.update(ok=(bool, False), jit_cand=(bool, False), id_hash=(np.int64, 0), arrival=(float, 0.0),
                          seen=(np.int64, -(2 ** 62)), start=(np.int64, -(2 ** 62)), starving=(bool, False),
                          end=(float, math.inf), end_rev=(np.int64, -1))
            t = self._slots = SlotTable(fields, persistent=("seen", "start", "starving"))
        return t

    def _fill(self, g: Generation, slot: int, ctx: PolicyContext) -> None:
        """g's static area terms and admission need."""
        a = self._slots.a
        cost = self.cost
        c = self.private(g)
        last = g.policy.lamps.kv if g.segments else None
        resume = 0.0
        if last == "discard":
            resume = c * cost.t_fwd(c)
        elif last == "swap":
            resume = c * cost.t_swap(c)
        n = self.predict_tokens(g, ctx)
        c2 = c + n
        t_call = self.predict_call_s(g, ctx)
        fwd2, swp2 = cost.t_fwd(c2), cost.t_swap(c2)
        m = cost.bytes_per_token
        # admission_cut's blocks: one segment of growth, plus the private context unless preserved
        bs = max(1, ctx.stats.block_size)
        need = _seg_blocks(ctx.robots, g.request.robot_type, bs)
        if not (g.segments and g.policy.lamps.kv == "preserve"):
            need += math.ceil(c / bs)
        static = (c, resume, n * c + n * (n + 1) / 2, c2, t_call, fwd2, swp2, t_call * c2 * m, fwd2 * c2 * m, need)
        for k, v in zip(self._STATIC, static):
            a[k][slot] = v
        ok = t_call >= 0 and c2 >= 0  # waste() refuses negative inputs: the plain path raises
        jit_cand = bool(g.segments) and not g.segments[-1].blocking
        a["ok"][slot] = ok
        a["jit_cand"][slot] = jit_cand
        a["id_hash"][slot] = hash(g.gen_id)
        a["arrival"][slot] = g.request.arrival
        # for `_select_small`, the same terms as Python values, as the arrays hold them (float64),
        # in `_ROW`'s order; the swap's per-token factor doubled (2 T_swap(C'): exact)
        row = list(map(float, static[1:]))
        row[5] *= 2.0
        self._slots.py[slot] = (*row, ok, jit_cand, float(g.request.arrival))
        if g.policy.lamps.starving:
            a["starving"][slot] = True

    def wait_count(self, g: Generation) -> int:
        """Consecutive scheduling iterations g has spent ready (the starvation counter)."""
        t = self._table()
        slot = t.slot(g)
        return 0 if slot is None else int(t.a["seen"][slot] - t.a["start"][slot])

    def _renew_end(self, g: Generation, slot: int) -> float:
        """g's robot's dispatched actions' estimated end (`prev_exec_end_estimate`; inf before the
        first), kept in g's slot (`end`) with the sched_rev it holds for (`end_rev`): it moves
        only with a segment dispatched or executed, which the planner marks (`Generation.touch`;
        the default policy keeps `next_due` so).  Both paths read the kept one while g's
        sched_rev is `end_rev` and call this otherwise."""
        e = g.prev_exec_end_estimate()
        e = math.inf if e is None else e
        a = self._slots.a
        a["end"][slot] = e
        a["end_rev"][slot] = g.sched_rev
        return e

    def _held_area(self, g: Generation, it: int, area: float) -> float:
        """With `score_interval` > 1 a score holds that many iterations, or until g's segments
        change: g's kept area (its `LampsState.score`: policy, iteration, area, segments), or
        `area`, kept from now on."""
        st = g.policy.lamps
        cached = st.score
        if (cached is None or cached[0] != self._token or it - cached[1] >= self.score_interval
                or cached[3] != len(g.segments)):
            st.score = (self._token, it, area, len(g.segments))
            return area
        return cached[2]

    def _ready_slots(self, ready: Sequence[Generation], ctx: PolicyContext) -> np.ndarray:
        """The ready generations' slots, filled (`SlotTable.lookup`; every one observed before any
        area is computed, as the plain path does: the new and changed ones before their fill, the
        others were when filled); all refilled when the shared prompt prefixes, the robots or the
        block size change.  When `ready` holds the last point's generations, none changed since
        (their sched_revs: the planner marks every change of a generation's output,
        `Generation.touch`, and its output is all a slot goes stale by) and no slot was
        invalidated since (`_handling_changed`, or those changes), the last point's slots, without
        the lookup.  The caller reads the array and does not change it."""
        table = self._table()
        shared = self.prefix.signature()
        sig = (shared, id(ctx.robots), ctx.stats.block_size)
        revs = [g.sched_rev for g in ready]
        kept = self.__dict__.get("_kept")
        if sig != self.__dict__.get("_sig"):
            table.invalidate()
        elif (kept is not None and kept[2] == revs and len(kept[0]) == len(ready)
              and all(map(operator.is_, ready, kept[0]))):
            return kept[1]
        fill = lambda g, slot: self._fill(g, slot, ctx)  # noqa: E731
        sl = table.lookup(ready, fill, self.observe)
        if self.prefix.signature() != shared:  # the new ones changed a shared prefix: every private context changes
            table.invalidate()
            sl = table.lookup(ready, fill)
            sig = (self.prefix.signature(), id(ctx.robots), ctx.stats.block_size)
        self._sig = sig
        self._kept = (list(ready), sl, revs)
        return sl

    def select(self, ready: Sequence[Generation], running: Sequence[Generation], ctx: PolicyContext,
               now: float) -> Selection:
        self.observe(running)
        if not ready:
            return Selection(order=self.admission_cut([], running, ctx) if self.memory_admission else [])
        sl = self._ready_slots(ready, ctx)
        if len(ready) <= self.small_n:
            return self._select_small(ready, running, ctx, now, sl)
        it = ctx.iteration
        table = self._slots
        a = table.a
        # starvation counters (_count, for all ready generations at once): a run of iterations
        # ready goes on from the last one, else starts now
        starv = a["starving"][sl]  # (kept equal to a["starving"][sl] below: one gather)
        start = np.where(a["seen"][sl] == it - 1, a["start"][sl], it)
        a["start"][sl] = start
        a["seen"][sl] = it
        for i in ((it - start >= self.starvation_threshold) & ~starv).nonzero()[0].tolist():
            g = ready[i]
            a["starving"][sl[i]] = starv[i] = True
            _mark_starving(g, it)
        # eligibility (just-in-time resume): a suspended generation whose last segment does not
        # block waits until its robot's action is about G from its end
        elig = None  # None: all eligible (no array built for that common case)
        if self.jit_resume:
            suspended = GenState.SUSPENDED
            # (the state read for the candidates alone: a list over every ready one costs ~40 µs at
            # 1,000; their sched_rev with it, -1 for one not suspended: it waits for nothing)
            ci = a["jit_cand"][sl].nonzero()[0]
            revs = np.array([g.sched_rev if g.state is suspended else -1 for g in map(ready.__getitem__, ci.tolist())],
                            dtype=np.int64)
            slc = sl[ci]
            ends = a["end"][slc]
            for k in ((a["end_rev"][slc] != revs) & (revs >= 0)).nonzero()[0].tolist():  # (`_renew_end`)
                ends[k] = self._renew_end(ready[ci[k]], int(slc[k]))
            wait = (revs >= 0) & (ends != np.inf) & ~(now >= ends - ctx.seg_gen_s)
            if wait.any():
                elig = np.ones(len(ready), dtype=bool)
                elig[ci[wait]] = False
        # areas
        tau = max(ctx.token_s, 0.0)
        c_other, free, run_ids = self._batch_terms(running, ctx)
        m = self.cost.bytes_per_token
        c2, fwd2, swp2, t_call = a["c2"][sl], a["fwd2"][sl], a["swp2"][sl], a["t_call"][sl]
        waste = {"preserve": a["wp"][sl], "discard": a["wd0"][sl] + fwd2 * c_other * m,
                 "swap": 2.0 * swp2 * (c2 + c_other) * m}
        per_token = {"preserve": t_call, "discard": fwd2, "swap": 2 * swp2}
        h0 = self.allowed[0]
        best_w, mult = waste[h0], per_token[h0]
        for h in self.allowed[1:]:  # Waste.best: least waste, ties to the earlier handling
            take = waste[h] < best_w
            best_w = np.where(take, waste[h], best_w)
            mult = np.where(take, per_token[h], mult)
        area = (a["resume"][sl] + tau * a["D"][sl]) + c2 * mult
        ok = a["ok"][sl]
        slow = [] if ok.all() else (~ok).nonzero()[0].tolist()
        if run_ids:  # a ready generation with a running one's id (hashes first, then the ids)
            # (one comparison of the hash column per running id: a set lookup per ready one costs
            # ~50 µs at 1,000, np.isin ~20 µs at 8; _select_small takes the few-ready case)
            idh = a["id_hash"][sl]
            hit = None
            for h in {hash(r) for r in run_ids}:
                hit = idh == h if hit is None else hit | (idh == h)
            maybe = hit.nonzero()[0].tolist()
            slow += [i for i in maybe if ready[i].gen_id in run_ids]
        for i in slow:  # C_other of a running one, or inputs waste() refuses: the plain formula
            area[i] = self.area(ready[i], ctx, running, None if ready[i].gen_id in run_ids else int(c_other))
        if self.score_interval > 1:  # a score holds score_interval iterations, or until g's segments change
            for i in (range(len(ready)) if elig is None else elig.nonzero()[0].tolist()):
                area[i] = self._held_area(ready[i], it, float(area[i]))
        arrival = a["arrival"][sl]
        keep = None if elig is None else elig.nonzero()[0]
        if keep is None:
            gens, area_k, starving = list(ready), area, starv
        else:
            gens, area_k, starving = list(map(ready.__getitem__, keep.tolist())), area[keep], starv[keep]
            arrival = arrival[keep]
        set_priorities(gens, (-area_k).tolist())
        # starving ones first, each group by area, FCFS among equals (all or none starving: one group)
        perm = ascending_perm(gens, area_k, first=starving if starving.any() and not starving.all() else None,
                              arrival=arrival)
        order = list(map(gens.__getitem__, perm))
        if self.memory_admission and order:
            # admission_cut over the static block needs: the longest prefix whose cumulative need
            # stays within the free blocks (the head always, when nothing runs); none shorter
            # when all of them fit (block counts: exact sums)
            need = a["need"][sl] if keep is None else a["need"][sl][keep]
            if need.sum() > free:
                cum = need[perm].cumsum()
                over = (cum > free).nonzero()[0]
                if not running and over.size and over[0] == 0:
                    over = over[1:]
                order = order[: int(over[0]) if over.size else len(order)]
        return Selection(order=order)

    # At a handful of ready generations numpy's per-call cost (~1 µs a call) is most of the
    # point: up to `small_n` of them take `_select_small`, the same operations on Python floats,
    # element by element (the same bits; tests/test_scheduling_fastpaths.py runs both paths
    # against the plain oracle).  It touches the table's arrays for the counters (`starving` and
    # `seen` read, `seen` written; `start` read while some do not starve yet, written for the
    # runs that restart) and, when a suspended one may wait on its robot, the kept action ends
    # (`_renew_end`); it reads each generation's other terms from its Python row (`_ROW`, kept by
    # `_fill`): one pass for eligibility and areas, the least waste among the allowed handlings
    # by three flags.  No admission cut is looked for when the needs of all the ready ones
    # together fit.  Its order is the tuple sort `ascending_perm` stands for, with its shortcut:
    # finite areas all distinct, by area alone.
    small_n = 32
    _ROW = ("resume", "D", "c2", "t_call", "fwd2", "2 swp2", "wp", "wd0", "need", "ok", "jit_cand", "arrival")

    def _select_small(self, ready: Sequence[Generation], running: Sequence[Generation], ctx: PolicyContext,
                      now: float, sl: np.ndarray) -> Selection:
        """`select` for a few ready generations, past `_ready_slots` (`sl`: their slots)."""
        a = self._slots.a
        it = ctx.iteration
        n = len(ready)
        # starvation counters (as in select): only the runs that (re)start now write their start
        starv = a["starving"][sl].tolist()
        prev = it - 1
        seen = a["seen"][sl].tolist()
        if seen.count(prev) != n:
            a["start"][sl[[i for i, s_ in enumerate(seen) if s_ != prev]]] = it
        a["seen"][sl] = it
        if not all(starv):  # (the starving stay so)
            thr = it - self.starvation_threshold  # a run started by then is long enough
            start = a["start"][sl].tolist()
            if min(start) <= thr:
                for i, s_ in enumerate(start):
                    if s_ <= thr and not starv[i]:
                        a["starving"][sl[i]] = starv[i] = True
                        _mark_starving(ready[i], it)
        py = self._slots.py
        rows = list(map(py.__getitem__, sl.tolist()))
        jit = self.jit_resume
        kept = ends = None  # the kept action ends (`_renew_end`), read at the first suspended candidate
        suspended = GenState.SUSPENDED
        G = ctx.seg_gen_s
        tau = max(ctx.token_s, 0.0)
        c_other, free, run_ids = self._batch_terms(running, ctx)
        m = self.cost.bytes_per_token
        allowed = self.allowed
        hp, hd, hs = "preserve" in allowed, "discard" in allowed, "swap" in allowed
        elig = None
        area: list[float] = []
        put = area.append
        slow = []  # C_other of a running one, or inputs waste() refuses: the plain formula
        total_need = 0.0  # (all of them: an upper bound of the admitted ones')
        for i, (g, (res, D, c2, t_call, fwd2, swp2x2, wp, wd0, need, ok, jit_cand, _)) in enumerate(zip(ready, rows)):
            total_need += need
            if jit and jit_cand and g.state is suspended:
                if kept is None:
                    kept, ends = a["end_rev"][sl].tolist(), a["end"][sl].tolist()
                e = ends[i] if kept[i] == g.sched_rev else self._renew_end(g, int(sl[i]))
                if not (e == math.inf or now >= e - G):
                    if elig is None:
                        elig = [True] * n
                    elig[i] = False
            # Waste.best: least waste, ties to the earlier handling (`waste`'s terms, as select's)
            wd = wd0 + fwd2 * c_other * m
            ws = swp2x2 * (c2 + c_other) * m
            best = None
            if hp:
                best, mult = wp, t_call
            if hd and (best is None or wd < best):
                best, mult = wd, fwd2
            if hs and (best is None or ws < best):
                mult = swp2x2
            put((res + tau * D) + c2 * mult)
            if not ok:
                slow.append(i)
        if run_ids and not run_ids.isdisjoint([g.request.request_id for g in ready]):
            slow += [i for i, g in enumerate(ready) if g.gen_id in run_ids]
        for i in slow:
            area[i] = self.area(ready[i], ctx, running, None if ready[i].gen_id in run_ids else int(c_other))
        if self.score_interval > 1:
            for i in range(n):
                if elig is None or elig[i]:
                    area[i] = self._held_area(ready[i], it, area[i])
        keep = range(n) if elig is None else [i for i in range(n) if elig[i]]
        for i in keep:
            ready[i].priority = -area[i]
        # starving ones first, each group by area, FCFS among equals: `ascending_perm`'s order.
        # As there, finite areas all distinct never read the tie-breakers: by area alone, then
        # (stably) the starving ones first, if only some starve
        vals = area if elig is None else [area[i] for i in keep]
        if math.isfinite(sum(vals)) and len(set(vals)) == len(vals):
            perm = sorted(keep, key=area.__getitem__)
            if any(starv) and not all(starv):
                perm.sort(key=starv.__getitem__, reverse=True)
        else:
            perm = sorted(keep, key=lambda i: (not starv[i], area[i], ready[i].ready_since, rows[i][11],
                                               ready[i].gen_id))
        order = list(map(ready.__getitem__, perm))
        if self.memory_admission and order:  # admission_cut over the static block needs (as in select)
            if total_need <= free:  # (block counts: exact sums, never above the total)
                return Selection(order=order)
            cum = 0.0
            for k, i in enumerate(perm):
                cum += rows[i][8]
                if cum > free and (k or running):
                    order = order[:k]
                    break
        return Selection(order=order)

    def priority(self, g, ctx, now):
        return -self.area(g, ctx, ctx.running)

    def params(self) -> dict:
        return {"allowed": list(self.allowed), "starvation_threshold": self.starvation_threshold,
                "max_pinned_frac": self.max_pinned_frac, "memory_admission": self.memory_admission,
                "score_interval": self.score_interval, "jit_resume": self.jit_resume,
                "cost": {"prefill_s_per_token": self.cost.prefill_s_per_token,
                         "prefill_base_s": self.cost.prefill_base_s,
                         "swap_s_per_block": self.cost.swap_s_per_block, "block_size": self.cost.block_size}}


class FCFSHandling(WasteHandling, Policy):
    """FCFS order with a fixed handling, or the waste-based one (InferCept)."""

    name = "infercept"

    def __init__(self, *, handling: str = "waste", cost: Any = None, profile: Any = None,
                 allowed: Sequence[str] = HANDLINGS, max_pinned_frac: float = 0.5,
                 memory_admission: bool = True) -> None:
        if handling not in ("waste",) + HANDLINGS:
            raise ValueError(f"handling must be 'waste' or one of {HANDLINGS}, got {handling!r}")
        self.handling = handling
        self.cost = cost_model(cost, profile) if handling == "waste" else KVCostModel(0.0)
        self.allowed = _check_allowed(allowed) if handling == "waste" else (handling,)
        self.max_pinned_frac = _frac(max_pinned_frac)
        self.memory_admission = bool(memory_admission)
        self.name = "infercept" if handling == "waste" else f"fcfs-{handling}"

    def priority(self, g, ctx, now):
        return -g.request.arrival

    def select(self, ready, running, ctx, now):
        self.observe(running)
        self.observe(ready)
        sel = super().select(ready, running, ctx, now)
        if self.memory_admission:
            sel.order = self.admission_cut(sel.order, running, ctx)
        return sel

    def params(self) -> dict:
        return {"handling": self.handling, "allowed": list(self.allowed), "max_pinned_frac": self.max_pinned_frac,
                "memory_admission": self.memory_admission}


class TimelyLLMLAMPS(WasteHandling, TimelyLLM):
    """TimelyLLM's Eq. 4 priority with LAMPS's handling choice at every suspension."""

    name = "timelyllm-lamps"

    def __init__(self, *, cost: Any = None, profile: Any = None, allowed: Sequence[str] = HANDLINGS,
                 min_slack_s: float | None = None, max_pinned_frac: float = 0.5) -> None:
        TimelyLLM.__init__(self, min_slack_s=min_slack_s)
        self.max_pinned_frac = _frac(max_pinned_frac)
        self.cost = cost_model(cost, profile)
        self.allowed = _check_allowed(allowed)

    def select(self, ready, running, ctx, now):
        self.observe(running)
        self.observe(ready)
        return super().select(ready, running, ctx, now)

    def params(self) -> dict:
        return {**TimelyLLM.params(self), "allowed": list(self.allowed)}

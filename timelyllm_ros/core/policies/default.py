"""The default policy: urgent first segments protected, everything else streamed or just in time.

Rule numbers are docs/policies.md's, where the same rules are stated in plain words.  Rules 1-2:
every live generation has a *deadline* for its next segment and an *estimated generation time*:

  deadline   k = 0: arrival + ERT (the TUF starts to fall after it);
             k > 0: estimated end of the robot's dispatched actions (it idles after that)
  est. time  (predicted tokens of the next segment − tokens already generated for it, at least 1,
             + 1 step to enter the batch when not running) × measured time per token; predicted
             tokens = running mean of the segment lengths this planner has seen for that robot
             type, first segments and later ones apart (online: no reference plans)
  slack      deadline − now − est. time

A generation is *critical* when its slack is at most ``lead`` = max(``min_lead_s``,
``lead_steps`` × time per token); otherwise it is *deferrable*.

At each scheduling point (``select``):

3. critical generations are admitted first, first segments and continuations alike (Eq. 3
   scores a robot idling mid-plan, TUF1 of its wait, with the slope of its first action's TUF),
   by apparent tardiness cost (ATC, Vepsalainen & Morton 1987):
   |TUF slope| / p × exp(−max(0, slack) / (``atc_k`` × mean p)), p = est. time — once past its
   deadline a segment loses |alpha| utility per second of delay, so among late ones this is
   weighted shortest processing time first, which minimises the sum of alpha × lateness (under
   overload an urgent plan, 6.67 per second, goes before a chat reply, 2 per second, of the same
   length);
4. deferrable ones (least slack first) are admitted only while no critical *first* segment is
   running or waiting: spare engine time goes to work that is not due yet, but a step that
   decides a response time is not made longer by work that could wait (each extra sequence, each
   prompt to tokenise and prefill, lengthens the step for everyone in it);
6. admissions stop where free KV memory runs out (``kv_budget``): a generation whose robot type
   has nobody in the batch counts its whole prompt (its shared prefix is probably not cached),
   the others their own tokens plus one worst-case segment — over-admitting makes the engine
   preempt and re-prefill (memory thrash);
7. when the batch is full (the planner's batch-size controller refused a ready generation at the
   previous point: a binding cap or KV memory) a waiting critical generation preempts a running
   one at token level, one for one (Andes-style): a deferrable one first, else a critical one
   that has more than 2 tokens of its segment left and a ``preempt_ratio`` times lower ATC
   priority;
   the batch also counts as full here when the step-time cap (rule 10) — or, with ``memory_full``,
   this policy's own KV budget (rule 6) — held a ready generation back at the previous point;
9. pacing (``pace``, off by default: it pauses continuations, which Eq. 3 charges): while a critical first segment is running or waiting, each of those that can
   still make its deadline needs its remaining tokens in steps of at most (deadline − now) /
   tokens left; the tightest such budget, through an online model of the engine's step time
   (a + b·generations + c·new requests + d·prefilled tokens, least squares over the steps seen,
   `step_time.py`),
   gives the most generations the next step may hold.  Above it running generations are paused at
   token level: deferrable ones first (most slack first), then, after the waiting critical
   continuations are held back, critical continuations (least dense first); first segments never.
   A paused generation keeps its KV in place (``preserve``) and comes back through rules 3–4 (it
   costs one recomputed token) — so only where the engine honours ``preserve``, at least
   ``pace_min_free`` of the KV memory is free and the model predicts the steps (relative one-step
   error at most ``pace_max_error``): with vLLM's prefix cache a resume recomputes the
   last, partial KV block, which costs more than the pause saves (drones:800: 62.8 % urgent with
   ``pace_kv="cache"``).
10. step-time cap (``step_ratio``): admissions also stop where a step would take more than 3 times
   a one-generation step, by the step-time model (``step_time.py``, least squares; until it has
   seen 4 steps, at most twice the running batch, at least 8) — per engine: behind an engine
   pool the model learns one member's iterations and the pool's batch may hold the cap times
   its usable members (pacing's limit, rule 9, too): beyond that every running
   generation gets its tokens slower than a newcomer gains by starting now — on an engine where
   each extra sequence is expensive (the edge board) a 256-wide batch makes every response late.
   The cap protects response times, so it is lifted while no first segment has run or waited
   for ``drain_after_s`` (5 s): only continuations are left — robots idle until their next
   segment — and past their deadlines throughput decides (k late jobs of L tokens each in
   batches of n finish in total about k² L (a/n + b) / 2, which falls as n grows); the edge
   board with drones:1600 spent 320 s draining 2,700 continuations 12 at a time (urgent
   −41,886 % with the cap held, −36,185 % lifted).  A new request brings the cap back at once
   for admissions: it enters by preempting a continuation (rule 7) and the batch shrinks to the
   cap as continuations end — the price: the first request after a quiet spell of 5 s may meet
   a wide batch.  ``roomy_ratio`` (10, the default since 2026-11-28 evening; 3: one cap) widens
   the cap to that ratio at points where KV memory has room (rule 6's KV budget admits at least
   what the wider cap would; else 3, and memory counts as short for rule 8 only where it cuts
   within that cap of 3).  It buys the throughput of a saturated fleet on an engine whose extra
   sequence is costly against its step (`vllm_cpu_tiny` drones:800, default batching: accrued
   total −65.1 % at 3 against 96.9 % at 10; the full grid 243 -> 257 of 324 cells pass) with
   urgent robots' response times where wider steps slow their first statements (the edge
   board's WID2: accrued urgent 45.7 -> 34.9 %); simulator, docs/results/2026-11-28-roomy-default.md.
   Steep cap (``steep_cap``, on by default since 2026-11-28): the cap protects a first segment
   only when its TUF is steeper than the flattest live generation's (|alpha| above the least,
   running and ready alike) — where every live generation has one slope (an arm fleet, a chat
   flood without robots) a narrow batch only moves lateness from first actions to
   continuations of the same slope and costs throughput (Eq. 3 charges both alike): then no
   cap, as while draining.  While a protected first segment runs or waits, the running batch
   shrinks to the cap at once (`_shrink`): running continuations of the flattest slope beyond
   it are preempted (deferrable ones first, most slack first, then by priority, lowest first),
   and one more when the admission order's head is a critical steeper first segment, which
   enters at this point — not only as continuations end.  First segments and steeper work are
   never shrunk away.  The edge board's arm_heavy (ours): accrued total / urgent 18.3 / −3.6 %
   → 72.9 / 3.1 % (simulator; docs/results/2026-11-28-steep-cap.md).  ``steep_cap=false``:
   every first segment protected, admissions cut only.
11. overload (``overload``, on by default): when more ready generations are past their
   deadlines than the batch holds — swapping the whole batch would still leave late work
   waiting — a generation that leaves the batch now waits behind that backlog: their estimated
   times summed over the running batch (``queue_wait``).  Rule 7 then takes a deferrable victim
   only if its slack exceeds lead + that wait; otherwise it would be back after its robot went
   idle, and the swap would only decide who is late, at the price of a re-add and re-prefill
   that lengthens the steps of everyone (on the edge board, drones:400 with default batching:
   accrued −1,756 % instead of −2,226 %, vllm-priority −1,849 %; simulator,
   docs/results/2026-11-27-overload.md).  Where KV memory is short (less than
   ``keep_kv_min_free`` free: rule 13 keeps no KV, and a victim's freed blocks are soon evicted
   from the prefix cache), its re-add re-prefills its whole context in one step that holds up
   the running batch, so (``victim_readd``, `readd_stall_per_token`) its slack must also exceed that
   prefill's time — the step-time model's seconds per prefilled token × its prompt and output
   tokens — times the running generations (Andes' refiner prices a restore's stall on every
   running request alike).  Tried there and not kept: ranking by the whole
   plan's remaining work (WSRPT) instead of the next segment's (−2,351 %: continuations went
   first and new plans' first actions waited longer), keeping slots at statement ends under
   overload (rule 5; it wins the edge board's cap-8 cells but loses the 4090's drones:400
   cap 8, where re-adds are cheap: −75.6 % vs −6.9 %), and lifting rule 10's cap under overload
   (urgent −2,315 % instead of −28 %).  Opt-in (``back_factor`` > 0, `back_wait`): the critical
   queue — the waiting critical work's time over the running batch, × back_factor — counts as that
   wait too, for sustained floods (edge chat_mixed cap 16 −400 → −108 %); it loses the bursts,
   300 → 288 of 346 stored cells (docs/results/2026-11-30-critical-queue.md).
12. plan order (``plan_order``, on by default since 2026-11-28): in a deep, lasting overload every late
   statement waits whatever the order, so Eq. 3's loss is about Σ |TUF slope| × each plan's
   completion time, which weighted shortest remaining *reply* first minimises — not the next
   statement's ATC.  It applies while rule 11 sees a backlog whose wait, averaged over time
   (exponentially, time constant 10 s), is at least ``plan_depth_s`` (8 s; 0: any backlog) —
   the bursts of a moderate overload drain within seconds and keep ATC (measured: the backlog
   wait's median is at most 3.8 s in the cells where the rule loses, at least 12.6 s where it
   wins).  Then critical generations rank by |slope| / (the reply's predicted remaining tokens ×
   time per token), by the learned length predictor Trail uses (core/length_predictor.py: the
   prompt and the text so far, online); a generation at a statement end keeps its slot (rule 5)
   unless a waiting critical one outranks it — yielding to lower-ranked work only buys a re-add;
   and rule 7 passes over deferrable victims that rule 11 keeps instead of stopping at them, so
   an urgent short plan still preempts a long reply.  Edge board, chat_flood cap 8: accrued
   −3,379 % instead of −6,935 % (`trail` −3,297 %); chat_mixed kv/2 −1,530 % / −762 % total /
   urgent instead of −5,083 % / −7,138 % (simulator).  The full grid 231 → 243 of 324 cells
   pass, none lost, every cell re-judged; our workloads 13 → 13; the scale figure unchanged
   (2026-11-27-plan-order.md, 2026-11-27-heavy-maps.md, 2026-11-28-heavy-edge.md).  Its price:
   first actions come later where it applies (on the Pareto front).  It waited as an opt-in
   while its planner time per step made `default` worse on vLLM-cpu (2026-11-28-host-time.md);
   with the predictor asked only where a generation's text grew, the overloaded fidelity slice
   agrees with the simulator (5 of 5 orders) and, at one speed, gains accrued total for urgent
   first actions (docs/results/2026-11-28-plan-order-default.md).  ``plan_order=false``: without.
   Heavy load (``heavy_rho``, 1.6; inf: never): where the load factor ρ — offered tokens per
   second over the engine's full-batch decode tokens per second, online (`offered_load.py`:
   arrivals per robot type × its mean reply length, ``rho_tau_s`` 60 s) — is at least
   ``heavy_rho``, the backlog grows while requests arrive and every late statement waits
   whatever the order: every generation is critical (the lead is infinite: deferring work
   only buys a re-add later) and rule 12 applies at any backlog, from the first seconds of
   the overload instead of after its averaged wait reached ``plan_depth_s``.  It lasts while
   the backlog lasts and ρ stays at least 1; ρ reads 0 until the batch has reached its
   limit once (before, the engine serves whatever arrives).  Offline ρ separated the cells
   (the RTX 4090's drones:400 cap 8, 1.16, loses with it; cap 4, 1.99, and the edge board's
   drones:400, 2.1–3.3, win); online: docs/results/2026-11-29-heavy-load.md.
   Deep load (``steep_first_rho``, 3.5; inf: never; `deep_load`): under the heavy load, where ρ
   is at least 3.5 and a re-add is cheap even without kept KV (a kept-KV resume still attends
   over its whole context), first statements steeper than the flattest live slope rank before
   every whole-reply rank, so a new urgent plan preempts nearly finished flatter replies instead
   of waiting minutes behind them (the RTX 4090's drones:1600 cap 4, both columns; read off its
   online ρ, 4.5–6.3, against 1.4–3.2 where the heavy order wins: docs/results/2026-11-29-churn.md).
14. saturation (``sat_rho`` 1.0, ``sat_rho_off`` 0.7, ``sat_add_price`` 0.5, ``sat_min_steps``
   300; `saturation`): where the *effective* load factor — the offered tokens per second over
   the tokens per second of every full-batch step, prefills and re-adds included
   (`OfferedLoad.rho(effective=True)`) — is at least ``sat_rho`` (it lasts down to
   ``sat_rho_off``), on an engine whose added request costs at least ``sat_add_price`` of a
   one-generation step (the step-time model's c against a + b, read once, where the mode first
   applies after ``sat_min_steps`` steps and a re-add is dear; under a saturation the batch runs
   at one width and the fit drifts), nothing churns: no preemption (rule 7), no yield (rule 5),
   no shrink (rule 10), every generation critical, and every blocking statement is streamed past
   whatever its predicted result (`streams_unpredicted`; a different result still rolls the held
   statement back).  There each swap pays an add that costs the whole batch about a step, more
   than the waiter gains: `vllm_cpu_tiny` drones:800 cap 8, accrued −397.6 → −69.6 %
   (`vllm-priority` −70.5 %), where the edge board (an add ~0.3 of a step) needs its first
   statements to preempt (simulator, docs/results/2026-11-29-saturation.md).

At each statement boundary (``suspend_at``, rule 5) a generation keeps its slot and streams on, unless the
batch is full — a batch cap or KV memory refused a ready generation (with ``memory_full``, also
this policy's KV budget), *not* the step-time cap, a limit of the policy's own: suspending for it
costs a re-add (prefill) per statement (the edge board with chat_mixed lost 7 s of engine time in
120 s to that churn) — and its next segment is not due within the lead: then it is suspended (the
slot goes to waiting work) and resumes when it is critical or the engine is free.  Its price
(``yield_price``, ``yield_backlog_s``; `_yield_priced`): where a re-add is dear — its re-prefill,
half a KV block at the step-time model's seconds per prefilled token, costs more than 0.08 of a
one-generation step (edge board, `vllm_cpu_tiny`) — a full batch yields only for a first
statement: a critical one waiting behind a late backlog (rule 11's wait) under 30 s, or a steeper one rule 10
protects while critical work waits; a swap of continuations is not worth the re-add there
(docs/results/2026-11-28-yield-price-default.md).  Blocking statements
suspend (the plan needs the value); with ``speculate`` (rule 8, `speculates`) the generation goes on
under the predicted value, its next statement held until the robot's value confirms it
(core/speculation.py).  With ``stream_past`` (on by default, `streams_past`), where the
predicted value is the one the model goes on under untold (True for a bool skill) and the
generation would keep its slot here (rule 5; no late backlog, rule 11; memory not short, rule 6),
it does not leave the engine at all: it streams on, as an unsegmented policy's generation does,
and what follows is held and checked alike — no abort and re-add with the value appended (the
edge board's arm fleet, default batching: accrued 72.9 → 80.0 %; simulator,
docs/results/2026-11-28-stream-past.md).  So: uncontended, plain streaming (suspending costs a
re-add, a prefill and more, smaller steps — measured in issue 15); under a binding cap or memory
limit, TimelyLLM's segmentation with preemption.

Online by construction: it reads a request's arrival, TUF and robot type and what has been
generated and executed so far — never ``reference_plan`` nor future arrivals
(tests/test_default_policy.py checks this).  It never sheds: every request is served.
KV on suspension: vLLM's prefix-cache behaviour ("cache"), as TimelyLLM; a rule-9 pause: "preserve";
and rule 13 (``keep_kv``, on by default since 2026-11-28 night; `keeps_kv`): where the engine honours
"preserve" (an InferCept/LAMPS-style engine — the map's preserve column; stock vLLM cannot) and at
least ``keep_kv_min_free`` (0.25) of its KV memory is free, every suspension — a statement end,
a preemption — keeps its KV in place, so its re-add recomputes one token instead of re-prefilling
its last, partial block (rule 5's price then sees no dear re-add); where kept KV stalls the
engine, the planner releases it (`Planner._release_pinned`).  All stored cells: 280 -> 282 of 348
pass, none lost (the RTX 4090's drones:400 cap 8 and our edge burst fleet cap 8, preserve column);
no stock-column record moves (simulator, docs/results/2026-11-28-keep-kv.md).
(About 1,000 lines: the fourteen rules, stated here, and their vectorised `select`; the same
point for a handful of live generations, in plain Python, is default_small.py; the step-time
model is step_time.py.)
"""

from __future__ import annotations

import functools
import heapq
import math
import operator
from bisect import bisect_left
from typing import Sequence

import numpy as np

from ..length_predictor import PredictorError, make_predictor
from ..types import Generation, Segment
from .offered_load import OfferedLoad
from .base import DispatchMode, Policy, PolicyContext, Selection, batch_was_full, set_priorities
from .default_head import LazyHead, concat_head
from .default_small import SMALL_BELOW, select_small
from .slots import SlotTable
from .step_time import StepTimeModel

@functools.lru_cache(maxsize=1)
def _learned_predictor():
    """Rule 12's length predictor, loaded once: it keeps all its state in each generation
    (core/length_predictor.py), so one instance serves every planner."""
    try:
        return make_predictor("learned")
    except PredictorError as e:
        raise ValueError(f"plan_order (rule 12, on by default) needs the learned length predictor: {e}; "
                         f"install it or set plan_order=false") from e


def _kv_room(ctx: PolicyContext, share: float) -> bool:
    """At least `share` of the engine's KV memory is free (rules 9 and 13); True where the engine
    reports no KV memory."""
    st = ctx.stats
    return not st.kv_total_blocks or st.kv_free_blocks >= share * st.kv_total_blocks


def _steeper(mag, flat):
    """|TUF slope| `mag` (a float or an array) is steeper than `flat` (rule 10's steep cap, rule
    12's deep load)."""
    return mag > flat * (1 + 1e-9)


def _plan_weights(alpha: np.ndarray, rem: np.ndarray, token_s: float) -> np.ndarray:
    """Rule 12's weights: |TUF slope| / (predicted remaining tokens, at least 1, x time per
    token); always > 0 (a flat or rising TUF counts as 1e-12, a weight that underflows as 5e-324)."""
    w = np.where(alpha < 0.0, -alpha, 1e-12) / (np.fmax(rem, 1.0) * (token_s if token_s > 1e-9 else 1e-9))
    return np.where(w > 0.0, w, 5e-324)


_PLAN_TAU_S = 10.0  # rule 12: time constant of the backlog wait's average (a few bursts long)
_PLAN_FALLBACK = 256.0  # rule 12: tokens of a reply the length predictor cannot predict (Trail's fallback_len)
_STEP_CAP_MIN_STEPS = 4  # rule 10: steps the step-time model sees before `step_cap` reads it (slow start until then)
_RHO_EVERY_S = 0.5  # rule 12's heavy load: the load factor is read again after this long
_STEEP_FIRST = 1e6  # rule 12's deep load: a steep first statement's weight factor (weights, |slope| per
# second of reply, stay far below 1e4: x 1e6 ranks them before every other and keeps their order)
_REV = operator.attrgetter("sched_rev")
_PAUSE_KEY = operator.attrgetter("priority", "gen_id")  # lowest priority (most slack) first


def atc_priorities(alphas: Sequence[float] | np.ndarray, ps: Sequence[float] | np.ndarray,
                   slacks: Sequence[float] | np.ndarray, k: float, groups: Sequence[int] = ()) -> np.ndarray:
    """Apparent-tardiness-cost priorities (Vepsalainen & Morton 1987) of critical first segments:
    (TUF slope |alpha| / p) * exp(-max(0, slack) / (k * mean p)), p = estimated time to finish
    the segment.  Past its deadline a request loses |alpha| utility per second of delay, so
    among late ones the order is weighted-shortest-processing-time (what minimises the sum of
    alpha x lateness); slack discounts one not yet late.  `groups`: ascending positions that
    split the arrays into groups, each with its own mean p (`select` prices the running batch
    and the ready generations in one call); always > 0."""
    a = np.asarray(alphas, dtype=float)
    p = np.asarray(ps, dtype=float)
    s = np.asarray(slacks, dtype=float)
    bounds = [b for b in (0, *groups, p.size) if 0 < b < p.size]  # (np.add.reduce: np.sum's bits, less overhead)
    if bounds:
        scale = np.empty(p.size)
        for lo, hi in zip([0] + bounds, bounds + [p.size]):
            sc = float(np.add.reduce(p[lo:hi])) / (hi - lo) * k
            scale[lo:hi] = sc if sc > 1e-9 else 1e-9
    else:
        scale = float(np.add.reduce(p)) / p.size * k
        scale = scale if scale > 1e-9 else 1e-9
    w = np.where(a < 0.0, -a, 1e-12) / np.maximum(p, 1e-9) * np.exp(-np.maximum(s, 0.0) / scale)
    return np.fmax(w, 5e-324, out=w)  # (exp underflow: still critical, last; = where(w > 0, w, 5e-324), NaN too)


class Default(Policy):
    name = "default"
    observes_tokens = observes_steps = True  # rule 9's pacing counts each step's new requests and time
    chooses_suspension = True  # rule 5: stream on or suspend at each statement
    mode = DispatchMode.SUSPEND

    def __init__(self, lead_steps: float = 4.0, min_lead_s: float = 0.05, preempt: bool = True,
                 preempt_ratio: float = 4.0, len_weight: float = 0.1, kv_budget: bool = True,
                 pace: bool = False, pace_min_free: float = 0.25, pace_max_error: float = 0.5,
                 pace_kv: str = "preserve", step_ratio: float = 3.0, memory_full: bool = False,
                 atc_k: float = 2.0, drain_after_s: float = 5.0, speculate: bool = True,
                 overload: bool = True, roomy_ratio: float = 10.0, plan_order: bool = True,
                 plan_depth_s: float = 8.0, steep_cap: bool = True, stream_past: bool = True,
                 yield_price: float = 0.08, yield_backlog_s: float = 30.0, keep_kv: bool = True,
                 keep_kv_min_free: float = 0.25, victim_readd: bool = True, heavy_rho: float = 1.6,
                 rho_tau_s: float = 60.0, steep_first_rho: float = 3.5, sat_rho: float = 1.0,
                 sat_rho_off: float = 0.7, sat_add_price: float = 0.5, sat_min_steps: int = 300,
                 back_factor: float = 0.0, back_rho: float = 0.0) -> None:
        for k, v in (("preempt", preempt), ("kv_budget", kv_budget), ("pace", pace), ("memory_full", memory_full),
                     ("speculate", speculate), ("overload", overload), ("plan_order", plan_order),
                     ("steep_cap", steep_cap), ("stream_past", stream_past), ("keep_kv", keep_kv),
                     ("victim_readd", victim_readd)):
            if not isinstance(v, bool):
                raise ValueError(f"{k} must be true or false, got {v!r}")
        self.kv_budget = kv_budget
        self.plan_order = plan_order
        self.steep_cap = steep_cap  # rule 10 protects only steeper first segments, and shrinks the batch
        if (isinstance(plan_depth_s, bool) or not isinstance(plan_depth_s, (int, float))
                or not 0 <= plan_depth_s < math.inf):
            raise ValueError(f"plan_depth_s must be a finite number of seconds >= 0 (rule 12 applies while "
                             f"rule 11's backlog wait, averaged over ~{_PLAN_TAU_S:g} s, is at least that; "
                             f"0: whenever there is a backlog), got {plan_depth_s!r}")
        self.plan_depth_s = float(plan_depth_s)
        self._depth = 0.0  # rule 12: rule 11's backlog wait, exponentially averaged over time
        self._depth_t: float | None = None  # ... as of this time
        self._lenpred = None  # rule 12's reply-length predictor (loaded when plan_order is on)
        if self.plan_order:
            self._lenpred = _learned_predictor()
        self._plan = False  # rule 12 applies at this scheduling point
        if isinstance(heavy_rho, bool) or not isinstance(heavy_rho, (int, float)) or not heavy_rho > 0:
            raise ValueError(f"heavy_rho must be a number > 0 (rule 12's heavy load: offered tokens/s over "
                             f"full-batch tokens/s; inf: never), got {heavy_rho!r}")
        self.heavy_rho = float(heavy_rho)
        if isinstance(steep_first_rho, bool) or not isinstance(steep_first_rho, (int, float)) or not steep_first_rho > 0:
            raise ValueError(f"steep_first_rho must be a number > 0 (rule 12's heavy load: the load factor from which "
                             f"steep first statements rank first where a re-add is cheap; inf: never), "
                             f"got {steep_first_rho!r}")
        self.steep_first_rho = float(steep_first_rho)
        self._steep_first = False  # rule 12's deep load at this scheduling point: steep first statements first
        for k, v, what in (("sat_rho", sat_rho, "> 0 (rule 14: the effective load factor from which it applies; "
                            "inf: never)"), ("sat_rho_off", sat_rho_off, "> 0 (rule 14 lasts while the effective "
                            "load factor is at least this)"), ("sat_add_price", sat_add_price, "> 0 (rule 14: an "
                            "add's step-time term over a one-generation step)")):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"{k} must be a number {what}, got {v!r}")
        if not sat_rho_off <= sat_rho:
            raise ValueError(f"sat_rho_off must be at most sat_rho (rule 14's hysteresis), got {sat_rho_off!r} > {sat_rho!r}")
        if isinstance(sat_min_steps, bool) or not isinstance(sat_min_steps, int) or not sat_min_steps >= 4:
            raise ValueError(f"sat_min_steps must be an integer >= 4 (engine steps before rule 14 prices an add), "
                             f"got {sat_min_steps!r}")
        self.sat_rho = float(sat_rho)
        self.sat_rho_off = float(sat_rho_off)
        self.sat_add_price = float(sat_add_price)
        self.sat_min_steps = sat_min_steps
        self._saturated = False  # rule 14 applies at this scheduling point
        self._adds_dear: bool | None = None  # rule 14's verdict on this engine (None: not priced yet)
        self._load = OfferedLoad(tau_s=rho_tau_s)  # rule 12's load factor (validates rho_tau_s)
        self._heavy = False  # rule 12's heavy load at this scheduling point: every generation critical
        # `load_factor`'s last reads, by `effective`: (when, the load factor then)
        self._rho_read: dict[bool, tuple[float, float]] = {False: (-math.inf, 0.0), True: (-math.inf, 0.0)}
        self._head_pri = 0.0  # rule 12: the best waiting critical generation's priority at the last point
        if isinstance(roomy_ratio, bool) or not isinstance(roomy_ratio, (int, float)) or not 1 < roomy_ratio:
            raise ValueError(f"roomy_ratio must be a number > 1 (rule 10's ratio while KV memory has room; "
                             f"inf: no step-time cap then), got {roomy_ratio!r}")
        self.roomy_ratio = float(roomy_ratio)
        self.overload = overload
        self.victim_readd = victim_readd  # rule 11: a deferrable victim's slack also covers its re-add where memory is short
        self._queue_s = 0.0  # rule 11: the late backlog's wait at the last scheduling point
        self._back_s = 0.0  # rule 11 (opt-in): the waiting critical work's time over the running batch, x back_factor
        self.speculate = speculate
        self.stream_past = stream_past  # rule 8: speculate past a blocking statement without a re-add
        for k, v, what in (("yield_price", yield_price, "a share of a one-generation step; inf: rule 5 always "
                            "yields"), ("yield_backlog_s", yield_backlog_s, "seconds of late backlog"),
                           ("back_factor", back_factor, "rule 11's critical queue: a generation leaves the batch "
                            "only if its slack exceeds the lead plus back_factor x the waiting critical work's time "
                            "over the running batch; 0, the default: off; inf: never while critical work waits"),
                           ("back_rho", back_rho, "the load factor from which rule 11's critical queue applies; "
                            "0, the default: at any load; inf: never")):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                raise ValueError(f"{k} must be a number >= 0 ({what}), got {v!r}")
        self.back_factor = float(back_factor)
        self.back_rho = float(back_rho)
        self.yield_price = float(yield_price)  # rule 5: a yield is priced where a re-add costs more
        self.yield_backlog_s = float(yield_backlog_s)  # ... unless a first statement waits behind less
        self.keep_kv = keep_kv  # rule 13: a suspension keeps its KV where the engine can and memory has room
        self._first_waits = False  # a critical first statement was among the ready ones at the last point
        self._first_crit = False  # rule 10 protected a first statement while critical work waited (ditto)
        if isinstance(drain_after_s, bool) or not isinstance(drain_after_s, (int, float)) or not drain_after_s > 0:
            raise ValueError(f"drain_after_s must be a number > 0 (inf: the step-time cap always applies), "
                             f"got {drain_after_s!r}")
        self.drain_after_s = float(drain_after_s)
        self._first_seen = -math.inf  # when a first segment last ran or waited (rule 10)
        if isinstance(atc_k, bool) or not isinstance(atc_k, (int, float)) or not 0 < atc_k < math.inf:
            raise ValueError(f"atc_k must be a finite number > 0, got {atc_k!r}")
        self.atc_k = float(atc_k)
        for k, v in (("pace_min_free", pace_min_free), ("keep_kv_min_free", keep_kv_min_free)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise ValueError(f"{k} must be in [0, 1] (a share of the engine's KV memory that must be free), "
                                 f"got {v!r}")
        if (isinstance(pace_max_error, bool) or not isinstance(pace_max_error, (int, float))
                or not pace_max_error > 0):
            raise ValueError(f"pace_max_error must be > 0, got {pace_max_error!r}")
        self.pace_max_error = float(pace_max_error)
        if pace_kv not in ("preserve", "cache"):
            raise ValueError(f"pace_kv must be 'preserve' or 'cache', got {pace_kv!r}")
        self.pace = pace
        self.pace_kv = pace_kv  # KV of a paused generation ("cache": only to measure what it costs)
        self.pace_min_free = float(pace_min_free)
        self.keep_kv_min_free = float(keep_kv_min_free)  # rule 13's memory room
        self._steps = StepTimeModel()  # the engine's step time against batch size (rules 9 and 10)
        self._seen_new = 0  # new requests (their first output) in the engine step being reported
        self._seen_prefill = 0  # tokens that step prefilled (added generations' context - cache hits)
        if isinstance(step_ratio, bool) or not isinstance(step_ratio, (int, float)) or not 1 < step_ratio:
            raise ValueError(f"step_ratio must be a number > 1 (inf: no step-time cap), got {step_ratio!r}")
        self.step_ratio = float(step_ratio)
        self.memory_full = memory_full
        self._capped = False  # the step-time cap or the KV budget held back a ready generation
        self._mem_held = False  # ... the KV budget did, with memory_full
        self._mem_cut = False  # KV memory was short at the last point: rule 6 cut within the cap's room (rule 8 reads it)
        for k, v in (("lead_steps", lead_steps), ("min_lead_s", min_lead_s)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 or v == float("inf"):
                raise ValueError(f"{k} must be a finite number >= 0, got {v!r}")
        if isinstance(preempt_ratio, bool) or not isinstance(preempt_ratio, (int, float)) or not preempt_ratio >= 1:
            raise ValueError(f"preempt_ratio must be >= 1, got {preempt_ratio!r}")
        if isinstance(len_weight, bool) or not isinstance(len_weight, (int, float)) or not 0 < len_weight <= 1:
            raise ValueError(f"len_weight must be in (0, 1], got {len_weight!r}")
        self.lead_steps = float(lead_steps)
        self.min_lead_s = float(min_lead_s)
        self.preempt = preempt
        self.preempt_ratio = float(preempt_ratio)
        self.len_weight = float(len_weight)
        self._seg_len: dict[tuple[str, bool], float] = {}  # (robot type, first segment?) -> mean tokens
        self._seg_ver = 0  # bumped by every `observe` (`_point_terms` rebuilds its table then)
        self._pred: dict[tuple[str, bool], float] = {}
        self._pred_n = self._pred_ver = -1  # (the robots' count and `_seg_ver` it was built at)
        self._pred_robots: dict | None = None
        self._pred_by: tuple[dict[str, float], dict[str, float]] = ({}, {})
        # robots -> their worst segment + 1 by type, and the largest of those (17: an unknown type's)
        self._mem_seg: tuple[dict | None, dict[str, int], int] = (None, {}, 17)
        self._mem_rows: tuple = (None, -1, np.zeros(0, dtype=np.int64))  # ... by `_rtypes` row (`_fit_slots`)
        self._full = False  # the batch-size controller refused a ready generation at the last point
        # (not the step-time cap: suspending there trades a re-prefill per statement for a slot
        # the policy itself withholds — the edge board with chat_mixed lost 7 s of engine time to it)
        # a request's constants, filled once per generation: its TUF slope and robot type (2 x its
        # row of the prediction table + 1: a first segment's column); and the terms `select` read
        # of it at its `sched_rev` (`rev`): has segments, the current segment's tokens, next due time
        self._table = SlotTable({"alpha": (float, 0.0), "rt2f": (np.intp, 0), "rev": (np.int64, -1),
                                 "has": (bool, False), "tok": (float, 0.0), "due": (float, 0.0),
                                 # rule 12: the sched_rev its remaining tokens were last predicted at, and those
                                 "prev": (np.int64, -1), "rem": (float, 0.0),
                                 # rule 6: its prompt (fixed: filled once) and output tokens (read with the
                                 # terms above), arrival
                                 "plen": (np.int64, 0), "out": (np.int64, 0), "arr": (float, 0.0),
                                 # the priority `select` last set on it (NaN: none; `_pri_kept`)
                                 "pri": (float, math.nan)},
                                track_output=False)
        self._rtypes: dict[str, int] = {}  # robot type -> row of the per-point prediction table
        self._small_below = SMALL_BELOW  # fewer live generations: `select` takes default_small.py's path
        self._pri_kept = False  # the SlotTable's "pri" is what each generation's priority holds (`_set_priorities`)
        self._P: tuple = (None, -1, np.zeros(0))  # (pred, rows, predicted tokens at 2 x row + first?)

    # --- online estimates -------------------------------------------------------------------------
    def predicted_tokens(self, g: Generation, ctx: PolicyContext) -> float:
        """Tokens of g's next segment: the running mean observed for its robot type, first
        segments and later ones apart; before any observation, half the robot's worst case."""
        m = self._seg_len.get((g.request.robot_type, not g.segments))
        if m is None:
            robot = ctx.robots.get(g.request.robot_type)
            m = 0.5 * robot.max_segment_tokens if robot is not None else 8.0
        return m

    def observe(self, g: Generation, seg: Segment) -> None:
        """Learn segment lengths from what the engine produced (called at statement ends)."""
        if seg.token_count <= 0:
            return
        key = (g.request.robot_type, seg.index == 0)
        old = self._seg_len.get(key)
        w = self.len_weight
        self._seg_len[key] = float(seg.token_count) if old is None else (1 - w) * old + w * seg.token_count
        self._seg_ver += 1

    def lead(self, ctx: PolicyContext) -> float:
        """Slack at or below which a generation is critical (every one under a heavy load, rule
        12, and a saturation, rule 14)."""
        if self._heavy or self._saturated:
            return math.inf
        return max(self.min_lead_s, self.lead_steps * ctx.token_s)

    def slack(self, g: Generation, ctx: PolicyContext, now: float, running: bool) -> float:
        left = max(1.0, self.predicted_tokens(g, ctx) - g.seg_tokens)
        est = (left + (0.0 if running else 1.0)) * ctx.token_s  # +1 step to (re)enter the batch
        return g.next_due(now) - now - est

    # --- the decision -----------------------------------------------------------------------------
    def _point_terms(self, ctx: PolicyContext) -> tuple[float, float, dict[tuple[str, bool], float]]:
        """(time per token, lead, predicted tokens by (robot type, first?)) for one point (the
        table is rebuilt only after `observe` learned a length or for other robots)."""
        robots = ctx.robots
        if self._pred_robots is not robots or self._pred_n != len(robots) or self._pred_ver != self._seg_ver:
            pred = dict(self._seg_len)
            for name, robot in robots.items():
                for first in (True, False):
                    pred.setdefault((name, first), 0.5 * robot.max_segment_tokens)
            self._pred, self._pred_n, self._pred_ver, self._pred_robots = pred, len(robots), self._seg_ver, robots
            self._pred_by = ({t: v for (t, f), v in pred.items() if not f},  # continuations, first segments
                             {t: v for (t, f), v in pred.items() if f})
        return ctx.token_s, self.lead(ctx), self._pred

    def _pred_flat(self, pred: dict[tuple[str, bool], float]) -> np.ndarray:
        """Predicted tokens of a next segment at 2 x (robot type's row) + (first segment?), 8
        for robot types `pred` does not know (as default_small.py, the plain path); rebuilt when
        `pred` or the rows change."""
        rtypes = self._rtypes
        if self._P[0] is not pred or self._P[1] != len(rtypes):
            P = np.full((len(rtypes), 2), 8.0)
            for (name, first), v in pred.items():
                P[rtypes[name], int(first)] = v
            self._P = (pred, len(rtypes), P.ravel())
        return self._P[2]

    def _fill(self, g: Generation, slot: int) -> None:
        """`SlotTable` fill: g's request constants; its per-point terms are read at the next point."""
        req = g.request
        a = self._table.a
        rtypes = self._rtypes
        a["alpha"][slot] = req.tuf.alpha
        a["rt2f"][slot] = 2 * rtypes.setdefault(req.robot_type, len(rtypes)) + 1  # (- has segments)
        a["rev"][slot] = a["prev"][slot] = -1
        a["arr"][slot] = req.arrival
        a["plen"][slot] = len(g.prompt_ids)  # (a generation's prompt is fixed when it is made)
        a["pri"][slot] = math.nan

    def select(self, ready: Sequence[Generation], running: Sequence[Generation], ctx: PolicyContext,
               now: float) -> Selection:
        """Rules 3, 4, 6, 7, 9 and 10 (module docstring) at one scheduling point.  The running
        and the ready generations' slack and ATC priority are one pass of numpy arithmetic (few
        calls, whatever the count): a request's constants come from a SlotTable filled once per
        generation; whether it has segments, the current segment's tokens and the next due time
        (executor reports move it) are read again only for generations whose `sched_rev` moved
        since (`Generation.touch`: the running ones and those with news).  Only the
        head the step-time cap can admit is ordered — where rule 6 cuts it before the roomy cap,
        only the short cap's head (default_head.py).  Under `SMALL_BELOW` live generations (64)
        the point is one plain Python pass per generation instead (default_small.py: numpy's
        per-call overhead is most of a point at a handful); the two give the same Selection,
        priorities and state bit for bit, at every size (tests/test_scheduling_fastpaths.py
        forces each)."""
        self._full = batch_was_full(ready) or self._mem_held  # a cap or KV memory binds (suspend_at)
        full = self._full or self._capped
        if full:
            self._load.saturate()  # (rule 12's load factor: the largest batch seen is the full one)
        self._heavy = self.heavy_load(ctx, now)
        self._saturated = self.saturation(ctx, now)
        self._steep_first = self._heavy and self.deep_load(ctx, now)
        token_s, lead, pred = self._point_terms(ctx)
        n_run = len(running)
        n = n_run + len(ready)
        if not n:
            self._first_waits = False
            self._queue_s = self._back_s = 0.0
            self._plan = self.plan_applies(now)
            return self._finish([], False, [], full, running, ctx, now, first=False)
        if n < self._small_below:  # a handful: plain Python (default_small.py), the same bits
            self._pri_kept = False  # (it sets priorities itself)
            return select_small(self, ready, running, ctx, now, full, token_s, lead)
        gens = [*running, *ready]
        rtypes = self._rtypes
        if self._P[0] is not pred:
            for name, _ in pred:
                rtypes.setdefault(name, len(rtypes))
        sl = self._table.lookup(gens, self._fill)
        a = self._table.a
        P = self._pred_flat(pred)
        # what the planner changed since the last point (`Generation.touch`: the running ones'
        # tokens, segments cut, dispatched or executed): whether it has segments, the current
        # segment's tokens and the next due time (`Generation.next_due`: arrival + ERT, or its
        # robot's dispatched actions' estimated end — which does not depend on `now` then)
        revs = np.fromiter(map(_REV, gens), dtype=np.int64, count=n)
        moved = (a["rev"][sl] != revs).nonzero()[0].tolist()
        if moved:
            a_has, a_tok, a_due, a_out = a["has"], a["tok"], a["due"], a["out"]
            for i in moved:
                g = gens[i]
                j = sl[i]
                a_has[j] = not not g.segments
                a_tok[j] = g.seg_tokens
                a_due[j] = g.next_due(now)
                a_out[j] = len(g.output_ids)
            a["rev"][sl[moved]] = revs[moved]
        has = a["has"][sl]
        has_l = has.tolist()
        due = a["due"][sl]
        left = P[a["rt2f"][sl] - has] - a["tok"][sl]
        p = np.fmax(left, 1.0)  # (left if left > 1 else 1: NaN too) x time per token
        p *= token_s
        s = due - now
        s -= p
        s[n_run:] -= token_s  # +1 step to (re)enter the batch: the ready ones
        crit = s <= lead
        late = s[n_run:] < 0.0  # rule 11: the ready ones already past their deadlines
        self._queue_s = self.queue_wait(int(np.count_nonzero(late)), (p[n_run:][late] + token_s).tolist(), n_run)
        self._back_s = (self.back_wait((p[n_run:][crit[n_run:]] + token_s).tolist(), n_run, ctx, now)
                        if self.back_factor else 0.0)  # (off by default: no array made)
        self._plan = self.plan_applies(now)
        pri = -1.0 - s  # deferrable: least slack first
        ci = crit.nonzero()[0]
        cl = ci.tolist()
        nr = bisect_left(cl, n_run)  # critical running ones: cl[:nr]
        if cl:  # critical segments: ATC, the running batch and the ready ones each a group
            if not self._plan:
                pe = p[ci]
                pe[nr:] += token_s
                pri[ci] = atc_priorities(a["alpha"][sl[ci]], pe, s[ci], self.atc_k, (nr,))
            else:  # rule 12: the whole reply's WSRPT instead (`plan_priorities`, vectorised)
                sc = sl[ci]
                ask = (a["prev"][sc] != revs[ci]).nonzero()[0].tolist()
                for k in ask:  # the predictor, only where the text moved since it was last asked
                    self._remaining_at(gens[cl[k]], int(sc[k]))
                pri[ci] = _plan_weights(a["alpha"][sc], a["rem"][sc], token_s)
                if self._steep_first:  # rule 12's deep load: steep first statements before every reply rank
                    mag = -a["alpha"][sc]
                    pri[ci] *= np.where(~a["has"][sc] & _steeper(mag, mag.min()), _STEEP_FIRST, 1.0)
        self._head_pri = float(pri[ci[nr:]].max()) if self._plan and len(cl) > nr else 0.0
        self._set_priorities(gens, sl, pri)
        run_crit = [gens[i] for i in cl[:nr]]
        run_first = not all([has_l[i] for i in cl[:nr]])  # a critical first segment runs
        crit_ready = cl[nr:]
        first_r = ~has[n_run:]
        waits_first = bool(np.count_nonzero(first_r & crit[n_run:]))  # a critical first segment waits
        self._first_waits = waits_first  # (rule 5's price)
        protect = run_first or waits_first  # a critical first segment runs or waits
        if self.steep_cap:  # rule 10 protects first segments steeper than the flattest live generation
            mag = -a["alpha"][sl]
            first = bool(np.count_nonzero(~has & _steeper(mag, mag.min())))
        else:
            first = not all(has_l)
        head = self._head_needed(ctx, running, first, now, full and bool(crit_ready))
        arr = a["arr"][sl]
        groups = [ci[nr:]] if protect else [ci[nr:], (~crit[n_run:]).nonzero()[0] + n_run]
        lazy = self._lazy_head(ctx, gens, sl, n_run, groups, pri, arr, head)
        if lazy is not None:
            sel = self._finish([], bool(crit_ready), run_crit, full, running, ctx, now, first=first, lazy=lazy)
        else:
            oi = concat_head(gens, groups, pri, head, arr)
            order = list(map(gens.__getitem__, oi.tolist()))
            sel = self._finish(order, bool(crit_ready), run_crit, full, running, ctx, now, first=first,
                               slots=(sl[oi], sl[:n_run]))
        if not protect:
            return sel
        run_def = [g for g, c in zip(running, crit[:n_run].tolist()) if not c]
        budget = math.inf  # rule 9's tightest per-token budget of the waiting critical first segments
        if waits_first and self._pacing(ctx):
            fc = [i for i in crit_ready if not has_l[i]]  # the critical first segments waiting
            with np.errstate(all="ignore"):
                t = (due[fc] - now) / np.fmax(left[fc], 1.0)
            t = t[t > 0.0]
            if t.size:
                budget = float(t.min())
        return self._paced(sel, run_crit, run_def, running, ctx, now, budget)

    def _set_priorities(self, gens: list[Generation], sl: np.ndarray, pri: np.ndarray) -> None:
        """g.priority = pri[i] for each of `gens` (slots `sl`) — only where it differs, bit for bit,
        from what this path set at its last point (kept in the SlotTable; a deep queue's critical
        ones keep theirs from point to point), unless the plain path set priorities since then
        (`_pri_kept` False: all of them).  A policy is the only writer of its generations'
        priorities (a live policy change builds a new policy: nodes/wiring.py)."""
        a = self._table.a
        if self._pri_kept:
            ch = (a["pri"][sl].view(np.int64) != pri.view(np.int64)).nonzero()[0]
            for i, v in zip(ch.tolist(), pri[ch].tolist()):
                gens[i].priority = v
        else:
            set_priorities(gens, pri.tolist())
            self._pri_kept = True
        a["pri"][sl] = pri

    # --- rule 9: pace the steps that generate critical first segments ---------------------------
    def on_token(self, g: Generation, n_new: int, ctx: PolicyContext) -> None:
        """Count the new requests of the engine step that just ran (their first output: the step
        tokenised and prefilled their prompts)."""
        if not g.segments and not g.resumes and len(g.output_ids) == n_new:
            self._seen_new += 1
        adds = len(g.cached_tokens)  # the engine reports prefix-cache hits with an add's first output
        if adds and (st := g.policy.default).step_adds != adds:
            st.step_adds = adds
            self._seen_prefill += max(0, len(g.prompt_ids) + len(g.output_ids) - n_new - g.cached_tokens[-1])

    def on_step(self, duration_s: float, outputs: int) -> None:
        """Feed the step-time model (rules 9 and 10) and rule 12's load factor with the engine
        step that just ran."""
        self._load.step(duration_s, outputs, not self._seen_new and not self._seen_prefill)
        self._steps.observe(duration_s, outputs, self._seen_new, self._seen_prefill)
        self._seen_new = self._seen_prefill = 0

    def _pacing(self, ctx: PolicyContext) -> bool:
        """Whether rule 9 may pause: enabled, the engine keeps a paused generation's KV in place,
        free KV memory is at least `pace_min_free`, the step time grows with the batch, and the
        step-time model predicts it (root mean square one-step-ahead error at most
        `pace_max_error` of the mean step time: where uncached prefills dominate the step time —
        a memory-starved engine — the batch size does not decide it and pausing only adds noise)."""
        if not self.pace or (self.pace_kv != "cache" and self.pace_kv not in ctx.kv_modes):
            return False
        if not _kv_room(ctx, self.pace_min_free):
            return False
        return (self._steps.max_seqs(1.0, 0, ctx.token_s) is not None
                and self._steps.relative_error() <= self.pace_max_error)

    def _paced(self, sel: Selection, run_crit: list[Generation], run_def: list[Generation],
               running: Sequence[Generation], ctx: PolicyContext, now: float, budget: float) -> Selection:
        """Rule 9 (a critical first segment is running or waiting): each critical first segment
        that can still make its deadline needs its remaining tokens in steps of at most
        (deadline − now) / tokens left; the tightest of these budgets, through the step-time
        model, gives the most generations the next step may hold.  Above it, running
        generations are paused at token level (deferrable ones, most slack first; then critical
        continuations, whose robots are busy, least dense first, after the ready ones are held
        back); first segments are never paused.  A pause keeps the KV in place ("preserve"), so
        only where the engine honours that and free KV memory is at least `pace_min_free`: a
        resume that recomputes the last, partial KV block costs more than the pause saves."""
        if not self._pacing(ctx):
            return sel
        for g in run_crit:  # `budget`: the same over the waiting ones
            if g.segments:
                continue
            left = self.predicted_tokens(g, ctx) - g.seg_tokens
            t = (g.next_due(now) - now) / (left if left > 1.0 else 1.0)
            if 0.0 < t < budget:  # one already late is not saved by a budget
                budget = t
        if budget == math.inf:
            return sel
        new = sum(1 for g in sel.order if not g.output_ids)
        engines = max(1, ctx.engines)  # per engine, as the step-time cap
        cap = self._steps.max_seqs(budget, -(-new // engines), ctx.token_s)
        if cap is None:
            return sel
        cap *= engines
        held = {id(g) for g in sel.preempt}
        over = len(running) - len(held) + len(sel.order) - cap
        if over <= 0:
            return sel
        victims = sorted((g for g in run_def if id(g) not in held), key=_PAUSE_KEY)
        order = sel.order
        if over > len(victims):
            conts = [g for g in order if g.segments]
            drop = min(len(conts), over - len(victims))
            if drop:
                out = {id(g) for g in conts[len(conts) - drop:]}  # the least urgent of them
                order = [g for g in order if id(g) not in out]
                over -= drop
            victims += sorted((g for g in run_crit if g.segments and id(g) not in held), key=_PAUSE_KEY)
        paused = victims[:over]
        for g in paused:
            g.policy.default.pause_kv = True
        return Selection(order=order, preempt=list(sel.preempt) + paused)

    def kv_mode(self, g: Generation, seg: Segment | None, ctx: PolicyContext) -> str:
        """A generation paused by rule 9 keeps its KV in place (`pace_kv`); any other suspension
        — at a statement end, or preempted — too where rule 13 keeps KV (`keeps_kv`); else "cache"."""
        st = g.policy.default
        paused, st.pause_kv = st.pause_kv, False
        if paused and seg is None:
            return self.pace_kv
        return "preserve" if self.keeps_kv(ctx) else "cache"

    def keeps_kv(self, ctx: PolicyContext) -> bool:
        """Rule 13: whether a generation suspended now keeps its KV in place — `keep_kv` is on,
        the engine honours "preserve" (`Engine.kv_modes`: an InferCept/LAMPS-style engine; stock
        vLLM cannot) and at least `keep_kv_min_free` of its KV memory is free.  Its resume then
        recomputes one token instead of re-prefilling its last, partial KV block; where kept KV
        stalls the engine, the planner releases it (`Planner._release_pinned`)."""
        return self.keep_kv and "preserve" in ctx.kv_modes and _kv_room(ctx, self.keep_kv_min_free)

    def _finish(self, order: list[Generation], critical: bool, run_crit: list[Generation], full: bool,
                running: Sequence[Generation], ctx: PolicyContext, now: float, first: bool = True,
                tokens: int | None = None, slots: tuple[np.ndarray, np.ndarray] | None = None,
                lazy: LazyHead | None = None) -> Selection:
        """Rules 6 and 7: the memory cut, then token-level preemption (`critical`: whether a
        ready generation is critical), then rule 10's step-time cap (`first`: a first segment it
        protects runs or waits), which with `steep_cap` also shrinks the batch (`_shrink`).
        `tokens`: `order`'s prompt and output tokens summed, where the caller knows them (`_fit_memory`);
        `slots`: `order`'s and the running ones' slots in the SlotTable, where the caller has them
        (the numpy path: `_fit_slots`); `lazy`: instead of `order`, the order ordered as far as
        it is read, with rule 6's cut (`_lazy_head`)."""
        self._first_crit = first and critical  # (rule 5's price)
        held = False
        if lazy is not None:  # (kv_budget on, memory_full off)
            n_in = lazy.n
            order = lazy.head()  # (as far as it is ordered: at least the running batch + 1)
            fits = lazy.fits
        else:
            n_in = len(order)
            if self.kv_budget:
                order = (self._fit_memory(order, running, ctx, tokens) if slots is None
                         else self._fit_slots(order, *slots, running, ctx))
                held = self.memory_full and len(order) < n_in
            fitted = order

            def fits(m: int) -> bool:  # rule 6 admits at least the first m
                return len(fitted) >= m
        preempt: list[Generation] = []
        if self.preempt and full and critical and not self._saturated:  # (rule 14: no preemption)
            # token-level preemption, one for one: deferrable victims first, then critical ones
            # by ATC priority, lowest first (rules in the module docstring)
            crit_ids = {id(g) for g in run_crit}
            back = self.lead(ctx) + max(self._queue_s, self._back_s)  # rule 11: a deferrable victim's slack must exceed it
            stall = self.readd_stall_per_token(ctx, len(running))  # (its re-add's price, one per point)

            def kept(v: Generation) -> bool:  # rule 11: a deferrable victim back only after its robot idles
                return -1.0 - v.priority <= back + stall * (len(v.prompt_ids) + len(v.output_ids))

            victims = running
            if self._plan:  # rule 12: deferrable ones that rule 11 keeps are no victims, and stop nothing
                victims = [v for v in victims if id(v) in crit_ids or not kept(v)]
            # the walk pairs the order's head with the lowest victims: only that many are ranked
            # (nsmallest is sorted()[:n], ties included)
            victims = heapq.nsmallest(len(order), victims, key=lambda v: (id(v) in crit_ids, v.priority, v.gen_id))
            for want, v in zip(order, victims):
                if want.priority <= 0:
                    break  # only critical work preempts
                # a critical victim only for a preempt_ratio times higher priority (the swap pays
                # for the victim's re-add) and with more than 2 tokens of its segment to go
                if id(v) in crit_ids and not (want.priority > self.preempt_ratio * v.priority
                                              and self.predicted_tokens(v, ctx) - v.seg_tokens > 2):
                    break
                if id(v) not in crit_ids and kept(v):  # rule 11
                    break
                preempt.append(v)
        self._capped = self._mem_held = held
        if first:
            self._first_seen = now
        drain = now - self._first_seen >= self.drain_after_s  # rule 10 lifted: only continuations left
        cap = None if drain else self._cap_total(ctx, len(running) - len(preempt))  # (`_cap_room`'s)
        room = None if cap is None else max(0, cap - len(running) + len(preempt))
        if self.steep_cap and first and cap is not None and not self._saturated:  # (rule 14: no shrink)
            n_pre = len(preempt)
            preempt = self._shrink(running, preempt, cap, order[:1])
            if len(preempt) > n_pre:  # shrunk to the cap: no room left (any head `_head_needed` gives cuts alike)
                room = self._cap_room(ctx, len(running), len(preempt))
        # memory is short: rule 6's KV budget cut the order before the step-time cap would (both paths
        # of `select` agree: the numpy one hands over at least the cap's room + 1, `_head_needed`)
        self._mem_cut = not fits(n_in if room is None else min(n_in, room))
        if room is not None and self.roomy_ratio > self.step_ratio and self._mem_cut:
            # KV memory binds before the roomy cap: the cap is step_ratio's (rule 10)
            room = self._cap_room(ctx, len(running), len(preempt), short=True)
            self._mem_cut = not fits(min(n_in, room))  # ... and short against the cap that applies
        if room is not None and fits(room + 1):  # the step-time cap (rule 10)
            order = order[:room] if lazy is None else lazy.fitted(room)
            self._capped = True
        elif lazy is not None:
            order = lazy.fitted(None)
        return Selection(order=order, preempt=preempt)

    def _shrink(self, running: Sequence[Generation], preempt: list[Generation], cap: int,
                head: Sequence[Generation]) -> list[Generation]:
        """Rule 10 with `steep_cap`, while a protected first segment runs or waits: the running
        batch shrinks to the cap at once — `preempt` plus as many running continuations of the
        flattest slope in the batch as it holds beyond the cap, and one more when the admission
        order's `head` is a critical waiting first segment steeper than them, so that it enters now
        (deferrable ones first, most slack first, then critical ones by priority, lowest first);
        first segments and steeper work stay.  `cap`: `_cap_total` with the others staying."""
        staying = len(running) - len(preempt)
        if not running or staying < cap:  # (room even with the head entering)
            return preempt
        flat = min(-g.request.tuf.alpha for g in running)
        excess = staying - cap
        if (head and head[0].priority > 0 and not head[0].segments
                and _steeper(-head[0].request.tuf.alpha, flat)):  # a critical steeper first segment
            excess += 1
        if excess <= 0:
            return preempt
        taken = {id(v) for v in preempt}
        extra = sorted((v for v in running if id(v) not in taken and v.segments
                        and not _steeper(-v.request.tuf.alpha, flat)),
                       key=lambda v: (v.priority > 0, v.priority, v.gen_id))[:excess]
        return preempt + extra

    def _cap_room(self, ctx: PolicyContext, n_running: int, n_preempt: int, short: bool = False) -> int | None:
        """Admissions the step-time cap leaves after `n_preempt` of `n_running` are preempted (None:
        no cap): no step longer than roomy_ratio (`short`: step_ratio) x a one-generation step, per
        engine (a pool's members step side by side: the pool holds the cap times its usable members)."""
        cap = self._cap_total(ctx, n_running - n_preempt, short)
        return None if cap is None else max(0, cap - n_running + n_preempt)

    def _cap_total(self, ctx: PolicyContext, n_staying: int, short: bool = False) -> int | None:
        """The whole batch the step-time cap allows with `n_staying` generations running (None:
        no cap): `step_cap` per engine times the usable members."""
        engines = max(1, ctx.engines)
        cap = self.step_cap(ctx, -(-n_staying // engines), short=short)
        return None if cap is None else cap * engines

    def plan_applies(self, now: float) -> bool:
        """Rule 12 applies at this point (called once per `select`, after rule 11's `_queue_s`):
        `plan_order` is on, there is a backlog, and its wait averaged over time (exponentially,
        time constant `_PLAN_TAU_S`) is at least `plan_depth_s` — a deep, lasting overload, not
        a burst that drains within seconds."""
        if self._depth or self._queue_s:  # (no backlog, none remembered: the average stays 0.0 exactly)
            if self._depth_t is None:
                self._depth_t = now
            w = math.exp(-max(0.0, now - self._depth_t) / _PLAN_TAU_S)
            self._depth = w * self._depth + (1.0 - w) * self._queue_s
        self._depth_t = now
        return self.plan_order and self._queue_s > 0.0 and (self._heavy or self._depth >= self.plan_depth_s)

    # --- rule 12's heavy load ---------------------------------------------------------------------
    def on_arrival(self, g: Generation) -> None:
        """Count a new request for rule 12's load factor (the length predictor guesses its
        robot type's reply length once, until a reply of that type ends)."""
        if not self.plan_order or self.heavy_rho == math.inf:
            return
        rt = g.request.robot_type
        guess = None if self._load.knows(rt) else self._remaining_at(g, None)  # (rule 12's prediction)
        self._load.arrive(rt, g.request.arrival, guess)

    def on_reply_end(self, g: Generation) -> None:
        """Rule 12's load factor learns its robot type's reply length."""
        self._load.reply_ended(g.request.robot_type, len(g.output_ids))

    def heavy_load(self, ctx: PolicyContext, now: float) -> bool:
        """Rule 12's heavy load at this point (called once per `select`, before the point's
        lead): the load factor (`offered_load.py`) is at least `heavy_rho`, or the load was
        heavy at the last point, its late backlog (rule 11's wait, as of the last point) is not
        gone yet and ρ is still at least 1 — the backlog still grows."""
        if not self.plan_order or self.heavy_rho == math.inf or not self._load.saturated:
            return False  # (not saturated: the load factor reads 0.0, below 1 and heavy_rho > 0)
        rho = self.load_factor(ctx, now)
        if self._heavy and self._queue_s > 0.0 and rho >= 1.0:
            return True  # (hysteresis: a heavy load lasts while its backlog lasts and still grows)
        return rho >= self.heavy_rho

    def deep_load(self, ctx: PolicyContext, now: float) -> bool:
        """Rule 12's deep load (under its heavy load): the load factor is at least
        `steep_first_rho` and a re-add is cheap (`readd_dear`, priced as a re-prefill even where
        rule 13 keeps KV: a kept-KV resume still attends over its whole context, 3.4 ms on the
        edge board).  Then the first statements steeper than the flattest live slope rank before
        every whole-reply rank — a new urgent plan preempts nearly finished flatter replies —
        instead of waiting behind them: on the RTX 4090's drones:1600 cap 4 the whole-reply order
        put urgent first actions minutes late (docs/results/2026-11-29-churn.md).  Where a re-add is dear (the edge board,
        `vllm_cpu_tiny`, in either column) those preemptions cost more than they buy."""
        return self.load_factor(ctx, now) >= self.steep_first_rho and not self.readd_dear(ctx, kept=False)

    def saturation(self, ctx: PolicyContext, now: float) -> bool:
        """Rule 14 at this point (called once per `select`, after rule 12's heavy load): the
        effective load factor (`OfferedLoad.rho(effective=True)`, read at most every
        `_RHO_EVERY_S`) is at least `sat_rho`, or was at the last point and is still at least
        `sat_rho_off` — on an engine whose add is dear: the step-time model's term of an added
        request (c) is at least `sat_add_price` of a one-generation step (a + b), priced once,
        where the mode would first apply after `sat_min_steps` steps and a re-add is dear
        (`readd_dear`, priced whatever KV is kept) — under a saturation the batch runs at one
        width, a and b are no longer told apart and a drifts, so the first reading is the
        engine's."""
        if self.sat_rho == math.inf or self._steps.n < 4:
            return False
        rho = self.load_factor(ctx, now, effective=True)
        on = rho >= self.sat_rho or (self._saturated and rho >= self.sat_rho_off)
        if (on and self._adds_dear is None and self._steps.n >= self.sat_min_steps
                and self.readd_dear(ctx, kept=False)):
            a, b, c = self._steps.coefficients(ctx.token_s)
            self._adds_dear = c >= self.sat_add_price * (a + b)
        return on and self._adds_dear is True

    def load_factor(self, ctx: PolicyContext, now: float, effective: bool = False) -> float:
        """ρ (`offered_load.py`; `effective`: over the capacity of every full-batch step, rule
        14), each read again at most every `_RHO_EVERY_S` (a signal averaged over `rho_tau_s`,
        whose exps need not be paid at every point); 0.0 until the batch reached its limit
        (`OfferedLoad.rho`)."""
        t, rho = self._rho_read[effective]
        if not t <= now < t + _RHO_EVERY_S:
            rho = self._load.rho(now, ctx.engines, _PLAN_FALLBACK, effective=effective)
            self._rho_read[effective] = (now, rho)
        return rho

    def plan_priorities(self, gens: Sequence[Generation], token_s: float) -> list[float]:
        """Rule 12: weighted shortest remaining reply first — |TUF slope| / (the reply's
        predicted remaining tokens × time per token), by the learned length predictor
        (core/length_predictor.py, Trail's; online: the prompt and the text so far).  A request
        it cannot predict counts as `_PLAN_FALLBACK` tokens.  Always > 0.

        The prediction moves only when the generation's text grows, which the planner marks
        (`Generation.touch`): it is asked again only where `sched_rev` moved since (kept per
        slot; a generation this policy has no slot for is asked each time), so a deep backlog
        does not pay the predictor for every waiting generation at every point."""
        slot = self._table.slot
        rem = [self._remaining_at(g, slot(g)) for g in gens]
        w = _plan_weights(np.array([g.request.tuf.alpha for g in gens], dtype=float),
                          np.array(rem, dtype=float), token_s).tolist()
        if self._steep_first and gens:  # rule 12's deep load: steep first statements before every reply rank
            flat = min(-g.request.tuf.alpha for g in gens)
            w = [v * _STEEP_FIRST if not g.segments and _steeper(-g.request.tuf.alpha, flat) else v
                 for g, v in zip(gens, w)]
        return w

    def _remaining_at(self, g: Generation, slot: int | None) -> float:
        """Rule 12's predicted remaining tokens of g (`_PLAN_FALLBACK` where the predictor cannot
        tell), kept in g's slot (fields ``prev``/``rem``) with the `sched_rev` it was asked at:
        asked again only once the planner marked a change.  No slot: asked each time."""
        a = self._table.a
        if slot is not None and a["prev"][slot] == g.sched_rev:
            return float(a["rem"][slot])
        try:
            rem = float(self._lenpred.remaining(g))
        except PredictorError:
            rem = _PLAN_FALLBACK
        if slot is not None:
            a["prev"][slot], a["rem"][slot] = g.sched_rev, rem
        return rem

    def queue_wait(self, late: int, late_ps: "Sequence[float] | np.ndarray", n_running: int) -> float:
        """Rule 11: the wait of a generation that leaves the batch now, behind the ready ones
        already past their deadlines (`late` of them, estimated times `late_ps`): their summed
        time over the running batch — 0 unless they outnumber the batch (swapping the whole batch
        would still leave late work waiting).  `math.fsum`: the same bits in any order."""
        if not self.overload or late <= n_running:
            return 0.0
        return math.fsum(late_ps) / max(1, n_running)

    def back_wait(self, crit_ps: "Sequence[float]", n_running: int, ctx: PolicyContext, now: float) -> float:
        """Rule 11's critical queue (opt-in, `back_factor` > 0): how long a generation that leaves
        the batch now stays out — the ready critical generations' estimated times `crit_ps`
        summed over the running batch, times `back_factor` (the work that turns critical while it
        waits).  0.0 where `back_factor` is 0 (the default) or `overload` off, nothing critical
        waits, KV memory is short (less than `keep_kv_min_free` free: there rule 11 prices a
        victim's re-add instead, and a memory-starved batch must turn over), or the online load
        factor (rule 12's ρ) is below `back_rho` (0: at any load).  It wins sustained floods and
        loses bursts, gated by ρ ≥ 1 or not: docs/results/2026-11-30-critical-queue.md.
        `math.fsum`: the same bits in any order."""
        if not self.overload or not crit_ps or not self.back_factor or not _kv_room(ctx, self.keep_kv_min_free):
            return 0.0
        if self.back_rho > 0.0 and not (self._load.saturated and self.load_factor(ctx, now) >= self.back_rho):
            return 0.0  # (not saturated: ρ reads 0.0; not read then, as rule 12's heavy load)
        return self.back_factor * (math.fsum(crit_ps) / max(1, n_running))

    def _head_needed(self, ctx: PolicyContext, running: Sequence[Generation], first: bool, now: float,
                     may_preempt: bool) -> int | None:
        """How much of the admission order's head `_finish` can use (None: all of it): the
        step-time cap's room for any number of preemptions it may make (one per running
        generation, and only when the batch is full and a ready generation is critical), plus
        one (whether the cap cut), and at least the running batch (the preemption walk pairs the
        head with victims).  The KV budget cuts a prefix, so it keeps within that head; with
        ``memory_full`` its verdict reads the whole order (None), as while the cap is lifted."""
        if self.memory_full:
            return None
        first_seen = now if first else self._first_seen
        if now - first_seen >= self.drain_after_s:  # `_finish` lifts the cap: rule 10
            return None
        n_run = len(running)
        pres = n_run if (self.preempt and may_preempt) else 0  # the most preemptions `_finish` may make
        if self._steps.n >= _STEP_CAP_MIN_STEPS:
            # the cap no longer depends on the batch (`step_cap` past its slow start): the room
            # grows by one per preemption, so the most preemptions give the largest room
            room = self._cap_room(ctx, n_run, pres)
            return None if room is None else max(n_run, room + 1)
        need = n_run
        for pre in range(pres + 1):  # (slow start: the cap follows the running batch)
            room = self._cap_room(ctx, n_run, pre)
            if room is None:
                return None
            need = max(need, room + 1)
        return need

    def step_cap(self, ctx: PolicyContext, running: int, slow_start: int = 8, min_steps: int = _STEP_CAP_MIN_STEPS,
                 short: bool = False) -> int | None:
        """The step-time cap: the largest batch whose step takes at most `roomy_ratio` times a
        one-generation step — `step_ratio` times with `short` (KV memory is short: `_finish`) — by
        the step-time model (a + b·n); None when that ratio is infinite or the step
        time does not measurably grow with the batch.  Until the model has seen `min_steps`
        steps: twice the running batch, at least `slow_start` (the batch grows through sizes
        that tell the per-generation cost apart)."""
        ratio = self.step_ratio if short else max(self.step_ratio, self.roomy_ratio)
        if ratio == math.inf:
            return None
        if self._steps.n < min_steps:
            return max(slow_start, 2 * running)
        a, b = self._steps.least_squares()
        if b < 1e-6 or a + b <= 0:
            return None
        return max(2, int((ratio * (a + b) - a) / b + 1e-9))  # (+1e-9: an exact 14.0 is 14)

    def _fit_memory(self, order: list[Generation], running: Sequence[Generation],
                    ctx: PolicyContext, tokens: int | None = None) -> list[Generation]:
        """Admit only what fits in free KV memory: a generation whose robot type has nobody in
        the batch brings its whole prompt (its shared prefix is probably not cached), the others
        their own tokens plus one worst-case segment.  Over-admitting makes the engine preempt
        and re-prefill (memory thrash); the cut generations wait, in order.  Integer arithmetic
        in Python, stopping at the first that does not fit (the order is the head the step-time
        cap can admit, or memory runs out first).

        `tokens` (the plain path, default_small.py): the prompt and output tokens of `order`
        summed.  Where even every one of them with its prompt and the worst segment of any type,
        each rounded up to a whole block, fits — (tokens + n × worst segment) // block + n
        blocks, n = len(order) — all of `order` fits whatever the batch holds, and `order` is
        returned as it is without the walk (the walk would admit all of it)."""
        st = ctx.stats
        if not st.kv_total_blocks or not order:
            return order
        bs = max(1, st.block_size)
        robots = ctx.robots
        if self._mem_seg[0] is not robots or len(self._mem_seg[1]) != len(robots):
            seg = {name: r.max_segment_tokens + 1 for name, r in robots.items()}
            self._mem_seg = (robots, seg, max([17, *seg.values()]))
        if tokens is not None:  # (Σ ceil(x_i / bs) <= Σ x_i // bs + n)
            n = len(order)
            if (tokens + n * self._mem_seg[2]) // bs + n <= st.kv_free_blocks:
                return order
        seg = self._mem_seg[1]
        busy = {g.request.robot_type for g in running}  # (a dotted attrgetter is slower)
        free = st.kv_free_blocks
        used = n = 0
        for g in order:
            t = g.request.robot_type
            own = len(g.output_ids) + seg.get(t, 17)
            if t not in busy:  # the first of its type brings the prompt
                own += len(g.prompt_ids)
                busy.add(t)
            used += -(-own // bs)
            if used > free:
                break
            n += 1
        if n == 0 and not running:
            n = 1  # an empty engine always takes the head (the engine refuses it if it can never fit)
        return order[:n]

    def _seg_rows(self, ctx: PolicyContext) -> np.ndarray:
        """Rule 6's worst segment + 1 of each robot type, by its row in `_rtypes` (17 for a type
        the robots do not know)."""
        robots = ctx.robots
        if self._mem_seg[0] is not robots or len(self._mem_seg[1]) != len(robots):
            seg = {name: r.max_segment_tokens + 1 for name, r in robots.items()}
            self._mem_seg = (robots, seg, max([17, *seg.values()]))
        rtypes = self._rtypes
        if self._mem_rows[0] is not self._mem_seg[1] or self._mem_rows[1] != len(rtypes):
            seg = self._mem_seg[1]
            by_row = np.full(len(rtypes), 17, dtype=np.int64)
            for name, row in rtypes.items():
                by_row[row] = seg.get(name, 17)
            self._mem_rows = (seg, len(rtypes), by_row)
        return self._mem_rows[2]

    def _slot_tokens(self, ctx: PolicyContext, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rule 6 per slot of `slots`: its robot type's row and its tokens — output plus its type's
        worst segment + 1 (without the prompt the first of a type nobody runs brings)."""
        a = self._table.a
        rows = a["rt2f"][slots] >> 1
        return rows, a["out"][slots] + self._seg_rows(ctx)[rows]

    def _lazy_head(self, ctx: PolicyContext, gens: list[Generation], sl: np.ndarray, n_run: int,
                   groups: list[np.ndarray], pri: np.ndarray, arr: np.ndarray,
                   head: int | None) -> LazyHead | None:
        """The admission order's head (`head` of `groups`, the ready ones' indices in `gens`, slots
        `sl`) ordered only as far as `_finish` reads it (default_head.py), where that is well short
        of `head`: rule 6's KV budget applies, the step-time cap is past its slow start and its
        short room (`step_ratio`, with the most preemptions `_finish` can make) is under half the
        head, every ready generation's robot type has a running generation (none brings its
        prompt), the priorities are finite, and rule 6 cuts before the roomy cap's room (else the
        whole head is the order).  None: order all of it."""
        st = ctx.stats
        if head is None or not self.kv_budget or self.memory_full or not st.kv_total_blocks or not n_run:
            return None
        if self._steps.n < _STEP_CAP_MIN_STEPS:
            return None
        n = min(head, sum(len(g) for g in groups))
        room = self._cap_room(ctx, n_run, n_run, short=True)  # (the most preemptions `_finish` makes: the largest room)
        if room is None:
            return None
        h = max(n_run, room + 1)
        if 2 * h > n:
            return None
        rows, own = self._slot_tokens(ctx, sl)
        ready_rows = rows[n_run:]
        for row in set(range(len(self._rtypes))) - set(rows[:n_run].tolist()):
            if (ready_rows == row).any():
                return None  # (a type nobody runs: its first brings its prompt, which depends on the order)
        if not np.isfinite(pri[n_run:]).all():
            return None
        blocks = np.ceil(own / max(1, st.block_size))  # (whole blocks: exact in floats, as `_finish`)
        lazy = LazyHead(gens, groups, pri, arr, n, h, blocks, st.kv_free_blocks, True)
        wide = self._cap_room(ctx, n_run, n_run)  # the roomy cap's largest room
        if wide is None or lazy.set_fits(min(n, wide)):
            return None  # (rule 6 does not cut before the roomy cap: `_finish` reads the whole head)
        return lazy

    def _fit_slots(self, order: list[Generation], slots: np.ndarray, run_slots: np.ndarray,
                   running: Sequence[Generation], ctx: PolicyContext) -> list[Generation]:
        """`_fit_memory(order, running, ctx)` from the SlotTable (the numpy path; `slots`: order's
        slots, `run_slots`: the running ones'): each generation's blocks — its output tokens plus
        its robot type's worst segment, and the first of a type nobody in the batch runs its
        prompt too, rounded up to whole blocks — summed along the order; the longest prefix whose
        sum fits in the free blocks.  The same integers as the walk (it stops at the first that
        does not fit: the sums before it are these)."""
        st = ctx.stats
        if not st.kv_total_blocks or not order:
            return order
        bs = max(1, st.block_size)
        a = self._table.a
        rows, own = self._slot_tokens(ctx, slots)
        busy = set((a["rt2f"][run_slots] >> 1).tolist())
        for row in set(range(len(self._rtypes))) - busy:  # the first of its type brings the prompt
            at = rows == row
            i = int(at.argmax())
            if at[i]:
                own[i] += a["plen"][slots[i]]
        used = np.cumsum(np.ceil(own / bs))  # (whole blocks: exact in floats — a fraction is >= 1 / bs)
        n = int(np.searchsorted(used, st.kv_free_blocks, side="right"))
        if n == 0 and not running:
            n = 1  # an empty engine always takes the head (the engine refuses it if it can never fit)
        return order[:n]

    def suspend_at(self, g: Generation, seg: Segment, ctx: PolicyContext, now: float) -> bool:
        """Stream on (keep the slot) unless the batch is full and g's next segment is not due
        within the lead: then free the slot for waiting work, as TimelyLLM does."""
        self.observe(g, seg)
        return self._yields_slot(g, ctx, now)

    def _yields_slot(self, g: Generation, ctx: PolicyContext, now: float) -> bool:
        """Rule 5 at a statement end: g frees its slot when the batch is full and its next
        statement is not due within the lead — unless nobody waiting outranks it (rule 12) or the
        yield is not worth its re-add (`_yield_priced`)."""
        if not self._full or self._saturated:  # (rule 14: no yield)
            return False
        if self._plan and self.plan_priorities([g], ctx.token_s)[0] >= self._head_pri:
            return False  # rule 12: nobody waiting outranks g, so yielding would only cost a re-add
        if self._yield_priced(ctx):
            return False  # rule 5's price: the re-add costs more than the swap is worth
        return self.slack(g, ctx, now, running=False) > self.lead(ctx) + self._back_s  # (rule 11's critical queue)

    def _yield_priced(self, ctx: PolicyContext) -> bool:
        """Rule 5's price at a full batch (as of the last point): True where a yield is not worth
        its re-add — the re-add is dear (`readd_dear`), and neither did rule 10 protect a first
        statement while critical work waited, nor did a critical first statement wait behind a
        late backlog (rule 11's wait) shorter than `yield_backlog_s`."""
        if self._first_crit or (self._first_waits and self._queue_s < self.yield_backlog_s):
            return False
        return self.readd_dear(ctx)

    def readd_stall_per_token(self, ctx: PolicyContext, n_running: int, min_steps: int = 4) -> float:
        """Rule 11's price of preempting a deferrable victim (``victim_readd``), per token of its
        context (prompt and output): 0.0 where its re-add is cheap — at least `keep_kv_min_free`
        of KV memory is free, so its KV is kept (rule 13) or its blocks stay in the prefix cache
        until it is back (a re-add re-prefills half a block) — else, memory short, its freed blocks
        are soon evicted and its re-add re-prefills its whole context in one step, which holds up
        the `n_running` generations of the batch: the step-time model's seconds per prefilled
        token times `n_running`.  0.0 until the model has seen `min_steps` steps."""
        if not self.victim_readd or self._steps.n < min_steps or _kv_room(ctx, self.keep_kv_min_free):
            return 0.0
        return n_running * self._steps.prefill_s_per_token(ctx.token_s)

    def readd_dear(self, ctx: PolicyContext, min_steps: int = 4, kept: bool = True) -> bool:
        """Whether a re-add costs more than `yield_price` of a one-generation step on this engine:
        the re-prefill of a stock engine's re-add — on average half a KV block of tokens through
        the prefix cache, at the step-time model's seconds per prefilled token — against the
        model's a + b.  False until the model has seen `min_steps` steps, and where the
        suspension keeps its KV (rule 13, `keeps_kv`: the re-add recomputes one token; `kept`
        False: the engine's re-prefill priced whatever it keeps).  Measured (simulator):
        0.02-0.03 on the RTX 4090 profile, 0.13-0.34 on the edge board and `vllm_cpu_tiny`
        (docs/results/2026-11-28-yield-price.md)."""
        m = self._steps
        if m.n < min_steps or (kept and self.keeps_kv(ctx)):
            return False
        a, b, _ = m.coefficients(ctx.token_s)
        return m.prefill_s_per_token(ctx.token_s) * max(1, ctx.stats.block_size or 16) / 2 > self.yield_price * (a + b)

    def streams_past(self, g: Generation, seg: Segment, ctx: PolicyContext, now: float) -> bool:
        """Rule 8 without a re-add (``stream_past``): at a blocking statement whose predicted result
        is the one the model assumes untold, g streams on — where rule 5 would keep its slot at a
        statement end, rule 11 sees no late backlog and memory was not short at the last point
        (rule 6's KV budget cut nothing the step-time cap would have admitted).  Otherwise g suspends and its speculation comes back by the policy's
        order: the statement it generates cannot be dispatched before the robot answers, so under
        a backlog or short memory it would hold a slot or KV that waiting work needs.  Under rule
        14 g always streams on (`streams_unpredicted`: whatever result is predicted)."""
        return self.speculate and self.stream_past and (
            self._saturated or (self._queue_s <= 0.0 and not self._mem_cut and not self._yields_slot(g, ctx, now)))

    def streams_unpredicted(self, ctx: PolicyContext) -> bool:
        """Rule 14: under a saturation `streams_past` is asked at every blocking statement, also
        where the predicted result is not the one the model assumes untold (a suspension there
        would cost a re-add, dear on this engine; a different result still rolls back)."""
        return self._saturated

    def speculates(self, g: Generation, seg: Segment, ctx: PolicyContext) -> bool:
        """Rule 8: after a blocking statement, generate the next one under the predicted result
        (held until the robot answers: core/speculation.py) — the robot then waits only for the
        network after a call whose result was predicted, as long as without it otherwise."""
        return self.speculate

    def batching(self) -> str:
        return "continuous"  # vLLM-style; the admission gate above does the latency control

    def params(self) -> dict:
        return {"lead_steps": self.lead_steps, "min_lead_s": self.min_lead_s, "preempt": self.preempt,
                "preempt_ratio": self.preempt_ratio, "len_weight": self.len_weight, "pace": self.pace,
                "pace_min_free": self.pace_min_free, "pace_max_error": self.pace_max_error, "pace_kv": self.pace_kv,
                "step_ratio": self.step_ratio, "memory_full": self.memory_full, "atc_k": self.atc_k,
                "drain_after_s": self.drain_after_s, "speculate": self.speculate,
                "overload": self.overload, "roomy_ratio": self.roomy_ratio, "plan_order": self.plan_order,
                "plan_depth_s": self.plan_depth_s, "steep_cap": self.steep_cap, "stream_past": self.stream_past,
                "yield_price": self.yield_price, "yield_backlog_s": self.yield_backlog_s, "keep_kv": self.keep_kv,
                "keep_kv_min_free": self.keep_kv_min_free,
                "victim_readd": self.victim_readd, "heavy_rho": self.heavy_rho, "rho_tau_s": self._load.tau_s,
                "steep_first_rho": self.steep_first_rho, "sat_rho": self.sat_rho, "sat_rho_off": self.sat_rho_off,
                "sat_add_price": self.sat_add_price, "sat_min_steps": self.sat_min_steps,
                "back_factor": self.back_factor, "back_rho": self.back_rho}

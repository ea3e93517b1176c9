"""The planner: TimelyLLM's scheduling loop over an engine, a segmenter and robot executors.

One `step()` is one scheduling point followed by one engine iteration:
  1. drain the inbox (executor results, cancellations) — the only way other threads reach us;
  2. refresh priorities of every ready generation (queued + suspended), ask the policy for an
     order (and preemptions), admit in that order while the batch-size controller allows;
  3. run one engine step; feed each new token's text to that generation's segmenter;
  4. on a complete statement: guard it, then (SUSPEND mode) abort the generation in the engine,
     drop tokens past the statement end, dispatch the segment and queue the generation again.

Pure: no I/O, time from the injected clock.  The planner is the only writer of `Generation`s.

`Planner` is one class; its parts live beside it by concept, as mixins over its state:
planner_live.py (per-generation bookkeeping, `SubmitResult`), planner_resume.py (`resume` after a
restart), planner_speculation.py (value speculation and rollback), planner_engine.py (pinned KV,
engine supervisor, pool members lost), planner_results.py (results, cancellations, endings).  This
file keeps the loop: submission and admission control, the scheduling point, the engine step, the
statement cuts and dispatch, status.  It is ~650 lines because the loop (`step`, `_schedule`,
`_admit*`, `_on_output`, `_on_cut`) is one hot path whose pieces share locals and ordering.
"""

from __future__ import annotations

import collections
import operator
import queue
import threading
from dataclasses import dataclass
from itertools import compress, repeat
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

from .engine import Engine, EngineError, EngineOutput, EngineStats
from .batching import BatchSizer, FixedBatch, LatencyGuidedBatch
from .clock import Clock
from .exec_time import ExecTimeEstimator
from .metrics import plan_terms
from .guard import check_segment
from .policies import DispatchMode, Policy, PolicyContext
from .planner_engine import EngineSupervision, as_fleet, check_engine_scheduling
from .planner_live import SubmitResult, _Live, _tokens_through
from .planner_results import ResultsAndEndings
from .planner_resume import JournalResume
from .planner_speculation import Speculation
from .ports import Dispatcher, PlannerListener
from .robots import RobotSpec
from .segmenter import Segmenter
from .speculation import ValuePredictor, written_value
from .types import (GenState, Generation, PlanRequest, Segment, SegmentGoal, SegmentResult,
                    Value)

_STATE = operator.attrgetter("state")
# ids of the states the policy may (re)admit (ints: Enum.__hash__ is a Python call in 3.11)
_READY_IDS = frozenset({id(GenState.QUEUED), id(GenState.SUSPENDED)})


class PromptSource(Protocol):
    def prompt_ids(self, request: PlanRequest) -> list[int]: ...

    def result_ids(self, request: PlanRequest, segment: Segment, value: Value) -> list[int]: ...


@dataclass
class PlannerConfig:
    max_tokens: int = 256  # per generation
    seg_gen_s: float = 0.09  # initial G (paper: ~90 ms per segment in the robot runs)
    seg_gen_weight: float = 0.1  # EWMA weight of measured segment generation times
    token_s: float = 0.022  # initial time per decoded token (paper Table 1)
    sentence_mode: str = "sentence"  # chat segments: sentence | paragraph
    # admission control / back-pressure: over-limit requests are rejected at once with a reason
    max_live: int = 10_000  # non-terminal generations
    max_queued: int = 2_000  # generations waiting for their first segment
    max_per_agent: int = 16  # non-terminal generations of one robot_id
    agent_rate_per_s: float = 0.0  # sustained requests/s per robot_id (0: unlimited)
    agent_burst: int = 10  # token-bucket depth of that rate limit
    max_prompt_tokens: int = 16_384
    max_engine_restarts: int = 10  # supervisor restarts before the planner gives up on the engine
    keep_terminal: int = 100_000  # terminal generations kept for status/metrics (oldest dropped)
    # STREAM / WHOLE modes: the result a model that writes no `#<value>` annotation after a blocking
    # statement returning bool has assumed for the rest of its plan (the bundled model writes the
    # all-True plan: docs/model.md); None: such continuations are not checked (core/speculation.py)
    unwritten_result: bool | None = True


@dataclass
class PlannerStatus:
    counts: dict[str, int]
    batch_size: int
    kv_usage: float
    tokens_per_s: float
    accrued_utility: float  # Eq. 3 so far, summed over the generations kept (core/metrics.plan_terms)
    deadline_misses: int
    engine_healthy: bool
    submitted: int
    rejected: int


class Planner(JournalResume, Speculation, EngineSupervision, ResultsAndEndings):
    def __init__(self, *, clock: Clock, engine: Engine, dispatcher: Dispatcher,
                 robots: Mapping[str, RobotSpec], policy: Policy, estimator: ExecTimeEstimator,
                 prompts: PromptSource, batcher: BatchSizer | None = None,
                 config: PlannerConfig | None = None, listeners: Iterable[PlannerListener] = (),
                 engine_restart: Callable[[Engine], Engine] | None = None) -> None:
        self.clock = clock
        self.engine = engine
        self._fleet = as_fleet(engine)
        self.dispatcher = dispatcher
        self.robots = dict(robots)
        self.policy = policy
        self._engine_priority = policy.engine_scheduling == "priority"
        check_engine_scheduling(engine, policy)
        self.estimator = estimator
        self.prompts = prompts
        self.config = config or PlannerConfig()
        self.batcher = batcher or self.latency_guided()
        self.listeners = list(listeners)
        self.generations: dict[str, Generation] = {}
        self._live: dict[str, _Live] = {}
        self.values = ValuePredictor()  # blocking results seen, for value speculation
        self._live_order = 0
        # While step() handles the engine's outputs: the generations running in that step (a
        # superset of those still running: none is admitted meanwhile), put in _live order at
        # the first suspension that needs them (_on_cut's `others`, without a scan of _live).
        self._stepped: list[Generation] | None = None
        self._stepped_sorted = False
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.RLock()
        self.seg_gen_s = self.config.seg_gen_s
        self.token_s = self.config.token_s
        self.iteration = 0
        self.submitted = 0
        self.rejected = 0
        self.engine_healthy = True
        self.engine_restart = engine_restart  # supervisor: rebuilds a failed engine
        self.engine_restarts = 0
        self._stats: EngineStats | None = None
        self.admission_checks: list[Callable[[PlanRequest, "Planner"], str]] = []
        self._per_agent: dict[str, int] = {}
        self._buckets: dict[str, tuple[float, float]] = {}
        self._terminal: collections.deque[str] = collections.deque()
        self._ended_utility: dict[str, float] = {}  # Eq. 3 score of ended generations (status(): once each)
        self._pinned: dict[str, None] = {}  # suspended generations whose KV we asked to preserve
        self.kv_released = 0  # pinned KV released to break a memory deadlock (`_release_pinned`)
        self.request_faults = 0  # requests failed by a fault while handling their output / result

    # ------------------------------------------------------------------ construction helpers
    def max_segment_tokens(self, g: Generation) -> int:
        return self.robots[g.request.robot_type].max_segment_tokens

    def budget(self, g: Generation, now: float) -> float:
        """Time left before g's current segment is due (first: ERT after arrival; later: the
        estimated end of the previous action)."""
        return g.next_due(now) - now

    def latency_guided(self, max_batch: int = 256) -> LatencyGuidedBatch:
        return LatencyGuidedBatch(budget=self.budget, max_segment_tokens=self.max_segment_tokens,
                                  max_batch=max_batch)

    def fixed(self, max_batch: int) -> FixedBatch:
        return FixedBatch(max_batch=max_batch, max_segment_tokens=self.max_segment_tokens)

    def use_batching(self, max_batch: int | None = None, max_num_seqs: int = 256) -> str:
        """Install the batch-size controller for this policy and return its label: a fixed cap
        of `max_batch` when given, else what the policy asks for (`Policy.batching`):
        latency-guided (§4.4) or vLLM-style continuous batching, both bounded by `max_num_seqs`."""
        if max_batch is not None:
            self.batcher = self.fixed(max_batch)
            return f"fixed({max_batch})"
        if self.policy.batching() == "latency-guided":
            self.batcher = self.latency_guided(max_num_seqs)
            return "latency-guided"
        self.batcher = self.fixed(max_num_seqs)
        return f"fixed({max_num_seqs})"

    # ------------------------------------------------------------------ public entry points
    def submit(self, request: PlanRequest) -> SubmitResult:
        with self._lock:
            reason = self._admission_reason(request)
            if reason:
                self.rejected += 1
                return SubmitResult(False, request.request_id, reason)
            try:
                prompt = list(self.prompts.prompt_ids(request))
            except Exception as e:  # a prompt that cannot be built must not take the planner down
                self.rejected += 1
                return SubmitResult(False, request.request_id, f"cannot build prompt: {e}")
            if len(prompt) > self.config.max_prompt_tokens:
                self.rejected += 1
                return SubmitResult(False, request.request_id,
                                    f"prompt has {len(prompt)} tokens, limit {self.config.max_prompt_tokens}")
            new_segmenter = self._segmenters(request)
            g = Generation(request=request, prompt_ids=prompt, ready_since=request.arrival)
            self._register(g, _Live(new_segmenter=new_segmenter, segmenter=new_segmenter()))
            self.policy.on_arrival(g)
            self._notify(g)
            return SubmitResult(True, request.request_id)

    def _segmenters(self, request: PlanRequest) -> Callable[[], Segmenter]:
        robot = self.robots[request.robot_type]
        mode = self.config.sentence_mode

        def new_segmenter() -> Segmenter:
            return Segmenter(robot, mode=mode) if robot.language == "sentence" else Segmenter(robot)
        return new_segmenter

    def _register(self, g: Generation, live: _Live) -> None:
        request = g.request
        self.generations[request.request_id] = g
        self._live_order += 1
        live.order = self._live_order
        self._live[request.request_id] = live
        self._per_agent[request.robot_id] = self._per_agent.get(request.robot_id, 0) + 1
        self.submitted += 1

    def _admission_reason(self, r: PlanRequest) -> str:
        if r.robot_type not in self.robots:
            return f"unknown robot_type {r.robot_type!r}"
        if r.request_id in self.generations:
            return f"duplicate request_id {r.request_id!r}"
        cfg = self.config
        if len(self._live) >= cfg.max_live:
            return f"planner full ({cfg.max_live} live requests)"
        if len(self._live) >= cfg.max_queued and self._queued_count() >= cfg.max_queued:  # queued <= live
            return f"queue full ({cfg.max_queued} requests waiting for a first segment)"
        if self._per_agent.get(r.robot_id, 0) >= cfg.max_per_agent:
            return f"agent {r.robot_id!r} has {cfg.max_per_agent} unfinished requests (limit)"
        if cfg.agent_rate_per_s > 0:
            now = self.clock.now()
            tokens, last = self._buckets.get(r.robot_id, (float(cfg.agent_burst), now))
            tokens = min(float(cfg.agent_burst), tokens + (now - last) * cfg.agent_rate_per_s)
            if tokens < 1.0:
                return f"agent {r.robot_id!r} exceeds {cfg.agent_rate_per_s:g} requests/s"
            self._buckets[r.robot_id] = (tokens - 1.0, now)
        if not self.engine_healthy:
            return "engine unavailable"
        for check in self.admission_checks:
            reason = check(r, self)
            if reason:
                return reason
        return ""

    def post_result(self, result: SegmentResult) -> None:
        """Thread-safe: executors (any thread) report segment results here."""
        self._inbox.put(("result", result))

    def cancel(self, request_id: str, reason: str = "cancelled by client") -> None:
        """Thread-safe: cancel a request; it ends CANCELLED with the reason."""
        self._inbox.put(("cancel", (request_id, reason)))

    def busy(self) -> bool:
        return bool(self._live) or not self._inbox.empty()

    def live(self) -> list[Generation]:
        return [self.generations[i] for i in self._live]

    # ------------------------------------------------------------------ the loop
    def step(self) -> bool:
        """One scheduling point + one engine step.  Returns True if the engine ran."""
        with self._lock:
            self._drain_inbox()
            # A stats snapshot lives for one scheduling point: one taken at a point where nothing
            # was admitted (so the engine did not step) misses the KV that aborts freed since
            # (preemptions, ended requests) and would block admission forever.
            self._stats = None
            self.iteration += 1
            now = self.clock.now()
            # in _live order (C-level maps: with thousands queued this runs at every point)
            gl = list(map(self.generations.__getitem__, self._live))
            states = list(map(_STATE, gl))
            running: list[Generation] = list(compress(gl, map(operator.is_, states, repeat(GenState.RUNNING))))
            ready: list[Generation] = list(compress(gl, map(_READY_IDS.__contains__, map(id, states))))
            if ready or running:
                try:
                    running = self._schedule(ready, running, now)
                except EngineError as e:  # the engine died while generations were being added
                    self._engine_failed(str(e))
                    return False
            if not running:
                return False
            t_step = self.clock.now()
            try:
                outs = self.engine.step()
            except EngineError as e:
                # Memory pinned by suspended generations (preserve) can leave the engine unable to
                # run even the generations it holds: release it and try once more before giving up.
                if not self._release_pinned():
                    self._engine_failed(str(e))
                    return False
                try:
                    outs = self.engine.step()
                except EngineError as e2:
                    self._engine_failed(str(e2))
                    return False
            now = self.clock.now()
            self._stepped, self._stepped_sorted = running, False
            try:
                for out in outs:  # each output on its own: a fault fails its request, no other
                    try:
                        self._on_output(out, now)
                    except EngineError:
                        raise  # the engine failed (an abort raised): the engine's supervisor path
                    except Exception as e:  # noqa: BLE001 - isolated to this request, reported on it
                        self._request_fault(out.gen_id, "its LLM output", e)
            finally:
                self._stepped = None
            if self.policy.observes_steps:
                on_step = self.policy.on_step
                if self._fleet is not None:  # one engine's step each: a pool's members run side by side
                    for dt, n in self._fleet.member_steps():
                        on_step(dt, n)
                else:
                    on_step(now - t_step, len(outs))
            if self._fleet is not None:
                self._requeue_lost(now)
            self._stats = None
            return True

    def _engine_stats(self) -> EngineStats:
        if self._stats is None:
            self._stats = self.engine.stats()
        return self._stats

    def context(self, running: Sequence[Generation] = ()) -> PolicyContext:
        return PolicyContext(estimator=self.estimator, robots=self.robots, stats=self._engine_stats(),
                             seg_gen_s=self.seg_gen_s, token_s=self.token_s, running=running,
                             iteration=self.iteration, kv_modes=self._kv_modes(),
                             engines=len(self._fleet.members()) if self._fleet is not None else 1)

    def _schedule(self, ready: list[Generation], running: list[Generation], now: float) -> list[Generation]:
        """Refresh priorities, preempt and admit; returns the generations now running."""
        ctx = self.context(running)
        sel = self.policy.select(ready, running, ctx, now)
        for g in sel.preempt:
            if g.state is GenState.RUNNING:
                self._suspend_kv(g, self.policy.kv_mode(g, None, ctx))
                g.state = GenState.SUSPENDED if g.segments else GenState.QUEUED
                g.ready_since = now
                g.num_preemptions += 1
                self._notify(g)
        if sel.preempt:
            # the aborts freed KV: admission must see it (a snapshot from before them once left
            # an emptied engine refusing the best waiting generation for memory, forever)
            self._stats = None
        running = [g for g in running if g.state is GenState.RUNNING]
        if self._fleet is not None:
            return self._admit_fleet(sel.order, running, now)
        why = self._admit_in_order(sel.order, running, now)
        if not running and why == "kv memory" and self._release_pinned():
            # The engine would stay empty: the best waiting generation does not fit because
            # suspended generations pin KV (preserve) — which, behind it in strict priority, can
            # never run and free it.  Their KV was released to the prefix cache: try again.
            self._admit_in_order(sel.order, running, now)
        return running

    def _admit_in_order(self, order: list[Generation], running: list[Generation], now: float) -> str:
        """Admit `order` while the batch-size controller allows (appending to `running`); returns
        why the first refused generation was refused ("" if none was)."""
        for g in order:
            if g.state not in (GenState.QUEUED, GenState.SUSPENDED):
                continue
            ok, why = self.batcher.can_admit(running, g, self._engine_stats(), now)
            if not ok:
                g.blocked = why
                return why  # strict priority: nobody overtakes the best waiting generation
            if self._admit(g, now):
                running.append(g)
            self._stats = None
        return ""

    def _admit_fleet(self, order: list[Generation], running: list[Generation], now: float) -> list[Generation]:
        """Admission over an engine pool: each generation goes to the first member in the pool's
        preference (KV affinity, then load) whose batch-size controller admits it.  A member that
        refuses is closed for this scheduling point (strict priority per member: nobody overtakes
        the best generation it refused); admission ends when every member is closed."""
        fleet = self._fleet
        assert fleet is not None
        on: dict[str, list[Generation]] = {m: [] for m in fleet.members()}
        for g in running:
            m = fleet.member_of(g.gen_id)
            if m is not None:
                on.setdefault(m, []).append(g)
        closed: set[str] = set()
        for g in order:
            if len(closed) >= len(on):
                break
            if g.state not in (GenState.QUEUED, GenState.SUSPENDED):
                continue
            for m in fleet.preference(g.gen_id, g.prompt_ids):
                if m in closed or m not in on:
                    continue
                ok, why = self.batcher.can_admit(on[m], g, fleet.member_stats(m), now)
                if not ok:
                    g.blocked = why
                    closed.add(m)
                    continue
                try:
                    admitted = self._admit(g, now, member=m)
                except EngineError:
                    if not self.engine.stats().healthy:
                        raise
                    on.pop(m, None)  # the member failed: its generations come back re-queued
                    self._requeue_lost(now)
                    continue
                if admitted:
                    on[m].append(g)
                    running.append(g)
                self._stats = None
                break
        return [g for g in running if g.state is GenState.RUNNING]

    def _admit(self, g: Generation, now: float, member: str | None = None) -> bool:
        """Add g to the engine (to `member` of an engine pool).  If the engine refuses this
        generation (e.g. prompt + generated ids no longer fit its context) g fails with the
        reason and False is returned; an EngineError from an engine (or pool member) that is no
        longer healthy propagates."""
        remaining = self.config.max_tokens - len(g.output_ids)
        for retry in (False, True):
            try:
                if member is not None:
                    assert self._fleet is not None
                    self._fleet.assign(g.gen_id, member)
                if self._engine_priority:  # vLLM priority scheduling: the engine orders by it
                    self.engine.add(g.gen_id, g.prompt_ids + g.output_ids, max(1, remaining),
                                    priority=self.policy.engine_priority(g))
                else:
                    self.engine.add(g.gen_id, g.prompt_ids + g.output_ids, max(1, remaining))
                break
            except EngineError as e:
                member_lost = member is not None and self._fleet is not None and member not in self._fleet.members()
                if member_lost or not self.engine.stats().healthy:
                    raise
                # refused for memory that suspended generations pin: release it, try once more
                if retry or member is not None or not self._release_pinned():
                    self._fail(g, f"engine refused the generation: {e}")
                    return False
        self._pinned.pop(g.gen_id, None)  # its preserved KV (if any) is in use again
        if g.seg_start is None:
            g.seg_start = now
        if g.output_ids or g.segments:
            g.resumes += 1
        g.state = GenState.RUNNING
        g.awaiting_cache_report = True
        self._notify(g)
        return True

    # ------------------------------------------------------------------ engine outputs
    def _on_output(self, out: EngineOutput, now: float) -> None:
        g = self.generations.get(out.gen_id)
        if g is None or g.state is not GenState.RUNNING:
            return  # output of an aborted generation: never reported
        live = self._live[g.gen_id]
        if out.num_cached_tokens is not None and g.awaiting_cache_report:
            g.awaiting_cache_report = False
            g.cached_tokens.append(out.num_cached_tokens)
        g.output_ids.extend(out.token_ids)
        g.seg_tokens += len(out.token_ids)
        g.touch_tokens()
        g.text += out.text
        live.tok_ends.extend([len(g.text)] * len(out.token_ids))
        if self.policy.observes_tokens:
            self.policy.on_token(g, len(out.token_ids), self.context())
        else:  # the base hook does nothing: skip building a context, keep its stats snapshot
            self._engine_stats()
        cuts = live.segmenter.feed(out.text) if out.text else []
        if out.finished and out.finish_reason != "length":
            # the end of the generation completes a trailing statement without ';' -- but not when
            # max_tokens cut it: that text may be the beginning of something else (`tp` of `tpx`)
            cuts = list(cuts) + list(live.segmenter.finish())
        for cut in cuts:
            if not self._on_cut(g, live, cut, now, final=out.finished):
                return
            if g.state is not GenState.RUNNING:
                return  # suspended at this statement; tokens past it were dropped
        if out.finished:
            self._engine_done(g, live, now, out.finish_reason)
        elif len(g.output_ids) >= self.config.max_tokens and g.state is GenState.RUNNING:
            self._engine_done(g, live, now, "length")

    def _on_cut(self, g: Generation, live: _Live, cut: Any, now: float, final: bool = False) -> bool:
        """Handle one complete statement; False if the generation failed.  `final`: the engine
        finished the generation with this output, so there is nothing to suspend and resume."""
        robot = self.robots[g.request.robot_type]
        if cut.error:
            self._fail(g, f"invalid statement from the LLM: {cut.error} in {cut.text!r}")
            return False
        if cut.note:  # `#<value>`: the model wrote a blocking statement's result itself
            if live.blind is None:
                self._fail(g, f"invalid statement from the LLM: result annotation {'#' + cut.text!r} "
                              "not right after a blocking statement whose result it has not been given")
                return False
            live.cut_end = live.text_base + cut.end
            self._assume(g, live, written_value(cut.text), now)
            return True
        if live.blind is not None:  # a statement after a blocking one, with no annotation between
            self._assume(g, live, self._unwritten(g, g.segments[live.blind.seg_index]), now)
            if g.state is not GenState.RUNNING:
                return True  # rolled back: the robot had already answered otherwise
        verdict = check_segment(robot, cut.text, cut.calls, live.guard_plan)
        if not verdict.ok:
            self._fail(g, f"dispatch guard rejected {cut.text!r}: {verdict.reason}")
            return False
        live.guard_plan = verdict.plan
        mode = self.policy.mode
        abs_end = live.text_base + cut.end
        live.cut_end = abs_end
        seg_tokens = g.seg_tokens
        gen_start = g.seg_start if g.seg_start is not None else now
        # the token whose text reaches the statement end: ids past it are not the statement's
        keep = _tokens_through(live.tok_ends, abs_end)
        seg = Segment(index=g.k, text=cut.text, calls=tuple(cut.calls), blocking=bool(cut.blocking),
                      token_count=seg_tokens, gen_start=gen_start, gen_end=now,
                      est_exec_s=self.estimator.estimate(g.request.robot_type, cut.calls),
                      out_len=keep, out_text_len=live.tok_ends[keep - 1] if keep else 0, text_end=abs_end)
        if live.spec is not None:
            return self._hold(g, live, seg, abs_end)
        g.segments.append(seg)
        suspend = mode is DispatchMode.SUSPEND and not final
        past = suspend and seg.blocking and self._streams_past(g, seg, now)  # speculation without a re-add
        if past:
            suspend = False
        if suspend and not seg.blocking and self.policy.chooses_suspension:
            suspend = self.policy.suspend_at(g, seg, self.context(), now)  # per-statement choice
        if suspend:
            # Drop tokens past the statement end: keep up to the token whose text reaches it.
            if keep < len(g.output_ids):
                del g.output_ids[keep:]
                del live.tok_ends[keep:]
                g.text = g.text[: live.tok_ends[-1] if live.tok_ends else 0]
        w = self.config.seg_gen_weight
        if seg_tokens > 0:  # a statement that arrived in the same token as the last one took no time
            self.seg_gen_s = (1 - w) * self.seg_gen_s + w * max(0.0, now - gen_start)
        if seg_tokens > 0 and now > gen_start:
            self.token_s = (1 - w) * self.token_s + w * (now - gen_start) / seg_tokens
        g.seg_tokens = 0
        g.touch()  # (a segment appended, its count reset)
        g.seg_start = None if suspend or (final and mode is DispatchMode.SUSPEND) else now
        if mode is DispatchMode.WHOLE:
            live.pending.append(seg)
            if seg.blocking:
                live.blind = self._rollback_point(g, live, seg, abs_end)
            return True
        self._dispatch(g, seg, now)
        if seg.blocking and (mode is DispatchMode.STREAM or past):
            live.blind = self._rollback_point(g, live, seg, abs_end)
        if suspend:
            # the batch g leaves behind (LAMPS weighs g's held memory against C_other)
            if self._stepped is not None:
                if not self._stepped_sorted:
                    lives = self._live
                    self._stepped = sorted((x for x in self._stepped if x.state is GenState.RUNNING),
                                           key=lambda x: lives[x.gen_id].order)
                    self._stepped_sorted = True
                others = [x for x in self._stepped if x is not g and x.state is GenState.RUNNING]
            else:
                others = [x for i in self._live
                          if (x := self.generations[i]) is not g and x.state is GenState.RUNNING]
            ctx = self.context(others)
            self._suspend_kv(g, self.policy.kv_mode(g, seg, ctx))
            # A fresh segmenter starts at the statement end; text of the last kept token that lies
            # past the statement (rare: a token spanning ";m") is fed to it.
            live.segmenter = live.new_segmenter()
            live.text_base = abs_end
            overflow = g.text[abs_end:]
            extra = live.segmenter.feed(overflow) if overflow else []
            g.state = GenState.WAITING if seg.blocking else GenState.SUSPENDED
            g.ready_since = now
            self._notify(g)
            # That token may also complete the next statement(s): already generated, so they are
            # segments too (dispatched in order, each suspending as above), never dropped.
            for nxt in extra:
                if not self._on_cut(g, live, nxt, now, final):
                    return False
            if seg.blocking and g.state is GenState.WAITING and g.segments[-1] is seg:
                self._speculate(g, live, seg, now)
        return True

    # ------------------------------------------------------------------ end of generation, dispatch
    def _engine_done(self, g: Generation, live: _Live, now: float, reason: str) -> None:
        if live.blind is not None:  # the plan ended right after a blocking statement: under a result too
            self._assume(g, live, self._unwritten(g, g.segments[live.blind.seg_index]), now)
            if g.state is not GenState.RUNNING:
                return  # rolled back
        if live.spec is not None and live.spec.held is None:
            # the plan ended under a predicted result: that is speculative too
            if g.state is GenState.RUNNING:
                self._suspend_kv(g, "cache")
            live.spec.ended, live.spec.end_reason = True, reason
            g.state = GenState.WAITING
            self._notify(g)
            return
        g.engine_finished = True
        self.policy.on_reply_end(g)
        if g.state is GenState.RUNNING:
            self.engine.abort(g.gen_id, "discard")
        if reason == "length":  # cut by max_tokens: whatever was generated, the plan is not complete
            tail = g.text[live.cut_end:].strip()
            g.truncated = (
                f"plan truncated at max_tokens ({self.config.max_tokens} tokens): "
                f"{len(g.segments)} complete statement(s) before the cut"
                + (f", the rest ({tail[:40]!r}{'...' if len(tail) > 40 else ''}) never completed" if tail else "")
                + " -- not the whole plan")
        for seg in live.pending:
            self._dispatch(g, seg, now)
        live.pending.clear()
        if not g.segments:
            self._fail(g, g.truncated or
                       f"the LLM produced no executable statement (finish: {reason or 'eos'})")
            return
        g.state = GenState.DRAINING
        self._maybe_finished(g, now)
        if not g.state.terminal:
            self._notify(g)

    def _dispatch(self, g: Generation, seg: Segment, now: float) -> None:
        seg.dispatched_at = now
        g.touch()
        goal = SegmentGoal(request_id=g.gen_id, robot_id=g.request.robot_id,
                           robot_type=g.request.robot_type, segment_index=seg.index, text=seg.text,
                           calls=seg.calls, est_exec_s=seg.est_exec_s, blocking=seg.blocking)
        for lst in self.listeners:
            lst.on_segment_dispatched(g, seg)
        self.dispatcher.dispatch(goal)

    def _queued_count(self) -> int:
        return list(map(_STATE, map(self.generations.__getitem__, self._live))).count(GenState.QUEUED)

    # ------------------------------------------------------------------ status
    def _notify(self, g: Generation) -> None:
        for lst in self.listeners:
            lst.on_request_update(g)

    def status(self) -> PlannerStatus:
        with self._lock:
            counts: dict[str, int] = {s.value: 0 for s in GenState}
            utility = 0.0
            misses = 0
            for g in self.generations.values():
                counts[g.state.value] += 1
                if g.segments and g.segments[0].exec_start is not None:
                    t = g.segments[0].exec_start - g.request.arrival
                    misses += t > g.request.tuf.ert
                if g.state.terminal:  # Eq. 3 so far (core/metrics.py); an ended one is computed once
                    u = self._ended_utility.get(g.gen_id)
                    if u is None:
                        u = self._ended_utility[g.gen_id] = plan_terms(g).accrued
                    utility += u
                elif g.segments:
                    utility += plan_terms(g).accrued
            st = self.engine.stats() if self.engine_healthy else None
            kv = 1.0 - st.kv_free_blocks / st.kv_total_blocks if st and st.kv_total_blocks else 0.0
            return PlannerStatus(counts=counts, batch_size=counts[GenState.RUNNING.value], kv_usage=kv,
                                 tokens_per_s=st.tokens_per_s if st else 0.0, accrued_utility=utility,
                                 deadline_misses=misses, engine_healthy=self.engine_healthy,
                                 submitted=self.submitted, rejected=self.rejected)

"""Executor results and the ends of requests (core/planner.py's part): the inbox other threads
post to, a segment's result, per-request faults, terminal states and their bookkeeping."""

from __future__ import annotations

import queue

from .engine import EngineError
from .types import GenState, Generation, ResultCode, SegmentResult


class ResultsAndEndings:
    """Mixin of `Planner` (uses its state; see there): results, cancellations, terminal states."""

    def _drain_inbox(self) -> None:
        while True:
            try:
                kind, item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "result":
                try:
                    self._on_result(item)
                except EngineError:
                    raise
                except Exception as e:  # noqa: BLE001 - isolated to the result's request
                    self._request_fault(item.request_id, f"segment {item.segment_index}'s result", e)
            elif kind == "cancel":
                rid, reason = item
                g = self.generations.get(rid)
                if g is not None and not g.state.terminal:
                    self._end(g, GenState.CANCELLED, reason, cancel_robot=True)

    def _on_result(self, res: SegmentResult) -> None:
        g = self.generations.get(res.request_id)
        if g is None or not (0 <= res.segment_index < len(g.segments)):
            return  # unknown or stale result: nothing to attach it to
        seg = g.segments[res.segment_index]
        if seg.ok is not None:
            return  # duplicate result
        seg.exec_start, seg.exec_end = res.exec_start, res.exec_end
        g.touch()
        seg.measured_s, seg.result, seg.ok, seg.error = res.call_durations_s, res.value, res.ok, res.error
        self._ended_utility.pop(g.gen_id, None)  # a late result of an ended request changes its score
        for call, d in zip(seg.calls, res.call_durations_s):
            self.estimator.update(g.request.robot_type, call, d)
        for lst in self.listeners:
            lst.on_segment_result(g, seg)
        if g.state.terminal:
            return
        now = self.clock.now()
        if not res.ok:
            self._end(g, GenState.FAILED,
                      f"segment {res.segment_index} {ResultCode(res.code).name.lower()}: {res.error}",
                      cancel_robot=True)
            return
        live = self._live.get(g.gen_id)
        if seg.blocking:
            self.values.observe(g.request.robot_type, seg, res.value)
        if live is not None and live.spec is not None and live.spec.seg_index == res.segment_index:
            self._resolve_speculation(g, live, res.value, now)
        elif g.state is GenState.WAITING and res.segment_index == len(g.segments) - 1:
            self._resume_after(g, self._live[g.gen_id], seg, res.value, now)
        self._maybe_finished(g, now)

    def _request_fault(self, gen_id: str, what: str, e: Exception) -> None:
        """An unexpected exception while handling one request's output or result: that request
        alone fails, with the exception as its reason; the other requests of the step go on."""
        self.request_faults += 1
        g = self.generations.get(gen_id)
        if g is None or g.state.terminal:
            return
        reason = f"planner fault while handling {what}: {type(e).__name__}: {e}"
        try:
            self._fail(g, reason)
        except EngineError:
            raise
        except Exception:  # noqa: BLE001 - a listener / dispatcher failing again: end it anyway
            if not g.state.terminal:
                self._set_terminal(g, GenState.FAILED, reason)

    def _maybe_finished(self, g: Generation, now: float) -> None:
        if g.state is GenState.DRAINING and all(s.ok for s in g.segments):
            truncated = g.truncated
            if truncated:  # what was generated ran; the plan did not end: the task is not known done
                self._end(g, GenState.FAILED, f"{truncated}; the {len(g.segments)} executed")
            else:
                self._end(g, GenState.FINISHED, "plan executed" +
                          (" (resumed after a planner restart)" if g.recovered else ""))

    def _fail(self, g: Generation, reason: str) -> None:
        self._end(g, GenState.FAILED, reason, cancel_robot=True)

    def _end(self, g: Generation, state: GenState, reason: str, *, cancel_robot: bool = False) -> None:
        if self.engine_healthy and (g.state is GenState.RUNNING or g.output_ids):
            # running: free its slot; suspended/waiting: release KV a policy may have pinned
            try:
                self.engine.abort(g.gen_id, "discard")
            except EngineError:
                pass  # the engine is failing; _engine_failed deals with it at the next step
        if cancel_robot and any(s.ok is None for s in g.segments):
            self.dispatcher.cancel(g.gen_id)
        self._set_terminal(g, state, reason)
        self._notify(g)
        self._terminal.append(g.gen_id)
        while len(self._terminal) > self.config.keep_terminal:  # bounded memory
            old = self._terminal.popleft()
            self.generations.pop(old, None)
            self._ended_utility.pop(old, None)

    def _set_terminal(self, g: Generation, state: GenState, reason: str) -> None:
        """Record g's end and release its live bookkeeping (admission counts, pinned KV)."""
        g.state, g.reason, g.finished_at = state, reason, self.clock.now()
        self._pinned.pop(g.gen_id, None)
        if self._live.pop(g.gen_id, None) is not None:
            n = self._per_agent.get(g.request.robot_id, 1) - 1
            if n > 0:
                self._per_agent[g.request.robot_id] = n
            else:
                self._per_agent.pop(g.request.robot_id, None)

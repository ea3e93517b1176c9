"""Value speculation in the planner (core/planner.py's part): at a blocking statement, generation
goes on under a predicted (or, streaming, a written or assumed) result, held until the robot's
result arrives, and rolled back to the statement's end when it differs (core/speculation.py: the
predictor and the record)."""

from __future__ import annotations

from typing import Any

from .planner_live import _Live, _tokens_through
from .policies import DispatchMode
from .speculation import ValueSpeculation, same_value
from .types import GenState, Generation, Segment, Value

_UNCHECKED = object()  # `_unwritten`: no result a continuation can be checked against


class Speculation:
    """Mixin of `Planner` (uses its state; see there): value speculation and rollback."""

    def _rollback_point(self, g: Generation, live: _Live, seg: Segment, abs_end: int) -> ValueSpeculation:
        """What to roll g back to if what follows blocking `seg` (ending at text offset `abs_end`)
        was generated under a result other than the robot's: the tokens up to the statement end."""
        ends = live.tok_ends
        keep = _tokens_through(ends, abs_end)
        return ValueSpeculation(seg_index=seg.index, value=None, out_len=keep,
                                text_len=ends[keep - 1] if keep else 0, tok_len=keep,
                                text_base=abs_end, guard_plan=live.guard_plan)

    def _unwritten(self, g: Generation, seg: Segment) -> Any:
        """The result an unsegmented model that wrote no annotation after blocking `seg` went on
        under (`PlannerConfig.unwritten_result` for a bool skill), or `_UNCHECKED`."""
        spec = self.robots[g.request.robot_type].skills.get(seg.calls[-1].name) if seg.calls else None
        value = self.config.unwritten_result
        return value if value is not None and spec is not None and spec.returns == "bool" else _UNCHECKED

    def _assume(self, g: Generation, live: _Live, value: Any, now: float) -> None:
        """STREAM / WHOLE: g goes on after the blocking statement `live.blind` under `value` (written
        by the model or assumed without a word): that is a speculation like the planner's own
        (`_speculate`), held and checked against the robot's result the same way.  `_UNCHECKED`:
        not checked (a non-bool result the model did not write: executed as generated)."""
        spec, live.blind = live.blind, None
        assert spec is not None
        if value is _UNCHECKED:
            return
        spec.value = value
        if live.pending:  # WHOLE: what leads up to the blocking statement goes now; its result decides the rest
            for s in live.pending:
                self._dispatch(g, s, now)
            live.pending.clear()
        seg = g.segments[spec.seg_index]
        live.spec = spec
        if seg.ok is not None:  # the robot has already answered
            self._resolve_speculation(g, live, seg.result, now)

    def _streams_past(self, g: Generation, seg: Segment, now: float) -> bool:
        """SUSPEND mode, at blocking `seg`: the predicted result is the one the model goes on under
        when it is not given one (`_unwritten`) and the policy keeps g running past the statement
        (`Policy.streams_past`).  Then what follows is held and checked like any speculation
        (`_assume`), without aborting g and re-adding it with the result appended.  A policy may
        ask for it whatever the prediction (`Policy.streams_unpredicted`)."""
        ctx = self.context()
        if not self.policy.streams_unpredicted(ctx):
            value = self.values.predict(g.request.robot_type, seg)
            if value is None or not same_value(value, self._unwritten(g, seg)):
                return False
        return self.policy.streams_past(g, seg, ctx, now)

    def _speculate(self, g: Generation, live: _Live, seg: Segment, now: float) -> None:
        """At blocking `seg`: append the predicted result and let g generate its next statement
        (held, not dispatched, until the real result decides: `_resolve_speculation`).  STREAM /
        WHOLE modes: the model goes on by itself, under a result it writes or assumes (`_assume`)."""
        if self.policy.mode is not DispatchMode.SUSPEND:
            live.blind = self._rollback_point(g, live, seg, live.text_base)
            return
        if not self.policy.speculates(g, seg, self.context()):
            return
        value = self.values.predict(g.request.robot_type, seg)
        if value is None:
            return
        live.spec = ValueSpeculation(seg_index=seg.index, value=value, out_len=len(g.output_ids),
                                     text_len=len(g.text), tok_len=len(live.tok_ends),
                                     text_base=live.text_base, guard_plan=live.guard_plan)
        self._resume_after(g, live, seg, value, now)

    def _resume_after(self, g: Generation, live: _Live, seg: Segment, value: Value, now: float) -> None:
        """Append blocking `seg`'s result `value` (real or predicted) to g's token record and make g
        ready to generate on from it."""
        extra = list(self.prompts.result_ids(g.request, seg, value))
        if extra:
            g.output_ids.extend(extra)
            live.tok_ends.extend([len(g.text)] * len(extra))
            g.touch()
        g.state = GenState.SUSPENDED
        g.ready_since = now
        self._notify(g)

    def _hold(self, g: Generation, live: _Live, seg: Segment, abs_end: int) -> bool:
        """A statement generated under a predicted result: keep it (and the tokens up to its
        end), park g until the result arrives."""
        assert live.spec is not None
        keep = seg.out_len
        if keep < len(g.output_ids):
            del g.output_ids[keep:]
            del live.tok_ends[keep:]
            g.text = g.text[: live.tok_ends[-1] if live.tok_ends else 0]
        live.spec.held = seg
        live.segmenter = live.new_segmenter()
        live.text_base = abs_end
        g.seg_tokens = 0
        g.touch()
        g.seg_start = None
        if g.state is GenState.RUNNING:
            self._suspend_kv(g, "cache")
        g.state = GenState.WAITING
        self._notify(g)
        return True

    def _resolve_speculation(self, g: Generation, live: _Live, value: Value, now: float) -> None:
        """The real result of the speculated blocking segment arrived (g is not terminal)."""
        spec = live.spec
        assert spec is not None
        live.spec = None
        if same_value(value, spec.value):
            g.spec_hits += 1
            held = spec.held
            if held is not None:
                g.segments.append(held)
                self._dispatch(g, held, now)  # (touches g)
                waits = held.blocking and self.policy.mode is DispatchMode.SUSPEND
                g.state = GenState.WAITING if waits else GenState.SUSPENDED
                g.ready_since = now
                self._notify(g)
                if held.blocking:
                    self._speculate(g, live, held, now)
            elif spec.ended:
                self._engine_done(g, live, now, spec.end_reason)
            return
        g.spec_misses += 1
        if g.state is GenState.RUNNING:
            self._suspend_kv(g, "cache")
        del g.output_ids[spec.out_len:]
        del live.tok_ends[spec.tok_len:]
        g.text = g.text[:spec.text_len]
        live.text_base, live.guard_plan, live.cut_end = spec.text_base, spec.guard_plan, spec.text_base
        live.segmenter = live.new_segmenter()
        g.seg_tokens, g.seg_start, g.engine_finished = 0, None, False
        g.touch()
        seg = g.segments[spec.seg_index]
        self._resume_after(g, live, seg, value, now)

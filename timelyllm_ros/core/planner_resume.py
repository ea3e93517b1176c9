"""`Planner.resume`: go on with a plan a planner that died left in its journal (core/planner.py's
part for a restart; journal.py recovers the records)."""

from __future__ import annotations

from .guard import PlanState, check_segment
from .planner_live import SubmitResult, _Live
from .types import GenState, Generation, PlanRequest, Segment, TokenRecord, prompt_digest


class JournalResume:
    """Mixin of `Planner` (uses its state; see there): resuming plans from journal records."""

    def resume(self, request: PlanRequest, record: TokenRecord) -> SubmitResult:
        """Go on with a plan left by a planner that died, every dispatched segment of which ran
        (`journal.recover`): generation continues from its token record -- the same prompt, the
        ids generated up to its last dispatched statement, and that statement's result appended
        as a live result is (`_resume_after`) when it was blocking -- with its segments (the next
        one is numbered after them), its arrival and its TUF, so its utility counts the crash.
        Refused with a reason, nothing changed, if the record does not fit this planner."""
        with self._lock:
            why = self._admission_reason(request)
            prompt: list[int] = []
            if not why:
                try:
                    prompt = list(self.prompts.prompt_ids(request))
                except Exception as e:  # noqa: BLE001 - as submit: reported, never raised
                    why = f"cannot build prompt: {e}"
            if not why and prompt_digest(prompt) != record.prompt_digest:
                why = ("its prompt is not the one this planner builds (model, tokenizer or robot "
                       "prompt changed since)")
            built = None if why else self._rebuild(request, record)
            if isinstance(built, str) or built is None:
                self.rejected += 1
                return SubmitResult(False, request.request_id, why or str(built))
            segments, live = built
            now = self.clock.now()
            g = Generation(request=request, prompt_ids=prompt, output_ids=list(record.output_ids),
                           text=record.text, segments=segments, ready_since=now, recovered=True)
            if record.truncated:
                g.truncated = record.truncated
            self._register(g, live)
            last = segments[-1]
            if record.engine_finished:  # nothing left to generate: it ends when its segments have
                g.engine_finished, g.state = True, GenState.DRAINING
                self._notify(g)
                self._maybe_finished(g, now)
            elif last.blocking:
                self._resume_after(g, live, last, last.result, now)
            else:
                g.state, g.ready_since = GenState.SUSPENDED, now
                self._notify(g)
            return SubmitResult(True, request.request_id)

    def _rebuild(self, request: PlanRequest, record: TokenRecord) -> tuple[list[Segment], _Live] | str:
        """The segments of `record` (re-read by the segmenter and the dispatch guard, as when they
        were generated) and the planner's bookkeeping to go on from its token record; or why not."""
        robot = self.robots[request.robot_type]
        new_segmenter = self._segmenters(request)
        plan: PlanState | None = None
        segments: list[Segment] = []
        for r in record.segments:
            if r.index != len(segments):
                return f"segment {len(segments)} is missing from its journal record"
            seg = new_segmenter()
            cuts = list(seg.feed(r.text)) + list(seg.finish())
            if len(cuts) != 1 or cuts[0].error:
                return f"segment {r.index} {r.text!r} does not read as one statement"
            cut = cuts[0]
            verdict = check_segment(robot, cut.text, cut.calls, plan)
            if not verdict.ok:
                return f"segment {r.index} {r.text!r} no longer passes the dispatch guard: {verdict.reason}"
            plan = verdict.plan
            segments.append(Segment(
                index=r.index, text=cut.text, calls=tuple(cut.calls), blocking=bool(cut.blocking),
                token_count=0, gen_start=r.dispatched_at, gen_end=r.dispatched_at,
                est_exec_s=self.estimator.estimate(request.robot_type, cut.calls), dispatched_at=r.dispatched_at,
                exec_start=r.exec_start, exec_end=r.exec_end, result=r.value, ok=True))
        if not segments:
            return "no dispatched segment in its journal record"
        last = record.segments[-1]
        if segments[-1].blocking and not last.value_known and not record.engine_finished:
            return (f"segment {last.index} ran, but its result, which the plan waits on, was lost with the "
                    f"planner (an executor's goal record holds no value)")
        text, base, n = record.text, record.text_base, len(record.output_ids)
        if not 0 <= base <= len(text) or not n:
            return "its token record is inconsistent"
        segments[-1].out_len, segments[-1].out_text_len, segments[-1].text_end = n, len(text), base
        # the ids before the last all end before the next statement (what _on_cut keeps)
        live = _Live(new_segmenter=new_segmenter, segmenter=new_segmenter(), text_base=base, cut_end=base,
                     tok_ends=[0] * (n - 1) + [len(text)], guard_plan=plan)
        overflow = text[base:]  # the part of the last token past the statement: the next one's start
        if overflow and live.segmenter.feed(overflow):
            return "its token record holds a statement past the last dispatched one"
        return segments, live

"""Value speculation at blocking statements: generate the next statement before the robot answers.

A blocking statement (a skill whose return value the plan needs, e.g. ``iv('cat')``) makes a
segmenting planner wait: the robot runs it, the result comes back, the planner appends it to the
token record (``#True``) and only then generates the next statement — so the robot idles for a
whole segment's generation after every blocking call (Eq. 3 charges that wait as TUF1(W)).

Speculation hides that wait without changing what the plan is conditioned on: at the blocking
statement the planner appends the *predicted* result instead and lets the generation go on to its
next statement, which is cut and **held**, not dispatched.  When the real result arrives:

* it equals the prediction: the held statement is dispatched at once (the robot waits only for
  the network) and generation goes on as usual;
* it differs: the speculated tokens are thrown away (token record, text, segmenter and dispatch
  guard state rolled back to the blocking statement), the real result is appended and the
  generation resumes from there — the robot waits as long as it would have without speculation,
  and the engine did the discarded work for nothing (counted in ``Generation.spec_misses``).

Nothing a robot runs was generated under a value it did not return.  The prediction is the
online majority of the values that skill returned on that robot type so far (``ValuePredictor``),
only for boolean and string results (a number is not worth guessing), only once it has seen
``min_seen`` results and the majority holds at least ``min_share`` of them.

**One rule for every policy.**  An unsegmented policy (STREAM / WHOLE dispatch: vllm, vllm-stream,
vllm-priority, andes, trail, ...) never gives the model the robot's result: what it generates after
a blocking statement was generated under a result of the model's own — written (`#True\n`, the
annotation format it is shown results in; the segmenter cuts it as a note, ``written_value``
reads it) or, when it writes none, assumed (the bundled model then writes the all-True plan:
``PlannerConfig.unwritten_result``, for bool skills; other unwritten results are not checked).
That is a speculation like the planner's own, and the planner treats it the same way: the
statement after the blocking one is held, the real result decides, a mismatch is rolled back to
the blocking statement, the real result appended and generation resumed (a WHOLE plan is
dispatched up to the blocking statement first, since its result decides the rest).  Hits and
misses of both kinds are counted in ``Generation.spec_hits`` / ``spec_misses``.

Pure: no I/O; the planner owns one predictor and one ``ValueSpeculation`` per live generation.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from .guard import PlanState
from .types import Segment, Value


@dataclass(slots=True)
class ValueSpeculation:
    """One speculated result: what to roll back to, and the statement generated under it."""

    seg_index: int  # the blocking segment whose result was predicted
    value: Value  # the predicted (or model-written) result
    out_len: int  # len(Generation.output_ids) at the blocking statement (before the prediction)
    text_len: int  # len(Generation.text) there
    tok_len: int  # len(_Live.tok_ends) there
    text_base: int  # the segmenter's start offset there
    guard_plan: PlanState | None  # the dispatch guard's plan state there
    # `value` is the planner's prediction (SUSPEND) or the result the model wrote / assumed (STREAM,
    # WHOLE); None while a STREAM / WHOLE continuation's result is not known yet (`_Live.blind`)
    held: Segment | None = None  # the next statement, generated under the prediction, not dispatched
    ended: bool = False  # the engine ended the generation under the prediction with no further statement
    end_reason: str = ""


def written_value(text: str) -> Value:
    """The value of a result annotation the model wrote itself (`#True` -> True, `#0.42` -> 0.42,
    `#None` -> None, anything else the string): the inverse of ``prompts.result_text``."""
    t = text.strip()
    if t in ("True", "False"):
        return t == "True"
    if t == "None":
        return None
    for conv in (int, float):
        try:
            return conv(t)
        except ValueError:
            pass
    return t


def same_value(a: Value, b: Value) -> bool:
    """Whether a real result equals a predicted one (True is not 1, "1" is not 1)."""
    return type(a) is type(b) and a == b


@dataclass(slots=True)
class ValuePredictor:
    """Online majority of the results each (robot type, skill) returned; no future knowledge."""

    min_seen: int = 3
    min_share: float = 0.6
    _counts: dict[tuple[str, str], Counter] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.min_seen, bool) or not isinstance(self.min_seen, int) or self.min_seen < 1:
            raise ValueError(f"min_seen must be an int >= 1, got {self.min_seen!r}")
        if not 0.5 <= self.min_share <= 1.0:
            raise ValueError(f"min_share must be in [0.5, 1], got {self.min_share!r}")

    @staticmethod
    def _key(robot_type: str, seg: Segment) -> tuple[str, str] | None:
        return (robot_type, seg.calls[-1].name) if seg.calls else None

    def observe(self, robot_type: str, seg: Segment, value: Value) -> None:
        """Learn from a blocking segment's real result."""
        key = self._key(robot_type, seg)
        if key is not None and isinstance(value, (bool, str)):
            self._counts.setdefault(key, Counter())[(type(value).__name__, value)] += 1

    def predict(self, robot_type: str, seg: Segment) -> Value:
        """The value to speculate on for `seg`'s result, or None (do not speculate)."""
        key = self._key(robot_type, seg)
        c = self._counts.get(key) if key is not None else None
        if not c:
            return None
        n = sum(c.values())
        (_, value), top = max(c.items(), key=lambda kv: (kv[1], kv[0][0], str(kv[0][1])))
        if n < self.min_seen or top < self.min_share * n:
            return None
        return value

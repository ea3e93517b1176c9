"""The planner's per-generation bookkeeping (`_Live`: segmenter, token text ends, held and
pending segments, speculation) and what `Planner.submit` / `Planner.resume` answer
(`SubmitResult`); shared by core/planner.py and its parts (planner_*.py)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Callable

from .guard import PlanState
from .speculation import ValueSpeculation
from .types import Segment


def _tokens_through(tok_ends: list[int], end: int) -> int:
    """How many output tokens it takes to reach text offset `end` (through the token whose text
    reaches it; all of them if none does): `tok_ends` is the text length after each token."""
    i = bisect.bisect_left(tok_ends, end)
    return i + 1 if i < len(tok_ends) else len(tok_ends)


@dataclass(frozen=True, slots=True)
class SubmitResult:
    accepted: bool
    request_id: str
    reason: str = ""


@dataclass(slots=True)
class _Live:
    """Planner-private per-generation bookkeeping that is not part of the public record."""

    new_segmenter: Callable[[], Any]
    segmenter: Any = None
    text_base: int = 0  # offset in Generation.text where the current segmenter started
    tok_ends: list[int] = field(default_factory=list)  # text length after each output token (1:1)
    pending: list[Segment] = field(default_factory=list)  # WHOLE mode: cut, not yet dispatched
    guard_plan: PlanState | None = None  # what the dispatch guard knows of the plan's accepted segments
    order: int = 0  # position in Planner._live (submission order)
    cut_end: int = 0  # offset in Generation.text just past the last complete statement
    spec: ValueSpeculation | None = None  # a blocking result being speculated on (core/speculation.py)
    # STREAM / WHOLE: the last blocking statement, whose continuation's assumed result (written by
    # the model, or not) is not known yet: where to roll back to (core/speculation.py)
    blind: ValueSpeculation | None = None

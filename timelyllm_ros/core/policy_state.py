"""Per-generation state a policy keeps on a `Generation` (`Generation.policy`): typed fields, one
record per owner, written and read by it alone — never by the planner, the journal or the
simulator, which read `Generation`'s own fields (benchmarks read LAMPS' handling counts for
their reports).

    owner                                         record          field of `PolicyState`
    core/length_predictor.py (Trail, rule 12)     `LengthState`   ``length``
    core/policies/trail.py                        `TrailState`    ``trail``
    core/policies/lamps.py (and timelyllm-lamps)  `LampsState`    ``lamps``
    core/policies/andes.py                        a float         ``andes_pri``
    core/policies/default.py, default_small.py    `DefaultState`  ``default``
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class LengthState:
    """A length predictor's view of one request (core/length_predictor.py)."""

    total: float | None = None  # oracle / noisy oracle: the (noisy) total reply length, drawn once
    q: Any = None  # learned: the bin distribution (numpy array) after `seen` tokens; None: not started
    r0: float = 0.0  # learned: the first prediction, the predicted bin's midpoint (Trail's r0)
    seen: int = 0  # learned: generated tokens the Bayesian update has consumed
    last_obs: int = 0  # learned: the age at the classifier's last observation


@dataclass(slots=True)
class TrailState:
    """Trail's marks (core/policies/trail.py)."""

    r0: float | None = None  # the prediction its pinning threshold c·r0 uses, kept from the first token
    pinned_at: int | None = None  # the age (tokens) at which it became pinned (not preemptable)
    error: str | None = None  # why the length predictor failed for it (it then ranks as the longest)


@dataclass(slots=True)
class LampsState:
    """LAMPS' marks (core/policies/lamps.py; `timelyllm-lamps` too)."""

    kv: str | None = None  # the KV handling chosen at its last suspension ("preserve", "discard", ...)
    kv_modes: dict[str, int] = field(default_factory=dict)  # handlings chosen so far, counted by handling
    pin_fallbacks: int = 0  # suspensions where preserve was chosen but pinned memory was full
    starving: bool = False  # ready for `starvation_threshold` iterations in a row: ranked first
    starved_at: int | None = None  # the iteration it started starving
    score: tuple | None = None  # the kept area: (policy token, iteration, area, segments)


@dataclass(slots=True)
class DefaultState:
    """The default policy's marks (core/policies/default.py, default_small.py)."""

    step_adds: int = 0  # its (re)adds whose prefill the step-time model has counted (rule 9/10)
    pause_kv: bool = False  # paused by rule 9 at the last point: its suspension keeps KV (`pace_kv`)
    # default_small.py's per-generation terms, kept while seg_rev and the prediction table hold:
    # (seg_rev, the table (`Default._pred_by`), has segments, predicted next segment's tokens,
    # `Generation.next_due`, |TUF slope| (-alpha), ATC's numerator (that, or 1e-12 where not > 0),
    # prompt tokens (rule 6))
    terms: tuple = (-1, None)  # (none yet: seg_rev starts at 0)


@dataclass(slots=True)
class PolicyState:
    """Each owner's record, one per generation (a few hundred bytes: made with the generation)."""

    length: LengthState = field(default_factory=LengthState)
    trail: TrailState = field(default_factory=TrailState)
    lamps: LampsState = field(default_factory=LampsState)
    andes_pri: float | None = None  # Andes: the priority of the last solve (None: no solve holds)
    default: DefaultState = field(default_factory=DefaultState)

"""Trail: shortest predicted remaining processing time first, with limited preemption.

Rank of a generation = its predicted remaining output tokens (``LengthPredictor``), refreshed
after every token (``on_token``); ties go first-come first-served.  A generation may be preempted
only while its age (tokens generated) is below ``c·r0`` (r0 = its initial prediction, the
midpoint of the predicted bin for the learned predictor); from then on it is *pinned*: it ranks
ahead of everything (SOAP rank −∞ in the paper) and is never preempted.  c = 1 is the paper's
"plain SPRPT" point; c = inf never pins.

Preemption rule (the paper leaves it to vLLM's scheduler; ours, documented in docs/policies.md):
the batch is *full* when the planner's batch-size controller refused a ready generation at the
previous scheduling point (``Generation.blocked``, set by the planner).  Then ready
generations, best rank first, are paired with preemptable running ones, worst rank first; each
pair where the ready one ranks strictly better preempts the running one, one for one; the first
pair that does not stops the pass.  The preempted generation is aborted with KV mode ``kv`` (cache:
its blocks stay in the prefix cache, the re-add of prompt + generated ids reuses them) and queued
again with its rank.  One scheduling point of lag (one token) is the price of not reaching into
the batcher.
"""

from __future__ import annotations

import math
from typing import Sequence

from ..length_predictor import (LearnedPredictor, LengthPredictor, NoisyOraclePredictor, OraclePredictor,
                                PredictorError, age, make_predictor)
from ..types import Generation, Segment
from .base import (DispatchMode, Policy, PolicyContext, Selection, ascending_perm, batch_was_full,
                   set_priorities)
from .slots import SlotTable

# Predictors whose answers for a generation change only when its age changes or they observe it
# again (the learned one keeps what it saw of tokens a suspension dropped): their ranks may be
# kept between scheduling points, dropped whenever the predictor is consulted outside `_fill`.
_CACHEABLE = (OraclePredictor, NoisyOraclePredictor, LearnedPredictor)

_MODES = {"stream": DispatchMode.STREAM, "suspend": DispatchMode.SUSPEND, "whole": DispatchMode.WHOLE}


class Trail(Policy):
    name = "trail"
    observes_tokens = True  # the length prediction is refined as tokens arrive

    def __init__(self, c: float = 0.8, predictor: str | LengthPredictor = "learned", noise_p: float = 0.3,
                 seed: int = 0, model_dir: str | None = None, refresh_every: int = 1,
                 mode: str = "stream", kv: str = "cache", fallback_len: int = 256) -> None:
        if not (isinstance(c, (int, float)) and c > 0 and not math.isnan(c)):
            raise ValueError(f"c must be > 0 (inf: never pin), got {c!r}")
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {sorted(_MODES)}, got {mode!r}")
        if kv not in ("cache", "discard", "preserve", "swap"):
            raise ValueError(f"kv must be cache, discard, preserve or swap, got {kv!r}")
        self.c = float(c)
        if fallback_len < 1:
            raise ValueError(f"fallback_len must be >= 1, got {fallback_len}")
        self.fallback_len = int(fallback_len)
        self.mode = _MODES[mode]
        self.kv = kv
        if isinstance(predictor, str):
            params: dict = {}
            if predictor == "noisy":
                params = {"p": noise_p, "seed": seed}
            elif predictor == "learned":
                params = {"refresh_every": refresh_every}
                if model_dir:
                    params["model_dir"] = model_dir
            try:
                self.predictor = make_predictor(predictor, **params)
            except PredictorError as e:
                raise ValueError(str(e)) from e
        else:
            self.predictor = predictor
        self._cacheable = type(self.predictor) in _CACHEABLE
        self._desc = {"c": self.c, "predictor": getattr(self.predictor, "name", str(predictor)),
                      "noise_p": noise_p, "seed": seed, "refresh_every": refresh_every, "mode": mode, "kv": kv, "fallback_len": self.fallback_len}

    # --- ranks ----------------------------------------------------------------------------------
    def _safe(self, fn, g: Generation) -> float:
        """A request the predictor cannot handle (e.g. the oracle without a reference reply) must
        not take the planner loop down: it ranks as the longest possible reply and the reason is
        kept in its `TrailState` (``error``)."""
        try:
            return fn(g)
        except PredictorError as e:
            g.policy.trail.error = str(e)
            return float(self.fallback_len)

    def r0(self, g: Generation) -> float:
        return self._safe(self.predictor.initial, g)

    def pinned(self, g: Generation) -> bool:
        """Past c·r0 generated tokens: no longer preemptable (and ranked first)."""
        return age(g) >= self.c * self.r0(g)

    def remaining(self, g: Generation) -> float:
        """Predicted remaining tokens.  A predictor's state may advance here (the learned one
        catches up on tokens it has not seen); the state is kept when a suspension drops tokens,
        so the answer is not a function of the age alone: g's cached rank terms are dropped."""
        self._forget(g)
        return self._safe(self.predictor.remaining, g)

    def _forget(self, g: Generation) -> None:
        table = self.__dict__.get("_table")
        if table is not None:
            table.invalidate(g)

    def rank(self, g: Generation) -> tuple:
        """Smaller runs first: pinned ones, then predicted remaining tokens, then FCFS."""
        rem = self.remaining(g)
        g.priority = -rem
        return (0 if self.pinned(g) else 1, rem, g.ready_since, g.request.arrival, g.gen_id)

    def priority(self, g, ctx, now):
        return -self.remaining(g)

    # --- decisions ------------------------------------------------------------------------------
    def _fill(self, g: Generation, slot: int) -> None:
        """A ready generation's rank terms: fixed until it runs (its age changes, or the predictor
        sees it again: `remaining`, `on_token`), for the predictors whose answers only change
        then; others (and generations whose prediction failed) are refilled at every point."""
        errors = _failed(g)
        a = self._table.a
        a["rem"][slot] = self._safe(self.predictor.remaining, g)
        a["pinned"][slot] = self.pinned(g)
        a["arrival"][slot] = g.request.arrival
        if not self._cacheable or errors or _failed(g):
            self._table.invalidate(g)

    def select(self, ready: Sequence[Generation], running: Sequence[Generation], ctx: PolicyContext,
               now: float) -> Selection:
        """Pinned ones first, then by predicted remaining tokens, FCFS among equals: the same
        order as sorting by `rank` (ranks of ready generations kept in a SlotTable: a ready
        generation generates nothing, so its rank stays put between scheduling points)."""
        full = batch_was_full(ready)
        if self.__dict__.get("_table") is None:
            self._table = SlotTable({"rem": (float, 0.0), "pinned": (bool, False), "arrival": (float, 0.0)})
        table = self._table
        sl = table.lookup(ready, self._fill)
        rem = table.a["rem"][sl]
        pinned = table.a["pinned"][sl]
        set_priorities(ready, (-rem).tolist())
        perm = ascending_perm(ready, rem, first=pinned, arrival=table.a["arrival"][sl])
        order = list(map(ready.__getitem__, perm))
        preempt: list[Generation] = []
        if full and order:
            victims = sorted(((self.rank(g), g) for g in running if not self.pinned(g)),
                             key=lambda kg: kg[0], reverse=True)
            for i, (vk, v) in zip(perm, victims):
                if (0 if pinned[i] else 1, float(rem[i])) < vk[:2]:  # strictly better predicted work; ties never preempt
                    preempt.append(v)
                else:
                    break
        return Selection(order=order, preempt=preempt)

    def on_token(self, g: Generation, n_new: int, ctx: PolicyContext) -> None:
        self._forget(g)
        if not _failed(g):
            try:
                self.predictor.observe(g, n_new)
            except PredictorError as e:
                g.policy.trail.error = str(e)
        st = g.policy.trail
        if st.r0 is None:
            st.r0 = self.r0(g)
        if st.pinned_at is None and self.pinned(g):
            st.pinned_at = age(g)

    def kv_mode(self, g: Generation, seg: Segment | None, ctx: PolicyContext) -> str:
        return self.kv if seg is None else "cache"


def _failed(g: Generation) -> bool:
    """The length predictor failed for g (Trail ranks it as the longest reply from then on)."""
    return g.policy.trail.error is not None

    def params(self) -> dict:
        return dict(self._desc)

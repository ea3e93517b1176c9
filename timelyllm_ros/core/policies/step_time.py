"""An online model of the engine's step time: dt ≈ a + b·seqs + c·new requests + d·prefill tokens.

Fitted by exponentially weighted least squares on what the policy sees between two scheduling
points (how many generations produced a token, how many of them were new requests, how many
prompt tokens the step prefilled — the added generations' context minus their prefix-cache hits —
and the time that passed), with a small ridge towards (a0, 0, 0, 0) so that an engine whose step time does not
depend on the batch (b ≈ 0) gives no batch limit.  Pure: no clock, the caller passes the times.
"""

from __future__ import annotations

import math

import numpy as np


class StepTimeModel:
    def __init__(self, forget: float = 0.995, ridge: float = 1.0) -> None:
        if not 0 < forget <= 1:
            raise ValueError(f"forget must be in (0, 1], got {forget!r}")
        if not ridge > 0:
            raise ValueError(f"ridge must be > 0, got {ridge!r}")
        self.forget = float(forget)
        self.ridge = float(ridge)
        self._xx = np.zeros((4, 4))
        self._xy = np.zeros(4)
        self.n = 0  # observations so far
        self._coef: tuple[float, float, float] | None = None  # cached fit (a, b, c), None: stale
        self._a0 = 0.0
        self._ols: tuple[float, float] | None = None  # cached least-squares (a, b), None: stale

    def observe(self, dt: float, seqs: int, new: int, prefill: int = 0) -> None:
        """One engine step of `seqs` generations (`new` of them new requests) that prefilled
        `prefill` tokens took `dt` seconds.  (Without the prefill term, the first steps of a run
        — a cold prompt costs seconds on a slow engine — would be read as a large per-step
        constant and no per-generation cost.)"""
        if not (dt > 0 and math.isfinite(dt)) or seqs < 1:
            return
        x = np.array((1.0, float(seqs), float(new), float(prefill)))
        f = self.forget
        self._xx *= f
        self._xx += np.outer(x, x)
        self._xy *= f
        self._xy += x * dt
        self.n += 1
        self._coef = None
        self._ols = None

    def coefficients(self, a0: float) -> tuple[float, float, float]:
        """(a, b, c); before any observation (a0, 0, 0).  Negative slopes are read as 0."""
        if self._coef is None or a0 != self._a0:
            lam = self.ridge
            prior = np.array((a0, 0.0, 0.0, 0.0))
            try:
                a, b, c, _ = np.linalg.solve(self._xx + lam * np.eye(4), self._xy + lam * prior).tolist()
            except np.linalg.LinAlgError:
                a, b, c = a0, 0.0, 0.0
            self._coef, self._a0 = (a, max(0.0, b), max(0.0, c)), a0
        return self._coef

    def least_squares(self) -> tuple[float, float]:
        """(a, b) by plain least squares, without the ridge's prior on the intercept (whose
        prior, the time per token, can be far from a step's constant on an overloaded engine
        while few steps are seen); (0, 0) before two batch sizes are seen."""
        if self._ols is None:
            xx = self._xx
            w = xx[0, 0]
            if w <= 0 or not xx[1, 1] / w - (xx[0, 1] / w) ** 2 > 1e-9:
                self._ols = (0.0, 0.0)
            else:  # lstsq: new requests and prefill tokens may be collinear (or never seen)
                a, b = np.linalg.lstsq(xx, self._xy, rcond=None)[0][:2].tolist()
                self._ols = (a, b)
        return self._ols

    def max_seqs(self, budget_s: float, new: int, a0: float, min_slope: float = 1e-6) -> int | None:
        """The most generations a step may hold to take at most `budget_s` with `new` new
        requests in it; None when the step time does not measurably grow with the batch."""
        a, b, c = self.coefficients(a0)
        if b < min_slope:
            return None
        return max(0, math.floor((budget_s - a - c * new) / b))

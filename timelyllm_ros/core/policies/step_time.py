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
        self._d = 0.0  # the fit's seconds per prefilled token (>= 0), set with _coef
        self._err2 = 0.0  # forgetting-weighted sums of squared one-step-ahead errors, of dt, of weights
        self._dt = 0.0
        self._w = 0.0
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
        if self.n:  # how well the fit so far predicted this step
            a, b, c = self.coefficients(self._a0)
            err = dt - (a + b * seqs + c * new + self._d * prefill)
            self._err2 = f * self._err2 + err * err
            self._dt = f * self._dt + dt
            self._w = f * self._w + 1.0
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
                a, b, c, d = np.linalg.solve(self._xx + lam * np.eye(4), self._xy + lam * prior).tolist()
            except np.linalg.LinAlgError:
                a, b, c, d = a0, 0.0, 0.0, 0.0
            self._coef, self._a0, self._d = (a, max(0.0, b), max(0.0, c)), a0, max(0.0, d)
        return self._coef

    def prefill_s_per_token(self, a0: float) -> float:
        """d: the fit's seconds per prefilled token (>= 0; 0 before any observation)."""
        self.coefficients(a0)
        return self._d

    def relative_error(self) -> float:
        """Root mean square of the one-step-ahead prediction errors over the mean step time (the
        same forgetting); inf before two observations."""
        if self._w <= 0 or self._dt <= 0:
            return math.inf
        return math.sqrt(self._err2 / self._w) / (self._dt / self._w)

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

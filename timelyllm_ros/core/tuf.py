"""Time-utility functions (TimelyLLM Eq. 1) and their validation."""

from __future__ import annotations

import math
from dataclasses import dataclass


class TUFError(ValueError):
    """A TUF parameter is outside what Eq. 1 allows."""


@dataclass(frozen=True, slots=True)
class TUF:
    """TUF(t) = min(beta, alpha * (t - ert) + beta); t is response time in seconds.

    beta > 0 is the maximum utility, alpha <= 0 its decay rate per second after the expected
    response time ert >= 0.  Utility may go negative, as in the paper.
    """

    ert: float
    alpha: float
    beta: float

    def __post_init__(self) -> None:
        for name in ("ert", "alpha", "beta"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise TUFError(f"TUF {name} must be a finite number, got {v!r}")
        if self.beta <= 0:
            raise TUFError(f"TUF beta (max utility) must be > 0, got {self.beta}")
        if self.alpha > 0:
            raise TUFError(f"TUF alpha (decay rate) must be <= 0, got {self.alpha}")
        if self.ert < 0:
            raise TUFError(f"TUF ert (expected response time) must be >= 0, got {self.ert}")

    def __call__(self, t: float) -> float:
        """TUF0: utility of a first segment whose action starts t seconds after the request."""
        return min(self.beta, self.alpha * (t - self.ert) + self.beta)

    def suspended(self, t: float) -> float:
        """TUF1: ERT = 0, waiting measured from the end of the previous action (t may be < 0)."""
        return min(self.beta, self.alpha * max(t, 0.0) + self.beta)

    def zero_time(self) -> float:
        """Response time at which utility reaches 0 (inf when alpha == 0)."""
        return math.inf if self.alpha == 0 else self.ert + self.beta / -self.alpha

    @classmethod
    def from_mapping(cls, m: dict) -> "TUF":
        if not isinstance(m, dict):
            raise TUFError(f"TUF must be a mapping with ert, alpha, beta; got {m!r}")
        missing = {"ert", "alpha", "beta"} - set(m)
        if missing:
            raise TUFError(f"TUF is missing {sorted(missing)}")
        extra = set(m) - {"ert", "alpha", "beta"}
        if extra:
            raise TUFError(f"TUF has unknown keys {sorted(extra)}")
        return cls(ert=m["ert"], alpha=m["alpha"], beta=m["beta"])


# The paper's categories (digest: normal ERT 1 s, beta 1, alpha -2; urgent ERT 0.2 s, beta 2, alpha -6.67).
NORMAL = TUF(ert=1.0, alpha=-2.0, beta=1.0)
URGENT = TUF(ert=0.2, alpha=-6.67, beta=2.0)

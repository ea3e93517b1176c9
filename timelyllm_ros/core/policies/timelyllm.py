"""TimelyLLM's priority: potential utility density with slack (paper Eq. 4).

    Pri(s_k, t) = [δ_k TUF0(W(s_k; t)) + (1 − δ_k) TUF1(W(s_k; t))] / (G(s_k) · L(s_k))

W(s_k; t): the waiting time segment k would have if its generation started now and took G:
  k = 0: t + G − arrival;  k > 0: t + G − (estimated end of segment k−1's action).
L(s_k): slack = time left until the segment is due, minus G: due − (t + G), where due is
  arrival + ERT for k = 0 and the estimated end of the previous action for k > 0
  (`Generation.next_due`).  The paper only says "remaining time until the expected completion of
  generation"; we floor it at G so that overdue generations keep a finite, comparable priority
  (their TUF term then decides).

One implementation, `eq4`: a loop over the ready generations with the per-point constants
hoisted; `priority` and `terms` call it for one generation.  tests/test_scheduling_fastpaths.py
checks it bit for bit against the formula written out with `TUF.__call__` / `TUF.suspended`.
(A numpy version was measured slower at 1,000 generations: gathering the inputs into arrays costs
more than the arithmetic.)
"""

from __future__ import annotations

from typing import Sequence

from ..types import Generation
from .base import Policy, PolicyContext, Selection, priority_order, set_priorities


def eq4(gens: Sequence[Generation], now: float, G: float, floor: float, rescue_late: bool,
        detail: bool = False) -> list:
    """Eq. 4 priority of every generation's next segment if started at `now` (G already floored
    at 1e-6); with `detail`, (utility, slack, priority) tuples, utility as the TUF gives it
    (before the rescue_late rule).

    Same arithmetic as the formula: TUF0(t) = min(beta, alpha (t - ert) + beta) at t = now + G -
    arrival; TUF1 = min(beta, alpha max(t, 0) + beta) at t = now + G - due; slack = max(due -
    (now + G), floor, 1e-6) — Python's min/max tie rules kept, so results are bit for bit the
    formula's.  With rescue_late a late segment's numerator is beta + the utility already lost."""
    out: list = []
    put = out.append
    now_g = now + G
    for g in gens:
        req = g.request
        tuf = req.tuf
        beta = tuf.beta
        due = g.next_due(now)
        if g.segments:
            t = now_g - due
            u = tuf.alpha * (0.0 if 0.0 > t else t) + beta  # TUF1: max(t, 0.0)
        else:
            u = tuf.alpha * ((now_g - req.arrival) - tuf.ert) + beta  # TUF0
        if not u < beta:  # min(beta, u): u only if u < beta
            u = num = beta
        elif rescue_late:
            num = beta + (beta - u)
        else:
            num = u
        slack = due - now_g
        if floor > slack:
            slack = floor
        if 1e-6 > slack:
            slack = 1e-6
        pri = num / (G * slack)
        put((u, slack, pri) if detail else pri)
    return out


class TimelyLLM(Policy):
    name = "timelyllm"

    def __init__(self, min_slack_s: float | None = None, rescue_late: bool = True) -> None:
        self.min_slack_s = min_slack_s  # None: floor at G
        # Eq. 4's numerator falls as a segment gets late, so a late generation sinks below every
        # other and starves while its (possibly negative) utility keeps falling.  With rescue_late
        # a late segment's numerator is beta + the utility already lost (|alpha| * lateness):
        # equal to Eq. 4 until the TUF starts to fall, then growing with the loss rate.
        self.rescue_late = rescue_late

    def _g_floor(self, ctx: PolicyContext) -> tuple[float, float]:
        G = max(ctx.seg_gen_s, 1e-6)
        return G, (G if self.min_slack_s is None else self.min_slack_s)

    def terms(self, g, ctx, now) -> tuple[float, float, float]:
        """(utility, G, L) for g's next segment if started at `now`."""
        G, floor = self._g_floor(ctx)
        u, slack, _ = eq4((g,), now, G, floor, self.rescue_late, detail=True)[0]
        return u, G, slack

    def priority(self, g, ctx, now):
        G, floor = self._g_floor(ctx)
        return eq4((g,), now, G, floor, self.rescue_late)[0]

    def select(self, ready: Sequence[Generation], running: Sequence[Generation], ctx: PolicyContext,
               now: float) -> Selection:
        """Eq. 4 for every ready generation in one pass; subclasses that change `priority` or
        `terms` take the generic path."""
        cls = type(self)
        if cls.priority is not TimelyLLM.priority or cls.terms is not TimelyLLM.terms:
            return super().select(ready, running, ctx, now)
        G, floor = self._g_floor(ctx)
        set_priorities(ready, eq4(ready, now, G, floor, self.rescue_late))
        return Selection(order=priority_order(ready))

    def params(self):
        return {"min_slack_s": self.min_slack_s, "rescue_late": self.rescue_late}

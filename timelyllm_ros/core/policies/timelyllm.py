"""TimelyLLM's priority: potential utility density with slack (paper Eq. 4).

    Pri(s_k, t) = [δ_k TUF0(W(s_k; t)) + (1 − δ_k) TUF1(W(s_k; t))] / (G(s_k) · L(s_k))

W(s_k; t): the waiting time segment k would have if its generation started now and took G:
  k = 0: t + G − arrival;  k > 0: t + G − (estimated end of segment k−1's action).
L(s_k): slack = time left until the segment is due, minus G: due − (t + G), where due is
  arrival + ERT for k = 0 and the estimated end of the previous action for k > 0.  The paper only
  says "remaining time until the expected completion of generation"; we floor it at G so that
  overdue generations keep a finite, comparable priority (their TUF term then decides).
"""

from __future__ import annotations

from typing import Sequence

from ..tuf import TUF
from ..types import Generation
from .base import Policy, PolicyContext, Selection, priority_order


class TimelyLLM(Policy):
    name = "timelyllm"

    def __init__(self, min_slack_s: float | None = None, rescue_late: bool = True) -> None:
        self.min_slack_s = min_slack_s  # None: floor at G
        # Eq. 4's numerator falls as a segment gets late, so a late generation sinks below every
        # other and starves while its (possibly negative) utility keeps falling.  With rescue_late
        # a late segment's numerator is beta + the utility already lost (|alpha| * lateness):
        # equal to Eq. 4 until the TUF starts to fall, then growing with the loss rate.
        self.rescue_late = rescue_late

    def terms(self, g, ctx, now) -> tuple[float, float, float]:
        """(utility, G, L) for g's next segment if started at `now`."""
        G = max(ctx.seg_gen_s, 1e-6)
        tuf = g.request.tuf
        if g.k == 0:
            due = g.request.arrival + tuf.ert
            utility = tuf(now + G - g.request.arrival)
        else:
            prev_end = g.prev_exec_end_estimate()
            due = prev_end if prev_end is not None else now
            utility = tuf.suspended(now + G - due)
        floor = G if self.min_slack_s is None else self.min_slack_s
        slack = max(due - (now + G), floor, 1e-6)
        return utility, G, slack

    def priority(self, g, ctx, now):
        utility, G, slack = self.terms(g, ctx, now)
        beta = g.request.tuf.beta
        if self.rescue_late and utility < beta:
            utility = beta + (beta - utility)
        return utility / (G * slack)

    def select(self, ready: Sequence[Generation], running: Sequence[Generation], ctx: PolicyContext,
               now: float) -> Selection:
        """Eq. 4 for every ready generation, inlined: the same arithmetic as `terms`/`priority`
        (bit for bit: same operations in the same order, `min`/`max` tie rules kept), with the
        per-point constants hoisted.  Subclasses that change `terms` or `priority`, and TUF
        subclasses, take the generic path."""
        cls = type(self)
        if cls.priority is not TimelyLLM.priority or cls.terms is not TimelyLLM.terms:
            return super().select(ready, running, ctx, now)
        G = max(ctx.seg_gen_s, 1e-6)
        floor = G if self.min_slack_s is None else self.min_slack_s
        now_g = now + G
        rescue = self.rescue_late
        for g in ready:
            tuf = g.request.tuf
            if type(tuf) is not TUF:
                g.priority = self.priority(g, ctx, now)
                continue
            if g.segments:
                prev_end = g.prev_exec_end_estimate()
                due = prev_end if prev_end is not None else now
            else:
                due = None
            g.priority = eq4_density(g, due, now_g, G, floor, rescue)
        return Selection(order=priority_order(ready))


def eq4_density(g: Generation, due: float | None, now_g: float, G: float, floor: float,
                rescue_late: bool) -> float:
    """`TimelyLLM.priority` for a plain `TUF`, bit for bit, given the constants of one point
    (now_g = now + G, floor = the slack floor) and, for k > 0, when the previous action is
    estimated to end (`due`; None for a first segment).  TimelyLLM.select and the default policy
    call it once per ready generation."""
    req = g.request
    tuf = req.tuf
    beta = tuf.beta
    if due is not None:
        t = now_g - due
        u = tuf.alpha * (0.0 if 0.0 > t else t) + beta  # TUF1: max(t, 0.0)
    else:
        due = req.arrival + tuf.ert
        u = tuf.alpha * ((now_g - req.arrival) - tuf.ert) + beta  # TUF0
    if not u < beta:  # min(beta, u): u only if u < beta
        u = beta
    elif rescue_late:
        u = beta + (beta - u)
    slack = due - now_g  # max(due - (now + G), floor, 1e-6)
    if floor > slack:
        slack = floor
    if 1e-6 > slack:
        slack = 1e-6
    return u / (G * slack)

    def params(self):
        return {"min_slack_s": self.min_slack_s, "rescue_late": self.rescue_late}

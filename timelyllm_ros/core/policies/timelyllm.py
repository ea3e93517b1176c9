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

from .base import Policy


class TimelyLLM(Policy):
    name = "timelyllm"

    def __init__(self, min_slack_s: float | None = None) -> None:
        self.min_slack_s = min_slack_s  # None: floor at G

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
        return utility / (G * slack)

    def params(self):
        return {"min_slack_s": self.min_slack_s}

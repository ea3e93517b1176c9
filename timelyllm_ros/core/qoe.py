"""Andes QoE of a streamed reply (Andes §3.1, Eqs. 1-3), for queued, running or finished requests.

A user consumes tokens at speed r (tokens/s) and expects the first one by ``ideal_start`` =
arrival + TTFT target.  With u = 1/r:

* ideal timeline   T_i^I = ideal_start + (i-1)·u
* actual timeline  T_1^A = max(d_1, T_1^I),  T_i^A = max(d_i, T_{i-1}^A + u)   (d_i: delivery time)
* S_delay = Σ_i (T_i^A − T_i^I),  S_whole = Σ_i (T_n^A − T_i^I),  QoE = 1 − S_delay / S_whole

The paper states the metric only in words and Eq. 1-3; the two timelines above are the
reconstruction its Fig. 5 draws (digest ``andes.md``).  Tokens reach users in *runs*: a group
released at once (a sentence segment: interval 0) or a stream at a fixed interval (projected
generation).  Within a run the actual timeline has a closed form, so the cost is O(runs), not
O(tokens) — the Andes policy evaluates it for every request and candidate batch size.

Unfinished requests ("QoE so far", at time ``now``): the user expected m(now) tokens by now (those
whose ideal time has passed).  Delivered tokens are consumed as above; the expected but undelivered
ones have not been consumed: their actual time is ``now`` for all of them (a flat stretch of the
actual timeline, the user is stuck waiting).  This is what makes the paper's boundary cases hold:
QoE = 1 before anything is due, and "when no tokens arrive, S_delay equals S_whole: QoE 0".  A
request that delivers nothing and is given up has QoE 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np

from .robots import RobotSpec
from .types import Generation, GenState, PlanRequest

READING_TOK_S = 4.8  # Andes Fig. 2: reading speed, 1 word = 1.3 tokens
SPEAKING_TOK_S = 3.3  # listening speed
PAPER_TOKENS_PER_WORD = 1.3  # the tokenizer the paper's speeds are counted in
_EPS = 1e-9


class QoEError(ValueError):
    """Bad QoE parameters (non-positive rate, non-finite times, negative counts)."""


@dataclass(frozen=True, slots=True)
class Run:
    """``count`` tokens delivered at start, start + interval, ...  (interval 0: all at once)."""

    start: float
    count: int
    interval: float = 0.0
    pending: bool = False  # expected but not delivered: all consumed "at start" (flat), internal


@dataclass(frozen=True, slots=True)
class QoE:
    qoe: float
    s_delay: float
    s_whole: float
    tokens: int  # n: tokens on the timelines (delivered + expected-but-late)
    delivered: int


def _check(ideal_start: float, rate: float) -> float:
    if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
        raise QoEError(f"consumption rate must be a finite number > 0 tokens/s, got {rate!r}")
    if not math.isfinite(ideal_start):
        raise QoEError(f"ideal start must be finite, got {ideal_start!r}")
    return 1.0 / rate


def expected_tokens(ideal_start: float, rate: float, at: float) -> int:
    """Tokens whose ideal consumption time is <= at."""
    u = _check(ideal_start, rate)
    if at < ideal_start - _EPS:
        return 0
    return int(math.floor((at - ideal_start) / u + _EPS)) + 1


def qoe_of_runs(runs: Iterable[Run], *, ideal_start: float, rate: float, now: float | None = None,
                complete: bool = True) -> QoE:
    """QoE of tokens delivered in ``runs``.

    complete=True: the reply is whole (n = tokens delivered).  complete=False: evaluate "so far" at
    ``now``: only tokens delivered by ``now`` count, and tokens the user expected by ``now`` but did
    not get are placed at ``now``.
    """
    u = _check(ideal_start, rate)
    rs: list[Run] = []
    for r in runs:
        if r.count < 0 or not math.isfinite(r.start) or r.interval < 0 or not math.isfinite(r.interval):
            raise QoEError(f"bad delivery run {r!r}")
        if r.count:
            rs.append(r)
    rs.sort(key=lambda r: r.start)
    if not complete:
        if now is None:
            raise QoEError("an unfinished request needs `now`")
        cut: list[Run] = []
        for r in rs:
            if r.start > now + _EPS:
                break
            c = r.count if r.interval == 0 else min(r.count, int(math.floor((now - r.start) / r.interval + _EPS)) + 1)
            cut.append(Run(r.start, c, r.interval))
        rs = cut
        delivered = sum(r.count for r in rs)
        missing = expected_tokens(ideal_start, rate, now) - delivered
        if missing > 0:
            rs.append(Run(now, missing, 0.0, pending=True))
    delivered_n = sum(r.count for r in rs) if complete else delivered
    n = sum(r.count for r in rs)
    if n == 0:
        return QoE(1.0, 0.0, 0.0, 0, 0)  # nothing expected yet, nothing late
    s_actual, prev_next, last = fold_runs(rs, u, ideal_start)
    s_ideal = n * ideal_start + u * n * (n - 1) / 2
    s_delay = max(0.0, s_actual - s_ideal)
    s_whole = n * last - s_ideal
    q = 1.0 if s_whole <= _EPS else max(0.0, min(1.0, 1.0 - s_delay / s_whole))
    return QoE(q, s_delay, s_whole, n, delivered_n)


def fold_runs(rs: Sequence[Run], u: float, ideal_start: float, s_actual: float = 0.0,
              prev_next: float | None = None, last: float | None = None) -> tuple[float, float, float]:
    """Walk sorted, cut runs through the actual timeline (1/u tokens per second): returns
    (Σ actual consumption times, earliest time of the next token, time of the last token).
    Within a run the timeline has a closed form, so the cost is O(runs)."""
    if prev_next is None:
        prev_next = ideal_start  # earliest the next token can be consumed
    if last is None:
        last = ideal_start
    for r in rs:
        c, s, iv = r.count, r.start, r.interval
        a0 = max(s, prev_next)
        if r.pending:
            s_actual += c * a0
            last = a0
            prev_next = last + u
            continue
        if iv <= u or c == 1:
            kstar = c  # consumption-bound for the whole run
        else:
            kstar = min(c, max(0, math.ceil((a0 - s) / (iv - u) - _EPS)))
        # k < kstar: a_k = a0 + k·u ; k >= kstar: a_k = s + k·iv
        s_actual += kstar * a0 + u * kstar * (kstar - 1) / 2
        if kstar < c:
            s_actual += (c - kstar) * s + iv * (c * (c - 1) / 2 - kstar * (kstar - 1) / 2)
            last = s + (c - 1) * iv
        else:
            last = a0 + (c - 1) * u
        prev_next = last + u
    return s_actual, prev_next, last


class QoEBatch:
    """`qoe_of_runs(..., complete=False, now=at).qoe` for many requests at once (numpy).

    Each request's delivered runs are already folded (`fold_runs`) into (s_actual, prev_next,
    last, delivered); the caller guarantees that none of them starts after ``at`` + eps (none is
    cut).  `at(T, stream)` adds one more run, ``stream`` = (start, count, interval) with scalar
    start and interval (Andes' projected generation), which starts no earlier than every delivered
    run; it is dropped when its count is 0 and cut at T like any run.  Same operations in the same
    order as `qoe_of_runs` (Python's min/max tie rules kept, branches that cannot apply skipped
    only when they cannot apply to any request), so the values are bit for bit the scalar ones;
    tests/test_scheduling_fastpaths.py checks it.  Arrays broadcast: one request against many
    times works too."""

    def __init__(self, s_actual: np.ndarray, prev_next: np.ndarray, last: np.ndarray, delivered: np.ndarray,
                 ideal_start: np.ndarray, u: np.ndarray) -> None:
        self.sa, self.pn, self.la, self.dl = s_actual, prev_next, last, delivered
        self.start, self.u = ideal_start, u
        self.u_min = float(u.min()) if u.size else math.inf  # (ndarray methods: numpy's wrappers cost ~1 µs a call)
        self._expected: dict = {}

    def at_streams(self, at: float, s: Sequence[float], pending: np.ndarray, cnt: Sequence[int],
                   iv: Sequence[float]) -> np.ndarray:
        """`at(at, (s, pending + cnt, iv))` with one stream per row (s, cnt, iv: one value per
        row): shape (rows, requests).  The compiled loop of core/qoe_kernel.py when numba is
        there (the same bits), else numpy."""
        from .qoe_kernel import stream_rows
        out = stream_rows(self, at, s, pending, cnt, iv)
        if out is None:
            col = lambda xs: np.array(xs, dtype=float)[:, None]  # noqa: E731
            out = self.at(at, (col(s), pending + col(cnt), col(iv)))
        return out

    def expected(self, at: float) -> np.ndarray:
        """expected_tokens(ideal_start, rate, at) for every request."""
        e = self._expected.get(at)
        if e is None:
            start, u = self.start, self.u
            e = self._expected[at] = np.where(at < start - _EPS, 0.0, np.floor((at - start) / u + _EPS) + 1)
        return e

    def at(self, at: float | np.ndarray, stream: tuple[float, np.ndarray, float] | None = None) -> np.ndarray:
        sa, pn, la, dl, u = self.sa, self.pn, self.la, self.dl, self.u
        with np.errstate(divide="ignore", invalid="ignore"):
            if stream is not None:
                s, count, iv = stream  # s, iv: scalars or one per row (shape (k, 1)); count per request
                started = ~(np.asarray(s) > at + _EPS)  # a stream starting after `at` is cut away
                c = np.minimum(count, np.floor((at - s) / iv + _EPS) + 1)
                a0 = np.where(pn > s, pn, s)  # max(s, prev_next)
                if (np.asarray(iv) <= self.u_min).all():  # consumption-bound everywhere: kstar = c
                    cm1 = c - 1
                    sa2 = sa + (c * a0 + u * c * cm1 / 2)
                    la2 = a0 + cm1 * u
                else:
                    ks = np.where((iv <= u) | (c == 1), c,
                                  np.minimum(c, np.maximum(0, np.ceil((a0 - s) / (iv - u) - _EPS))))
                    sa2 = sa + (ks * a0 + u * ks * (ks - 1) / 2)
                    tail = ks < c
                    sa2 = np.where(tail, sa2 + ((c - ks) * s + iv * (c * (c - 1) / 2 - ks * (ks - 1) / 2)), sa2)
                    la2 = np.where(tail, s + (c - 1) * iv, a0 + (c - 1) * u)
                if bool(np.all(started)) and np.min(count) > 0:
                    sa, la, pn, dl = sa2, la2, la2 + u, dl + c
                    some = bool(np.min(c) >= 1)  # every request has a token on its timeline: n >= 1
                else:
                    has = started & (count > 0)  # zero-count runs are dropped
                    sa, la = np.where(has, sa2, sa), np.where(has, la2, la)
                    pn, dl = np.where(has, la2 + u, pn), dl + np.where(has, c, 0)
                    some = False
            else:
                some = False
            if np.ndim(at):
                start = self.start
                expected = np.where(at < start - _EPS, 0.0, np.floor((at - start) / u + _EPS) + 1)
            else:
                expected = self.expected(at)
            # (token counts are integers in floats: their sums and differences are exact)
            missing = expected - dl
            pend = missing > 0  # expected but not delivered: consumed "at `at`" (flat)
            a0 = np.where(pn > at, pn, at)  # max(at, prev_next)
            t = missing * a0
            t += sa  # sa + missing * a0
            sa = np.where(pend, t, sa)
            la = np.where(pend, a0, la)
            n = np.where(pend, expected, dl)  # dl + missing
            s_ideal = n * self.start
            t = u * n
            t *= n - 1
            t /= 2
            s_ideal += t  # n * start + u * n * (n - 1) / 2
            d = sa - s_ideal
            s_delay = np.where(d > 0.0, d, 0.0)  # max(0.0, ·)
            s_whole = n * la
            s_whole -= s_ideal
            y = s_delay / s_whole
            np.subtract(1.0, y, out=y)  # <= 1 where it is used (s_delay >= 0, s_whole > eps): min(1, ·) is a no-op
            y = np.where(y > 0.0, y, 0.0)  # max(0.0, ·)
        if some:
            return np.where(s_whole <= _EPS, 1.0, y)
        return np.where((n == 0) | (s_whole <= _EPS), 1.0, y)


def qoe_of_deliveries(times: Sequence[float], *, ideal_start: float, rate: float, now: float | None = None,
                      complete: bool = True) -> QoE:
    """Per-token delivery times (the textbook form; used by tests and small cases)."""
    return qoe_of_runs((Run(t, 1) for t in times), ideal_start=ideal_start, rate=rate, now=now,
                       complete=complete)


# --- requests -------------------------------------------------------------------------------------

def consume_rate(request: PlanRequest, robot: RobotSpec | None = None, *,
                 speaking_types: Iterable[str] = (), action_rate: float = 5.0,
                 tokens_per_word: float = PAPER_TOKENS_PER_WORD) -> float:
    """Tokens/s the reply is consumed at: the request's own value, else reading (4.8) or, for robot
    types that speak their replies, listening (3.3) — people read *words*, so the paper's speeds
    (counted at 1.3 tokens per word) are rescaled to this tokenizer's ``tokens_per_word``.  Action
    robots "consume" a plan by executing it; ``action_rate`` (a choice, see docs/policies.md)
    stands in for that pace."""
    if request.consume_rate is not None:
        return float(request.consume_rate)
    if robot is not None and robot.language != "sentence":
        return action_rate
    base = SPEAKING_TOK_S if request.robot_type in set(speaking_types) else READING_TOK_S
    return base * tokens_per_word / PAPER_TOKENS_PER_WORD


def measured_tokens_per_word(gen: Generation) -> float | None:
    """Tokens per word of what this request delivered (its own tokenizer's ratio); None before
    anything was delivered."""
    toks = words = 0
    for s in gen.segments:
        if s.dispatched_at is not None:
            toks += s.token_count
            words += len(s.text.split())
    return toks / words if toks and words else None


def ttft_target(request: PlanRequest) -> float:
    """TTFT target = the request's expected response time (TUF ERT: 1 s for chat, 0.2 s urgent)."""
    return max(0.0, request.tuf.ert)


def delivery_runs(gen: Generation, network_latency_s: float = 0.0) -> list[Run]:
    """Tokens reach the user when their segment is dispatched (sentence granularity)."""
    return [Run(s.dispatched_at + network_latency_s, max(1, s.token_count))
            for s in gen.segments if s.dispatched_at is not None]


def request_qoe(gen: Generation, now: float, *, rate: float | None = None, robot: RobotSpec | None = None,
                network_latency_s: float = 0.0, speaking_types: Iterable[str] = (),
                tokens_per_word: float | None = None) -> QoE:
    """QoE of one request at ``now`` in whatever state it is.  Without ``rate``, reading speeds
    are rescaled by ``tokens_per_word`` (default: measured on the request's delivered text, else
    the paper's 1.3)."""
    req = gen.request
    if rate is None:
        tpw = tokens_per_word or measured_tokens_per_word(gen) or PAPER_TOKENS_PER_WORD
        rate = consume_rate(req, robot, speaking_types=speaking_types, tokens_per_word=tpw)
    r = rate
    start = req.arrival + ttft_target(req)
    runs = delivery_runs(gen, network_latency_s)
    if gen.state is GenState.FINISHED or (gen.engine_finished and gen.state is GenState.DRAINING):
        return qoe_of_runs(runs, ideal_start=start, rate=r)
    if gen.state.terminal:  # failed / cancelled: the rest never comes
        if not runs:
            return QoE(0.0, 0.0, 0.0, 0, 0)
        return qoe_of_runs(runs, ideal_start=start, rate=r)
    at = max(now, req.arrival)
    return qoe_of_runs(runs, ideal_start=start, rate=r, now=at, complete=False)


def qoe_summary(values: Sequence[float], threshold: float = 0.95) -> Mapping[str, float | int | None]:
    """Average QoE and the share of requests at or above ``threshold`` (Andes reports 0.95)."""
    n = len(values)
    if not n:
        return {"count": 0, "qoe_mean": None, "share_ge": None, "threshold": threshold}
    return {"count": n, "qoe_mean": math.fsum(values) / n,
            "share_ge": sum(1 for v in values if v >= threshold - _EPS) / n, "threshold": threshold}

"""The load factor ρ online: offered tokens per second over the engine's full-batch tokens per second.

`default`'s rule 12 (docs/policies.md) switches to its heavy-load mode where ρ is high: above 1 the
late backlog grows while requests keep arriving, and the offline figure (`benchmarks/load_factor.py`)
separated the cells that want the whole-reply order from their first seconds (ρ 1.99–3.30) from
those that lose with it (0.19–1.45).  Online both halves are estimates:

  offered   Σ over robot types: arrivals per second (an exponentially decaying count, time
            constant `tau_s`, over the window it spans: tau × (1 − exp(−span / tau)), span the
            time since the first arrival, at least `min_span_s` (5 s: a burst of requests at
            once is not a rate; without it `burst_fleet` on the RTX 4090 profile at cap 8 went
            heavy on its first burst: accrued 90.3 → 85.5 %, simulator) — exact for a steady
            rate from the first arrival on)
            × that type's reply length — the running mean of whole replies that ended (weight
            `len_weight`), before the first one ended the length predictor's estimate for the
            type's first arrival (`first_guess`)
  capacity  tokens per second of the engine steps that added no request and prefilled
            nothing (a prefill step is not the batch's decode speed) and ran at least 90 % of
            the largest batch seen so far — a running mean (weight `len_weight`, restarted where
            a step outgrows the ones it holds) — times the engines serving the batch; read only
            once the batch has reached its limit (`saturate`): until then the largest batch seen
            is not the full one, and ρ is 0
  effective the same offered load over the tokens per second of *every* full-batch step —
            prefills, new requests and re-adds included: what the engine delivers while it
            also takes work in (`rho(effective=True)`; `default`'s rule 14) — the ratio of
            running means of outputs and durations (weight `len_weight` / 10: the steps vary
            with what they take in, and the ratio of means weighs each by its time)

Pure: no clock, no I/O; the caller passes the times (`now`, a request's arrival).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class _Arrivals:
    count: float  # arrivals of one robot type, each decayed by exp(-age / tau) as of `at`
    at: float


@dataclass
class OfferedLoad:
    tau_s: float = 60.0
    len_weight: float = 0.1
    full_share: float = 0.9  # a step counts as a full batch at this share of the largest one seen
    min_span_s: float = 5.0  # arrivals are a rate over at least this long: a burst at once is not one
    # what it learned (not constructor arguments)
    arrivals: dict[str, _Arrivals] = field(default_factory=dict, init=False)
    reply_len: dict[str, float] = field(default_factory=dict, init=False)  # robot type -> mean tokens of an ended reply
    guess: dict[str, float] = field(default_factory=dict, init=False)  # robot type -> predicted tokens of its first arrival
    first_at: float | None = field(default=None, init=False)
    max_outputs: int = field(default=0, init=False)
    full_tps: float = field(default=0.0, init=False)  # tokens/s of the decode-only steps at a full batch (0: none seen)
    held_width: int = field(default=0, init=False)  # the narrowest step in that mean
    eff_tps: float = field(default=0.0, init=False)  # tokens/s of every full-batch step (0: none seen)
    eff_width: int = field(default=0, init=False)  # the narrowest step in that mean
    _eff_out: float = field(default=0.0, init=False)  # ... its running means: outputs and seconds
    _eff_s: float = field(default=0.0, init=False)
    saturated: bool = field(default=False, init=False)  # the batch reached its limit once (`saturate`)

    def __post_init__(self) -> None:
        if isinstance(self.tau_s, bool) or not isinstance(self.tau_s, (int, float)) or not 0 < self.tau_s < math.inf:
            raise ValueError(f"rho_tau_s must be a finite number of seconds > 0, got {self.tau_s!r}")

    def knows(self, robot_type: str) -> bool:
        """Whether a reply length (ended or guessed) is known for the type: `arrive` needs no guess."""
        return robot_type in self.reply_len or robot_type in self.guess

    def arrive(self, robot_type: str, at: float, first_guess: float | None = None) -> None:
        """A request of `robot_type` arrived at `at`; `first_guess`: its predicted reply tokens,
        used for the type until a reply of it ends (needed only where `knows` is False)."""
        if first_guess is not None and not self.knows(robot_type):
            self.guess[robot_type] = float(first_guess)
        if self.first_at is None:
            self.first_at = at
        a = self.arrivals.get(robot_type)
        if a is None:
            self.arrivals[robot_type] = _Arrivals(1.0, at)
        else:
            a.count = a.count * math.exp(-max(0.0, at - a.at) / self.tau_s) + 1.0
            a.at = max(a.at, at)

    def reply_ended(self, robot_type: str, tokens: int) -> None:
        """A reply of `robot_type` ended after `tokens` generated tokens."""
        m = self.reply_len.get(robot_type)
        w = self.len_weight
        self.reply_len[robot_type] = float(tokens) if m is None else (1 - w) * m + w * tokens

    def step(self, duration_s: float, outputs: int, decode_only: bool) -> None:
        """An engine step of `outputs` generations took `duration_s`; `decode_only`: it added no
        request and prefilled nothing (only such steps measure the full batch's decode speed)."""
        if not duration_s > 0 or outputs < 1:
            return
        if outputs > self.max_outputs:
            self.max_outputs = outputs
        full = self.full_share * self.max_outputs
        if outputs >= full:  # the effective capacity: every full-batch step
            w = self.len_weight * 0.1
            if self.eff_width < full:  # the steps held so far are no full ones now
                self._eff_out, self._eff_s, self.eff_width = float(outputs), float(duration_s), outputs
            else:
                self._eff_out = (1 - w) * self._eff_out + w * outputs
                self._eff_s = (1 - w) * self._eff_s + w * duration_s
                self.eff_width = min(self.eff_width, outputs)
            self.eff_tps = self._eff_out / self._eff_s
        if decode_only and outputs >= full:
            tps = outputs / duration_s
            w = self.len_weight
            if self.full_tps <= 0 or self.held_width < full:  # the steps held so far are no full ones now
                self.full_tps, self.held_width = tps, outputs
            else:
                self.full_tps = (1 - w) * self.full_tps + w * tps
                self.held_width = min(self.held_width, outputs)

    def saturate(self) -> None:
        """The batch reached its limit (a batch cap, KV memory or the policy's step-time cap held
        a ready generation back): from now on the largest batch seen is the full batch.  Before,
        the engine serves whatever arrives and ρ reads 0 — the steps seen then are narrower than
        a full batch and would make any load look heavy."""
        self.saturated = True

    def rho(self, now: float, engines: int = 1, fallback_len: float = 256.0, effective: bool = False) -> float:
        """ρ at `now` (`engines` serving the batch, each at `full_tps`; `effective`: at
        `eff_tps`); 0.0 before an arrival, before the batch reached its limit (`saturate`) or
        before a full decode-only step (`effective`: a full step)."""
        tps = self.eff_tps if effective else self.full_tps
        if self.first_at is None or not self.saturated or not tps > 0:
            return 0.0
        tau = self.tau_s
        span = max(self.min_span_s, now - self.first_at)  # the decayed count's window: tau x (1 - exp(-span / tau))
        offered = 0.0
        for rt, a in self.arrivals.items():
            n = self.reply_len.get(rt, self.guess.get(rt, fallback_len))
            offered += a.count * math.exp(-max(0.0, now - a.at) / tau) * n
        offered /= tau * (1 - math.exp(-span / tau))
        return offered / (tps * max(1, engines))

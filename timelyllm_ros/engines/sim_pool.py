"""N simulated engines behind one planner: parallel machines on one virtual clock.

Each member is a `SimulatedEngine` on its own clock; all share one `Scripts` (a generation resumed
on another member continues its text).  A pool step starts an iteration on every idle member
that has work (its outputs are computed at once but held until it ends: start + the member's
modelled duration), then moves the shared clock to the earliest end and delivers the outputs of
the members that finish then.  So members run concurrently, each at its own pace, and the
planner reacts to each as soon as its iteration ends (what a real pool of GPUs does), rather
than all waiting for the slowest.

While a member's iteration is in flight the planner may add to it (the generation joins its next
iteration, as in vLLM) or abort one of its generations (the held output of that generation is
dropped and its script position rewound, so the token is generated again on resume).
"""

from __future__ import annotations

from typing import Sequence

from ..core.clock import VirtualClock
from ..core.engine import EngineError, EngineOutput, Tokenizer
from ..core.latency_profile import LatencyProfile
from .pool import EnginePool
from .simulated import EngineCounters, KVCapacityError, Scripts, SimulatedEngine


class SimulatedPool(EnginePool):
    """`EnginePool` of simulated engines stepped as parallel machines (module docstring)."""

    def __init__(self, clock: VirtualClock, members: Sequence[SimulatedEngine]) -> None:
        super().__init__({f"e{i}": m for i, m in enumerate(members)})
        self.clock = clock
        self._sims: dict[str, SimulatedEngine] = {f"e{i}": m for i, m in enumerate(members)}
        self._inflight: dict[str, tuple[float, float, list[EngineOutput]]] = {}  # member -> (start, end, outputs)

    @classmethod
    def build(cls, clock: VirtualClock, n: int, profile: LatencyProfile | None = None,
              tokenizer: Tokenizer | None = None, kind: str = "preserve",
              scheduling_policy: str = "fcfs") -> "SimulatedPool":
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"engine count must be an int >= 1, got {n!r}")
        scripts = Scripts()
        return cls(clock, [SimulatedEngine(VirtualClock(clock.now()), profile, tokenizer, scripts, kind=kind,
                                           scheduling_policy=scheduling_policy)
                           for _ in range(n)])

    def set_script(self, gen_id: str, text: str, notes: Sequence[tuple[int, int]] = (),
                   prompt_len: int | None = None) -> None:
        next(iter(self._sims.values())).set_script(gen_id, text, notes, prompt_len)  # shared by every member

    @property
    def scheduling_policy(self) -> str:
        return next(iter(self._sims.values())).scheduling_policy

    @property
    def profile(self) -> LatencyProfile:
        return next(iter(self._sims.values())).profile

    def engine_counters(self) -> EngineCounters:
        """The members' counters summed (steps, busy time, tokens, ...)."""
        total = EngineCounters()
        for m in self._sims.values():
            for f in EngineCounters.__slots__:  # type: ignore[attr-defined]
                setattr(total, f, getattr(total, f) + getattr(m.counters, f))
        return total

    def abort(self, gen_id: str, kv: str = "cache") -> None:
        m = self.member_of(gen_id)
        held = self._inflight.get(m) if m is not None else None
        if held is not None:
            keep = [o for o in held[2] if o.gen_id != gen_id]
            for o in held[2]:
                if o.gen_id == gen_id and o.token_ids and not o.finished:
                    self._sims[m].unemit(gen_id, o.token_ids[-1])
            self._inflight[m] = (held[0], held[1], keep)
        super().abort(gen_id, kv)

    def _step_members(self) -> list[EngineOutput]:
        now = self.clock.now()
        for name in self.members():
            if name in self._inflight:
                continue
            sim = self._sims[name]
            if not sim.has_unfinished():
                continue
            sim.clock.advance_to(now)
            try:
                outs = sim.step()
            except KVCapacityError:
                raise  # memory the planner over-committed: fails the pool, as it fails a lone engine
            except EngineError as e:  # the member failed: its generations move elsewhere
                self._lose(name, str(e))
                continue
            end = sim.clock.now()
            if outs or end > now:
                self._inflight[name] = (now, end, outs)
        self._member_steps = []
        if not self._inflight:
            return []
        t = min(end for _, end, _ in self._inflight.values())
        self.clock.advance_to(t)
        delivered: list[EngineOutput] = []
        for name in list(self._inflight):
            start, end, outs = self._inflight[name]
            if end <= t:
                del self._inflight[name]
                delivered.extend(outs)
                self._member_steps.append((end - start, len(outs)))
        return delivered

    def has_unfinished(self) -> bool:
        return bool(self._inflight) or super().has_unfinished()

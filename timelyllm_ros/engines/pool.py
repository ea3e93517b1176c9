"""Several engines behind one planner: a composite `Engine` that routes generations.

The planner sees one engine (the `EngineFleet` hooks of core/engine.py tell it the members):
- placement: a generation that ran before goes back to the member that holds its prefix (KV
  affinity); a new one goes to the least-loaded member, preferring one that already served its
  prompt prefix (the robot type's fixed part, cached there);
- the planner runs its batch-size controller per member (`member_stats`), so every member keeps
  the latency-guided batch of its own speed; each member iteration's duration and outputs
  (`member_steps`) feed the policy's step-time model, whose batch limits hold per member;
- a member that raises `EngineError` (crash, server down, garbage) is dropped: the generations it
  was running are handed back through `take_lost` and the planner re-queues them (they resume
  from their token records elsewhere; `counters.lost` counts those re-prefills); when the last
  member is gone the pool itself fails and the planner's usual engine-failure path takes over.

Members are stepped one after another (`EnginePool`: real engines, wall clock; a remote member's
step only drains what its server already streamed).  `SimulatedPool` (engines/sim_pool.py) steps
simulated members as parallel machines on one virtual clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from ..core.clock import Clock, WallClock
from ..core.engine import Engine, EngineError, EngineFleet, EngineOutput, EngineStats, Tokenizer


@dataclass
class PoolCounters:
    lost: int = 0  # running generations re-queued because their member failed (re-prefill)
    moved: int = 0  # resumed generations placed away from the member holding their prefix
    added: int = 0
    served: dict[str, int] = field(default_factory=dict)  # adds per member


class EnginePool(EngineFleet):
    """Composite engine over named members (see the module docstring)."""

    def __init__(self, members: Mapping[str, Engine] | Sequence[Engine], *, prefix_tokens: int = 64,
                 prefix_bonus: int = 1, clock: Clock | None = None) -> None:
        named = dict(members) if isinstance(members, Mapping) else {f"e{i}": e for i, e in enumerate(members)}
        if not named:
            raise EngineError("an engine pool needs at least one engine")
        self._members: dict[str, Engine] = named
        first = next(iter(named.values()))
        self.tokenizer: Tokenizer = first.tokenizer
        modes = frozenset(first.kv_modes)
        for e in named.values():
            modes &= frozenset(e.kv_modes)
        self.kv_modes = modes or frozenset({"cache"})
        self.prefix_tokens = prefix_tokens
        self.prefix_bonus = prefix_bonus
        self.down: dict[str, str] = {}  # member -> why it was dropped
        self.counters = PoolCounters(served={m: 0 for m in named})
        self._where: dict[str, str] = {}  # running gen -> member
        self._home: dict[str, str] = {}  # gen -> member that last ran it (holds its prefix KV)
        self._load: dict[str, int] = {m: 0 for m in named}
        self._prefixes: dict[str, set[int]] = {m: set() for m in named}
        self._next: dict[str, str] = {}  # gen -> member chosen by assign()
        self._lost: list[tuple[str, str]] = []
        self._step_log: list | None = None
        self._clock: Clock = clock if clock is not None else WallClock()  # times member iterations
        self._member_steps: list[tuple[float, int]] = []  # (duration s, outputs) of the last step's iterations

    @property
    def step_log(self) -> list | None:
        """The members' iteration records (StepRecord), one list shared by every member that keeps
        them (None: off)."""
        return self._step_log

    @step_log.setter
    def step_log(self, log: list | None) -> None:
        self._step_log = log
        for e in self._members.values():
            if hasattr(e, "step_log"):
                e.step_log = log  # type: ignore[attr-defined]

    # -- EngineFleet hooks --------------------------------------------------------------------

    @property
    def scheduling_policy(self) -> str | None:
        """"priority" when every member schedules by priority; else the first other value a
        member states (None: none states one)."""
        vals = [getattr(m, "scheduling_policy", None) for m in self._members.values()]
        if vals and all(v == "priority" for v in vals):
            return "priority"
        return next((v for v in vals if isinstance(v, str) and v != "priority"), None)

    def members(self) -> list[str]:
        return [m for m in self._members if m not in self.down]

    def member(self, name: str) -> Engine:
        return self._members[name]

    def member_of(self, gen_id: str) -> str | None:
        return self._where.get(gen_id)

    def member_stats(self, member: str) -> EngineStats:
        return self._members[member].stats()

    def _prefix_key(self, prompt_ids: Sequence[int]) -> int:
        return hash(tuple(prompt_ids[:self.prefix_tokens]))

    def preference(self, gen_id: str, prompt_ids: Sequence[int]) -> list[str]:
        alive = self.members()
        key = self._prefix_key(prompt_ids)
        bonus = self.prefix_bonus
        order = sorted(alive, key=lambda m: self._load[m] - (bonus if key in self._prefixes[m] else 0))
        home = self._home.get(gen_id)
        if home in self._load and home not in self.down:
            order.remove(home)
            order.insert(0, home)
        return order

    def assign(self, gen_id: str, member: str) -> None:
        if member not in self._members or member in self.down:
            raise EngineError(f"engine pool: no usable member {member!r}")
        self._next[gen_id] = member

    def member_steps(self) -> list[tuple[float, int]]:
        """(duration in seconds, outputs) of each member iteration that ended in the last `step`:
        what one engine's step is to the policy's step-time model (a pool step is not one: its
        members run side by side)."""
        return self._member_steps

    def take_lost(self) -> list[tuple[str, str]]:
        lost, self._lost = self._lost, []
        return lost

    # -- Engine protocol ----------------------------------------------------------------------

    def add(self, gen_id: str, prompt_ids: Sequence[int], max_tokens: int, **kw: int) -> None:
        """Add to the assigned (else the preferred) member; `priority=` (priority scheduling)
        passes through to it."""
        m = self._next.pop(gen_id, None)
        if m is None:
            prefs = self.preference(gen_id, prompt_ids)
            if not prefs:
                raise EngineError(self._all_down())
            m = prefs[0]
        home = self._home.get(gen_id)
        moved = home is not None and home != m
        if moved:  # text an adapter held back at the suspension moves with the generation
            src, dst = getattr(self._members[home], "held", None), getattr(self._members[m], "held", None)
            if src is not None and dst is not None:
                dst.put(gen_id, src.take(gen_id))
        try:
            self._members[m].add(gen_id, prompt_ids, max_tokens, **kw)
        except EngineError as e:
            if not self._members[m].stats().healthy:
                self._lose(m, str(e))
            raise
        if moved:
            self.counters.moved += 1
        self.counters.added += 1
        self.counters.served[m] += 1
        self._where[gen_id] = m
        self._home[gen_id] = m
        self._load[m] += 1
        self._prefixes[m].add(self._prefix_key(prompt_ids))

    def abort(self, gen_id: str, kv: str = "cache") -> None:
        m = self._where.pop(gen_id, None)
        if m is not None:
            self._load[m] -= 1
        else:
            m = self._home.get(gen_id)  # suspended: its KV (maybe pinned) lives there
        if kv == "discard":
            self._home.pop(gen_id, None)
        if m is None or m in self.down:
            return
        try:
            self._members[m].abort(gen_id, kv)
        except EngineError as e:
            if self._members[m].stats().healthy:
                raise
            self._lose(m, str(e))

    def step(self) -> list[EngineOutput]:
        if not self.members():
            raise EngineError(self._all_down())
        outs = self._step_members()
        for o in outs:
            if o.finished:
                m = self._where.pop(o.gen_id, None)
                if m is not None:
                    self._load[m] -= 1
        if not self.members():
            raise EngineError(self._all_down())
        return outs

    def _step_members(self) -> list[EngineOutput]:
        outs: list[EngineOutput] = []
        steps: list[tuple[float, int]] = []
        now = self._clock.now
        for m in self.members():
            e = self._members[m]
            if not e.has_unfinished():
                continue
            t0 = now()
            try:
                got = e.step()
            except EngineError as err:
                self._lose(m, str(err))
                continue
            outs.extend(got)
            steps.append((now() - t0, len(got)))
        self._member_steps = steps
        return outs

    def has_unfinished(self) -> bool:
        return any(self._members[m].has_unfinished() for m in self.members())

    def stats(self) -> EngineStats:
        alive = [self._members[m].stats() for m in self.members()]
        if not alive:
            first = next(iter(self._members.values())).stats()
            return EngineStats(kv_total_blocks=0, kv_free_blocks=0, block_size=first.block_size, running=0,
                               tokens_per_s=0.0, healthy=False)
        speeds = [s.tokens_per_s for s in alive if s.tokens_per_s > 0]
        return EngineStats(kv_total_blocks=sum(s.kv_total_blocks for s in alive),
                           kv_free_blocks=sum(s.kv_free_blocks for s in alive),
                           block_size=alive[0].block_size, running=sum(s.running for s in alive),
                           tokens_per_s=min(speeds) if speeds else 0.0, healthy=True)

    def shutdown(self) -> None:
        for e in self._members.values():
            e.shutdown()

    # -- failures -----------------------------------------------------------------------------

    def _lose(self, member: str, reason: str) -> None:
        if member in self.down:
            return
        self.down[member] = reason
        for gid, m in list(self._where.items()):
            if m == member:
                del self._where[gid]
                self._lost.append((gid, f"engine {member} failed: {reason}"))
                self.counters.lost += 1
        for gid, m in list(self._home.items()):
            if m == member:
                del self._home[gid]
        self._load[member] = 0
        try:
            self._members[member].shutdown()
        except Exception:  # noqa: BLE001 - it already failed; closing is best effort
            pass

    def _all_down(self) -> str:
        why = "; ".join(f"{m}: {r}" for m, r in self.down.items())
        return f"every engine of the pool failed ({why})"

"""The planner's side of the engine (core/planner.py's part): KV pinned by suspended generations
and its release when it stalls the engine, the engine supervisor (restart, re-queue), an engine
pool's lost members, the engine checks made when an engine is installed."""

from __future__ import annotations

from .engine import Engine, EngineError, EngineFleet
from .policies import Policy
from .types import GenState, Generation

_CACHE_ONLY = frozenset({"cache"})


def as_fleet(engine: Engine) -> EngineFleet | None:
    """The engine as an engine pool if it is one (it subclasses `EngineFleet`)."""
    return engine if isinstance(engine, EngineFleet) else None


def check_engine_scheduling(engine: Engine, policy: Policy) -> None:
    """A policy that relies on the engine's priority scheduling (vllm-priority) needs an engine
    started with it; an engine that says how it schedules (`scheduling_policy`) is checked here,
    so the mistake is one clear error and not a silent FCFS run (or a refused add per request)."""
    want = policy.engine_scheduling
    have = engine.scheduling_policy
    if want == "priority" and isinstance(have, str) and have != want:
        raise ValueError(f"policy {policy.name!r} needs an engine with scheduling_policy='priority' "
                         f"(vLLM's priority scheduling); this engine has {have!r}")


class EngineSupervision:
    """Mixin of `Planner` (uses its state; see there): pinned KV, engine failure and replacement."""

    def _suspend_kv(self, g: Generation, mode: str) -> None:
        """Suspend g in the engine with KV handling `mode`; remember who holds preserved KV."""
        live = self._live.get(g.gen_id)
        if mode == "preserve" and live is not None and live.spec is not None:
            mode = "cache"  # its tokens past the blocking statement may be rolled back
        self.engine.abort(g.gen_id, mode)
        if mode == "preserve":
            self._pinned[g.gen_id] = None
        else:
            self._pinned.pop(g.gen_id, None)

    def _release_pinned(self) -> int:
        """Turn the preserved KV of every suspended generation into cached KV (vLLM's "cache":
        freed, reused on resume unless evicted first) and return how many were released.

        Called only when pinned memory stalls the engine: the best waiting generation does not
        fit in an empty engine, or the engine cannot run the generations it holds.  Preserving
        (LAMPS / InferCept) is chosen because it wastes the least memory × time while the robot
        acts; once it keeps the engine idle it wastes all of it, more than any recompute.
        Released in order of expected resume, latest first (a generation waiting for a blocking
        skill's result before a ready one; otherwise oldest suspension first), so the prefix
        cache evicts the KV needed last first."""
        if not self._pinned:
            return 0
        gens = self.generations
        pinned = [g for gid in self._pinned if (g := gens.get(gid)) is not None
                  and g.state in (GenState.SUSPENDED, GenState.WAITING)]
        self._pinned.clear()
        pinned.sort(key=lambda g: g.state is not GenState.WAITING)  # stable: WAITING first
        for g in pinned:
            try:
                self.engine.abort(g.gen_id, "cache")
            except EngineError:
                return 0  # the engine is failing: the caller gives up on it
            g.kv_released += 1
            self.policy.on_kv_released(g)
        self.kv_released += len(pinned)
        self._stats = None
        return len(pinned)

    def _kv_modes(self) -> frozenset[str]:
        """The KV modes the engine honours on abort (`Engine.kv_modes`; "cache" if it says none)."""
        modes = self.engine.kv_modes
        if isinstance(modes, frozenset) and modes:
            return modes
        try:
            return frozenset(modes) or _CACHE_ONLY
        except TypeError:
            return _CACHE_ONLY

    def _engine_failed(self, reason: str) -> None:
        """The engine raised: its KV is lost, our token records are not.  With a supervisor
        (`engine_restart`) and restarts left, the engine is rebuilt and the generations it was
        running are re-queued (they resume from their token ids, re-prefilling); otherwise they
        fail with the reason and new requests are refused until `replace_engine`."""
        running = [g for g in self.live() if g.state is GenState.RUNNING]
        if self.engine_restart is not None and self.engine_restarts < self.config.max_engine_restarts:
            try:
                engine = self.engine_restart(self.engine)
            except Exception as e:  # noqa: BLE001 - a failed restart is reported, not raised
                reason = f"{reason}; restart failed: {e}"
            else:
                self.engine_restarts += 1
                self.engine, self._fleet, self._stats = engine, as_fleet(engine), None
                self._pinned.clear()  # the old engine's KV is gone
                now = self.clock.now()
                for g in running:
                    g.engine_restarts += 1
                    self._requeue(g, now)
                return
        self.engine_healthy = False  # from here on _end does not touch the engine
        for g in self.live():
            if g.state is not GenState.DRAINING:  # all that still needs the engine (DRAINING: plan done)
                self._end(g, GenState.FAILED, f"engine failure: {reason}", cancel_robot=True)

    def _requeue(self, g: Generation, now: float) -> None:
        """g's engine lost its KV: g waits again and resumes from its token record (re-prefill);
        the caller has counted why (`Generation.engine_restarts` / `engine_lost`)."""
        g.state = GenState.SUSPENDED if g.segments else GenState.QUEUED
        g.ready_since = now
        self._notify(g)

    def _requeue_lost(self, now: float) -> None:
        """Re-queue the running generations of pool members that failed."""
        assert self._fleet is not None
        for gid, _why in self._fleet.take_lost():
            g = self.generations.get(gid)
            if g is not None and g.state is GenState.RUNNING:
                g.engine_lost += 1
                self._requeue(g, now)
        self._stats = None

    def replace_engine(self, engine: Engine) -> None:
        """After an engine restart: serve the remaining generations on the new one."""
        with self._lock:
            check_engine_scheduling(engine, self.policy)
            self.engine = engine
            self._fleet = as_fleet(engine)
            self.engine_healthy = True
            self._stats = None
            self._pinned.clear()

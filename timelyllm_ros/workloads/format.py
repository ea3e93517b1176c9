"""LRTrace workload files (paper §6, Table 3): parsing, validation and deterministic expansion.

A workload file describes *how* requests arrive; the tasks themselves (task text, scenes and the
reference plan the simulated LLM "generates") live in ``workloads/lrtrace_tasks.yaml`` and are
passed in as a catalog.  Format::

    name: WID1
    description: mixed TUF                  # optional
    duration_s: 260                         # events arrive in [0, duration_s)
    seed: 1                                 # expansion is a pure function of the file + seed
    network_latency_s: 0.008                # per dispatched segment (paper: 8 ms); optional
    events: {rate_per_s: 0.25, max_tasks_per_event: 8}   # Poisson events, 1..max tasks each
    # events: {rate_per_s: 0.05, min_tasks_per_event: 32, max_tasks_per_event: 48}  # min..max (bursts)
    # events:                               # ... or phases: each from its from_s to the next's
    #   - {rate_per_s: 0.5, max_tasks_per_event: 4}              # (the first from 0)
    #   - {from_s: 20, rate_per_s: 8, max_tasks_per_event: 4}    # a surge after a light start
    agents: {tello: 25}                     # count per robot type ...
    # agents: [{robot_id: drone0, robot_type: tello}, ...]   # ... or an explicit list
    traces: [1, 2, 3, 4, 5, 6, 7, 8]        # task ids (n -> "Tn") drawn uniformly per task
    tuf:                                    # per task category; validated by core.tuf.TUF
      normal: {ert: 1.0, alpha: -2.0, beta: 1.0}
      urgent: {ert: 0.2, alpha: -6.67, beta: 2.0}
    requests:                               # optional hand-written arrivals (added to the above)
      - {time: 1.5, task: T6, scene: 0, robot_id: tello3}   # scene index (default 0); robot_id optional

Malformed files are rejected with ``file:line: where: reason`` (line numbers come from the YAML
node tree, so they point at the offending key or value).

Agent choice.  Arrivals are fixed before the simulation so every policy sees exactly the same
requests.  Each task goes to an agent of its robot type; an agent counts as busy from the arrival of
its request until ``arrival + expected execution time of the reference plan + agent_busy_margin_s``
(a policy-independent estimate of when the request will finish).  Among idle agents the least
recently used one is chosen; if all are busy, the least recently used agent overall (ties: the
lowest index).  A busy agent that receives another request simply gets a second concurrent request.

One module for one format (~610 lines): the YAML node walk with line numbers, the built-in scaled
loads and the expansion into arrivals share the same dataclasses and error type.
"""

from __future__ import annotations

import heapq
import math
import random
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

import yaml

from ..core.robots import RobotSpec
from ..core.tuf import TUF, TUFError
from ..core.types import PlanRequest
from ..paths import data_dir

WORKLOADS_DIR = data_dir("workloads")
DEFAULT_NETWORK_LATENCY_S = 0.008
DEFAULT_BUSY_MARGIN_S = 2.0
_ID_RE = re.compile(r"^[A-Za-z0-9_.:/-]{1,64}$")
# a skill call, with or without arguments ("tp;", "mf(100);"); quoted strings are skipped whole
_CALL_RE = re.compile(r"'[^']*'|\"[^\"]*\"|\b([A-Za-z_][A-Za-z0-9_]*)\s*(?:\(([^()]*)\))?")
_TOP_KEYS = {"name", "description", "duration_s", "seed", "network_latency_s", "events", "agents",
             "traces", "tuf", "requests", "agent_busy_margin_s"}


class WorkloadError(ValueError):
    """A workload file is malformed or refers to unknown tasks / robot types."""


# --- catalog (the tasks module): what a workload needs of a task --------------------------------

class SceneLike(Protocol):  # catalog.Scene
    scene: str
    plan: str


class TaskLike(Protocol):  # catalog.TaskDef
    task_id: str
    robot_type: str
    category: str
    task: str
    scenes: Sequence[SceneLike]


# --- parsed workload ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Agent:
    robot_id: str
    robot_type: str


@dataclass(frozen=True, slots=True)
class ExplicitRequest:
    time: float
    task: str
    scene: int | None
    robot_id: str | None
    request_id: str | None
    path: tuple  # where in the file, for error messages


@dataclass(frozen=True, slots=True)
class EventPhase:
    """A phase of the generated arrivals: from `from_s` (to the next phase's, or the workload's
    end) events come at `rate_per_s` with min..max tasks each."""

    from_s: float
    rate_per_s: float
    min_tasks_per_event: int = 1
    max_tasks_per_event: int = 1


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    description: str
    duration_s: float
    seed: int
    network_latency_s: float
    rate_per_s: float
    max_tasks_per_event: int
    agents: tuple[Agent, ...]
    traces: tuple[str, ...]
    tuf: Mapping[str, TUF]
    requests: tuple[ExplicitRequest, ...]
    agent_busy_margin_s: float = DEFAULT_BUSY_MARGIN_S
    source: str = "<workload>"
    min_tasks_per_event: int = 1  # tasks per event are drawn uniformly from min..max
    # phases after the first (whose rate and tasks per event are the fields above), by from_s
    later_phases: tuple[EventPhase, ...] = ()
    lines: Mapping[tuple, int] = field(default_factory=dict, compare=False, repr=False)

    @property
    def phases(self) -> tuple[EventPhase, ...]:
        """Every phase of the generated arrivals, the first (the fields above, from 0) included."""
        return (EventPhase(0.0, self.rate_per_s, self.min_tasks_per_event, self.max_tasks_per_event),
                *self.later_phases)

    def where(self, path: tuple) -> str:
        """``source:line: a.b[2]`` for the deepest part of path that exists in the file."""
        return _where(self.source, self.lines, path)


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request of an expanded workload, in arrival order."""

    time: float
    request_id: str
    robot_id: str
    robot_type: str
    task_id: str
    category: str
    task: str
    scene_index: int
    scene: str
    reference_plan: str
    tuf: TUF

    def to_request(self) -> PlanRequest:
        return PlanRequest(
            request_id=self.request_id, robot_id=self.robot_id, robot_type=self.robot_type,
            task=self.task, scene=self.scene, tuf=self.tuf, arrival=self.time, task_type=self.task_id,
            category=self.category, reference_plan=self.reference_plan,
        )


# --- YAML with line numbers -----------------------------------------------------------------------

def _fmt_path(path: tuple) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "<top>"


def _where(source: str, lines: Mapping[tuple, int], path: tuple) -> str:
    for n in range(len(path), -1, -1):
        if path[:n] in lines:
            return f"{source}:{lines[path[:n]]}: {_fmt_path(path)}"
    return f"{source}: {_fmt_path(path)}"


def _compose(text: str, source: str) -> tuple[Any, dict[tuple, int]]:
    """Parse YAML into plain data plus the 1-based line of every mapping key / list item."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise WorkloadError(f"{source}{line}: not valid YAML: {getattr(e, 'problem', None) or e}") from e
    if root is None:
        raise WorkloadError(f"{source}: empty workload file")
    lines: dict[tuple, int] = {(): root.start_mark.line + 1}
    constructor = yaml.SafeLoader("")

    def build(node: yaml.Node, path: tuple) -> Any:
        if isinstance(node, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for knode, vnode in node.value:
                if not isinstance(knode, yaml.ScalarNode):
                    raise WorkloadError(f"{source}:{knode.start_mark.line + 1}: {_fmt_path(path)}: "
                                        "mapping keys must be plain scalars")
                key = constructor.construct_object(knode, deep=True)
                if key in out:
                    raise WorkloadError(f"{source}:{knode.start_mark.line + 1}: {_fmt_path(path + (key,))}: "
                                        "duplicate key")
                lines[path + (key,)] = knode.start_mark.line + 1
                out[key] = build(vnode, path + (key,))
            return out
        if isinstance(node, yaml.SequenceNode):
            items = []
            for i, item in enumerate(node.value):
                lines[path + (i,)] = item.start_mark.line + 1
                items.append(build(item, path + (i,)))
            return items
        try:
            return constructor.construct_object(node, deep=True)
        except yaml.YAMLError as e:
            raise WorkloadError(f"{source}:{node.start_mark.line + 1}: {_fmt_path(path)}: {e}") from e

    return build(root, ()), lines


# --- validation -----------------------------------------------------------------------------------

class _V:
    """Field checks that raise WorkloadError located at the offending line."""

    def __init__(self, source: str, lines: dict[tuple, int]) -> None:
        self.source, self.lines = source, lines

    def fail(self, path: tuple, reason: str) -> WorkloadError:
        return WorkloadError(f"{_where(self.source, self.lines, path)}: {reason}")

    def number(self, v: Any, path: tuple, *, lo: float | None = None, strict: bool = False) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v in (float("inf"), float("-inf")):
            raise self.fail(path, f"must be a finite number, got {v!r}")
        if lo is not None and (v < lo or (strict and v == lo)):
            raise self.fail(path, f"must be {'>' if strict else '>='} {lo:g}, got {v!r}")
        return float(v)

    def integer(self, v: Any, path: tuple, *, lo: int) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.fail(path, f"must be an integer, got {v!r}")
        if v < lo:
            raise self.fail(path, f"must be >= {lo}, got {v!r}")
        return v

    def ident(self, v: Any, path: tuple) -> str:
        if not isinstance(v, str) or not _ID_RE.match(v):
            raise self.fail(path, f"must be an id matching {_ID_RE.pattern}, got {v!r}")
        return v

    def mapping(self, v: Any, path: tuple, allowed: set[str], required: set[str] = frozenset()) -> dict:
        if not isinstance(v, dict):
            raise self.fail(path, f"must be a mapping, got {type(v).__name__}")
        for k in v:
            if k not in allowed:
                raise self.fail(path + (k,), f"unknown key (allowed: {', '.join(sorted(allowed))})")
        for k in sorted(required):
            if k not in v:
                raise self.fail(path, f"missing required key {k!r}")
        return v


def task_id(v: Any) -> str:
    """Trace ids may be written as numbers (Table 2: 1..11) or ids ("T1", "C1")."""
    if isinstance(v, bool):
        raise TypeError(v)
    return f"T{v}" if isinstance(v, int) else str(v)


def parse_workload(data: Any, source: str = "<workload>", lines: dict[tuple, int] | None = None) -> Workload:
    """Validate an already-parsed workload mapping (use load_workload for files: line numbers)."""
    lines = lines if lines is not None else {}
    v = _V(source, lines)
    d = v.mapping(data, (), _TOP_KEYS, {"name"})
    name = v.ident(d["name"], ("name",))
    desc = d.get("description", "")
    if not isinstance(desc, str):
        raise v.fail(("description",), "must be a string")
    seed = v.integer(d.get("seed", 0), ("seed",), lo=0)
    latency = v.number(d.get("network_latency_s", DEFAULT_NETWORK_LATENCY_S), ("network_latency_s",), lo=0)
    margin = v.number(d.get("agent_busy_margin_s", DEFAULT_BUSY_MARGIN_S), ("agent_busy_margin_s",), lo=0)

    phases: list[EventPhase] = []
    if "events" in d:
        evs = d["events"]
        listed = isinstance(evs, list)  # phases; a mapping is the one phase, from 0
        if listed and not evs:
            raise v.fail(("events",), "must be a mapping or a non-empty list of phases")
        keys = {"rate_per_s", "min_tasks_per_event", "max_tasks_per_event"} | ({"from_s"} if listed else set())
        for i, ev in enumerate(evs if listed else [evs]):
            p = ("events", i) if listed else ("events",)
            ev = v.mapping(ev, p, keys, {"rate_per_s"} | ({"from_s"} if i else set()))
            start = v.number(ev.get("from_s", 0.0), p + ("from_s",), lo=0)
            if i == 0 and start != 0:
                raise v.fail(p + ("from_s",), f"the first phase starts at 0, got {start:g}")
            if phases and start <= phases[-1].from_s:
                raise v.fail(p + ("from_s",), f"must be after the previous phase's ({phases[-1].from_s:g}), got {start:g}")
            rate = v.number(ev["rate_per_s"], p + ("rate_per_s",), lo=0, strict=True)
            max_tpe = v.integer(ev.get("max_tasks_per_event", 1), p + ("max_tasks_per_event",), lo=1)
            min_tpe = v.integer(ev.get("min_tasks_per_event", 1), p + ("min_tasks_per_event",), lo=1)
            if min_tpe > max_tpe:
                raise v.fail(p + ("min_tasks_per_event",),
                             f"must be <= max_tasks_per_event ({max_tpe}), got {min_tpe}")
            phases.append(EventPhase(start, rate, min_tpe, max_tpe))
    first = phases[0] if phases else EventPhase(0.0, 0.0)

    traces: list[str] = []
    if "traces" in d:
        if not isinstance(d["traces"], list) or not d["traces"]:
            raise v.fail(("traces",), "must be a non-empty list of task ids")
        for i, t in enumerate(d["traces"]):
            if isinstance(t, bool) or not isinstance(t, (int, str)):
                raise v.fail(("traces", i), f"must be a task id or number, got {t!r}")
            traces.append(v.ident(task_id(t), ("traces", i)))
    if bool(traces) != ("events" in d):
        raise v.fail(("events",) if traces else ("traces",),
                     "'events' and 'traces' go together (generated arrivals need both)")

    requests: list[ExplicitRequest] = []
    if "requests" in d:
        if not isinstance(d["requests"], list):
            raise v.fail(("requests",), "must be a list")
        for i, r in enumerate(d["requests"]):
            p = ("requests", i)
            r = v.mapping(r, p, {"time", "task", "scene", "robot_id", "request_id"}, {"time", "task"})
            t = v.number(r["time"], p + ("time",), lo=0)
            if isinstance(r["task"], bool) or not isinstance(r["task"], (int, str)):
                raise v.fail(p + ("task",), f"must be a task id, got {r['task']!r}")
            scene = r.get("scene")
            if scene is not None:
                scene = v.integer(scene, p + ("scene",), lo=0)
            rid = v.ident(r["robot_id"], p + ("robot_id",)) if "robot_id" in r else None
            qid = v.ident(r["request_id"], p + ("request_id",)) if "request_id" in r else None
            requests.append(ExplicitRequest(t, v.ident(task_id(r["task"]), p + ("task",)), scene, rid, qid, p))
        ids = [r.request_id for r in requests if r.request_id]
        dup = sorted({x for x in ids if ids.count(x) > 1})
        if dup:
            raise v.fail(("requests",), f"duplicate request_id {dup[0]!r}")
    if not traces and not requests:
        raise v.fail((), "workload has no arrivals: give events + traces, or requests")

    if "duration_s" in d:
        duration = v.number(d["duration_s"], ("duration_s",), lo=0, strict=True)
        if len(phases) > 1 and phases[-1].from_s >= duration:
            raise v.fail(("events", len(phases) - 1, "from_s"),
                         f"must be before duration_s ({duration:g}), got {phases[-1].from_s:g}")
    elif traces:
        raise v.fail((), "missing required key 'duration_s'")
    else:
        duration = max(r.time for r in requests)

    agents: list[Agent] = []
    if "agents" in d:
        a = d["agents"]
        if isinstance(a, dict):
            for rt, n in a.items():
                v.ident(rt, ("agents", rt))
                n = v.integer(n, ("agents", rt), lo=1)
                agents.extend(Agent(f"{rt}{i}", str(rt)) for i in range(n))
        elif isinstance(a, list):
            for i, item in enumerate(a):
                item = v.mapping(item, ("agents", i), {"robot_id", "robot_type"}, {"robot_id", "robot_type"})
                agents.append(Agent(v.ident(item["robot_id"], ("agents", i, "robot_id")),
                                    v.ident(item["robot_type"], ("agents", i, "robot_type"))))
        else:
            raise v.fail(("agents",), "must be a mapping robot_type -> count or a list of {robot_id, robot_type}")
        seen: set[str] = set()
        for i, ag in enumerate(agents):
            if ag.robot_id in seen:
                raise v.fail(("agents", i) if isinstance(a, list) else ("agents",), f"duplicate robot_id {ag.robot_id!r}")
            seen.add(ag.robot_id)
        if not agents:
            raise v.fail(("agents",), "no agents")
    elif traces:
        raise v.fail((), "missing required key 'agents' (generated arrivals need agents)")
    if agents:
        known = {ag.robot_id for ag in agents}
        for r in requests:
            if r.robot_id is not None and r.robot_id not in known:
                raise v.fail(r.path + ("robot_id",), f"unknown agent {r.robot_id!r}")
    elif any(r.robot_id is None for r in requests):
        bad = next(r for r in requests if r.robot_id is None)
        raise v.fail(bad.path, "robot_id is required when the workload lists no agents")

    tufs: dict[str, TUF] = {}
    tuf_raw = d.get("tuf", {})
    if not isinstance(tuf_raw, dict):
        raise v.fail(("tuf",), "must be a mapping category -> {ert, alpha, beta}")
    for cat, m in tuf_raw.items():
        v.ident(cat, ("tuf", cat))
        try:
            tufs[cat] = TUF.from_mapping(m)
        except TUFError as e:
            raise v.fail(("tuf", cat), str(e)) from e

    return Workload(
        name=name, description=desc, duration_s=duration, seed=seed, network_latency_s=latency,
        rate_per_s=first.rate_per_s, max_tasks_per_event=first.max_tasks_per_event, agents=tuple(agents),
        traces=tuple(traces), tuf=tufs, requests=tuple(requests), agent_busy_margin_s=margin, source=source,
        lines=lines, min_tasks_per_event=first.min_tasks_per_event, later_phases=tuple(phases[1:]),
    )


SCALED_DRONES_PREFIX = "drones:"


def scaled_drones(n_agents: int, *, duration_s: float = 60.0, seed: int = 11) -> Workload:
    """The scaled drone load of the regime map: WID1's shape (traces 1-8, at most 8 tasks per
    event, its TUFs) with ``n_agents`` Tello agents and events at ``0.25 * n_agents / 25`` per
    second, for ``duration_s`` seconds.  ``load_workload("drones:N")`` names it."""
    if not isinstance(n_agents, int) or isinstance(n_agents, bool) or n_agents < 1:
        raise WorkloadError(f"scaled drone load: agent count must be an integer >= 1, got {n_agents!r}")
    base = load_workload("WID1")
    return replace(
        base, name=f"{SCALED_DRONES_PREFIX}{n_agents}",
        description=f"WID1-shaped drone load scaled to {n_agents} Tello agents",
        duration_s=float(duration_s), seed=seed, rate_per_s=base.rate_per_s * n_agents / 25,
        agents=tuple(Agent(f"tello{i}", "tello") for i in range(n_agents)),
        source=f"{SCALED_DRONES_PREFIX}{n_agents}", lines={},
    )


def load_workload(path_or_name: str | Path) -> Workload:
    """Load a workload file; a bare name such as ``WID1`` means ``workloads/WID1.yaml``;
    ``drones:N`` means :func:`scaled_drones` with N agents."""
    name = str(path_or_name)
    if name.startswith(SCALED_DRONES_PREFIX) and not Path(name).exists():
        count = name[len(SCALED_DRONES_PREFIX):]
        if not count.isdigit():
            raise WorkloadError(f"workload {name!r}: expected drones:N with N a positive integer")
        return scaled_drones(int(count))
    p = Path(path_or_name)
    if not p.exists() and not p.suffix and (WORKLOADS_DIR / f"{p}.yaml").exists():
        p = WORKLOADS_DIR / f"{p}.yaml"
    try:
        text = p.read_text()
    except OSError as e:
        known = ", ".join(list_workloads()) or "none"
        raise WorkloadError(f"cannot read workload {str(path_or_name)!r}: {e.strerror or e} "
                            f"(bundled workloads: {known})") from e
    data, lines = _compose(text, str(p))
    return parse_workload(data, str(p), lines)


def list_workloads() -> list[str]:
    """Names of the bundled workload files (task catalogs, `*_tasks.yaml`, excluded)."""
    return sorted(p.stem for p in WORKLOADS_DIR.glob("*.yaml") if not p.stem.endswith("_tasks"))


def default_catalog(robots: Mapping[str, RobotSpec] | None = None,
                    paths: Sequence[str | Path] | None = None) -> dict[str, Any]:
    """Task catalog for workloads: every bundled ``workloads/*_tasks.yaml`` (LRTrace T1-T11, C1-C3,
    chat tasks, ...) merged, or the given catalog files.  A task id defined twice is an error."""
    from .catalog import load_tasks

    files = [Path(p) for p in paths] if paths else sorted(WORKLOADS_DIR.glob("*_tasks.yaml"))
    merged: dict[str, Any] = {}
    origin: dict[str, Path] = {}
    for f in files:
        try:
            tasks = load_tasks(f, robots=dict(robots) if robots is not None else None)
        except ValueError as e:
            raise WorkloadError(str(e)) from e
        for tid, t in tasks.items():
            if tid in merged:
                raise WorkloadError(f"task {tid!r} is defined in both {origin[tid]} and {f}")
            merged[tid], origin[tid] = t, f
    return merged


# --- expansion ------------------------------------------------------------------------------------

def plan_exec_estimate(plan: str, robot: RobotSpec | None) -> float:
    """Expected execution time of a reference plan: profile means, variable skills at the mean of
    their uniform range (not the scheduler's min_s: here an underestimate would hand a robot a new
    task while it is still busy).

    A rough, policy-independent estimate used only to decide when an agent is free again; loops and
    conditionals count once.  Chat plans are read at the robot's words-per-minute.
    """
    if robot is None:
        return 0.0
    if robot.language == "sentence":
        return len(plan.split()) * 60.0 / robot.words_per_minute
    total = 0.0
    for abbr, raw in _CALL_RE.findall(plan):
        spec = robot.skill(abbr) if abbr else None
        if spec is None:
            continue
        args: dict[str, Any] = {}
        for a, s in zip(spec.args, (x.strip() for x in raw.split(","))):
            try:
                args[a.name] = float(s)
            except ValueError:
                pass
        m = spec.exec_time
        total += (float(m.min_s or 0.0) + float(m.max_s)) / 2 if m.variable else m.nominal(args)
    return total


class _AgentPicker:
    """The agent `expand` gives an arrival at time t: among the type's agents idle at t
    (busy_until <= t) the least recently used (ties: list order), else — all busy — the least
    recently used of all.  The same choice as scanning the pool per arrival, in O(log n): arrival
    times never decrease, so an agent idle at t stays idle until it is given work (`touched`).

    `busy` holds (busy_until, index, version, id) of agents that may still be busy, `idle` holds
    (last_used, index, version, id) of agents known idle; an entry whose version is not the
    agent's current one is stale and skipped."""

    def __init__(self, pool: Sequence[Agent], index: Mapping[str, int]) -> None:
        self.pool = list(pool)
        self.index = index
        self.version = {a.robot_id: 0 for a in pool}
        self.busy: list[tuple[float, int, int, str]] = [(0.0, index[a.robot_id], 0, a.robot_id) for a in pool]
        heapq.heapify(self.busy)
        self.idle: list[tuple[float, int, int, str]] = []

    def touched(self, robot_id: str, busy_until: float) -> None:
        """robot_id got work (busy until `busy_until`, last used now)."""
        v = self.version[robot_id] + 1
        self.version[robot_id] = v
        heapq.heappush(self.busy, (busy_until, self.index[robot_id], v, robot_id))

    def pick(self, t: float, busy_until: Mapping[str, float], last_used: Mapping[str, float]) -> str:
        busy, idle, version = self.busy, self.idle, self.version
        while busy and busy[0][0] <= t:
            _, i, v, rid = heapq.heappop(busy)
            if version[rid] == v:
                heapq.heappush(idle, (last_used[rid], i, v, rid))
        while idle and version[idle[0][3]] != idle[0][2]:
            heapq.heappop(idle)
        if idle:
            return idle[0][3]
        index = self.index
        return min(self.pool, key=lambda a: (last_used[a.robot_id], index[a.robot_id])).robot_id


def expand(workload: Workload, catalog: Mapping[str, TaskLike], robots: Mapping[str, RobotSpec] | None = None,
           *, seed: int | None = None,
           busy_estimate: Callable[[TaskLike, SceneLike], float] | None = None) -> list[Arrival]:
    """The workload's arrivals, sorted by (time, request_id): a pure function of file, catalog, seed.

    ``seed`` overrides the file's seed.  Unknown tasks, tasks whose robot type has no agent, unknown
    scenes and categories without a TUF are rejected with the file location.
    """
    rng = random.Random(workload.seed if seed is None else seed)
    robots = robots or {}

    def est(task: TaskLike, scene: SceneLike) -> float:
        base = busy_estimate(task, scene) if busy_estimate else plan_exec_estimate(scene.plan, robots.get(task.robot_type))
        return base + workload.agent_busy_margin_s

    by_type: dict[str, list[Agent]] = {}
    by_robot: dict[str, str] = {}
    for ag in workload.agents:
        by_type.setdefault(ag.robot_type, []).append(ag)
        by_robot[ag.robot_id] = ag.robot_type

    def lookup(tid: str, path: tuple) -> TaskLike:
        task = catalog.get(tid)
        if task is None:
            raise WorkloadError(f"{workload.where(path)}: unknown task {tid!r} (known: {', '.join(sorted(catalog))})")
        if robots and task.robot_type not in robots:
            raise WorkloadError(f"{workload.where(path)}: task {tid!r} needs robot type {task.robot_type!r}, "
                                f"which has no robot definition")
        if workload.agents and task.robot_type not in by_type:
            raise WorkloadError(f"{workload.where(path)}: task {tid!r} needs a {task.robot_type!r} agent, "
                                f"but the workload has none")
        if task.category not in workload.tuf:
            raise WorkloadError(f"{workload.where(('tuf',))}: no TUF for category {task.category!r} "
                                f"(task {tid!r})")
        if not task.scenes:
            raise WorkloadError(f"{workload.where(path)}: task {tid!r} has no scenes")
        return task

    if robots:
        for i, ag in enumerate(workload.agents):
            if ag.robot_type not in robots:
                raise WorkloadError(f"{workload.where(('agents',))}: agent {ag.robot_id!r} has robot type "
                                    f"{ag.robot_type!r}, which has no robot definition (known: "
                                    f"{', '.join(sorted(robots))})")
    for i, tid in enumerate(workload.traces):
        lookup(tid, ("traces", i))

    # raw arrivals: (time, order, task, scene, fixed robot_id, fixed request_id)
    raw: list[tuple[float, int, TaskLike, int, str | None, str | None]] = []
    order = 0
    if workload.traces:
        phases = workload.phases
        for k, ph in enumerate(phases):  # a Poisson process per phase (memoryless: restarted at its start)
            # (a phase past a shortened duration_s, `dataclasses.replace`, generates nothing)
            end = min(phases[k + 1].from_s if k + 1 < len(phases) else math.inf, workload.duration_s)
            t = ph.from_s
            while True:
                t += rng.expovariate(ph.rate_per_s)
                if t >= end:
                    break
                for _ in range(rng.randint(ph.min_tasks_per_event, ph.max_tasks_per_event)):
                    task = catalog[rng.choice(workload.traces)]
                    raw.append((t, order, task, rng.randrange(len(task.scenes)), None, None))
                    order += 1
    for r in workload.requests:
        task = lookup(r.task, r.path + ("task",))
        si = r.scene or 0
        if si >= len(task.scenes):
            raise WorkloadError(f"{workload.where(r.path + ('scene',))}: task {r.task!r} has "
                                f"{len(task.scenes)} scenes, index {si} is out of range")
        if r.robot_id is not None and workload.agents:
            rt = next(a.robot_type for a in workload.agents if a.robot_id == r.robot_id)
            if rt != task.robot_type:
                raise WorkloadError(f"{workload.where(r.path + ('robot_id',))}: agent {r.robot_id!r} is a "
                                    f"{rt!r}, task {r.task!r} needs a {task.robot_type!r}")
        raw.append((r.time, order, task, si, r.robot_id, r.request_id))
        order += 1
    raw.sort(key=lambda x: (x[0], x[1]))

    busy_until: dict[str, float] = {ag.robot_id: 0.0 for ag in workload.agents}
    last_used: dict[str, float] = {ag.robot_id: -1.0 for ag in workload.agents}
    index = {ag.robot_id: i for i, ag in enumerate(workload.agents)}
    pickers = ({rt: _AgentPicker(pool, index) for rt, pool in by_type.items()}
               if len(index) == len(workload.agents) else None)
    out: list[Arrival] = []
    taken = {x[5] for x in raw if x[5]}
    n = 0
    for t, _, task, si, robot_id, request_id in raw:
        scene = task.scenes[si]
        if robot_id is None:
            pool = by_type[task.robot_type]
            if pickers is not None:
                robot_id = pickers[task.robot_type].pick(t, busy_until, last_used)
            else:  # duplicate agent ids (only a hand-built Workload): the plain scan
                idle = [a for a in pool if busy_until[a.robot_id] <= t]
                agent = min(idle or pool, key=lambda a: (last_used[a.robot_id], index[a.robot_id]))
                robot_id = agent.robot_id
        if robot_id in busy_until:
            busy_until[robot_id] = max(busy_until[robot_id], t) + est(task, scene)
            last_used[robot_id] = t
            if pickers is not None:
                pickers[by_robot[robot_id]].touched(robot_id, busy_until[robot_id])
        if request_id is None:
            while True:
                request_id = f"{workload.name}.{n:04d}"
                n += 1
                if request_id not in taken:
                    break
        out.append(Arrival(
            time=t, request_id=request_id, robot_id=robot_id, robot_type=task.robot_type,
            task_id=task.task_id, category=task.category, task=task.task, scene_index=si,
            scene=scene.scene, reference_plan=scene.plan, tuf=workload.tuf[task.category],
        ))
    return out

"""The regime map's pure evaluation: one policy in one cell, and the isolated-service bound.

A *cell* is (load, capacity, engine profile):

* load: any name ``load_workload`` accepts (``WID1``, ``chat_mixed``, ``drones:800``, a path);
* capacity: ``default`` (the runner's batching: latency-guided for segmenting policies, vLLM's
  256 for the others), ``kv/N`` (the profile's KV memory divided by N, default batching) or
  ``capN`` (a fixed batch cap of N for every policy, full KV memory);
* profile: a ``profiles/*.yaml`` name or a path;
* engine kind (the capability column, ``ENGINE_KINDS``): ``stock`` — vLLM as users run it, in
  process or ``vllm serve``, ``Engine.kv_modes`` {cache, discard}: abort frees the KV, a resume
  goes through the prefix cache, and a policy asking to preserve or swap gets "cache", exactly as
  `VllmEngine` serves it — the headline; ``preserve`` — an InferCept/LAMPS-style engine that
  can also pin (preserve), swap and evict a paused request's KV (`engines/kv_cache.EngineKind`).

Every policy of a cell replays the same arrivals (same workload, same seed).  ``run_cell_policy``
returns the figures of the map — accrued utility of the whole plan (Eq. 3) and first-action
utility (Eq. 1), overall / urgent / normal as % of max, mean / p99 completion, p99 / max
continuation wait, the ``core/metrics.plan_summary`` block under the names of ``timelyllm bench``,
Andes' chat QoE, Trail's mean latency — plus the per-request utilities needed to compare with the
bounds.

**Isolated-service bound of Eq. 3** (``isolated_plan``): every request of the cell alone on an
idle engine of the profile (prompt cached, as below), with its real request and robot ids and the
cell's seed, so its robot's sampled execution times, answers and plan path are the ones of the
cell's runs; the engine generates its segments at that profile's speed.  Alone, streaming the
whole plan (``PLAN_BOUND_POLICY`` = vllm-stream: every statement dispatched as soon as it is
generated, nothing suspended, nothing sharing a step) is the as-soon-as-possible schedule: no
action can start earlier, so by TUF0/TUF1 being non-increasing no scheduler earns more on that
request (checked: on WID1, chat_mixed and drones samples on both profiles and both engine kinds,
no registered policy alone earned more than it; the test suite checks every policy against it
request by request on a contended cell).  It never suspends, so it is the same for both engine
kinds and every capacity; it is computed per request (execution times differ per request).

**Isolated-service bound of the first action.**  The best a request can get is to be served alone on an idle engine:
no other request shares a step, nothing queues.  ``isolated_response`` simulates exactly that: a
fresh engine of the cell's profile whose prefix cache already holds the request's whole prompt
(an identical earlier request is the most a real history can have cached: a cold cache would be
beaten by any policy that reuses the robot type's shared prefix), then the request alone,
served by every registered policy in turn; the bound is the earliest first action any of them
achieves.  Its utility is the request's own TUF at that response time (TUFs are non-increasing,
so no scheduler on that profile can do better for that request).  The response depends only on
(task, scene, robot type, profile, network latency), so callers cache it on that key.  KV memory
and batch caps do not bind a request served alone (its prompt fits: otherwise every policy of the
cell fails), so the bound of a cell uses the profile's full memory.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..core.metrics import plan_summary
from ..core.policies import policy_names
from ..core.robots import RobotSpec
from ..core.types import Generation, GenState
from ..engines.simulated import PROFILES_DIR, LatencyProfile
from ..inputs import InputError
from ..workloads.format import Arrival, Workload, expand, load_workload
from ..workloads.catalog import TaskDef
from .runner import run_simulation

CATEGORIES = ("urgent", "normal")
# figures of a run and which way is better (+1: higher, -1: lower); the cell names the best policy of each
BEST_FIELDS = {"accrued_total_pct": 1.0, "accrued_urgent_pct": 1.0, "accrued_normal_pct": 1.0,
               "total_pct": 1.0, "urgent_pct": 1.0, "normal_pct": 1.0, "completion_mean_s": -1.0,
               "continuation_wait_p99_s": -1.0, "chat_qoe": 1.0, "mean_latency_s": -1.0}
TIE_TOLERANCE = 0.05  # points (or QoE / seconds): policies this close to the best tie with it
WARM_GAP_S = 1.0  # virtual seconds between the warm-up prefill and the isolated request


class GridError(InputError):
    """A grid entry (load, capacity, profile) is malformed; the message says which (one line)."""


class CellTimeout(Exception):
    """A run passed its wall-clock limit (the cell is reported as ``timeout``, never dropped)."""


# --------------------------------------------------------------------------------------- grid

@dataclass(frozen=True, slots=True)
class Capacity:
    """How much engine a cell has: default batching, a KV memory fraction, or a fixed cap."""

    label: str
    kv_divisor: int = 1
    max_batch: int | None = None

    def profile(self, base: LatencyProfile) -> LatencyProfile:
        if self.kv_divisor == 1:
            return base
        return dataclasses.replace(base, kv_capacity_blocks=max(1, base.kv_capacity_blocks // self.kv_divisor))


_CAP_RE = re.compile(r"^(?:(default)|kv/(\d+)|cap(\d+))$")


def parse_capacity(s: str) -> Capacity:
    """``default`` | ``kv/N`` (KV memory / N) | ``capN`` (fixed batch cap N)."""
    m = _CAP_RE.match(s.strip())
    if not m:
        raise GridError(f"capacity {s!r}: expected default, kv/N (KV memory / N) or capN (fixed batch cap)")
    if m.group(1):
        return Capacity("default")
    n = int(m.group(2) or m.group(3))
    if n < 1:
        raise GridError(f"capacity {s!r}: N must be >= 1")
    if m.group(2):
        return Capacity(f"kv/{n}", kv_divisor=n)
    return Capacity(f"cap{n}", max_batch=n)


def resolve_profile(name: str) -> Path:
    """A bundled profile name (``rtx4090_llama3_8b``) or a YAML path."""
    p = Path(name)
    if p.suffix in (".yaml", ".yml") and p.is_file():
        return p
    bundled = PROFILES_DIR / f"{name}.yaml"
    if bundled.is_file():
        return bundled
    known = ", ".join(sorted(q.stem for q in PROFILES_DIR.glob("*.yaml")))
    raise GridError(f"profile {name!r}: no such file or bundled profile (bundled: {known})")


def check_load(name: str) -> Workload:
    from ..workloads.format import WorkloadError

    try:
        return load_workload(name)
    except WorkloadError as e:
        raise GridError(f"load {name!r}: {e}") from None


def check_policies(names: Sequence[str]) -> list[str]:
    """Every name a registered policy, none twice (``inputs.check_policies``)."""
    from ..inputs import check_policies

    check_policies(names, arg="--policies")
    return list(names)


ENGINE_KINDS = ("stock", "preserve")  # the map's capability columns (engines/kv_cache.EngineKind); first = headline


def check_engine_kinds(names: Sequence[str]) -> list[str]:
    """Every name an engine kind (``stock`` | ``preserve``), none twice."""
    for n in names:
        if n not in ENGINE_KINDS:
            raise GridError(f"engine kind {n!r}: expected one of {', '.join(ENGINE_KINDS)} (stock: vLLM as users "
                            f"run it, no preserve; preserve: an InferCept/LAMPS-style engine that can pin KV)")
    dup = sorted({n for n in names if list(names).count(n) > 1})
    if dup:
        raise GridError(f"engine kind {dup[0]!r} given twice")
    return list(names)


@dataclass(frozen=True, slots=True)
class Cell:
    load: str
    capacity: str
    profile: str  # profile name or path as given
    engine: str = "stock"  # engine kind: the capability column (ENGINE_KINDS)

    @property
    def key(self) -> str:
        return f"{self.load} | {self.capacity} | {Path(self.profile).stem} | {self.engine}"


def parse_cell_key(key: str) -> Cell:
    """PROFILE/ENGINE/LOAD/CAPACITY, as the stored maps' cells are named (`benchmarks/rejudge.py`;
    the capacity may hold a slash: kv/4) -> a Cell; GridError on another form, an unknown engine
    kind or capacity (the profile and load are checked where they are loaded)."""
    parts = key.split("/", 3)
    if len(parts) != 4 or not all(parts):
        raise GridError(f"cell {key!r}: expected PROFILE/ENGINE/LOAD/CAPACITY, "
                        f"e.g. rtx4090_llama3_8b/stock/drones:400/cap8")
    profile, engine, load, capacity = parts
    check_engine_kinds([engine])
    parse_capacity(capacity)
    return Cell(load=load, capacity=capacity, profile=profile, engine=engine)


# --------------------------------------------------------------------------------------- one run

def _pct(agg: Mapping[str, Any] | None) -> float | None:
    return None if agg is None else agg.get("utility_pct_of_max")


def _acc(agg: Mapping[str, Any] | None) -> float | None:
    return None if agg is None else agg.get("accrued_utility_pct_of_max")


def mean_latency_s(gens: Sequence[Generation]) -> float | None:
    """Trail's request latency (last token − arrival), mean over finished requests; the last
    token is taken as the end of the last generated segment."""
    lat = []
    for g in gens:
        if g.state is GenState.FINISHED and g.segments:
            end = max((s.gen_end for s in g.segments if s.gen_end is not None), default=None)
            if end is not None:
                lat.append(end - g.request.arrival)
    return math.fsum(lat) / len(lat) if lat else None


def map_cell_key(cell: Mapping[str, Any]) -> str:
    """A stored map's cell record -> its PROFILE/ENGINE/LOAD/CAPACITY name (`parse_cell_key`'s
    form; maps swept before the engine column count as stock)."""
    return f"{cell['profile']}/{cell.get('engine', 'stock')}/{cell['load']}/{cell['capacity']}"


def cell_profile(cell: Cell) -> LatencyProfile:
    """The cell's engine: its profile's latency model with the capacity's KV memory."""
    return parse_capacity(cell.capacity).profile(LatencyProfile.from_yaml(resolve_profile(cell.profile)))


def run_cell_policy(cell: Cell, policy: str, *, seed: int | None = None,
                    robots: Mapping[str, RobotSpec] | None = None, catalog: Mapping[str, TaskDef] | None = None,
                    timeout_s: float | None = None) -> dict[str, Any]:
    """One policy on one cell: the map's figures, or ``{"status": "timeout" | "error", ...}``.

    Never raises for a run that fails or times out: the cell records it (with the reason)."""
    cap = parse_capacity(cell.capacity)
    profile = cell_profile(cell)
    wall0 = time.perf_counter()
    deadline = None if not timeout_s else wall0 + timeout_s

    def watchdog(now: float, done: int, total: int) -> None:
        if deadline is not None and time.perf_counter() > deadline:
            raise CellTimeout(f"wall limit {timeout_s:g} s passed at virtual t={now:.1f} s, {done}/{total} done")

    try:
        r = run_simulation(check_load(cell.load), policy, max_batch=cap.max_batch, seed=seed, profile_path=profile,
                           robots=robots, catalog=catalog, progress=watchdog, progress_every=20,
                           engine_kind=cell.engine)
    except CellTimeout as e:
        return {"status": "timeout", "reason": str(e), "wall_s": time.perf_counter() - wall0}
    except Exception as e:  # noqa: BLE001 — a failing run is a result of the map, reported with its reason
        return {"status": "error", "reason": f"{type(e).__name__}: {e}", "wall_s": time.perf_counter() - wall0}
    m = r.metrics
    cats = m["by_category"]
    qoe = m.get("qoe")
    ov = m["overall"]
    return {
        "status": "ok",
        "requests": ov["count"],
        "accrued_total_pct": _acc(ov),
        "accrued_urgent_pct": _acc(cats.get("urgent")),
        "accrued_normal_pct": _acc(cats.get("normal")),
        "total_pct": _pct(ov),
        "urgent_pct": _pct(cats.get("urgent")),
        "normal_pct": _pct(cats.get("normal")),
        "completion_mean_s": ov["completion_s"]["mean"],
        "completion_p99_s": ov["completion_s"]["p99"],
        "continuation_wait_p99_s": ov["continuation_wait_s"]["p99"],
        "continuation_wait_max_s": ov["continuation_wait_s"]["max"],
        "metrics": plan_summary(m),
        "chat_qoe": qoe["qoe_mean"] if qoe else None,
        "mean_latency_s": mean_latency_s(r.generations),
        "unfinished": m["overall"]["count"] - m["overall"]["states"].get("finished", 0),
        "engine_busy_s": r.engine["busy_s"],
        "kv_fallbacks": r.engine["kv_fallbacks"],
        "engine_steps": r.engine["steps"],
        "batcher": r.batcher,
        "utility": {row["request_id"]: row["utility"] for row in m["requests"]},
        "accrued": {row["request_id"]: row["accrued_utility"] for row in m["requests"]},
        "wall_s": r.wall_s,
    }


# --------------------------------------------------------------------------------------- bound

BoundKey = tuple[str, int, str]  # (task id, scene index, robot type)


def bound_key(a: Arrival) -> BoundKey:
    return (a.task_id, a.scene_index, a.robot_type)


def cell_arrivals(load: str, robots: Mapping[str, RobotSpec], catalog: Mapping[str, TaskDef],
                  seed: int | None = None) -> list[Arrival]:
    """The arrivals every policy of a cell with this load replays."""
    wl = check_load(load)
    return expand(wl, catalog, robots, seed=wl.seed if seed is None else seed)


@functools.lru_cache(maxsize=8)
def _isolated_workload(network_latency_s: float) -> Workload:
    """A workload without arrivals (``isolated_response`` supplies its own request)."""
    return dataclasses.replace(load_workload("WID1"), name="isolated", traces=(), requests=(),
                               network_latency_s=network_latency_s)


def isolated_response(arrival: Arrival, profile: str | Path | LatencyProfile, *, network_latency_s: float,
                      robots: Mapping[str, RobotSpec], catalog: Mapping[str, TaskDef],
                      policies: Sequence[str] | None = None) -> tuple[float, str]:
    """(earliest response time, the policy that achieves it) of ``arrival`` served alone on an
    idle engine whose prefix cache holds its prompt (see the module docstring)."""
    base = _isolated_workload(network_latency_s)
    if not isinstance(profile, LatencyProfile):
        profile = LatencyProfile.from_yaml(profile)
    best: tuple[float, str] | None = None
    for policy in policies or policy_names():
        got: dict[str, Any] = {}

        def setup(planner, _arrivals, _got=got):
            eng = planner.engine
            warm = dataclasses.replace(arrival, request_id=f"{arrival.request_id}~warm")
            eng.add(warm.request_id, planner.prompts.prompt_ids(warm.to_request()), max_tokens=1)
            while eng.has_unfinished():
                eng.step()
            target = dataclasses.replace(arrival, time=planner.clock.now() + WARM_GAP_S)
            _got["arrival"] = target.time
            return [target]

        r = run_simulation(base, policy, profile_path=profile, robots=robots, catalog=catalog, setup=setup)
        row = r.metrics["requests"][0]
        if row["response_s"] is None:
            continue  # this policy cannot serve it at all; another one bounds it
        if best is None or row["response_s"] < best[0]:
            best = (row["response_s"], policy)
    if best is None:
        raise RuntimeError(f"no policy serves request {arrival.request_id} ({arrival.task_id}) alone")
    return best


PLAN_BOUND_POLICY = "vllm-stream"  # alone, streaming the whole plan is the as-soon-as-possible schedule


def isolated_plan(arrivals: Sequence[Arrival], profile: str | Path | LatencyProfile, *, network_latency_s: float,
                  seed: int, robots: Mapping[str, RobotSpec], catalog: Mapping[str, TaskDef],
                  policy: str = PLAN_BOUND_POLICY) -> dict[str, tuple[float, float]]:
    """{request id: (accrued utility, its maximum)} of every arrival served **alone** on an idle
    engine of `profile` whose prefix cache holds its prompt (as ``isolated_response``), with its
    real request and robot ids and the cell's ``seed`` — so its robot's sampled execution times,
    perception answers and plan path are exactly those of the cell's runs — scored by Eq. 3
    (``core/metrics.plan_terms``).  See the module docstring: the isolated-service bound of Eq. 3."""
    base = _isolated_workload(network_latency_s)
    if not isinstance(profile, LatencyProfile):
        profile = LatencyProfile.from_yaml(profile)
    out: dict[str, tuple[float, float]] = {}
    for arrival in arrivals:
        def setup(planner, _arrivals, _a=arrival):
            eng = planner.engine
            warm = dataclasses.replace(_a, request_id=f"{_a.request_id}~warm")
            eng.add(warm.request_id, planner.prompts.prompt_ids(warm.to_request()), max_tokens=1)
            while eng.has_unfinished():
                eng.step()
            return [dataclasses.replace(_a, time=planner.clock.now() + WARM_GAP_S)]

        r = run_simulation(base, policy, profile_path=profile, robots=robots, catalog=catalog, setup=setup, seed=seed)
        row = r.metrics["requests"][0]
        out[arrival.request_id] = (row["accrued_utility"], row["accrued_max_utility"])
    return out


def plan_bound_figures(arrivals: Sequence[Arrival], plan: Mapping[str, tuple[float, float]]) -> dict[str, Any]:
    """Accrued utility (Eq. 3) of the isolated-service bound, % of max overall and per category."""
    def pct(sel: Sequence[Arrival]) -> float | None:
        mx = math.fsum(plan[a.request_id][1] for a in sel)
        return 100.0 * math.fsum(plan[a.request_id][0] for a in sel) / mx if sel and mx > 0 else None

    out: dict[str, Any] = {"accrued_total_pct": pct(arrivals)}
    for c in CATEGORIES:
        out[f"accrued_{c}_pct"] = pct([a for a in arrivals if a.category == c])
    return out


def bound_figures(arrivals: Sequence[Arrival], response: Callable[[Arrival], float]) -> dict[str, Any]:
    """Utility of every request at its isolated response time: % of max overall and per category,
    plus the per-request utilities (for a policy's % of the bound)."""
    util = {a.request_id: a.tuf(response(a)) for a in arrivals}

    def pct(sel: Sequence[Arrival]) -> float | None:
        mx = math.fsum(a.tuf.beta for a in sel)
        return 100.0 * math.fsum(util[a.request_id] for a in sel) / mx if sel and mx > 0 else None

    out = {"total_pct": pct(arrivals), "utility": util}
    for c in CATEGORIES:
        out[f"{c}_pct"] = pct([a for a in arrivals if a.category == c])
    return out


def pct_of_bound(policy_util: Mapping[str, float], bound_util: Mapping[str, float],
                 ids: Sequence[str] | None = None) -> float | None:
    """A policy's utility as % of the bound's over the same requests (all, or ``ids``)."""
    ids = list(bound_util) if ids is None else list(ids)
    b = math.fsum(bound_util[i] for i in ids)
    if not ids or b <= 0:
        return None
    return 100.0 * math.fsum(policy_util.get(i, 0.0) for i in ids) / b


def summarize_cell(cell: Cell, arrivals: Sequence[Arrival], bound: Mapping[str, Any],
                   runs: Mapping[str, Mapping[str, Any]],
                   plan: Mapping[str, tuple[float, float]] | None = None) -> dict[str, Any]:
    """The JSON record of one cell: bounds (first action; with ``plan``, Eq. 3's), every policy's
    figures (without per-request utilities), their % of the bounds, and the best policy of each
    figure (``best_of``)."""
    urgent_ids = [a.request_id for a in arrivals if a.category == "urgent"]
    plan_util = {k: v[0] for k, v in plan.items()} if plan is not None else None
    policies: dict[str, Any] = {}
    for name, run in runs.items():
        rec = {k: v for k, v in run.items() if k not in ("utility", "accrued", "wall_s")}
        if run.get("status") == "ok":
            rec["pct_of_bound"] = pct_of_bound(run["utility"], bound["utility"])
            rec["urgent_pct_of_bound"] = pct_of_bound(run["utility"], bound["utility"], urgent_ids) if urgent_ids else None
            if plan_util is not None:
                rec["accrued_pct_of_bound"] = pct_of_bound(run["accrued"], plan_util)
                rec["accrued_urgent_pct_of_bound"] = (pct_of_bound(run["accrued"], plan_util, urgent_ids)
                                                      if urgent_ids else None)
        policies[name] = rec
    bound_rec = {k: v for k, v in bound.items() if k != "utility"}
    if plan is not None:
        bound_rec.update(plan_bound_figures(arrivals, plan))

    return {
        "load": cell.load, "capacity": cell.capacity, "profile": Path(cell.profile).stem, "engine": cell.engine,
        "requests": len(arrivals),
        "bound": bound_rec,
        "policies": policies,
        **best_of(policies),
    }


def best_of(policies: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """{"best": {figure: policy}, "best_ties": {figure: how many others are within
    TIE_TOLERANCE}} over the runs that finished; ties go to the alphabetically first name."""
    best: dict[str, Any] = {}
    ties: dict[str, int] = {}
    for field, sign in BEST_FIELDS.items():
        vals = sorted((-sign * v[field], n) for n, v in policies.items()
                      if v.get("status") == "ok" and v.get(field) is not None)
        best[field] = vals[0][1] if vals else None
        ties[field] = sum(1 for v, _ in vals[1:] if v - vals[0][0] <= TIE_TOLERANCE) if vals else 0
    return {"best": best, "best_ties": ties}

"""``timelyllm sweep``: the regime map — every policy on a grid of loads × capacities × profiles.

For each cell (load, capacity, engine profile; see ``sim/regime.py``) every policy replays the
same arrivals in the simulator; the sweep reports total / urgent / normal time utility (% of
max), Andes' chat QoE, Trail's mean latency, and the isolated-service bound (each request served
alone on an idle engine: the physical limit of any scheduler on that profile), with every policy
also as % of that bound.  Output: a table on stdout, canonical JSON (same seeds → byte-identical
file), a heatmap PNG (policies × cells) and optionally a Markdown table; progress and per-cell
wall times go to stderr (wall times also to ``<out>.walls.json``, never into the JSON).

Runs are spread over worker processes (``--workers``, default 2: this project's machines have 2
cores); ``--cell-timeout S`` stops a run after S wall seconds and marks it ``timeout`` in every
output (no run is ever dropped; a cell with a timeout is not deterministic).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import itertools
import json
import os
import sys
import time
import zlib
from pathlib import Path
from typing import Any, Iterable, Sequence

from .paths import data_dir

FULL_LOADS = ("WID1", "WID2", "WID3", "chat_mixed", "drones:25", "drones:100", "drones:400", "drones:800",
              "drones:1600")
FULL_CAPACITIES = ("default", "kv/2", "kv/4", "cap16", "cap8", "cap4")
FULL_PROFILES = ("rtx4090_llama3_8b", "vllm_cpu_tiny", "orin_nano_llama3_2_3b")
HEARTBEAT_S = 30.0  # a progress line at least this often (wall seconds) while jobs finish
BOUND_WEIGHT = 30  # an isolated-service job costs about as much as replaying 30 arrivals (for the ETA)
PLAN_CHUNK = 64  # requests per Eq. 3 isolated-service job (each served alone in turn)
PLAN_WEIGHT = 1  # one request alone costs about as much as replaying one arrival (for the ETA)
QUICK_LOADS = ("WID1", "chat_mixed", "drones:400")
QUICK_CAPACITIES = ("default", "kv/4", "cap8")
QUICK_PROFILES = ("rtx4090_llama3_8b", "orin_nano_llama3_2_3b")


def _csv(s: str) -> list[str]:
    items = [x.strip() for x in s.split(",")]
    if not s.strip() or any(not x for x in items):
        raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {s!r}")
    return items


def add_parser(sub: Any) -> None:
    from .cli import _positive_float, _positive_int

    p = sub.add_parser("sweep", help="regime map: every policy on loads x capacities x engine profiles",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help=f"small grid: loads {','.join(QUICK_LOADS)}; capacities {','.join(QUICK_CAPACITIES)}; "
                        f"profiles {','.join(QUICK_PROFILES)}")
    p.add_argument("--loads", type=_csv, help=f"comma-separated workloads (default: {','.join(FULL_LOADS)})")
    p.add_argument("--capacities", type=_csv,
                   help=f"comma-separated: default, kv/N, capN (default: {','.join(FULL_CAPACITIES)})")
    p.add_argument("--profiles", type=_csv, help=f"comma-separated profile names or YAML paths "
                                                 f"(default: {','.join(FULL_PROFILES)})")
    p.add_argument("--policies", type=_csv, help="comma-separated policies (default: every registered policy)")
    p.add_argument("--engine-kinds", type=_csv, metavar="KINDS",
                   help="capability columns, comma-separated: stock (vLLM as users run it: no preserve; abort "
                        "frees KV, resume through the prefix cache), preserve (InferCept/LAMPS-style engine that "
                        "can pin KV) (default: stock,preserve)")
    p.add_argument("--seed", type=int, default=None, help="arrival + robot seed of every load (default: each load's own)")
    p.add_argument("--workers", type=_positive_int, default=2, help="worker processes (default 2)")
    p.add_argument("--cell-timeout", type=_positive_float, default=None, metavar="S",
                   help="wall seconds one policy may take in one cell before it is marked timeout (default: no limit)")
    p.add_argument("--out", default=None, help="JSON results (default regime.json; with --from-json: the "
                                               "map read, merged where several, written only when given)")
    p.add_argument("--heatmap", default=None, help="heatmap PNG (default: next to --out, .png; with --from-json: "
                                                   "only when given)")
    p.add_argument("--markdown", default=None, help="also write the table as Markdown here")
    p.add_argument("--cache-dir", default=None, metavar="DIR",
                   help="store every finished run here and reuse it (resume a stopped sweep; keyed by a "
                        "fingerprint of the code and data, so a code change recomputes)")
    p.add_argument("--cached-only", action="store_true",
                   help="with --cache-dir: report what the cache holds (runs not there yet: pending), run nothing")
    p.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    p.add_argument("--check", default="default", metavar="POLICY",
                   help="print the acceptance verdicts for this policy: issue 25's on the whole plan, then issue "
                        "15's on the first action (default: default; 'none' to skip)")
    p.add_argument("--from-json", action="append", default=[], metavar="FILE",
                   help="run nothing: print the tables and acceptance of a regime map written earlier; "
                        "repeat it to read parts of one grid run separately (same seeds and policies) as one map")
    p.add_argument("--versus", type=_csv, action="append", default=[], metavar="A,B",
                   help="also print policy A against policy B per regime (profile x column x kind of capacity): "
                        "cells where each is ahead by more than 1 point and the margins, on the whole plan and "
                        "the first action (repeatable; e.g. vllm-priority,vllm-stream)")
    p.set_defaults(func=run_sweep)


# --------------------------------------------------------------------------------------- workers

_ctx: dict[str, Any] = {}


def _init_worker() -> None:
    for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(v, "1")
    if "robots" not in _ctx:
        from .core.robots import load_robots
        from .workloads.format import default_catalog

        _ctx["robots"] = load_robots()
        _ctx["catalog"] = default_catalog(_ctx["robots"])


def _do(item: tuple[int, tuple]) -> tuple[int, Any]:
    """One unit of work, numbered: ("run", cell, policy, seed, timeout), ("bound", profile, net,
    arrival) or ("plan", profile, load, net, seed, arrivals).  Returns (its number, its result)."""
    from .sim import regime

    i, job = item
    _init_worker()
    if job[0] == "run":
        _, cell, policy, seed, timeout = job
        return i, regime.run_cell_policy(cell, policy, seed=seed, robots=_ctx["robots"], catalog=_ctx["catalog"],
                                         timeout_s=timeout or None)
    if job[0] == "plan":
        _, profile, _load, net, seed, arrivals = job
        t0 = time.perf_counter()
        plan = regime.isolated_plan(arrivals, regime.resolve_profile(profile), network_latency_s=net, seed=seed,
                                    robots=_ctx["robots"], catalog=_ctx["catalog"])
        return i, {"plan": {k: list(v) for k, v in plan.items()}, "wall_s": time.perf_counter() - t0}
    _, profile, net, arrival = job
    t0 = time.perf_counter()
    resp, _ = regime.isolated_response(arrival, regime.resolve_profile(profile), network_latency_s=net,
                                       robots=_ctx["robots"], catalog=_ctx["catalog"])
    return i, {"response_s": resp, "wall_s": time.perf_counter() - t0}


def _map(items: list[tuple[int, tuple]], workers: int) -> Iterable[tuple[int, Any]]:
    """(number, result) of every numbered job, in completion order."""
    if workers == 1 or len(items) <= 1:
        for it in items:
            yield _do(it)
        return
    import multiprocessing as mp

    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    with ctx.Pool(workers, initializer=_init_worker) as pool:
        yield from pool.imap_unordered(_do, items, chunksize=1)


# --------------------------------------------------------------------------------------- sweep

def _grid(args: argparse.Namespace) -> tuple[list[str], list[str], list[str], list[str], list[str]]:
    from .core.policies import policy_names
    from .sim import regime

    loads = args.loads or list(QUICK_LOADS if args.quick else FULL_LOADS)
    caps = args.capacities or list(QUICK_CAPACITIES if args.quick else FULL_CAPACITIES)
    profiles = args.profiles or list(QUICK_PROFILES if args.quick else FULL_PROFILES)
    policies = args.policies or policy_names()
    kinds = regime.check_engine_kinds(args.engine_kinds or list(regime.ENGINE_KINDS))
    for name, xs in (("load", loads), ("capacity", caps), ("profile", profiles)):
        dup = sorted({x for x in xs if xs.count(x) > 1})
        if dup:
            raise regime.GridError(f"{name} {dup[0]!r} given twice")
    for c in caps:
        regime.parse_capacity(c)
    for p in profiles:
        regime.resolve_profile(p)
    for ld in loads:
        regime.check_load(ld)
    regime.check_policies(policies)
    return loads, caps, profiles, policies, kinds


def sweep(loads: Sequence[str], capacities: Sequence[str], profiles: Sequence[str], policies: Sequence[str], *,
          seed: int | None = None, workers: int = 2, cell_timeout_s: float = 0.0,
          cache_dir: str | Path | None = None, cached_only: bool = False,
          log: Any = None, engine_kinds: Sequence[str] = ("stock",)) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run the grid; returns (the JSON document, wall times: a cached job's are from its own
    run).  ``log(str)`` gets progress lines.  ``engine_kinds``: the capability columns
    (``sim/regime.ENGINE_KINDS``; every cell is run once per kind).
    With ``cache_dir``, every finished job (not a timeout) is stored there under a key that
    includes a fingerprint of the code and data files, and reused by the next sweep: a long grid
    can be stopped and resumed, and grids that share cells share the work.  ``cached_only``: run
    nothing but the (cheap) isolated-service jobs; runs not in the cache are reported as
    ``pending`` (a look at a sweep still running elsewhere on the same cache)."""
    from .core.robots import load_robots
    from .workloads.format import default_catalog
    from .sim import regime

    t_start = time.perf_counter()
    robots = load_robots()
    catalog = default_catalog(robots)
    arrivals = {ld: regime.cell_arrivals(ld, robots, catalog, seed) for ld in loads}
    nets = {ld: regime.check_load(ld).network_latency_s for ld in loads}
    seeds = {ld: regime.check_load(ld).seed if seed is None else seed for ld in loads}
    regime.check_engine_kinds(engine_kinds)
    cells = [regime.Cell(ld, c, p, k) for k in engine_kinds for p in profiles for ld in loads for c in capacities]

    # isolated-service bound: one job per (profile, network latency, task, scene, robot type)
    reps: dict[tuple, Any] = {}
    for p in profiles:
        for ld in loads:
            for a in arrivals[ld]:
                reps.setdefault((p, nets[ld]) + regime.bound_key(a), a)
    jobs: list[tuple] = [("bound", k[0], k[1], a) for k, a in reps.items()]
    # isolated-service bound of Eq. 3: every request alone (its own execution times), in chunks
    for p in profiles:
        for ld in loads:
            arr = arrivals[ld]
            for j in range(0, len(arr), PLAN_CHUNK):
                jobs.append(("plan", p, ld, nets[ld], seeds[ld], tuple(arr[j:j + PLAN_CHUNK])))
    # smallest loads first: a sweep stopped early (or resumed from its cache) has whole cells
    runs = [("run", c, pol, seed, cell_timeout_s) for c in cells for pol in policies]
    runs.sort(key=lambda j: len(arrivals[j[1].load]))
    jobs += runs
    cache = _Cache(cache_dir) if cache_dir is not None else None
    cached = {i: r for i, j in enumerate(jobs) if cache is not None and (r := cache.get(j)) is not None}
    weight = [BOUND_WEIGHT if j[0] == "bound" else PLAN_WEIGHT * len(j[5]) if j[0] == "plan"
              else len(arrivals[j[1].load]) for j in jobs]
    total_w = sum(weight)
    done_w = 0
    bound_resp: dict[tuple, float] = {}
    plan_bound: dict[tuple[str, str], dict[str, tuple[float, float]]] = {}
    results: dict[tuple, dict[str, dict[str, Any]]] = {c: {} for c in cells}
    walls: dict[str, Any] = {"bound_s": 0.0, "plan_bound_s": 0.0, "cells": {}}
    cells_done = 0
    say = log or (lambda s: None)
    n_plan = sum(len(arrivals[ld]) for ld in loads) * len(profiles)
    say(f"sweep: {len(cells)} cells x {len(policies)} policies = {len(runs)} runs + {len(reps)} isolated-service "
        f"requests (first action) + {n_plan} (Eq. 3), {workers} worker(s)" + (f"; {len(cached)} jobs from the cache {cache_dir}" if cache else ""))
    last_say = time.perf_counter()
    todo = [(i, j) for i, j in enumerate(jobs) if i not in cached]
    if cached_only:
        for i, j in todo:
            if j[0] == "run":
                cached[i] = {"status": "pending", "reason": "not in the cache yet", "wall_s": 0.0}
        todo = [(i, j) for i, j in todo if j[0] != "run"]
    for n_done, (i, res) in enumerate(itertools.chain(cached.items(), _map(todo, workers)), 1):
        job = jobs[i]
        if cache is not None and i not in cached:
            cache.put(job, res)
        if res.get("status") == "pending":  # --cached-only: shown as such, not a finished run
            results[job[1]][job[2]] = res
            continue
        done_w += weight[i]
        el = time.perf_counter() - t_start
        if time.perf_counter() - last_say >= HEARTBEAT_S:  # long cells: show that runs still finish
            last_say = time.perf_counter()
            say(f"[jobs {n_done}/{len(jobs)} | {_hms(el)} elapsed | ETA {_hms(el * (total_w - done_w) / done_w)}]")
        if job[0] == "bound":
            _, p, net, a = job
            bound_resp[(p, net) + regime.bound_key(a)] = res["response_s"]
            walls["bound_s"] += res["wall_s"]
            continue
        if job[0] == "plan":
            plan_bound.setdefault((job[1], job[2]), {}).update({k: (v[0], v[1]) for k, v in res["plan"].items()})
            walls["plan_bound_s"] += res["wall_s"]
            continue
        _, cell, pol, _, _ = job
        results[cell][pol] = res
        walls["cells"].setdefault(cell.key, {})[pol] = round(res["wall_s"], 3)
        if len(results[cell]) == len(policies):
            cells_done += 1
            last_say = time.perf_counter()
            eta = el * (total_w - done_w) / done_w if done_w else 0.0
            st = [f"{n} {r['status']}" for n, r in results[cell].items() if r["status"] != "ok"]
            say(f"[cells {cells_done}/{len(cells)} | {_hms(el)} elapsed | ETA {_hms(eta)}] {cell.key}: "
                f"wall {sum(r['wall_s'] for r in results[cell].values()):.1f} s" + (f" ({', '.join(st)})" if st else ""))

    out_cells = []
    for cell in cells:
        arr = arrivals[cell.load]
        net = nets[cell.load]
        bound = regime.bound_figures(arr, lambda a: bound_resp[(cell.profile, net) + regime.bound_key(a)])
        out_cells.append(regime.summarize_cell(cell, arr, bound, {p: results[cell][p] for p in policies},
                                               plan_bound[(cell.profile, cell.load)]))
    walls["total_s"] = time.perf_counter() - t_start
    walls["workers"] = workers
    doc = {
        "kind": "timelyllm regime map", "source": "simulator", "seed": seed,
        "grid": {"loads": list(loads), "capacities": list(capacities),
                 "profiles": [Path(p).stem for p in profiles], "policies": list(policies),
                 "engine_kinds": list(engine_kinds)},
        "cell_timeout_s": cell_timeout_s or None,
        "cells": out_cells,
    }
    return doc, walls


# what a cell's figures depend on (package-relative): a change here invalidates the cache
SIMULATION_CODE = ("core", "engines", "sim", "workloads", "prompts.py")


class _Cache:
    """Finished jobs on disk, one JSON file per job, keyed by the job and a fingerprint of the
    simulation code (``SIMULATION_CODE``), the bundled workloads, robots, profiles and Trail's
    length predictor (a change
    to any of them makes every old entry unused; output-only changes keep it).  Timeouts are
    never stored: they depend on the machine's load."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        h = hashlib.sha256()
        pkg = Path(__file__).resolve().parent
        code = [p for d in SIMULATION_CODE for p in ((pkg / d).rglob("*.py") if (pkg / d).is_dir() else [pkg / d])]
        named = [(f"{pkg.name}/{p.relative_to(pkg)}", p) for p in code]
        for sub, pattern in (("workloads", "*.yaml"), ("robots", "*.yaml"), ("profiles", "*.yaml"),
                             ("models", "length-predictor/*")):
            d = data_dir(sub)
            named += [(f"{sub}/{f.relative_to(d)}", f) for f in d.glob(pattern)]
        for name, f in sorted(named):
            h.update(name.encode() + b"\0" + f.read_bytes())
        self.fingerprint = h.hexdigest()

    def _path(self, job: tuple) -> Path:
        from .sim import regime

        if job[0] == "bound":
            _, profile, net, a = job
            ident = ["bound", regime.resolve_profile(profile).read_text(), net, *regime.bound_key(a)]
        elif job[0] == "plan":
            _, profile, ld, net, seed, arrs = job
            load = Path(ld).read_text() if Path(ld).is_file() else ld
            ident = ["plan", regime.resolve_profile(profile).read_text(), load, net, seed,
                     [a.request_id for a in arrs]]
        else:
            _, cell, policy, seed, _ = job
            prof = regime.resolve_profile(cell.profile)
            load = Path(cell.load).read_text() if Path(cell.load).is_file() else cell.load
            ident = ["run", load, cell.capacity, prof.read_text(), policy, seed, cell.engine]
        key = hashlib.sha256(json.dumps([self.fingerprint, *ident], default=str).encode()).hexdigest()
        return self.root / f"{key[:40]}.json"

    def get(self, job: tuple) -> Any:
        p = self._path(job)
        try:
            return json.loads(p.read_text())
        except (OSError, ValueError):
            return None

    def put(self, job: tuple, result: Any) -> None:
        if isinstance(result, dict) and result.get("status") == "timeout":
            return
        p = self._path(job)
        tmp = p.with_suffix(".tmp")
        tmp.write_text(json.dumps(result))
        tmp.replace(p)


def _hms(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def run_sweep(args: argparse.Namespace) -> int:
    from .cli import CliError
    from .inputs import check_out_file
    from .sim.regime import GridError

    if args.from_json:
        return _report_saved(args)
    try:
        loads, caps, profiles, policies, kinds = _grid(args)
    except GridError as e:
        raise CliError(str(e)) from None
    if args.cached_only and not args.cache_dir:
        raise CliError("--cached-only needs --cache-dir")
    _check_versus(args.versus, policies)
    out = check_out_file(args.out or "regime.json")
    heat = check_out_file(args.heatmap, arg="--heatmap") if args.heatmap else out.with_suffix(".png")
    if args.markdown:
        check_out_file(args.markdown, arg="--markdown")
    log = None if args.no_progress else (lambda s: print(s, file=sys.stderr, flush=True))
    doc, walls = sweep(loads, caps, profiles, policies, seed=args.seed, workers=args.workers,
                       cell_timeout_s=args.cell_timeout or 0.0, cache_dir=args.cache_dir, cached_only=args.cached_only,
                       log=log, engine_kinds=kinds)
    _report(doc, args, out, heat)
    walls_path = out.with_name(out.stem + ".walls.json")
    walls_path.write_text(json.dumps(walls, indent=1, sort_keys=True) + "\n")
    print(f"wrote {out}, {heat}, {walls_path}" + (f", {args.markdown}" if args.markdown else "")
          + f"; wall {walls['total_s']:.0f} s with {walls['workers']} worker(s)", file=sys.stderr)
    return 0


def read_map(path: str | Path) -> dict[str, Any]:
    """A regime map written by ``timelyllm sweep --out``, gzipped where the name ends in .gz (the
    stored maps, docs/results/maps/); CliError naming the file otherwise."""
    from .cli import CliError

    try:
        raw = Path(path).read_bytes()
        doc = json.loads(gzip.decompress(raw) if str(path).endswith(".gz") else raw)
        if not isinstance(doc, dict) or doc.get("kind") != "timelyllm regime map":
            raise ValueError("not a regime map written by timelyllm sweep")
        grid = doc.get("grid")
        if not (isinstance(grid, dict) and isinstance(grid.get("policies"), list)
                and isinstance(grid.get("profiles"), list) and isinstance(doc.get("cells"), list)):
            raise ValueError("a regime map needs grid.policies, grid.profiles and cells")
    except (OSError, ValueError, EOFError, zlib.error) as e:  # (gzip: a truncated or corrupt file)
        raise CliError(f"{path}: {getattr(e, 'strerror', None) or e}") from None
    return doc


def _report_saved(args: argparse.Namespace) -> int:
    from .cli import CliError
    from .sim.regime import GridError
    from .sim.regime_merge import merge_maps

    docs = [read_map(path) for path in args.from_json]
    if len(docs) == 1:
        doc = docs[0]
    else:
        try:
            doc = merge_maps(docs, args.from_json, {"loads": FULL_LOADS, "capacities": FULL_CAPACITIES,
                                                    "profiles": FULL_PROFILES})
        except GridError as e:
            raise CliError(f"--from-json: {e}") from None
        print(f"{len(doc['cells'])} cells from {len(docs)} regime maps", file=sys.stderr)
    _check_versus(args.versus, doc["grid"]["policies"])
    from .inputs import check_out_file

    out = check_out_file(args.out) if args.out else None
    heat = check_out_file(args.heatmap, arg="--heatmap") if args.heatmap else None
    if args.markdown:
        check_out_file(args.markdown, arg="--markdown")
    _report(doc, args, out, heat)
    return 0


def _report(doc: dict[str, Any], args: argparse.Namespace, out: Path | None, heat: Path | None) -> None:
    """A map's tables, acceptance and --versus comparisons on stdout; its JSON (`out`), heatmap
    (`heat`) and --markdown where given (a swept map and one read back alike)."""
    from .core.metrics import to_json

    print_tables(doc)
    _print_acceptance(doc, args.check)
    _print_versus(doc, args.versus)
    if out:
        out.write_text(to_json(doc))
    if heat:
        from .plots import plot_regime_heatmap

        plot_regime_heatmap(doc, heat)
    if args.markdown:
        Path(args.markdown).write_text(markdown_table(doc) + _acceptance_markdown(doc, args.check)
                                       + _versus_markdown(doc, args.versus))


def _check_versus(pairs: Sequence[Sequence[str]], policies: Sequence[str]) -> None:
    """Before any work: each --versus names two different policies of the map."""
    from .cli import CliError

    for pair in pairs:
        if len(pair) != 2 or pair[0] == pair[1]:
            raise CliError(f"--versus {','.join(pair)}: expected two different policies, A,B")
        for p in pair:
            if p not in policies:
                raise CliError(f"--versus {','.join(pair)}: policy {p!r} is not in this map "
                               f"(it has: {', '.join(policies)})")


def _print_versus(doc: dict[str, Any], pairs: Sequence[Sequence[str]]) -> None:
    from rich.table import Table

    from .report import console
    from .sim.versus import rows, versus

    for a, b in pairs:
        head, body = rows(versus(doc, a, b), a, b)
        t = Table(title=f"{a} against {b} per regime — points of % of max, ahead = by more than 1 point (simulator)")
        for i, col in enumerate(head):
            t.add_column(col, justify="left" if i < 4 else "right")
        for row in body:
            t.add_row(*row)
        console().print(t)


def _versus_markdown(doc: dict[str, Any], pairs: Sequence[Sequence[str]]) -> str:
    from .sim.versus import markdown, versus

    return "".join("\n" + markdown(versus(doc, a, b), a, b) for a, b in pairs)


def _acceptance(doc: dict[str, Any], policy: str) -> Any:
    """(issue 25's verdicts on the whole plan, issue 15's on the first action) for `policy`
    (sim/acceptance.py), or None where there is nothing to check ('none', a policy not in the
    map, or no other policy to compare with)."""
    from .sim.acceptance import check, check_plan

    pols = doc["grid"]["policies"]
    if policy == "none" or policy not in pols or len(pols) < 2:
        return None
    return check_plan(doc, policy), check(doc, policy)


def _print_acceptance(doc: dict[str, Any], policy: str) -> None:
    acc = _acceptance(doc, policy)
    if acc is not None:
        print(acc[0].summary())
        print("first-action-only rules, for comparison: " + acc[1].summary())


def _acceptance_markdown(doc: dict[str, Any], policy: str) -> str:
    from .sim.acceptance import markdown, plan_markdown

    acc = _acceptance(doc, policy)
    return "" if acc is None else "\n" + plan_markdown(acc[0]) + "\nFirst-action-only rules, for comparison:\n\n" + \
        markdown(acc[1])


# --------------------------------------------------------------------------------------- output

def cell_value(rec: dict[str, Any], field: str) -> str:
    if rec.get("status") != "ok":
        return rec.get("status", "?")
    v = rec.get(field)
    return "-" if v is None else f"{v:.3f}" if field == "chat_qoe" or field.endswith("_s") else f"{v:.1f}"


def _rows(doc: dict[str, Any], profile: str) -> list[dict[str, Any]]:
    return [c for c in doc["cells"] if c["profile"] == profile]


TABLES = (("accrued_total_pct", "accrued utility of the whole plan (Eq. 3), total, % of max"),
          ("accrued_urgent_pct", "accrued utility of the whole plan (Eq. 3), urgent, % of max"),
          ("accrued_normal_pct", "accrued utility of the whole plan (Eq. 3), normal, % of max"),
          ("total_pct", "first-action utility only (Eq. 1), total, % of max"),
          ("urgent_pct", "first-action utility only (Eq. 1), urgent, % of max"),
          ("normal_pct", "first-action utility only (Eq. 1), normal, % of max"),
          ("completion_mean_s", "mean completion s (arrival -> last action ends)"),
          ("continuation_wait_p99_s", "p99 continuation wait s (previous action end -> next action start)"),
          ("chat_qoe", "chat QoE (Andes), mean"),
          ("mean_latency_s", "mean latency s (Trail: last token - arrival, finished requests)"))


def print_tables(doc: dict[str, Any], console: Any = None) -> None:
    """Per profile and figure (total, urgent, normal utility, chat QoE, mean latency): one row per
    cell, the bound (utilities) first, one column per policy; the best policy is starred and
    named in the last column.  A figure no cell has (no chat load: no QoE) is left out."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    policies = doc["grid"]["policies"]
    cols = ["column", "load", "capacity", "bound"] + policies + ["best"]
    width = 4 + sum(max(len(c), 7) + 3 for c in cols) + 20
    console = console or Console(width=width)
    for profile in doc["grid"]["profiles"]:
        rows = _rows(doc, profile)
        for field, what in TABLES:
            if not any(c["best"].get(field) for c in rows):
                continue
            t = Table(title=f"{what} — simulator, profile {profile}")
            for col in cols:
                t.add_column(escape(col), justify="left" if col in ("column", "load", "capacity", "best") else "right",
                             no_wrap=True)
            for c in rows:
                best = c["best"].get(field)
                b = c["bound"].get(field)
                vals = [cell_value(c["policies"][p], field) + ("*" if p == best else "") for p in policies]
                t.add_row(escape(c.get("engine", "-")), escape(c["load"]), escape(c["capacity"]),
                          "-" if b is None else f"{b:.1f}" if not field.endswith("_s") else f"{b:.3f}", *vals,
                          escape((best or "-") + _ties(c, field)))
            console.print(t)


REFERENCE_POLICIES = ("default", "timelyllm")  # shown beside the best policy in the summary, when in the grid


def _pair(r: dict[str, Any], f1: str, f2: str) -> str:
    return f"{cell_value(r, f1)} / {cell_value(r, f2)}" if r.get("status") == "ok" else f"*{r.get('status')}*"


def markdown_summary(doc: dict[str, Any]) -> str:
    """One compact Markdown table: per cell the bound, the best policy on accrued (Eq. 3, the
    whole plan) total and urgent utility (% of max) and the reference policies (``default``,
    ``timelyllm``) as accrued total / urgent, then first-action-only total / urgent."""
    refs = [p for p in REFERENCE_POLICIES if p in doc["grid"]["policies"]]
    head = ["profile", "column", "load", "capacity", "bound accrued total / urgent", "best accrued total",
            "best accrued urgent"] + [f"`{p}` accrued total / urgent (first action)" for p in refs]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in doc["cells"]:
        b = c["bound"]
        row = [f"`{c['profile']}`", c.get("engine", "-"), c["load"], c["capacity"],
               f"{_fmt(b.get('accrued_total_pct'))} / {_fmt(b.get('accrued_urgent_pct'))}"]
        for field in ("accrued_total_pct", "accrued_urgent_pct"):
            best = c["best"].get(field)
            row.append(f"{cell_value(c['policies'][best], field)} `{best}`{_ties(c, field)}" if best else "-")
        for p in refs:
            r = c["policies"][p]
            row.append(_pair(r, "accrued_total_pct", "accrued_urgent_pct")
                       + (f" ({_pair(r, 'total_pct', 'urgent_pct')})" if r.get("status") == "ok" else ""))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def markdown_table(doc: dict[str, Any]) -> str:
    """The summary, then one Markdown table per profile: per cell the bound and every policy as
    accrued (Eq. 3) total / urgent (% of max), the best accrued total in bold; runs that timed out
    or failed say so."""
    policies = doc["grid"]["policies"]
    lines: list[str] = [markdown_summary(doc)]
    for profile in doc["grid"]["profiles"]:
        lines += [f"**Profile `{profile}`** (simulator) — accrued utility of the whole plan (Eq. 3), % of max, "
                  f"total / urgent (bold: best accrued total of the cell)", "",
                  "| column | load | capacity | bound | " + " | ".join(f"`{p}`" for p in policies) + " |",
                  "|---|---|---|---|" + "---|" * len(policies)]
        for c in _rows(doc, profile):
            b = c["bound"]
            row = [c.get("engine", "-"), c["load"], c["capacity"],
                   f"{_fmt(b.get('accrued_total_pct'))} / {_fmt(b.get('accrued_urgent_pct'))}"]
            for p in policies:
                v = _pair(c["policies"][p], "accrued_total_pct", "accrued_urgent_pct")
                row.append(f"**{v}**" if p == c["best"].get("accrued_total_pct") else v)
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    return "\n".join(lines)


def _ties(cell: dict[str, Any], field: str) -> str:
    n = cell.get("best_ties", {}).get(field, 0)
    return f" (+{n} tied)" if n else ""


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"

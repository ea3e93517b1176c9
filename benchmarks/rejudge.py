"""Re-judge one policy in stored regime-map cells without re-running the others (simulator).

A full `timelyllm sweep` runs every registered policy per cell; a change to one policy's rules
changes only that policy's runs.  This runs `--policy` (default `default`) alone, with its
`--param` values, on each `--cell`, puts its record in place of the stored one in the cell of the
`--map` JSON(s) given (a `timelyllm sweep --out` file of the same code for every other policy) and
runs issue 25's acceptance (`sim/acceptance.check_plan`) on that cell: the verdict line before and
after, and the figures that moved.  Seconds a cell instead of minutes.

Not a sweep: the Eq. 3 isolated-service bound is not re-run; the re-run policy's % of it is
recomputed from the cell's stored bound figures (`bound_shares`: its % of max over the bound's,
exact wherever every request finished — every such stored record agrees, tests/test_stored_maps.py;
where some did not, the maxima differ and the stored % is kept), and it holds only where the other
policies' code is that of the map.  Checked 2026-11-27 against real sweeps (RTX 4090 9 cells, edge
board 4 cells, all policies): the same figures and verdicts (docs/results/2026-11-27-overload.md).

    python benchmarks/rejudge.py --map stock.json --map heavy.json \\
        --cell orin_nano_llama3_2_3b/stock/drones:400/cap8 --cell rtx4090_llama3_8b/stock/drones:400/cap4 \\
        --param overload=false [--out rejudged.json]

A cell is PROFILE/ENGINE/LOAD/CAPACITY as the map names them (capacity may hold a slash: kv/4);
`--all` re-judges every cell of the maps.  `--build POLICIES` first sweeps the `--cell`s with those
policies (one worker) into the first `--map` path, which must not exist yet (the smoke run's way
to a map; a real map comes from `timelyllm sweep --out`).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from timelyllm_ros.cli import _param  # noqa: E402  (the CLI's NAME=VALUE parsing)
from timelyllm_ros.sim import acceptance, regime  # noqa: E402
from timelyllm_ros.sweep import read_map  # noqa: E402  (gzipped maps too)


def _r(v):
    """The map stores figures to 6 decimals: compare at that precision."""
    return round(v, 5) if isinstance(v, float) else v


_BOUND_SHARES = (("pct_of_bound", "total_pct"), ("urgent_pct_of_bound", "urgent_pct"),
                 ("accrued_pct_of_bound", "accrued_total_pct"), ("accrued_urgent_pct_of_bound", "accrued_urgent_pct"))


def bound_shares(rec: dict, bound: dict, old: dict) -> dict:
    """`rec` with its % of the cell's bound: its % of max over the bound's (`regime.pct_of_bound`
    over the same requests and the same max; None where the bound's is not positive) when every
    request finished, else `old`'s stored figures (a request cut at the run's end changes the max)."""
    exact = rec.get("status") == "ok" and not rec.get("unfinished")
    for share, pct in _BOUND_SHARES:
        x, b = rec.get(pct), bound.get(pct)
        rec[share] = ((None if x is None or b is None or b <= 0 else 100.0 * x / b) if exact
                      else old.get(share))
    return rec


def build(path: Path, keys: list[str], policies: list[str]) -> None:
    """A map of `keys` (PROFILE/ENGINE/LOAD/CAPACITY) with `policies`, swept cell by cell."""
    from timelyllm_ros.sweep import sweep

    if path.exists():
        raise SystemExit(f"--build: {path} exists (it would be overwritten)")
    doc: dict | None = None
    for key in keys:
        cell = regime.parse_cell_key(key)
        d, _ = sweep([cell.load], [cell.capacity], [cell.profile], policies, workers=1, engine_kinds=(cell.engine,))
        if doc is None:
            doc = d
        else:
            doc["cells"] += d["cells"]
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--map", action="append", required=True,
                    help="timelyllm sweep --out JSON, or .json.gz (repeatable)")
    ap.add_argument("--cell", action="append", default=[], help="PROFILE/ENGINE/LOAD/CAPACITY (repeatable)")
    ap.add_argument("--all", action="store_true", help="every cell of the maps")
    ap.add_argument("--policy", default="default")
    ap.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="the policy's parameter")
    ap.add_argument("--out", help="JSON: per cell the new record and both verdicts")
    ap.add_argument("--build", metavar="POLICIES", help="sweep the --cells with these policies into the first --map")
    args = ap.parse_args()
    if args.build:
        build(Path(args.map[0]), args.cell, args.build.split(","))
    params = {k: v for _, k, v in map(_param, args.param)}
    cells: dict[str, tuple[dict, dict]] = {}
    for f in args.map:
        doc = read_map(f)
        for c in doc["cells"]:
            cells.setdefault(regime.map_cell_key(c), (c, doc))
    keys = list(cells) if args.all else args.cell
    missing = [k for k in keys if k not in cells]
    if missing or not keys:
        print(f"cells not in the maps: {missing or '(none given)'}", file=sys.stderr)
        return 2
    run_sim = regime.run_simulation
    regime.run_simulation = lambda *a, **kw: run_sim(*a, **{**kw, "policy_params": params})
    out, changed = [], 0
    for key in keys:
        c, doc = cells[key]
        old = c["policies"][args.policy]
        t0 = time.perf_counter()
        rec = regime.run_cell_policy(regime.Cell(load=c["load"], capacity=c["capacity"], profile=c["profile"],
                                                 engine=c.get("engine", "stock")), args.policy)
        wall = time.perf_counter() - t0
        new = bound_shares({k: v for k, v in rec.items() if k not in ("utility", "accrued", "wall_s")},
                           c["bound"], old)
        c2 = copy.deepcopy(c)
        c2["policies"][args.policy] = new
        before = acceptance.check_plan({"grid": doc["grid"], "cells": [c]}, args.policy).cells[0]
        after = acceptance.check_plan({"grid": doc["grid"], "cells": [c2]}, args.policy).cells[0]
        fields = ("accrued_total_pct", "accrued_urgent_pct", "total_pct", "urgent_pct", "completion_mean_s", "chat_qoe")
        moved = {f: (old.get(f), new.get(f)) for f in fields if _r(old.get(f)) != _r(new.get(f))}
        changed += bool(moved)
        flag = "" if before.passed == after.passed else f"  [{'PASS' if before.passed else 'FAIL'} -> " \
                                                         f"{'PASS' if after.passed else 'FAIL'}]"
        print(f"{key} ({wall:.0f} s){flag}" + ("" if moved else ": unchanged"))
        if moved:
            print("  before: " + acceptance.cell_line(before))
            print("  after:  " + acceptance.cell_line(after))
        out.append({"cell": key, "record": new, "passed_before": before.passed, "passed_after": after.passed})
    flips = [o["cell"] for o in out if o["passed_before"] != o["passed_after"]]
    print(f"{len(keys)} cells, {changed} changed, verdict flips: {', '.join(flips) or 'none'}; "
          f"pass {sum(o['passed_before'] for o in out)} -> {sum(o['passed_after'] for o in out)}")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

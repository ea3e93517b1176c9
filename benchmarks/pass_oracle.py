"""Which policy's behaviour would pass issue 25's acceptance in each stored cell (simulator, no run).

    python benchmarks/pass_oracle.py                       # every map in docs/results/maps/
    python benchmarks/pass_oracle.py --map docs/results/maps/own.json.gz --cells
    python benchmarks/pass_oracle.py --rejudged out/stock.json --rejudged out/pres.json ...

For every cell of the regime maps and every policy P in it, `sim/acceptance.check_plan` judges P as
if it were `default`: against every other policy of the cell except `default` (accrued Eq. 3 total
and urgent, first action and completion or the Pareto front, chat QoE, the isolated bound).  Printed
per engine profile: how many cells each policy would pass, the cells no policy passes, and (with
`--cells`) per cell the policies that pass, where `default` does not.  A map to work from: where
`default` fails, which behaviour would not have (a policy that passes a cell `default` fails is a
rule to learn, not a switch to copy: the same policy may fail elsewhere).

`default`'s own verdict reads the map's records, which are older than today's `default` (the maps'
README): `--rejudged FILE` (a `benchmarks/rejudge.py --out` file, repeatable) replaces them by the
records re-run there, cell by cell.  Reads stored records only: seconds, no simulation.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

from timelyllm_ros.cli import CliError
from timelyllm_ros.sim import acceptance
from timelyllm_ros.sim.regime import map_cell_key
from timelyllm_ros.sweep import read_map

MAPS = Path(__file__).resolve().parent.parent / "docs" / "results" / "maps"


def passers(doc: dict, c: dict, default_record: dict | None = None) -> list[str]:
    """The policies of cell `c` (of map `doc`) that pass issue 25's acceptance as if they were
    `default`, each judged against the cell's other policies without `default`; `default` itself
    against all of them (`default_record`: its record to judge instead of the stored one)."""
    pols = dict(c["policies"])
    if default_record is not None:
        pols["default"] = default_record
    out = []
    for p in doc["grid"]["policies"]:
        if p not in pols:
            continue
        q = {k: v for k, v in pols.items() if k != "default" or p == "default"}
        one = {"grid": dict(doc["grid"], policies=list(q)), "cells": [dict(c, policies=q)]}
        if acceptance.check_plan(one, p).cells[0].passed:
            out.append(p)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--map", action="append", type=Path,
                    help="a regime map (.json or .json.gz; repeatable; default: every map in docs/results/maps/)")
    ap.add_argument("--rejudged", action="append", type=Path, default=[],
                    help="a rejudge.py --out file: its records replace default's stored ones (repeatable)")
    ap.add_argument("--cells", action="store_true", help="list, per cell default fails, the policies that pass it")
    args = ap.parse_args()
    maps = args.map or sorted(MAPS.glob("*.json.gz"))
    fresh: dict[str, dict] = {}
    for path in args.rejudged:
        try:
            fresh.update({r["cell"]: r["record"] for r in json.loads(path.read_text())})
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"pass_oracle: {path}: not a rejudge.py --out file ({e})", file=sys.stderr)
            return 2
    count: dict[str, Counter] = defaultdict(Counter)
    cells: Counter = Counter()
    nobody: list[str] = []
    listed: list[str] = []
    for path in maps:
        try:
            doc = read_map(path)
        except CliError as e:
            print(f"pass_oracle: {e}", file=sys.stderr)
            return 2
        for c in doc["cells"]:
            key = map_cell_key(c)
            ps = passers(doc, c, fresh.get(key))
            cells[c["profile"]] += 1
            count[c["profile"]].update(ps)
            if not ps:
                nobody.append(key)
            elif "default" not in ps:
                listed.append(f"  {key} ({path.name}): {', '.join(ps)}")
    for profile, n in cells.items():
        ranked = sorted(count[profile].items(), key=lambda kv: (-kv[1], kv[0]))
        print(f"{profile}: {n} cells; would pass as default: " + ", ".join(f"{p} {k}" for p, k in ranked))
    total = sum(cells.values())
    print(f"cells some policy passes: {total - len(nobody)} of {total}; default passes "
          f"{sum(count[p]['default'] for p in cells)} ({len(fresh)} of its records re-judged)")
    if nobody:
        print("no policy passes: " + ", ".join(nobody))
    if args.cells:
        print(f"cells default fails that another policy passes ({len(listed)}):")
        print("\n".join(listed))
    return 0


if __name__ == "__main__":
    sys.exit(main())

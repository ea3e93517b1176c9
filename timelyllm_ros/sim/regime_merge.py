"""Several saved regime maps read as one (``timelyllm sweep --from-json A --from-json B``).

A full grid is often run in parts (a lent machine for some cells, this one for the rest, a
resumed sweep); the sweep is deterministic per seed, so parts of one grid run anywhere are
parts of the same map.  `merge_maps` joins them into the document `timelyllm sweep --out`
writes, so one command prints the whole grid's tables, acceptance and per-regime comparisons.

It refuses what would not be one map: different policy sets, seeds or sources (a GPU map beside
a simulated one), and a cell present twice with different figures (two code versions); the
same cell twice with the same figures is kept once.  Pure: documents in, document out.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from .regime import ENGINE_KINDS, GridError

_FIELDS = ("loads", "capacities", "profiles", "engine_kinds")  # _key's order


def _ordered(values: Sequence[str], canon: Sequence[str]) -> list[str]:
    seen = list(dict.fromkeys(values))
    return [v for v in canon if v in seen] + [v for v in seen if v not in canon]


def _key(cell: Mapping[str, Any]) -> tuple[str, str, str, str]:
    return cell["load"], cell["capacity"], cell["profile"], cell.get("engine", "stock")  # (maps before columns)


def merge_maps(docs: Sequence[Mapping[str, Any]], names: Sequence[str] | None = None,
               canon: Mapping[str, Sequence[str]] | None = None) -> dict[str, Any]:
    """One regime map holding every cell of `docs` (each as `timelyllm sweep --out` writes it),
    in the sweep's own cell order (engine kind, profile, load, capacity).  `canon`: the order of
    each grid list (``loads``, ``capacities``, ``profiles``; the sweep passes its full grid's) —
    names it lacks follow in the order first seen; engine kinds follow ``ENGINE_KINDS``.
    GridError names the file (`names[i]`) and what differs where the documents are not parts of
    one map."""
    if not docs:
        raise GridError("no regime maps to merge")
    names = list(names) if names is not None else [f"map {i + 1}" for i in range(len(docs))]
    first = docs[0]
    for doc, name in zip(docs[1:], names[1:]):
        for field in ("kind", "source", "seed"):
            if doc.get(field) != first.get(field):
                raise GridError(f"{name}: {field} {doc.get(field)!r} differs from {names[0]}'s "
                                f"{first.get(field)!r}: not parts of one map")
        if set(doc["grid"]["policies"]) != set(first["grid"]["policies"]):
            diff = sorted(set(doc["grid"]["policies"]) ^ set(first["grid"]["policies"]))
            raise GridError(f"{name}: its policies differ from {names[0]}'s ({', '.join(diff)}): not parts of one map")
    cells: dict[tuple[str, str, str, str], Mapping[str, Any]] = {}
    where: dict[tuple[str, str, str, str], str] = {}
    for doc, name in zip(docs, names):
        for cell in doc["cells"]:
            k = _key(cell)
            if k in cells and cells[k] != cell:
                raise GridError(f"cell {' | '.join(k)} is in {where[k]} and {name} with different figures "
                                "(different code or seeds): not parts of one map")
            cells.setdefault(k, cell)
            where.setdefault(k, name)
    # the grid's lists: what the cells hold (loads, capacities, profiles, engine kinds = _key's order)
    order_of = (*((canon or {}).get(f, ()) for f in ("loads", "capacities", "profiles")), ENGINE_KINDS)
    lists = [_ordered([k[i] for k in cells], order_of[i]) for i in range(4)]
    grid = dict(zip(_FIELDS, lists))
    rank = {f: {v: i for i, v in enumerate(grid[f])} for f in grid}
    order = sorted(cells, key=lambda k: (rank["engine_kinds"][k[3]], rank["profiles"][k[2]], rank["loads"][k[0]],
                                         rank["capacities"][k[1]]))
    timeouts = [d.get("cell_timeout_s") for d in docs]
    return {
        "kind": first["kind"], "source": first["source"], "seed": first.get("seed"),
        "grid": {"loads": grid["loads"], "capacities": grid["capacities"], "profiles": grid["profiles"],
                 "policies": list(first["grid"]["policies"]), "engine_kinds": grid["engine_kinds"]},
        # the longest limit any part ran under (None: some part ran without one)
        "cell_timeout_s": None if any(t is None for t in timeouts) else max(timeouts),
        "cells": [cells[k] for k in order],
    }

"""One policy against another over a regime map, per regime (`timelyllm sweep --versus A,B`).

A *regime* is an engine profile x capability column x kind of capacity: the policies' own
batching (``default``), less KV memory (``kv/N``) or a fixed batch cap (``capN``); its cells are
the map's loads at those capacities.  For each regime and each score — the whole plan (Eq. 3,
``accrued_*_pct``) and the first action (``*_pct``), total and urgent, % of max — it counts the
cells where A beats B by more than ``tol`` points, those where B beats A by more, and gives the
median, smallest and largest margin A − B over the regime's cells where both ran (a run that
timed out or failed is no figure: the cell is counted as not comparable).  Pure: reads the map's
JSON document, no I/O.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Sequence

SCORES = (("accrued_total_pct", "whole plan, total"), ("accrued_urgent_pct", "whole plan, urgent"),
          ("total_pct", "first action, total"), ("urgent_pct", "first action, urgent"))


def capacity_kind(capacity: str) -> str:
    """'default' -> 'own batching', 'kv/4' -> 'KV memory', 'cap8' -> 'batch cap'."""
    if capacity.startswith("kv/"):
        return "KV memory"
    if capacity.startswith("cap"):
        return "batch cap"
    return "own batching"


@dataclass(frozen=True)
class Margin:
    """A − B on one score over one regime's comparable cells."""
    score: str
    cells: int  # cells where both have the figure
    a_ahead: int  # cells where A − B > tol
    b_ahead: int  # cells where B − A > tol
    median: float | None
    low: float | None
    high: float | None


@dataclass(frozen=True)
class Regime:
    profile: str
    column: str
    capacity: str  # capacity_kind
    cells: int  # cells of the map in this regime
    loads: tuple[str, ...]
    margins: tuple[Margin, ...]


def _figure(cell: dict[str, Any], policy: str, field: str) -> float | None:
    rec = cell["policies"].get(policy)
    if not isinstance(rec, dict) or rec.get("status", "ok") != "ok":
        return None
    v = rec.get(field)
    return float(v) if isinstance(v, (int, float)) else None


def versus(doc: dict[str, Any], a: str, b: str, tol: float = 1.0) -> list[Regime]:
    """Per regime (in the map's own order of profiles, columns and capacities), A's margins over B.
    Raises ValueError naming the policy the map does not hold."""
    pols = doc["grid"]["policies"]
    for p in (a, b):
        if p not in pols:
            raise ValueError(f"policy {p!r} is not in this regime map (it has: {', '.join(pols)})")
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for cell in doc["cells"]:
        key = (cell["profile"], cell.get("engine", "stock"), capacity_kind(cell["capacity"]))
        groups.setdefault(key, []).append(cell)
    out = []
    for (profile, column, cap), cells in groups.items():
        margins = []
        for field, label in SCORES:
            diffs = []
            for cell in cells:
                fa, fb = _figure(cell, a, field), _figure(cell, b, field)
                if fa is not None and fb is not None:
                    diffs.append(fa - fb)
            margins.append(Margin(label, len(diffs), sum(d > tol for d in diffs), sum(d < -tol for d in diffs),
                                  statistics.median(diffs) if diffs else None, min(diffs, default=None),
                                  max(diffs, default=None)))
        loads = tuple(dict.fromkeys(c["load"] for c in cells))
        out.append(Regime(profile, column, cap, len(cells), loads, tuple(margins)))
    return out


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1f}"


def rows(regimes: Sequence[Regime], a: str, b: str) -> tuple[list[str], list[list[str]]]:
    """A table: one row per regime and score (header, rows), for the console and Markdown alike."""
    head = ["profile", "column", "capacity", "score", f"ahead: {a} / {b} / cells",
            f"{a} − {b}: median", "min", "max"]
    body = []
    for r in regimes:
        for m in r.margins:
            body.append([r.profile, r.column, r.capacity, m.score, f"{m.a_ahead} / {m.b_ahead} / {m.cells}",
                         _num(m.median), _num(m.low), _num(m.high)])
    return head, body


def markdown(regimes: Sequence[Regime], a: str, b: str, tol: float = 1.0) -> str:
    head, body = rows(regimes, a, b)
    lines = [f"`{a}` against `{b}` per regime (points of % of max; ahead = by more than {tol:g} point; "
             "loads: " + ", ".join(dict.fromkeys(ld for r in regimes for ld in r.loads)) + ")", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines) + "\n"

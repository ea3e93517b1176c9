"""Issue 15's acceptance rules, checked on a regime map (``timelyllm sweep`` JSON): pure, doc in,
verdicts out.

For the checked policy (``default``) in every cell:

* **not beaten** — total and urgent time utility (% of max) >= the best *other* policy that
  finished the cell − ``BEATEN_TOLERANCE`` (1 point).  A cell the checked policy did not finish
  (``error``/``timeout``) fails; other policies that did not finish are not candidates for "best".
* **binding cells** — a cell whose capacity is a cap or a KV-memory limit and where that limit
  *makes policies differ*: some policy that finished both this cell and the same load and profile
  with default batching moved by more than ``BINDING_MOVE`` (1 point) on total or urgent utility.
  (Without a default-capacity cell in the grid: any cap/memory cell whose policies span more than
  ``WIN_MARGIN`` points of urgent utility.)  There the checked policy should be >= best other + 5
  points on urgent utility, or within 2 points of the isolated-service bound; the goal is at least
  half of the binding cells.
* **chat QoE** — where the load has chat requests: the checked policy's mean QoE (Andes' metric,
  0..1) >= Andes' − 0.02 (2 points).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

BEATEN_TOLERANCE = 1.0  # points of % of max
BINDING_MOVE = 1.0  # points: a cap/memory limit "binds" when it moves some policy by more than this
WIN_MARGIN = 5.0  # points of urgent utility over the best other policy
BOUND_MARGIN = 2.0  # points below the isolated-service bound
QOE_TOLERANCE = 0.02  # QoE (0..1) below Andes'


@dataclass(frozen=True, slots=True)
class CellVerdict:
    profile: str
    load: str
    capacity: str
    status: str  # the checked policy's run status
    best_other_total: str | None  # name of the best other policy on total utility
    total_margin: float | None  # checked − best other, points (None: no figure)
    best_other_urgent: str | None
    urgent_margin: float | None
    urgent_to_bound: float | None  # checked urgent − bound urgent, points
    binding: bool
    binding_win: bool | None  # None where the cell is not binding
    qoe_margin: float | None  # checked QoE − Andes' QoE (None: no chat or no Andes run)
    not_beaten: bool
    qoe_ok: bool

    @property
    def key(self) -> str:
        return f"{self.profile}/{self.load}/{self.capacity}"


@dataclass(frozen=True, slots=True)
class Acceptance:
    policy: str
    cells: tuple[CellVerdict, ...]

    @property
    def beaten(self) -> list[CellVerdict]:
        return [c for c in self.cells if not c.not_beaten]

    @property
    def binding(self) -> list[CellVerdict]:
        return [c for c in self.cells if c.binding]

    @property
    def binding_wins(self) -> int:
        return sum(1 for c in self.binding if c.binding_win)

    @property
    def qoe_misses(self) -> list[CellVerdict]:
        return [c for c in self.cells if not c.qoe_ok]

    @property
    def passed(self) -> bool:
        b = self.binding
        return not self.beaten and not self.qoe_misses and (not b or 2 * self.binding_wins >= len(b))

    def summary(self) -> str:
        b = self.binding
        lines = [f"acceptance of `{self.policy}` (issue 15 rules, simulator): "
                 f"{'PASS' if self.passed else 'FAIL'}",
                 f"- not beaten (total and urgent >= best other − {BEATEN_TOLERANCE:g} point): "
                 f"{len(self.cells) - len(self.beaten)}/{len(self.cells)} cells",
                 f"- binding cap/memory cells where it is >= best other + {WIN_MARGIN:g} urgent or within "
                 f"{BOUND_MARGIN:g} of the bound: {self.binding_wins}/{len(b)} (goal: at least half)",
                 f"- chat QoE >= Andes − {QOE_TOLERANCE * 100:g} points: "
                 f"{len(self.cells) - len(self.qoe_misses)}/{len(self.cells)} cells"]
        for c in self.beaten:
            lines.append(f"  beaten in {c.key}: status {c.status}, total {_signed(c.total_margin)} vs "
                         f"{c.best_other_total}, urgent {_signed(c.urgent_margin)} vs {c.best_other_urgent}")
        for c in self.qoe_misses:
            lines.append(f"  chat QoE below Andes in {c.key}: {_signed(c.qoe_margin, 3)}")
        return "\n".join(lines)


def _signed(v: float | None, digits: int = 1) -> str:
    return "n/a" if v is None else f"{v:+.{digits}f}"


def _ok(rec: Mapping[str, Any] | None) -> bool:
    return rec is not None and rec.get("status") == "ok"


def _best_other(policies: Mapping[str, Mapping[str, Any]], me: str, field: str) -> tuple[str | None, float | None]:
    vals = [(r[field], n) for n, r in policies.items() if n != me and _ok(r) and r.get(field) is not None]
    if not vals:
        return None, None
    v, n = min(vals, key=lambda x: (-x[0], x[1]))  # the highest; ties: alphabetically first
    return n, v


def _binding(cell: Mapping[str, Any], base: Mapping[str, Any] | None) -> bool:
    if cell["capacity"] == "default":
        return False
    pols = cell["policies"]
    if base is not None:
        for name, rec in pols.items():
            ref = base["policies"].get(name)
            if not (_ok(rec) and _ok(ref)):
                continue
            for f in ("total_pct", "urgent_pct"):
                if rec.get(f) is not None and ref.get(f) is not None and abs(rec[f] - ref[f]) > BINDING_MOVE:
                    return True
        return False
    urg = [r["urgent_pct"] for r in pols.values() if _ok(r) and r.get("urgent_pct") is not None]
    return len(urg) > 1 and max(urg) - min(urg) > WIN_MARGIN


def check(doc: Mapping[str, Any], policy: str = "default") -> Acceptance:
    """The verdict of every cell of a regime map for `policy` (which must be in the grid)."""
    if policy not in doc["grid"]["policies"]:
        raise ValueError(f"policy {policy!r} is not in this regime map (policies: {', '.join(doc['grid']['policies'])})")
    by_key = {(c["profile"], c.get("engine"), c["load"], c["capacity"]): c for c in doc["cells"]}
    out: list[CellVerdict] = []
    for c in doc["cells"]:
        pols = c["policies"]
        me = pols[policy]
        base = by_key.get((c["profile"], c.get("engine"), c["load"], "default"))
        binding = _binding(c, base)
        bt, bt_v = _best_other(pols, policy, "total_pct")
        bu, bu_v = _best_other(pols, policy, "urgent_pct")
        ok = _ok(me)
        tm = me["total_pct"] - bt_v if ok and bt_v is not None and me.get("total_pct") is not None else None
        um = me["urgent_pct"] - bu_v if ok and bu_v is not None and me.get("urgent_pct") is not None else None
        bound_u = c["bound"].get("urgent_pct")
        ub = me["urgent_pct"] - bound_u if ok and bound_u is not None and me.get("urgent_pct") is not None else None
        not_beaten = ok and (tm is None or tm >= -BEATEN_TOLERANCE) and (um is None or um >= -BEATEN_TOLERANCE)
        win = None
        if binding:
            win = bool(ok and ((um is not None and um >= WIN_MARGIN) or (ub is not None and ub >= -BOUND_MARGIN)
                               or (um is None and ub is None)))
        andes = pols.get("andes")
        qm = None
        if ok and _ok(andes) and me.get("chat_qoe") is not None and andes.get("chat_qoe") is not None:
            qm = me["chat_qoe"] - andes["chat_qoe"]
        has_chat = ok and me.get("chat_qoe") is not None
        qoe_ok = (not has_chat) or qm is None or qm >= -QOE_TOLERANCE - 1e-12
        if not ok and any(_ok(r) and r.get("chat_qoe") is not None for r in pols.values()):
            qoe_ok = False
        out.append(CellVerdict(c["profile"], c["load"], c["capacity"], me.get("status", "?"), bt, tm, bu, um, ub,
                               binding, win, qm, not_beaten, qoe_ok))
    return Acceptance(policy, tuple(out))


def markdown(acc: Acceptance) -> str:
    """Per cell: margins vs the best other policy, binding or not, and the verdicts."""
    head = ["profile", "load", "capacity", "total − best other", "urgent − best other", "urgent − bound",
            "binding", "chat QoE − Andes", "verdict"]
    lines = [acc.summary().replace("\n", "  \n"), "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in acc.cells:
        verdict = "ok" if c.not_beaten and c.qoe_ok else "**beaten**" if not c.not_beaten else "**QoE**"
        bind = "-" if not c.binding else ("win" if c.binding_win else "no win")
        lines.append("| " + " | ".join([
            f"`{c.profile}`", c.load, c.capacity,
            f"{_signed(c.total_margin)} (`{c.best_other_total}`)" if c.best_other_total else "-",
            f"{_signed(c.urgent_margin)} (`{c.best_other_urgent}`)" if c.best_other_urgent else "-",
            _signed(c.urgent_to_bound), bind, _signed(c.qoe_margin, 3), verdict]) + " |")
    return "\n".join(lines) + "\n"

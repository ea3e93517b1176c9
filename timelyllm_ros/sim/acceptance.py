"""Acceptance rules on a regime map (``timelyllm sweep`` JSON): pure, doc in,
verdicts out.

**The headline: issue 25's rules on the whole plan** (``check_plan``; Eq. 3), for the checked
policy (``default``) in every cell and capability column (engine kind):

* accrued utility (Eq. 3), total and urgent: >= the best other policy that finished the cell − 1
  point;
* first-action utility, total and urgent: >= best other − 1 point, and mean completion time <=
  1.05 x the lowest other policy's — where that is not met, the cell still passes if no other
  policy has more first-action utility (total) AND less mean completion at once (the checked
  policy is on the cell's Pareto front, which Theorem 1 says Eq. 3's optimum is); such cells are
  named in the printout;
* chat QoE (Andes' metric, 0..1) >= Andes' − 0.02;
* >= 90 % of the Eq. 3 isolated-service bound in every cell where some policy reaches 95 % of it.

**Issue 15's rules** (``check``; first-action utility only, kept for comparison).
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


# =============================================================================================
# Issue 25: the whole plan (Eq. 3), per cell and capability column
# =============================================================================================

PLAN_TOLERANCE = 1.0  # points of % of max below the best other policy
COMPLETION_FACTOR = 1.05  # mean completion <= this x the lowest other policy's
BOUND_REACHED = 95.0  # % of the Eq. 3 isolated-service bound some policy reaches ...
BOUND_REQUIRED = 90.0  # ... where the checked policy must reach this


@dataclass(frozen=True, slots=True)
class Versus:
    """The checked policy's figure against the best other policy's (higher is better, except
    completion: lower)."""

    mine: float | None
    other: str | None  # the best other policy (None: no other has the figure)
    other_value: float | None

    @property
    def margin(self) -> float | None:
        return None if self.mine is None or self.other_value is None else self.mine - self.other_value


@dataclass(frozen=True, slots=True)
class PlanCellVerdict:
    """Issue 25's rules in one cell (load, capacity, profile, engine kind)."""

    profile: str
    engine: str
    load: str
    capacity: str
    status: str
    accrued_total: Versus
    accrued_urgent: Versus
    first_total: Versus
    first_urgent: Versus
    completion: Versus  # mean completion s vs the lowest other policy's
    dominated_by: tuple[str, ...]  # others with more first-action utility AND less mean completion
    qoe: Versus  # chat QoE vs Andes' (other = "andes")
    bound_pct: float | None  # the checked policy's accrued utility, % of the Eq. 3 isolated bound
    bound_best: Versus  # the best policy's % of that bound (any policy, the checked one included)
    accrued_ok: bool
    first_ok: bool  # first-action utility and completion rules met directly
    qoe_ok: bool
    bound_ok: bool

    @property
    def key(self) -> str:
        return f"{self.profile}/{self.engine}/{self.load}/{self.capacity}"

    @property
    def pareto_ok(self) -> bool:
        """Not met directly, but on the cell's Pareto front (first-action utility x completion)."""
        return not self.first_ok and self.status == "ok" and not self.dominated_by

    @property
    def passed(self) -> bool:
        return self.accrued_ok and (self.first_ok or self.pareto_ok) and self.qoe_ok and self.bound_ok


@dataclass(frozen=True, slots=True)
class PlanAcceptance:
    policy: str
    cells: tuple[PlanCellVerdict, ...]
    missing: bool = False  # the map has no whole-plan figures (written before issue 25)

    @property
    def passed(self) -> bool:
        return not self.missing and all(c.passed for c in self.cells)

    def summary(self) -> str:
        n = len(self.cells)
        head = (f"acceptance of `{self.policy}` (issue 25 rules: the whole plan, Eq. 3; simulator): "
                f"{'PASS' if self.passed else 'FAIL'} — {sum(c.passed for c in self.cells)}/{n} cells pass every rule")
        if self.missing:
            return head + "\n- this map has no whole-plan figures (written before issue 25): re-run the sweep"
        pareto = [c for c in self.cells if c.pareto_ok]
        bound_cells = [c for c in self.cells if c.bound_best.mine is not None and c.bound_best.mine >= BOUND_REACHED]
        chat = [c for c in self.cells if c.qoe.mine is not None]
        lines = [head,
                 f"- accrued utility (Eq. 3), total and urgent >= best other − {PLAN_TOLERANCE:g} point: "
                 f"{sum(c.accrued_ok for c in self.cells)}/{n} cells",
                 f"- first-action utility, total and urgent >= best other − {PLAN_TOLERANCE:g} point and mean "
                 f"completion <= {COMPLETION_FACTOR:g} x the lowest other's: {sum(c.first_ok for c in self.cells)}/{n} "
                 f"cells; on the Pareto front instead (no other policy has more first-action utility AND less "
                 f"mean completion): {len(pareto)}" + (f" ({', '.join(c.key for c in pareto)})" if pareto else ""),
                 f"- chat QoE >= Andes − {QOE_TOLERANCE * 100:g} points: {sum(c.qoe_ok for c in chat)}/{len(chat)} "
                 f"cells with chat",
                 f"- >= {BOUND_REQUIRED:g} % of the Eq. 3 isolated-service bound where some policy reaches "
                 f"{BOUND_REACHED:g} %: {sum(c.bound_ok for c in bound_cells)}/{len(bound_cells)} cells"]
        lines += ["  " + cell_line(c) for c in self.cells]
        return "\n".join(lines)


def _fmt(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _vs(v: Versus, digits: int = 1) -> str:
    if v.mine is None:
        return "-"
    return f"{_fmt(v.mine, digits)} ({v.other} {_fmt(v.other_value, digits)})" if v.other else _fmt(v.mine, digits)


def cell_line(c: PlanCellVerdict) -> str:
    """One cell's verdict with its numbers (the checked policy first, the best other in brackets)."""
    if c.status != "ok":
        return f"FAIL {c.key}: the checked policy's run is {c.status}"
    fails = [name for name, ok in (("accrued", c.accrued_ok), ("first-action/completion", c.first_ok or c.pareto_ok),
                                   ("QoE", c.qoe_ok), ("bound", c.bound_ok)) if not ok]
    ratio = (c.completion.mine / c.completion.other_value
             if c.completion.mine is not None and c.completion.other_value else None)
    first = f"first {_vs(c.first_total)} / {_vs(c.first_urgent)}, completion {_vs(c.completion, 2)} s" + \
        (f" x{ratio:.3f}" if ratio is not None else "")
    if c.pareto_ok:
        first += " [Pareto front]"
    elif not c.first_ok and c.dominated_by:
        first += f" [dominated by {', '.join(c.dominated_by)}]"
    parts = [f"accrued {_vs(c.accrued_total)} / {_vs(c.accrued_urgent)}", first]
    if c.qoe.mine is not None:
        parts.append(f"QoE {_vs(c.qoe, 3)}")
    parts.append(f"bound {_fmt(c.bound_pct)} % (best {_vs(c.bound_best)})")
    verdict = "PASS" if c.passed else "FAIL " + ", ".join(fails)
    return f"{verdict} {c.key}: " + "; ".join(parts)


def _best(policies: Mapping[str, Mapping[str, Any]], me: str | None, field: str, sign: float = 1.0) -> Versus:
    """The best policy other than `me` (None: any) on `field`; ties: alphabetically first."""
    vals = [(r[field], n) for n, r in policies.items() if n != me and _ok(r) and r.get(field) is not None]
    if not vals:
        return Versus(None, None, None)
    v, n = min(vals, key=lambda x: (-sign * x[0], x[1]))
    return Versus(None, n, v)


def _with(v: Versus, mine: Any) -> Versus:
    return Versus(mine, v.other, v.other_value)


def check_plan(doc: Mapping[str, Any], policy: str = "default") -> PlanAcceptance:
    """Issue 25's verdict of every cell (and capability column) of a regime map for `policy`:
    accrued utility (Eq. 3) total and urgent >= best other − 1 point; first-action utility total
    and urgent >= best other − 1 point and mean completion <= 1.05 x the lowest other policy's —
    or, where not, no other policy with more first-action utility (total) AND less mean completion
    (the cell's Pareto front; Theorem 1); chat QoE >= Andes − 2 points; >= 90 % of the Eq. 3
    isolated-service bound wherever some policy reaches 95 % of it.  Other policies that did not
    finish a cell are no candidates; the checked policy must finish every cell."""
    if policy not in doc["grid"]["policies"]:
        raise ValueError(f"policy {policy!r} is not in this regime map (policies: {', '.join(doc['grid']['policies'])})")
    if not any("accrued_total_pct" in r for c in doc["cells"] for r in c["policies"].values()):
        return PlanAcceptance(policy, (), missing=True)
    out: list[PlanCellVerdict] = []
    tol = PLAN_TOLERANCE - 1e-9
    for c in doc["cells"]:
        pols = c["policies"]
        me = pols[policy]
        ok = _ok(me)
        get = (lambda f: me.get(f)) if ok else (lambda f: None)
        vs = {f: _with(_best(pols, policy, f), get(f))
              for f in ("accrued_total_pct", "accrued_urgent_pct", "total_pct", "urgent_pct")}
        compl = _with(_best(pols, policy, "completion_mean_s", -1.0), get("completion_mean_s"))

        def meets(v: Versus) -> bool:  # no figure on either side: nothing to compare (e.g. no urgent requests)
            return v.margin is None or v.margin >= -tol

        accrued_ok = ok and meets(vs["accrued_total_pct"]) and meets(vs["accrued_urgent_pct"])
        compl_ok = compl.mine is None or compl.other_value is None or \
            compl.mine <= COMPLETION_FACTOR * compl.other_value + 1e-9
        first_ok = ok and meets(vs["total_pct"]) and meets(vs["urgent_pct"]) and compl_ok
        dominated: tuple[str, ...] = ()
        if ok and me.get("total_pct") is not None and me.get("completion_mean_s") is not None:
            dominated = tuple(sorted(
                n for n, r in pols.items() if n != policy and _ok(r) and r.get("total_pct") is not None
                and r.get("completion_mean_s") is not None and r["total_pct"] > me["total_pct"] + 1e-9
                and r["completion_mean_s"] < me["completion_mean_s"] - 1e-9))
        andes = pols.get("andes")
        qoe = Versus(get("chat_qoe"), "andes" if _ok(andes) and andes.get("chat_qoe") is not None else None,
                     andes.get("chat_qoe") if _ok(andes) else None)
        qoe_ok = ok and (qoe.margin is None or qoe.margin >= -QOE_TOLERANCE - 1e-12)
        if policy == "andes":
            qoe = Versus(qoe.mine, None, None)
        best_bound = _best(pols, None, "accrued_pct_of_bound")
        best_bound = Versus(best_bound.other_value, best_bound.other, best_bound.other_value)
        mine_b = get("accrued_pct_of_bound")
        bound_ok = ok and (best_bound.mine is None or best_bound.mine < BOUND_REACHED
                           or (mine_b is not None and mine_b >= BOUND_REQUIRED - 1e-9))
        out.append(PlanCellVerdict(
            c["profile"], c.get("engine", "-"), c["load"], c["capacity"], me.get("status", "?"),
            vs["accrued_total_pct"], vs["accrued_urgent_pct"], vs["total_pct"], vs["urgent_pct"], compl, dominated,
            qoe, mine_b, best_bound, accrued_ok, first_ok, qoe_ok, bound_ok))
    return PlanAcceptance(policy, tuple(out))


def plan_markdown(acc: PlanAcceptance) -> str:
    """Issue 25's summary, then per cell: the checked policy's figures against the best other's."""
    head = ["profile", "column", "load", "capacity", "accrued total / urgent (best other)",
            "first-action total / urgent (best other)", "mean completion s (lowest other)", "chat QoE (Andes)",
            "% of Eq. 3 bound (best)", "verdict"]
    lines = [acc.summary().split("\n  ")[0].replace("\n", "  \n"), "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in acc.cells:
        if c.status != "ok":
            lines.append(f"| `{c.profile}` | {c.engine} | {c.load} | {c.capacity} | *{c.status}* |" + " |" * 5
                         + " **FAIL** |")
            continue
        verdict = "PASS" if c.passed else "**FAIL**"
        if c.pareto_ok:
            verdict += " (Pareto)"
        lines.append("| " + " | ".join([
            f"`{c.profile}`", c.engine, c.load, c.capacity,
            f"{_vs(c.accrued_total)} / {_vs(c.accrued_urgent)}", f"{_vs(c.first_total)} / {_vs(c.first_urgent)}",
            _vs(c.completion, 2), _vs(c.qoe, 3), f"{_fmt(c.bound_pct)} ({_vs(c.bound_best)})", verdict]) + " |")
    return "\n".join(lines) + "\n"

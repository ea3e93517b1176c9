"""Issue 15's acceptance rules on a regime map (timelyllm_ros/sim/acceptance.py) and
`timelyllm sweep --from-json`: synthetic maps whose verdicts are known by construction."""

from __future__ import annotations

import json

import pytest

from timelyllm_ros.cli import main
from timelyllm_ros.sim.acceptance import check, check_plan, markdown, plan_markdown


def run(total: float, urgent: float, qoe: float | None = None, status: str = "ok") -> dict:
    if status != "ok":
        return {"status": status, "reason": "x"}
    return {"status": "ok", "total_pct": total, "urgent_pct": urgent, "chat_qoe": qoe}


def cell(capacity: str, policies: dict, load: str = "L", profile: str = "P", bound_urgent: float = 100.0) -> dict:
    return {"profile": profile, "load": load, "capacity": capacity,
            "bound": {"total_pct": 100.0, "urgent_pct": bound_urgent}, "policies": policies}


def doc(*cells: dict) -> dict:
    pols = sorted(cells[0]["policies"])
    return {"kind": "timelyllm regime map", "grid": {"policies": pols, "profiles": ["P"]}, "cells": list(cells)}


def test_a_policy_beaten_by_more_than_a_point_fails_the_cell_and_is_named():
    d = doc(cell("default", {"default": run(90.0, 80.0), "andes": run(90.5, 81.5), "fcfs": run(70, 60)}))
    acc = check(d)
    (v,) = acc.cells
    assert not v.not_beaten and v.best_other_urgent == "andes" and v.urgent_margin == pytest.approx(-1.5)
    assert v.total_margin == pytest.approx(-0.5)
    assert not acc.passed and "beaten in P/L/default" in acc.summary()


def test_within_one_point_is_not_beaten_and_failed_others_are_no_candidates():
    d = doc(cell("default", {"default": run(90.0, 80.0), "andes": run(90.9, 80.9),
                             "lamps": run(0, 0, status="error")}))
    acc = check(d)
    assert acc.passed and acc.cells[0].not_beaten
    d2 = doc(cell("default", {"default": run(0, 0, status="timeout"), "andes": run(10, 10)}))
    assert not check(d2).cells[0].not_beaten  # the checked policy must finish the cell


def test_a_cap_binds_only_where_it_moves_some_policy_against_default_batching():
    base = cell("default", {"default": run(95, 90), "andes": run(95, 90)})
    same = cell("cap8", {"default": run(95, 90), "andes": run(95.5, 90.5)})  # moves < 1 point: not binding
    moved = cell("kv/4", {"default": run(80, 70), "andes": run(60, 50)})  # binding, +20 urgent: a win
    close = cell("cap4", {"default": run(70, 52), "andes": run(69, 50)})  # binding, +2 only, far from bound
    acc = check(doc(base, same, moved, close))
    flags = {c.capacity: (c.binding, c.binding_win) for c in acc.cells}
    assert flags == {"default": (False, None), "cap8": (False, None), "kv/4": (True, True), "cap4": (True, False)}
    assert acc.binding_wins == 1 and len(acc.binding) == 2 and acc.passed  # half of the binding cells


def test_near_the_isolated_service_bound_counts_as_a_binding_win():
    base = cell("default", {"default": run(99, 99), "andes": run(99, 99)})
    capped = cell("cap4", {"default": run(97, 98.5), "andes": run(90, 97)}, bound_urgent=100.0)
    acc = check(doc(base, capped))
    assert acc.cells[1].binding and acc.cells[1].binding_win and acc.cells[1].urgent_to_bound == pytest.approx(-1.5)


def test_less_than_half_binding_wins_fails():
    base = cell("default", {"default": run(95, 90), "andes": run(95, 90)})
    c1 = cell("cap4", {"default": run(70, 52), "andes": run(69, 50)})
    acc = check(doc(base, c1))
    assert not acc.beaten and acc.binding_wins == 0 and not acc.passed


def test_chat_qoe_more_than_two_points_below_andes_fails():
    d = doc(cell("default", {"default": run(90, 80, qoe=0.95), "andes": run(85, 75, qoe=0.975)}))
    acc = check(d)
    assert acc.qoe_misses and not acc.passed and acc.cells[0].qoe_margin == pytest.approx(-0.025)
    d_ok = doc(cell("default", {"default": run(90, 80, qoe=0.96), "andes": run(85, 75, qoe=0.975)}))
    assert check(d_ok).passed


def test_unknown_policy_is_a_clear_error():
    with pytest.raises(ValueError, match="not in this regime map"):
        check(doc(cell("default", {"default": run(1, 1)})), "nope")


def test_from_json_prints_tables_and_verdicts_without_running(tmp_path, capsys):
    d = doc(cell("default", {"default": run(90.0, 80.0), "andes": run(95.0, 81.5)}))
    for c in d["cells"]:
        c.update(best={"total_pct": "andes", "urgent_pct": "andes"}, best_ties={}, requests=1)
    f = tmp_path / "m.json"
    f.write_text(json.dumps(d))
    md = tmp_path / "m.md"
    assert main(["sweep", "--from-json", str(f), "--markdown", str(md)]) == 0
    out = capsys.readouterr().out
    assert "acceptance of `default`" in out and "FAIL" in out and "beaten in P/L/default" in out
    assert "| `P` | L | default | -5.0 (`andes`) | -1.5 (`andes`)" in md.read_text()
    assert markdown(check(d)).count("\n") >= 8


def test_from_json_refuses_a_file_that_is_no_regime_map(tmp_path, capsys):
    f = tmp_path / "x.json"
    f.write_text('{"kind": "other"}')
    assert main(["sweep", "--from-json", str(f)]) == 2
    assert "not a regime map" in capsys.readouterr().err
    f.write_text('{"kind": "timelyllm regime map", "grid": {}}')
    assert main(["sweep", "--from-json", str(f)]) == 2
    assert "needs grid.policies" in capsys.readouterr().err


# --------------------------------------------------------------------------- issue 25: the whole plan

def prun(acc: float, acc_u: float, first: float, first_u: float, compl: float, bound: float = 99.0,
         qoe: float | None = None, status: str = "ok") -> dict:
    if status != "ok":
        return {"status": status, "reason": "x"}
    return {"status": "ok", "accrued_total_pct": acc, "accrued_urgent_pct": acc_u, "total_pct": first,
            "urgent_pct": first_u, "completion_mean_s": compl, "accrued_pct_of_bound": bound, "chat_qoe": qoe}


def pcell(policies: dict, engine: str = "stock", capacity: str = "default") -> dict:
    return {"profile": "P", "engine": engine, "load": "L", "capacity": capacity, "bound": {},
            "policies": policies}


def test_plan_rules_pass_within_a_point_and_five_percent_completion():
    d = doc(pcell({"default": prun(90.0, 80.0, 95.0, 90.0, 21.0), "andes": prun(90.9, 80.9, 95.9, 90.9, 20.0)}))
    acc = check_plan(d)
    (c,) = acc.cells
    assert acc.passed and c.accrued_ok and c.first_ok and c.bound_ok and c.qoe_ok
    assert c.accrued_urgent.other == "andes" and c.accrued_urgent.margin == pytest.approx(-0.9)
    assert "PASS P/stock/L/default" in acc.summary() and "accrued 90.0 (andes 90.9)" in acc.summary()


def test_accrued_beaten_by_more_than_a_point_fails_in_its_column_only():
    stock = pcell({"default": prun(90.0, 78.0, 95.0, 90.0, 20.0), "andes": prun(90.0, 79.5, 95.0, 90.0, 20.0)})
    pres = pcell({"default": prun(90.0, 80.0, 95.0, 90.0, 20.0), "andes": prun(90.0, 79.5, 95.0, 90.0, 20.0)},
                 engine="preserve")
    acc = check_plan(doc(stock, pres))
    assert [c.accrued_ok for c in acc.cells] == [False, True] and not acc.passed
    assert "FAIL accrued P/stock/L/default" in acc.summary()


def test_first_action_or_completion_miss_passes_on_the_pareto_front_and_is_named():
    # default: less first-action utility than andes but completes sooner: nobody beats it on both
    front = pcell({"default": prun(90, 80, 93.0, 88.0, 20.0), "andes": prun(90, 80, 95.0, 90.0, 22.0),
                   "fcfs": prun(80, 70, 90.0, 85.0, 19.5)})
    acc = check_plan(doc(front))
    (c,) = acc.cells
    assert not c.first_ok and c.pareto_ok and c.passed and not c.dominated_by
    assert "Pareto front instead" in acc.summary() and "(P/stock/L/default)" in acc.summary()
    # completion 1.06 x the lowest other and andes better on both: dominated, FAIL naming it
    dom = pcell({"default": prun(90, 80, 94.0, 90.0, 21.2), "andes": prun(90, 80, 94.5, 90.0, 20.0)})
    (c,) = check_plan(doc(dom)).cells
    assert not c.first_ok and not c.pareto_ok and c.dominated_by == ("andes",) and not c.passed
    assert "dominated by andes" in check_plan(doc(dom)).summary()


def test_chat_qoe_and_the_eq3_bound_rules():
    qoe = pcell({"default": prun(90, 80, 95, 90, 20, qoe=0.95), "andes": prun(90, 80, 95, 90, 20, qoe=0.975)})
    (c,) = check_plan(doc(qoe)).cells
    assert not c.qoe_ok and c.qoe.margin == pytest.approx(-0.025)
    # some policy reaches 95 % of the bound: default needs 90 %
    low = pcell({"default": prun(90, 80, 95, 90, 20, bound=89.0), "andes": prun(90, 80, 95, 90, 20, bound=96.0)})
    (c,) = check_plan(doc(low)).cells
    assert not c.bound_ok and c.bound_best.other == "andes" and c.bound_best.mine == 96.0
    # nobody reaches 95 %: the rule does not apply
    far = pcell({"default": prun(90, 80, 95, 90, 20, bound=50.0), "andes": prun(90, 80, 95, 90, 20, bound=94.0)})
    assert check_plan(doc(far)).cells[0].bound_ok


def test_plan_rules_fail_a_cell_the_checked_policy_did_not_finish_and_old_maps_say_so():
    d = doc(pcell({"default": prun(0, 0, 0, 0, 0, status="timeout"), "andes": prun(90, 80, 95, 90, 20)}))
    acc = check_plan(d)
    assert not acc.passed and acc.cells[0].status == "timeout" and "FAIL P/stock/L/default" in acc.summary()
    old = doc(cell("default", {"default": run(90.0, 80.0), "andes": run(90.5, 81.5)}))
    assert check_plan(old).missing and not check_plan(old).passed
    assert plan_markdown(acc).count("\n") >= 4

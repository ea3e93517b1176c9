"""Issue 15's acceptance rules on a regime map (timelyllm_ros/sim/acceptance.py) and
`timelyllm sweep --from-json`: synthetic maps whose verdicts are known by construction."""

from __future__ import annotations

import json

import pytest

from timelyllm_ros.cli import main
from timelyllm_ros.sim.acceptance import check, markdown


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

"""`timelyllm sweep --versus A,B` (sim/versus.py): one policy against another per regime, on a
hand-made regime map whose margins are computed here by hand."""

from __future__ import annotations

import json

import pytest

from timelyllm_ros.cli import main
from timelyllm_ros.sim.versus import capacity_kind, markdown, versus


def _run(acc_t, acc_u, first_t, first_u, status="ok"):
    return {"accrued_total_pct": acc_t, "accrued_urgent_pct": acc_u, "total_pct": first_t, "urgent_pct": first_u,
            "status": status}


def _doc():
    cells = [
        # rtx, own batching: A +0.5 (a tie within 1 point) and +3.0 on accrued total
        {"profile": "rtx", "engine": "stock", "load": "WID1", "capacity": "default",
         "policies": {"a": _run(99.5, 99, 99, 98), "b": _run(99.0, 99, 97, 90)}},
        {"profile": "rtx", "engine": "stock", "load": "drones:400", "capacity": "default",
         "policies": {"a": _run(90.0, 80, 85, 70), "b": _run(87.0, 85, 85, 75)}},
        # rtx, batch cap: B ahead by 10 on accrued total; a timed-out run is no figure
        {"profile": "rtx", "engine": "stock", "load": "WID1", "capacity": "cap8",
         "policies": {"a": _run(80.0, 70, 60, 50), "b": _run(90.0, 70, 60, 50)}},
        {"profile": "rtx", "engine": "stock", "load": "drones:400", "capacity": "cap4",
         "policies": {"a": _run(None, None, None, None, status="timeout"), "b": _run(50.0, 50, 50, 50)}},
        # kv/4 on another profile
        {"profile": "orin", "engine": "stock", "load": "WID1", "capacity": "kv/4",
         "policies": {"a": _run(-100.0, 10, 5, 5), "b": _run(-300.0, 12, 5, 5)}},
    ]
    return {"kind": "timelyllm regime map", "grid": {"policies": ["a", "b"], "profiles": ["rtx", "orin"]},
            "cells": cells}


def test_capacity_kinds():
    assert [capacity_kind(c) for c in ("default", "kv/2", "kv/4", "cap16", "cap4")] == \
        ["own batching", "KV memory", "KV memory", "batch cap", "batch cap"]


def test_margins_per_regime_by_hand():
    regimes = versus(_doc(), "a", "b")
    assert [(r.profile, r.capacity, r.cells) for r in regimes] == \
        [("rtx", "own batching", 2), ("rtx", "batch cap", 2), ("orin", "KV memory", 1)]
    own, cap, kv = regimes
    acc = own.margins[0]  # whole plan, total: +0.5 (tie) and +3.0
    assert (acc.score, acc.cells, acc.a_ahead, acc.b_ahead) == ("whole plan, total", 2, 1, 0)
    assert (acc.median, acc.low, acc.high) == (pytest.approx(1.75), pytest.approx(0.5), pytest.approx(3.0))
    urg = own.margins[1]  # whole plan, urgent: 0 and -5
    assert (urg.a_ahead, urg.b_ahead, urg.median) == (0, 1, pytest.approx(-2.5))
    first_u = own.margins[3]  # first action, urgent: +8 and -5
    assert (first_u.a_ahead, first_u.b_ahead, first_u.low, first_u.high) == (1, 1, -5, 8)
    assert cap.margins[0].cells == 1 and cap.margins[0].b_ahead == 1 and cap.margins[0].median == -10.0
    assert kv.margins[0].median == 200.0 and kv.margins[1].b_ahead == 1
    md = markdown(regimes, "a", "b")
    assert "| rtx | stock | batch cap | whole plan, total | 0 / 1 / 1 | -10.0 | -10.0 | -10.0 |" in md


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="'c' is not in this regime map"):
        versus(_doc(), "a", "c")


@pytest.mark.parametrize("pair, expected", [("a,a", "two different policies"), ("a", "two different policies"),
                                            ("a,zz", "policy 'zz' is not in this map")])
def test_cli_checks_versus_before_any_work(tmp_path, capsys, pair, expected):
    path = tmp_path / "map.json"
    path.write_text(json.dumps(_doc()))
    assert main(["sweep", "--from-json", str(path), "--check", "none", "--versus", pair]) == 2
    err = capsys.readouterr()
    assert expected in err.err and "against" not in err.out  # nothing printed before the check

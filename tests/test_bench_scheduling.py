"""benchmarks/bench_scheduling.py: policies measured in turn and pooled (no timing asserted)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from bench_scheduling import rounds_order, summary  # noqa: E402


def test_every_policy_is_measured_once_per_round_in_turn_and_pooled():
    order = rounds_order(["a", "b", "c"], 3)
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]  # each round once each, start rotating
    assert rounds_order(["a"], 2) == ["a", "a"]
    rounds = [{"wall": [1.0, 2.0], "cpu": [1.0, 1.0], "refused": 1}, {"wall": [9.0], "cpu": [3.0], "refused": 0}]
    r = summary(rounds)  # pooled: one slow round does not become the whole figure
    assert (r["n"], r["wall_med"], r["cpu_med"], r["refused"]) == (3, 2.0, 1.0, 1)
    assert r["wall_p99"] == 9.0 and r["cpu_p99"] == 3.0

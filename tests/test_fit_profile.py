"""The profile-fitting helpers of benchmarks/fit_vllm_profile.py and sim_fidelity.py (no engine)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from fit_vllm_profile import nonneg_lstsq  # noqa: E402
from timelyllm_ros.engines.base import StepRecord, host_gaps  # noqa: E402


def test_nonneg_lstsq_recovers_costs_and_never_goes_negative():
    rows = [[1.0, b - 1, c, 0.0] for b in (1, 2, 3, 4) for c in (100, 400, 900)]
    ys = [0.010 + 0.002 * r[1] + 1e-6 * r[2] for r in rows]
    f = nonneg_lstsq(rows, ys, ["base", "seq", "ctx", "unused"])
    assert f["base"] == pytest.approx(0.010, rel=1e-6)
    assert f["seq"] == pytest.approx(0.002, rel=1e-6)
    assert f["ctx"] == pytest.approx(1e-6, rel=1e-6)
    assert f["unused"] == 0.0
    # data that a negative slope would fit best: that term is dropped, the rest refitted
    rows = [[1.0, x] for x in range(1, 9)]
    f = nonneg_lstsq(rows, [0.02 - 0.001 * x for x in range(1, 9)], ["base", "slope"])
    assert f["slope"] == 0.0 and f["base"] > 0


def rec(start, dur, post=0.0):
    return StepRecord(start_s=start, duration_s=dur, post_s=post, seqs=1, prefill_tokens=0,
                      prefill_context_tokens=0, context_tokens=10, adds=0, output_tokens=1)


def test_host_gaps_skip_idle_periods():
    recs = [rec(0.0, 0.010, 0.001), rec(0.012, 0.010), rec(0.5, 0.010), rec(0.5105, 0.01)]
    assert host_gaps(recs) == pytest.approx([0.001, 0.0005])

"""Issue 26: an executor defends its robot on its own, whoever sends the goals.  Over DDS, with
the executor node (djitellopy backend) and the Tello emulator as separate processes and a foreign
rclpy node (no planner) sending goals: `benchmarks/foreign_goals.py`, run as its own process (it
makes a private network namespace for djitellopy's host-wide UDP ports before rclpy starts)."""

from __future__ import annotations

import json
import subprocess
import sys

from timelyllm_ros.paths import SOURCE_ROOT as REPO_ROOT


def test_thirty_foreign_goals_fly_at_most_the_envelope_over_dds(tmp_path):
    out = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "foreign_goals.py"), "--goals", "30",
                          "--logs", str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    if out.returncode == 2 and "no private network namespace" in out.stderr:
        import pytest

        pytest.skip(out.stderr.strip())
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, out.stdout + out.stderr
    res = json.loads(line[len("RESULT "):])
    assert res["flown_ok"] == 10 and res["refused"] == 20
    assert res["emulator_motion"] == ["forward 500"] * 10  # what reached the (emulated) drone
    assert res["refusal_reasons"] == {
        "outside the flight envelope: this flight (since takeoff) would command distance_cm 5500 (envelope 5000) "
        "(already flown: 5000 cm, 0 deg); nothing sent": 20}
    assert res["multi_call_goal"] == ("outside the flight envelope: goal would command distance_cm 1500 "
                                      "(envelope 1000); nothing sent")
    assert res["mismatch_goal"] == "goal calls [mf(500)] differ from the calls in the text [tc(90)]; nothing sent"
    assert out.returncode == 0

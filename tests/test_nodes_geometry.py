"""Planned paths of the planner node's markers (nodes/geometry.py)."""

from __future__ import annotations

import pytest

from timelyllm_ros.core.types import SkillCall
from timelyllm_ros.nodes.geometry import Pose, path_points


def test_path_points_follow_turns():
    pts, pose = path_points([SkillCall("move_forward", "mf", (100,)), SkillCall("turn_ccw", "tu", (90,)),
                             SkillCall("move_forward", "mf", (50,)), SkillCall("move_right", "mr", (20,))],
                            Pose())
    assert pts[0] == pytest.approx({"x": 1.0, "y": 0.0, "z": 0.8})
    assert pts[1] == pytest.approx({"x": 1.0, "y": 0.5, "z": 0.8})
    assert pts[2] == pytest.approx({"x": 1.2, "y": 0.5, "z": 0.8})  # right of +y heading is +x
    assert len(pts) == 3

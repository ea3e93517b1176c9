"""Planned paths: the positions a drone visits executing its move/turn skill calls (pure
geometry; the planner node publishes them as a MarkerArray)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass
class Pose:
    x: float = 0.0
    y: float = 0.0
    z: float = 0.8  # a Tello hovers at ~80 cm after takeoff
    yaw: float = 0.0  # rad, ROS convention: counter-clockwise positive


# skill -> (forward, left, up) unit (metres per cm of argument) or turn sign
_MOVES = {"move_forward": (1, 0, 0), "move_backward": (-1, 0, 0), "move_left": (0, 1, 0),
          "move_right": (0, -1, 0), "move_up": (0, 0, 1), "move_down": (0, 0, -1)}
_TURNS = {"turn_cw": -1, "turn_ccw": 1}


def moves(calls: Any) -> bool:
    """Whether any of the calls moves or turns the drone (draws a path)."""
    return any(c.name in _MOVES or c.name in _TURNS for c in calls)


def path_points(calls: Any, start: Pose) -> tuple[list[dict[str, float]], Pose]:
    """Positions visited by a drone executing move/turn calls from `start` (textual order; loop
    repetitions and untaken branches are not modelled: this is the *planned* path)."""
    p = Pose(start.x, start.y, start.z, start.yaw)
    pts = []
    for c in calls:
        if c.name in _MOVES and c.args and isinstance(c.args[0], (int, float)):
            f, left, up = _MOVES[c.name]
            d = float(c.args[0]) / 100.0
            p.x += d * (f * math.cos(p.yaw) - left * math.sin(p.yaw))
            p.y += d * (f * math.sin(p.yaw) + left * math.cos(p.yaw))
            p.z = max(0.0, p.z + up * d)
            pts.append({"x": p.x, "y": p.y, "z": p.z})
        elif c.name in _TURNS and c.args and isinstance(c.args[0], (int, float)):
            p.yaw += _TURNS[c.name] * math.radians(float(c.args[0]))
    return pts, p

"""The interfaces of the ROS package `timelyllm`: which message, action and service types exist
(their `pkg/kind/Name` type names, as `ros2 interface show` spells them), where their definition
files are (msg/, action/, srv/), and those files parsed by rosbags.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from timelyllm_ros import PACKAGE
from timelyllm_ros.paths import data_dir
from timelyllm_ros.ros.walker import MessageError

# ROS type names (pkg/kind/Name), as `ros2 interface show` spells them.
PLAN_REQUEST = f"{PACKAGE}/msg/PlanRequest"
SKILL_CALL = f"{PACKAGE}/msg/SkillCall"
SEGMENT = f"{PACKAGE}/msg/Segment"
REQUEST_STATUS = f"{PACKAGE}/msg/RequestStatus"
PLANNER_STATUS = f"{PACKAGE}/msg/PlannerStatus"
SEGMENT_STATUS = f"{PACKAGE}/msg/SegmentStatus"
EXECUTE_SEGMENT = f"{PACKAGE}/action/ExecuteSegment"
EXECUTE_SEGMENT_GOAL = EXECUTE_SEGMENT + "_Goal"
EXECUTE_SEGMENT_RESULT = EXECUTE_SEGMENT + "_Result"
EXECUTE_SEGMENT_FEEDBACK = EXECUTE_SEGMENT + "_Feedback"
PLAN_TASK = f"{PACKAGE}/action/PlanTask"
GOAL_STATE = f"{PACKAGE}/msg/GoalState"
GET_GOAL_STATES = f"{PACKAGE}/srv/GetGoalStates"
GET_REQUEST_STATE = f"{PACKAGE}/srv/GetRequestState"
STRING = "std_msgs/msg/String"  # a request id (cancel_requests), a heartbeat, the demo's start signal
DIAGNOSTIC_ARRAY = "diagnostic_msgs/msg/DiagnosticArray"
MARKER_ARRAY = "visualization_msgs/msg/MarkerArray"

MSG_FILES = ("SkillCall", "PlanRequest", "Segment", "RequestStatus", "PlannerStatus", "SegmentStatus",
             "GoalState")
ACTION_FILES = ("ExecuteSegment", "PlanTask")
SRV_FILES = ("GetGoalStates", "GetRequestState")


def interface_dir() -> Path:
    """Where msg/, action/ and srv/ live: the source tree, else the installed ROS share directory
    (`paths.data_dir`)."""
    msg = data_dir("msg")
    if not msg.is_dir():
        raise FileNotFoundError(f"cannot find the {PACKAGE} msg/ and action/ directories (looked at {msg})")
    return msg.parent


def _sections(text: str, count: int, kind: str) -> tuple[str, ...]:
    """Message sections of an interface file, separated by `---` lines."""
    parts: list[list[str]] = [[]]
    for line in text.splitlines():
        if line.strip() == "---":
            parts.append([])
        else:
            parts[-1].append(line)
    if len(parts) != count:
        raise MessageError(f"{kind} needs exactly {count} sections separated by '---', got {len(parts)}")
    return tuple("\n".join(p) + "\n" for p in parts)


def split_action(text: str) -> tuple[str, str, str]:
    """An .action file is goal, result and feedback message sections separated by `---` lines."""
    goal, result, feedback = _sections(text, 3, "an action")
    return goal, result, feedback


def split_service(text: str) -> tuple[str, str]:
    """A .srv file is request and response message sections separated by a `---` line."""
    request, response = _sections(text, 2, "a service")
    return request, response


def interface_types(root: Path | None = None) -> dict[str, Any]:
    """All of this package's interfaces parsed by rosbags (typename -> definition)."""
    from rosbags.typesys import get_types_from_msg

    root = interface_dir() if root is None else root
    types: dict[str, Any] = {}
    for name in MSG_FILES:
        types.update(get_types_from_msg((root / "msg" / f"{name}.msg").read_text(), f"{PACKAGE}/msg/{name}"))
    for name in ACTION_FILES:
        sections = split_action((root / "action" / f"{name}.action").read_text())
        for suffix, text in zip(("Goal", "Result", "Feedback"), sections):
            # Parsed under msg/ so that unqualified names (SkillCall) resolve to this package's
            # messages, as rosidl resolves them; then filed under the action's own name.
            parsed = get_types_from_msg(text, f"{PACKAGE}/msg/{name}_{suffix}")
            types[f"{PACKAGE}/action/{name}_{suffix}"] = parsed.pop(f"{PACKAGE}/msg/{name}_{suffix}")
            types.update(parsed)
    for name in SRV_FILES:
        sections = split_service((root / "srv" / f"{name}.srv").read_text())
        for suffix, text in zip(("Request", "Response"), sections):
            parsed = get_types_from_msg(text, f"{PACKAGE}/msg/{name}_{suffix}")
            types[f"{PACKAGE}/srv/{name}_{suffix}"] = parsed.pop(f"{PACKAGE}/msg/{name}_{suffix}")
            types.update(parsed)
    return types

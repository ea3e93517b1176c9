"""LRTrace task catalog (paper Table 2): the task definitions of `workloads/lrtrace_tasks.yaml`, their
validation and loading, and the plan check every reference plan passes.

The reference set holds 11 robot tasks (T1-T11) plus chat tasks (C1-C3), each with hand-checkable
scenes and the plan a competent planner writes for them.  Every plan is validated against the
robot schema (robots/*.yaml).  The seeded generator of more (task, scene, plan) examples (the tiny
model's training and held-out data) is `workloads/examples.py`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..core.minispec import MiniSpecError, parse_program
from ..core.robots import RobotSpec, load_robots, read_yaml_file
from ..paths import data_dir

TASKS_FILE = data_dir("workloads") / "lrtrace_tasks.yaml"
CATEGORIES = ("normal", "urgent", "chat")
MIN_SCENES = 5
_TASK_ID_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,15}$")


class TaskFileError(ValueError):
    """The LRTrace task file is malformed; the message names the task and the reason."""


class PlanError(ValueError):
    """A plan does not conform to its robot's schema."""


@dataclass(frozen=True, slots=True)
class Scene:
    scene: str
    plan: str


@dataclass(frozen=True, slots=True)
class TaskDef:
    task_id: str
    name: str
    robot_type: str
    category: str
    task: str
    scenes: tuple[Scene, ...]


# --------------------------------------------------------------------------------------------
# Plan checking
# --------------------------------------------------------------------------------------------

_CALL_RE = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:\((.*?)\))?\s*;", re.S)
_SENTENCE_RE = re.compile(r"[^.!?]*[A-Za-z0-9][^.!?]*[.!?]")


def split_statements(plan: str) -> list[str]:
    """Split a flat MiniSpec plan into `call;` statements (PlanError if it is not flat calls)."""
    out: list[str] = []
    pos = 0
    plan = plan.rstrip()
    while pos < len(plan):
        m = _CALL_RE.match(plan, pos)
        if not m:
            raise PlanError(f"not a skill call at offset {pos}: {plan[pos:pos + 30]!r}")
        out.append(m.group(0).strip())
        pos = m.end()
    return out


def check_plan(plan: str, robot: RobotSpec) -> None:
    """Raise PlanError unless `plan` conforms to the robot's schema.

    MiniSpec robots: the plan parses with core.minispec and every call has a known skill with the
    right arity, types and ranges.  Sentence robots: 1-8 sentences of plain text.
    """
    if not isinstance(plan, str) or not plan.strip():
        raise PlanError("plan is empty")
    if robot.language == "sentence":
        sentences = _SENTENCE_RE.findall(plan)
        rest = _SENTENCE_RE.sub("", plan).strip()
        if rest:
            raise PlanError(f"text after the last sentence: {rest[:40]!r}")
        if not 1 <= len(sentences) <= 8:
            raise PlanError(f"expected 1-8 sentences, got {len(sentences)}")
        return
    try:
        parse_program(plan, robot)  # the project's MiniSpec parser + schema check
    except MiniSpecError as e:
        raise PlanError(str(e)) from e


def count_sentences(text: str) -> int:
    return len(_SENTENCE_RE.findall(text))


# --------------------------------------------------------------------------------------------
# Loading the task file
# --------------------------------------------------------------------------------------------


def parse_tasks(data: Any, robots: dict[str, RobotSpec], source: str = "<tasks>") -> dict[str, TaskDef]:
    """Validate a parsed task file; TaskFileError names the task id and the reason."""
    if not isinstance(data, dict) or not isinstance(data.get("tasks"), dict) or not data["tasks"]:
        raise TaskFileError(f"{source}: top level must be a mapping with a non-empty 'tasks' mapping")
    out: dict[str, TaskDef] = {}
    for tid, t in data["tasks"].items():
        where = f"{source}: task {tid!r}"
        if not isinstance(tid, str) or not _TASK_ID_RE.match(tid):
            raise TaskFileError(f"{where}: task id must match {_TASK_ID_RE.pattern}")
        if not isinstance(t, dict):
            raise TaskFileError(f"{where}: must be a mapping")
        for key in ("name", "robot_type", "category", "task", "scenes"):
            if key not in t:
                raise TaskFileError(f"{where}: missing {key!r}")
        for key in ("name", "robot_type", "category", "task"):
            if not isinstance(t[key], str) or not t[key].strip():
                raise TaskFileError(f"{where}: {key} must be a non-empty string")
        if t["robot_type"] not in robots:
            raise TaskFileError(f"{where}: unknown robot_type {t['robot_type']!r}; known: {sorted(robots)}")
        if t["category"] not in CATEGORIES:
            raise TaskFileError(f"{where}: category must be one of {CATEGORIES}, got {t['category']!r}")
        extra = set(t) - {"name", "robot_type", "category", "task", "scenes"}
        if extra:
            raise TaskFileError(f"{where}: unknown keys {sorted(extra)}")
        scenes_raw = t["scenes"]
        if not isinstance(scenes_raw, list) or len(scenes_raw) < MIN_SCENES:
            raise TaskFileError(f"{where}: needs a list of at least {MIN_SCENES} scenes")
        robot = robots[t["robot_type"]]
        scenes: list[Scene] = []
        for i, s in enumerate(scenes_raw):
            if not isinstance(s, dict) or set(s) != {"scene", "plan"}:
                raise TaskFileError(f"{where}: scene {i} must be a mapping with exactly 'scene' and 'plan'")
            if not isinstance(s["scene"], str) or not isinstance(s["plan"], str):
                raise TaskFileError(f"{where}: scene {i}: scene and plan must be strings")
            try:
                check_plan(s["plan"], robot)
            except PlanError as e:
                raise TaskFileError(f"{where}: scene {i}: invalid plan {s['plan']!r}: {e}") from e
            scenes.append(Scene(s["scene"], s["plan"]))
        out[tid] = TaskDef(tid, t["name"], t["robot_type"], t["category"], t["task"], tuple(scenes))
    return out


def load_tasks(path: str | Path = TASKS_FILE, robots: dict[str, RobotSpec] | None = None) -> dict[str, TaskDef]:
    path = Path(path)
    data = read_yaml_file(path, "task file", TaskFileError)
    return parse_tasks(data, robots if robots is not None else load_robots(), str(path))

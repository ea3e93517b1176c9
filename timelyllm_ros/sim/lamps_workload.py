"""Tasks for the LAMPS benchmark: tool robots whose skills are the INFERCEPT API types.

Why a generator: LAMPS evaluates on InferCept's single-/multi-API datasets (API type, number of
calls, durations).  Their robot equivalent is a plan of blocking skill calls, each preceded by the
text the LLM writes before the call, behind a per-request context of varying length (the memory
each request holds).  `load_toolbot` reads workloads/lamps_toolbot.yaml and builds, per API type,
a single-call task `S_<api>` and a multi-call task `M_<api>` with seeded scenes whose reference
plans the simulated LLM will "generate".
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import yaml

from ..core.robots import RobotSpec, parse_robot
from ..workloads.catalog import Scene, TaskDef, check_plan
from ..paths import data_dir

TOOLBOT_FILE = data_dir("workloads") / "lamps_toolbot.yaml"
_WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
          "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()


class ToolbotError(ValueError):
    """The toolbot file is malformed."""


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def _range(g: dict, key: str) -> tuple[int, int]:
    v = g.get(key)
    if (not isinstance(v, list) or len(v) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in v)
            or not 0 < v[0] <= v[1]):
        raise ToolbotError(f"generator.{key} must be [min, max] positive ints, got {v!r}")
    return v[0], v[1]


def build_tasks(robot: RobotSpec, gen: dict[str, Any]) -> dict[str, TaskDef]:
    """S_<api> (one call) and M_<api> (Table 2's call count) tasks for every API type."""
    if not isinstance(gen, dict) or not isinstance(gen.get("calls"), dict) or not gen["calls"]:
        raise ToolbotError("generator needs a non-empty 'calls' mapping api -> [mean, std]")
    rng = random.Random(int(gen.get("seed", 0)))
    n_scenes = int(gen.get("scenes_per_task", 16))
    max_calls = int(gen.get("max_calls", 40))
    ctx_w, call_w, ans_w = _range(gen, "context_words"), _range(gen, "call_words"), _range(gen, "answer_words")
    tasks: dict[str, TaskDef] = {}
    for api, ms in gen["calls"].items():
        spec = robot.skill(api)
        if spec is None or not spec.blocking:
            raise ToolbotError(f"API type {api!r} must be a blocking skill of {robot.robot_type!r}")
        if not isinstance(ms, list) or len(ms) != 2:
            raise ToolbotError(f"calls.{api} must be [mean, std]")
        for kind in ("S", "M"):
            scenes = []
            for _ in range(n_scenes):
                k = 1 if kind == "S" else max(1, min(max_calls, round(rng.gauss(float(ms[0]), float(ms[1])))))
                stmts = [f"{spec.abbr}('{_words(rng, rng.randint(*call_w))}');" for _ in range(k)]
                stmts.append(f"an('{_words(rng, rng.randint(*ans_w))}');")
                plan = "".join(stmts)
                check_plan(plan, robot)
                scenes.append(Scene(f"history: {_words(rng, rng.randint(*ctx_w))}", plan))
            tid = f"{kind}_{api}"
            tasks[tid] = TaskDef(tid, f"{'single' if kind == 'S' else 'multi'}-call {api}", robot.robot_type,
                                 "normal", f"Use the {api} tool to help the user.", tuple(scenes))
    return tasks


def load_toolbot(path: str | Path = TOOLBOT_FILE) -> tuple[RobotSpec, dict[str, TaskDef]]:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ToolbotError(f"{path}: cannot read: {e}") from e
    if not isinstance(data, dict) or "robot" not in data or "generator" not in data:
        raise ToolbotError(f"{path}: needs 'robot' and 'generator'")
    robot = parse_robot(data["robot"], str(path))
    return robot, build_tasks(robot, data["generator"])

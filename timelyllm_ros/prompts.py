"""Prompts for the real planner model: a fixed per-robot-type prefix shared by every request.

TypeFly-style prompt (role, skill list rendered from robots/<type>.yaml as
`abbr:..,name:..,args:[..],description:..`, guides, worked examples).  The prefix depends only on the
robot type, so it is built and tokenised once and every request of that type starts with exactly
the same token ids: vLLM's prefix cache then serves it from KV for all requests (paper §4.1).  A
request adds only its task, scene and the answer cue, tokenised separately and appended as ids
(never re-tokenising the concatenated text, which could merge tokens across the boundary).

Results of blocking segments (scan, detect, ...) are fed back as a one-line annotation
`#<value>\\n` appended after the statement (see `result_text`); the bundled model is trained on it.
The annotation goes only into the generation's token record, never into its text, so the
segmenter never sees it.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

from .core.robots import ArgSpec, RobotSpec
from .core.types import PlanRequest, Segment, Value
from .paths import data_dir

DEFAULT_MODEL_DIR = data_dir("models") / "tiny-planner"
ANSWER_CUE = "Plan:\n"
RESULT_MAX_CHARS = 60


class PromptError(ValueError):
    """No prompt can be built for this request (unknown robot type, bad tokenizer output)."""


class Encoder(Protocol):
    def encode(self, text: str) -> list[int]: ...


# Worked examples shown in the prefix, per robot language / type: (task, scene, plan with results).
# They use the same result-annotation format as `result_text`.
EXAMPLES: dict[str, list[tuple[str, str, str]]] = {
    "tello": [
        ("Find the red ball and take a picture of it.", "objects: chair, door",
         "s('red ball');#True\ng('red ball');tp;"),
        ("A ladder is too close. Move away at once to prevent a collision.",
         "objects: ladder, box; ladder: 50 cm left", "mr(70);l('avoided the ladder');"),
        ("Find the umbrella.", "objects: sofa, lamp", "s('umbrella');#False\nl('no umbrella found');"),
    ],
    "arm": [
        ("Put the spoon into the drawer.", "objects: spoon, bowl",
         "hm;dt('spoon');#True\npk('spoon');pl('drawer');hm;"),
        ("Put the glass on the shelf.", "objects: plate",
         "hm;dt('glass');#False\nl('no glass found');hm;"),
    ],
    "chat": [
        ("What time is it?", "time: 10:30",
         "It is 10:30 now. You still have time before lunch."),
    ],
}

ROLES = {
    "minispec": ("You are a robot planner. You control a {description}. "
                 "Write a MiniSpec plan that completes the task in the scene."),
    "sentence": ("You are a helpful {description}. "
                 "Answer the user in two to five short sentences, using the facts in the scene."),
}

GUIDES = {
    "minispec": [
        "Write only skill calls from the list, each ending with ';'. Strings use single quotes.",
        "If the object is already in the scene, go to it directly; otherwise scan for it first.",
        "After a blocking call the result is shown as #True or #False. "
        "If it is #False, log that the object was not found and stop.",
        "For urgent tasks move away from the danger at once, with as few calls as possible.",
    ],
    "sentence": [
        "Only use facts from the scene. End every sentence with a period.",
    ],
}


def _arg_text(a: ArgSpec) -> str:
    if a.type == "str":
        return f"{a.name}:str"
    lo = "" if a.min is None else f"{a.min:g}"
    hi = "" if a.max is None else f"{a.max:g}"
    return f"{a.name}:{a.type}({lo}..{hi})" if (lo or hi) else f"{a.name}:{a.type}"


def skill_line(robot: RobotSpec, name: str) -> str:
    """TypeFly's skill description format, with the argument ranges the guard enforces."""
    s = robot.skills[name]
    args = ",".join(_arg_text(a) for a in s.args)
    ret = "" if s.returns == "none" else f",returns:{s.returns}"
    return f"abbr:{s.abbr},name:{s.name},args:[{args}]{ret},description:{s.description}"


def request_text(task: str, scene: str) -> str:
    """The per-request part of the prompt (everything after the shared prefix)."""
    return f"Task: {_one_line(task)}\nScene: {_one_line(scene)}\n{ANSWER_CUE}"


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def result_text(value: Value) -> str:
    """Annotation fed back after a blocking statement: `#True\\n`, `#False\\n`, `#0.42\\n`, `#<text>\\n`."""
    if isinstance(value, bool) or value is None:
        v = str(value)
    elif isinstance(value, int):
        v = str(value)
    elif isinstance(value, float):
        v = f"{value:.2f}" if math.isfinite(value) else "None"
    else:
        v = _one_line(str(value).replace("#", " "))[:RESULT_MAX_CHARS]
    return f"#{v}\n"


class PromptBuilder:
    """PromptSource for the real planner: shared per-type prefix ids + per-request ids.

    `prefix_ids(robot_type)` is computed once per type; `prompt_ids(request)` returns
    `prefix_ids + encode(request_text)`, so the prefix is a token-level prefix of every request.
    """

    def __init__(self, robots: Mapping[str, RobotSpec], tokenizer: Encoder | None,
                 examples: Mapping[str, Sequence[tuple[str, str, str]]] | None = None,
                 bos_id: int | None | str = "auto") -> None:
        self.robots = dict(robots)
        self.tokenizer = tokenizer
        self.examples = dict(EXAMPLES if examples is None else examples)
        if bos_id == "auto":  # the tokenizer's own BOS (the bundled model is trained with it first)
            bos_id = getattr(tokenizer, "bos_id", None)
            if bos_id is None:
                bos_id = getattr(tokenizer, "bos_token_id", None)
        self.bos_id = bos_id
        self._prefix_text: dict[str, str] = {}
        self._prefix_ids: dict[str, list[int]] = {}

    # -- text --------------------------------------------------------------------------------
    def prefix_text(self, robot_type: str) -> str:
        if robot_type not in self._prefix_text:
            robot = self.robots.get(robot_type)
            if robot is None:
                raise PromptError(f"no prompt for unknown robot type {robot_type!r}; known: {sorted(self.robots)}")
            lines = [ROLES[robot.language].format(description=robot.description), ""]
            if robot.language == "minispec":
                lines.append("Skills:")
                lines += [skill_line(robot, n) for n in robot.skills]
                lines.append("")
            lines.append("Guides:")
            lines += [f"- {g}" for g in GUIDES[robot.language]]
            lines.append("")
            exs = self.examples.get(robot_type, ())
            if exs:
                lines.append("Examples:")
                for task, scene, plan in exs:
                    lines.append(request_text(task, scene) + plan)
                    lines.append("")
            lines.append("Now the real request.")
            self._prefix_text[robot_type] = "\n".join(lines) + "\n"
        return self._prefix_text[robot_type]

    # -- ids ---------------------------------------------------------------------------------
    def _encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise PromptError("PromptBuilder has no tokenizer")
        ids = list(self.tokenizer.encode(text))
        if not all(isinstance(i, int) and i >= 0 for i in ids):
            raise PromptError("tokenizer returned non-integer ids")
        return ids

    def prefix_ids(self, robot_type: str) -> list[int]:
        """Token ids of the shared prefix (computed once per robot type; a copy is returned)."""
        if robot_type not in self._prefix_ids:
            ids = self._encode(self.prefix_text(robot_type))
            if self.bos_id is not None:
                ids = [self.bos_id] + ids
            self._prefix_ids[robot_type] = ids
        return list(self._prefix_ids[robot_type])

    def request_ids(self, task: str, scene: str) -> list[int]:
        return self._encode(request_text(task, scene))

    def prompt_ids(self, request: PlanRequest) -> list[int]:
        return self.prefix_ids(request.robot_type) + self.request_ids(request.task, request.scene)

    def result_ids(self, request: PlanRequest, segment: Segment, value: Value) -> list[int]:
        """`#<value>\\n` after a blocking MiniSpec statement; nothing for sentence robots."""
        robot = self.robots.get(request.robot_type)
        if robot is None or robot.language != "minispec" or not segment.blocking:
            return []
        return self.annotation_ids(value)

    def annotation_ids(self, value: Value) -> list[int]:
        """Token ids of `result_text(value)` (tokenised on its own, like every prompt part)."""
        return self._encode(result_text(value))


# ------------------------------------------------------------------------------------------------
# The bundled model's tokenizer, without importing transformers (slow import, heavy dependency).
# ------------------------------------------------------------------------------------------------


class TokenizerFile:
    """encode/decode over a Hugging Face `tokenizer.json` (the `tokenizers` library only)."""

    def __init__(self, model_dir: str | Path = DEFAULT_MODEL_DIR) -> None:
        from tokenizers import Tokenizer  # local import: optional dependency

        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises plain Exception subclasses
            raise PromptError(f"{path}: cannot load tokenizer: {e}") from e
        cfg: dict[str, Any] = {}
        cfg_path = model_dir / "tokenizer_config.json"
        if cfg_path.exists():
            cfg = json.loads(cfg_path.read_text())
        self.bos_token_id = self._tok.token_to_id(cfg.get("bos_token", "<s>"))
        self.eos_token_id = self._tok.token_to_id(cfg.get("eos_token", "</s>"))

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()


def default_prompt_builder(robots: Mapping[str, RobotSpec], model_dir: str | Path = DEFAULT_MODEL_DIR) -> PromptBuilder:
    """PromptBuilder for the bundled tiny planner (its tokenizer, BOS first)."""
    tok = TokenizerFile(model_dir)
    return PromptBuilder(robots, tok)

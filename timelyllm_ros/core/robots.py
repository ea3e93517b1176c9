"""Robot definitions: skill schema + execution-time model, loaded from robots/<type>.yaml.

The YAML is trusted configuration, but it is still validated at load time so that a typo gives a
clear error at start-up instead of a wrong plan at run time.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from ..paths import data_dir
from .envelope import Envelope, EnvelopeError, parse_envelope, parse_travel

ROBOTS_DIR = data_dir("robots")
ARG_TYPES = ("int", "float", "str")
RETURN_TYPES = ("none", "bool", "float", "str")
LANGUAGES = ("minispec", "sentence")


ON_PLANNER_LOST = ("hover", "land", "finish_goal")


class RobotSpecError(ValueError):
    """A robot YAML file is malformed."""


@dataclass(frozen=True, slots=True)
class ArgSpec:
    name: str
    type: str  # int | float | str
    min: float | None = None
    max: float | None = None
    max_len: int = 64
    unit: str = ""
    choices: tuple[str, ...] = ()
    min_abs: float | None = None  # a nonzero amount must be at least this large (0 stays allowed)
    nonzero: bool = False  # 0 is not a value of this argument (e.g. a signed rotation)

    def check(self, value: Any) -> str | None:
        """None if value is allowed for this argument, else the reason it is not."""
        if self.type == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                return f"argument {self.name!r} must be an int, got {value!r}"
        elif self.type == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                return f"argument {self.name!r} must be a number, got {value!r}"
        elif self.type == "str":
            if not isinstance(value, str):
                return f"argument {self.name!r} must be a string, got {value!r}"
            if len(value) > self.max_len:
                return f"argument {self.name!r} longer than {self.max_len} characters"
            if self.choices and value not in self.choices:
                return f"argument {self.name!r} must be one of {list(self.choices)}, got {value!r}"
            return None
        if self.min is not None and value < self.min:
            return f"argument {self.name!r}={value} below minimum {self.min:g}{self.unit}"
        if self.max is not None and value > self.max:
            return f"argument {self.name!r}={value} above maximum {self.max:g}{self.unit}"
        if self.nonzero and value == 0:
            return f"argument {self.name!r} must not be 0"
        if self.min_abs is not None and value != 0 and abs(value) < self.min_abs:
            return (f"argument {self.name!r}={value}: a nonzero amount must be at least {self.min_abs:g}{self.unit} "
                    f"in size (0 for none)")
        return None


@dataclass(frozen=True, slots=True)
class ExecTimeModel:
    """Execution time of one skill call, in seconds.

    Parametric skills: base_s + per_unit_s * |arg[unit_arg]|, with Gaussian jitter (jitter_cv).
    Variable skills (e.g. scan): uniform on [min_s, max_s]; the scheduler uses min_s, as in the
    paper (§4.3), so the next segment is ready even in the fastest case.
    """

    base_s: float = 0.0
    per_unit_s: float = 0.0
    unit_arg: str | None = None
    jitter_cv: float = 0.0
    min_s: float | None = None
    max_s: float | None = None
    per_word_s: float = 0.0  # chat: reading/speaking time per word

    @property
    def variable(self) -> bool:
        return self.max_s is not None

    def nominal(self, args: Mapping[str, Any] | None = None, words: int = 0) -> float:
        """The profile's estimate: mean for parametric skills, minimum for variable ones."""
        if self.variable:
            return float(self.min_s or 0.0)
        t = self.base_s + self.per_word_s * words
        v = args.get(self.unit_arg) if self.unit_arg and args else None
        if isinstance(v, (int, float)) and not isinstance(v, bool):  # None: computed at run time
            t += self.per_unit_s * abs(float(v))
        return t

    def sample(self, rng: random.Random, args: Mapping[str, Any] | None = None, words: int = 0) -> float:
        """A simulated duration (seeded rng): what a real robot would take."""
        if self.variable:
            return rng.uniform(float(self.min_s or 0.0), float(self.max_s))
        t = self.nominal(args, words)
        if self.jitter_cv > 0:
            t = rng.gauss(t, self.jitter_cv * t)
        floor = self.min_s if self.min_s is not None else 0.1 * self.nominal(args, words)
        return max(floor, t)


@dataclass(frozen=True, slots=True)
class SkillSpec:
    name: str
    abbr: str
    description: str
    args: tuple[ArgSpec, ...]
    returns: str
    blocking: bool
    exec_time: ExecTimeModel
    travel: tuple[tuple[str, float, str], ...] = ()  # (axis, coefficient, arg name or '') for the envelope

    def arg_map(self, values: tuple[Any, ...]) -> dict[str, Any]:
        return {a.name: v for a, v in zip(self.args, values)}


@dataclass(frozen=True, slots=True)
class RobotSpec:
    robot_type: str
    language: str
    description: str
    max_segment_tokens: int
    skills: dict[str, SkillSpec]  # by full name
    by_abbr: dict[str, SkillSpec] = field(default_factory=dict)
    words_per_minute: float = 300.0  # sentence language: "execution" = reading time
    source: str = ""
    envelope: Envelope | None = None  # travel bounds per segment / plan (core.envelope)
    platform: str = ""  # the hardware this skill set runs on (`platform:`, default robot_type): hard limits, backends
    # what its executor does with the running goal when the planner that sent it is lost
    # (supervision lease, nodes/supervision.py): hover (stop now) | land | finish_goal
    on_planner_lost: str = "hover"

    @property
    def hardware(self) -> str:
        """The platform whose hard limits and backends apply (the robot type unless the YAML says)."""
        return self.platform or self.robot_type

    def skill(self, name_or_abbr: str) -> SkillSpec | None:
        return self.by_abbr.get(name_or_abbr) or self.skills.get(name_or_abbr)


def _num(d: Mapping, key: str, where: str, default: float | None = None, *, positive: bool = False) -> float | None:
    v = d.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise RobotSpecError(f"{where}: {key} must be a number, got {v!r}")
    if v < 0 or (positive and v == 0):
        raise RobotSpecError(f"{where}: {key} must be {'> 0' if positive else '>= 0'}, got {v!r}")
    return float(v)


def _exec_time(d: Any, where: str) -> ExecTimeModel:
    if not isinstance(d, dict):
        raise RobotSpecError(f"{where}: exec_time must be a mapping")
    known = {"base_s", "per_unit_s", "unit_arg", "jitter_cv", "min_s", "max_s", "dist", "per_word_s"}
    extra = set(d) - known
    if extra:
        raise RobotSpecError(f"{where}: exec_time has unknown keys {sorted(extra)}")
    m = ExecTimeModel(
        base_s=_num(d, "base_s", where, 0.0) or 0.0,
        per_unit_s=_num(d, "per_unit_s", where, 0.0) or 0.0,
        unit_arg=d.get("unit_arg"),
        jitter_cv=_num(d, "jitter_cv", where, 0.0) or 0.0,
        min_s=_num(d, "min_s", where),
        max_s=_num(d, "max_s", where),
        per_word_s=_num(d, "per_word_s", where, 0.0) or 0.0,
    )
    if m.max_s is not None and (m.min_s is None or m.min_s > m.max_s):
        raise RobotSpecError(f"{where}: variable exec_time needs min_s <= max_s")
    if d.get("dist", "uniform") != "uniform":
        raise RobotSpecError(f"{where}: only dist: uniform is supported, got {d.get('dist')!r}")
    return m


def _arg(d: Any, where: str) -> ArgSpec:
    if not isinstance(d, dict) or "name" not in d or "type" not in d:
        raise RobotSpecError(f"{where}: each arg needs name and type")
    if d["type"] not in ARG_TYPES:
        raise RobotSpecError(f"{where}: arg type must be one of {ARG_TYPES}, got {d['type']!r}")
    extra = set(d) - {"name", "type", "min", "max", "max_len", "unit", "choices", "min_abs", "nonzero"}
    if extra:
        raise RobotSpecError(f"{where}: arg {d['name']!r} has unknown keys {sorted(extra)}")
    lo, hi = d.get("min"), d.get("max")
    if lo is not None and hi is not None and lo > hi:
        raise RobotSpecError(f"{where}: arg {d['name']!r} has min > max")
    if not isinstance(d.get("nonzero", False), bool):
        raise RobotSpecError(f"{where}: arg {d['name']!r}: nonzero must be true or false")
    return ArgSpec(
        name=str(d["name"]), type=d["type"], min=lo, max=hi, max_len=int(d.get("max_len", 64)),
        unit=str(d.get("unit", "")), choices=tuple(d.get("choices", ()) or ()),
        min_abs=_num(d, "min_abs", f"{where}: arg {d['name']!r}"), nonzero=bool(d.get("nonzero", False)),
    )


def parse_robot(data: Any, source: str = "<robot>") -> RobotSpec:
    if not isinstance(data, dict):
        raise RobotSpecError(f"{source}: top level must be a mapping")
    for key in ("robot_type", "language", "skills"):
        if key not in data:
            raise RobotSpecError(f"{source}: missing {key!r}")
    if data["language"] not in LANGUAGES:
        raise RobotSpecError(f"{source}: language must be one of {LANGUAGES}")
    skills: dict[str, SkillSpec] = {}
    by_abbr: dict[str, SkillSpec] = {}
    raw = data["skills"]
    if not isinstance(raw, dict):
        raise RobotSpecError(f"{source}: skills must be a mapping name -> skill")
    for name, s in raw.items():
        where = f"{source}: skill {name!r}"
        if not isinstance(s, dict):
            raise RobotSpecError(f"{where}: must be a mapping")
        returns = s.get("returns", "none")
        if returns not in RETURN_TYPES:
            raise RobotSpecError(f"{where}: returns must be one of {RETURN_TYPES}")
        extra = set(s) - {"abbr", "description", "args", "returns", "blocking", "exec_time", "travel"}
        if extra:
            raise RobotSpecError(f"{where}: unknown keys {sorted(extra)}")
        args = tuple(_arg(a, where) for a in (s.get("args") or []))
        try:
            travel = parse_travel(s["travel"], where, {a.name: a.type for a in args}) if "travel" in s else ()
        except EnvelopeError as e:
            raise RobotSpecError(str(e)) from None
        spec = SkillSpec(
            name=str(name), abbr=str(s.get("abbr", name)), description=str(s.get("description", "")),
            args=args, returns=returns, blocking=bool(s.get("blocking", False)),
            exec_time=_exec_time(s.get("exec_time", {}), where), travel=travel,
        )
        if spec.exec_time.unit_arg and spec.exec_time.unit_arg not in {a.name for a in spec.args}:
            raise RobotSpecError(f"{where}: exec_time.unit_arg {spec.exec_time.unit_arg!r} is not an arg")
        if spec.abbr in by_abbr or spec.abbr in skills and skills[spec.abbr] is not spec:
            raise RobotSpecError(f"{where}: abbreviation {spec.abbr!r} is used twice")
        skills[spec.name] = spec
        by_abbr[spec.abbr] = spec
    mst = data.get("max_segment_tokens", 16)
    if not isinstance(mst, int) or mst <= 0:
        raise RobotSpecError(f"{source}: max_segment_tokens must be a positive int")
    try:
        envelope = parse_envelope(data["envelope"], source) if "envelope" in data else None
    except EnvelopeError as e:
        raise RobotSpecError(str(e)) from None
    lost = data.get("on_planner_lost", "hover")
    if lost not in ON_PLANNER_LOST:
        raise RobotSpecError(f"{source}: on_planner_lost must be one of {list(ON_PLANNER_LOST)}, got {lost!r}")
    return RobotSpec(
        robot_type=str(data["robot_type"]), language=data["language"],
        description=str(data.get("description", "")), max_segment_tokens=mst, skills=skills,
        by_abbr=by_abbr, words_per_minute=float(data.get("words_per_minute", 300.0)), source=source,
        envelope=envelope, platform=_platform(data, source), on_planner_lost=lost,
    )


def _platform(data: Mapping, source: str) -> str:
    p = data.get("platform", data["robot_type"])
    if not isinstance(p, str) or not p:
        raise RobotSpecError(f"{source}: platform must be a non-empty string (the robot it runs on), got {p!r}")
    return p


def yaml_error_line(e: Exception, what: str = "not valid YAML") -> str:
    """A PyYAML error as ``:LINE: what: problem``, to follow a file name (PyYAML's own text spans
    several lines)."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    return f"{':' + str(mark.line + 1) if mark is not None else ''}: {what}: {problem}"


def read_yaml_file(path: str | Path, what: str, error: type[Exception], *, invalid: str | None = None) -> Any:
    """A YAML file's data; an unreadable or malformed file raises ``error`` in one line:
    ``PATH: cannot read WHAT: reason`` or ``PATH:LINE: INVALID: problem`` (INVALID defaults to
    ``cannot read WHAT: not valid YAML``)."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise error(f"{path}: cannot read {what}: {e.strerror or e}") from e
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise error(f"{path}{yaml_error_line(e, invalid or f'cannot read {what}: not valid YAML')}") from e


def load_robot(path: str | Path) -> RobotSpec:
    path = Path(path)
    return parse_robot(read_yaml_file(path, "robot definition", RobotSpecError, invalid="not valid YAML"), str(path))


def load_robots(directory: str | Path = ROBOTS_DIR, *, extra_dirs: Sequence[str | Path] = ()) -> dict[str, RobotSpec]:
    """All robot types in a directory, plus those of ``extra_dirs`` (custom robots beside the
    bundled ones), keyed by robot_type.  A robot_type defined twice is an error that blames the
    file added last — a file of ``extra_dirs`` over one of ``directory``; within one directory
    the newer file (modification time) — and names the other one."""
    out: dict[str, RobotSpec] = {}
    origin: dict[str, Path] = {}
    for i, d in enumerate((directory, *extra_dirs)):
        d = Path(d)
        if not d.is_dir():
            raise RobotSpecError(f"robots directory {str(d)!r} does not exist")
        files = sorted(d.glob("*.yaml"))
        if not files and i > 0:
            raise RobotSpecError(f"no robot definitions (*.yaml) in {d}")
        for p in files:
            spec = load_robot(p)
            old = origin.get(spec.robot_type)
            if old is not None:
                new, other = p, old
                if old.parent == p.parent and old.stat().st_mtime > p.stat().st_mtime:
                    new, other = old, p
                raise RobotSpecError(f"{new}: robot_type {spec.robot_type!r} is already defined in {other}")
            out[spec.robot_type], origin[spec.robot_type] = spec, p
    if not out:
        raise RobotSpecError(f"no robot definitions in {directory}")
    return out

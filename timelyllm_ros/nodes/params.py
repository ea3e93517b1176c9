"""Every planner / executor node parameter: declared and read here, and nowhere else.

Each parameter is a contract (`Param`): type (the default's), description, range or choices, and
whether it can change while the node runs (`live`).  On a node:

* `declare(node, specs)` declares each one with a full ParameterDescriptor (type fixed: no
  dynamic typing; IntegerRange / FloatingPointRange; choices in `additional_constraints`;
  `read_only` unless live).  A value given with `-p` / a params file is converted first (`1` for a
  float parameter is 1.0), and a wrong type, a value outside the range or an unknown name is a
  one-line ConfigError before anything starts.
* `LiveParameters` is the on-set callback: a change of a live parameter is checked (range and type
  by rclpy, choices here, the rest by the node's own `apply`) and applied by the node at its next
  scheduling point; anything else is refused with a reason (SetParametersResult
  successful=False), so `get` keeps returning the value the node really uses.
* `help_text(...)` is what `timelyllm ros planner --help` prints.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from timelyllm_ros.core.policies import DEFAULT_POLICY
from timelyllm_ros.inputs import InputError
from timelyllm_ros.nodes.supervision import DEFAULT_EXECUTOR_LEASE_S, DEFAULT_HEARTBEAT_S, DEFAULT_LEASE_S


class ConfigError(InputError):
    """A node parameter is invalid; the message (one line) names it."""


INT_MAX = 2**31 - 1


@dataclass(frozen=True)
class Param:
    name: str
    default: bool | int | float | str
    description: str
    live: bool = False  # may change while the node runs (else read_only)
    min: float | None = None  # int / float parameters: the inclusive range
    max: float | None = None
    choices: Callable[[], Sequence[str]] | tuple[str, ...] = ()

    @property
    def type_name(self) -> str:
        return {bool: "bool", int: "integer", float: "double", str: "string"}[type(self.default)]

    def choice_list(self) -> list[str]:
        return list(self.choices() if callable(self.choices) else self.choices)

    def check(self, value: Any) -> str:
        """'' if `value` (already of the right type) is in range / one of the choices, else why not."""
        if self.min is not None and value < self.min or self.max is not None and value > self.max:
            return f"parameter {self.name!r} must be in [{self.min:g}, {self.max:g}], got {value!r}"
        ch = self.choice_list()
        if ch and value not in ch:
            return f"parameter {self.name!r} must be one of {ch}, got {value!r}"
        return ""


def _policies() -> list[str]:
    from timelyllm_ros.core.policies import policy_names

    return list(policy_names())


AUTOSTART = Param("autostart", True, "configure and activate at start (a lifecycle manager sets false and "
                  "drives configure/activate itself)")

PLANNER_PARAMS: tuple[Param, ...] = (
    AUTOSTART,
    Param("engine", "simulated", "LLM engine: simulated (latency profile, virtual time paced to the wall) "
          "or vllm", choices=("simulated", "vllm")),
    Param("model", "", "vllm: model directory ('' = the bundled tiny planner model)"),
    Param("engine_config", "", "vllm: YAML mapping of engine settings (engines/vllm_engine.py)"),
    Param("engines", "", "vllm: several engines behind this planner, a YAML list inline or a .yaml path "
          "(docs/scale-out.md); '' = one in-process engine from model/engine_config"),
    Param("profile", "", "simulated: latency profile YAML ('' = profiles/rtx4090_llama3_8b.yaml)"),
    Param("policy", DEFAULT_POLICY, "scheduling policy (docs/policies.md); live: the next scheduling "
          "point uses it", live=True, choices=_policies),
    Param("policy_params", "", "policy parameters (docs/policies.md), comma-separated [POLICY:]NAME=VALUE with "
          "YAML values, e.g. 'default:roomy_ratio=3'; an unscoped one goes to whichever policy runs, so a "
          "live policy change is refused if the new policy does not take it"),
    Param("robots_dir", "", "directory of robot YAMLs ('' = robots/ of the source tree or share/timelyllm)"),
    Param("max_batch", 0, "fixed batch-size cap; 0 = the policy's own batching (latency-guided or "
          "continuous, 256)", live=True, min=0, max=4096),
    Param("max_tokens", 256, "tokens one plan may generate (live: requests decoding now included)",
          live=True, min=1, max=65536),
    Param("status_period_s", 0.5, "period of planner_status and /diagnostics, s", live=True, min=0.01, max=3600.0),
    Param("frame_id", "map", "frame of the planned-path markers"),
    Param("goal_timeout_factor", 3.0, "segment watchdog: factor x estimated execution time (+ margin); "
          "live: goals sent after the change", live=True, min=1.0, max=1000.0),
    Param("goal_timeout_margin_s", 10.0, "segment watchdog margin, s (live: goals sent after the change)",
          live=True, min=0.0, max=86400.0),
    Param("server_wait_s", 2.0, "how long a goal waits for its robot's action server, s", live=True,
          min=0.0, max=600.0),
    Param("max_live", 10_000, "admission: unfinished requests at most (more are rejected at once)", live=True,
          min=1, max=10_000_000),
    Param("max_queued", 2_000, "admission: requests waiting for a first segment at most", live=True,
          min=1, max=10_000_000),
    Param("max_per_agent", 16, "admission: unfinished requests of one robot_id at most", live=True,
          min=1, max=1_000_000),
    Param("agent_rate_per_s", 0.0, "admission: sustained requests/s per robot_id (0 = unlimited)", live=True,
          min=0.0, max=1e6),
    Param("agent_burst", 10, "admission: token-bucket depth of that rate", live=True, min=1, max=1_000_000),
    Param("journal_path", "", "SQLite request journal ('' = off); unfinished requests are recovered at start"),
    Param("journal_retention_s", 604800.0, "terminal requests kept in the journal, s", min=0.0, max=3.2e9),
    Param("executors", "", "comma-separated robot ids whose action servers are looked up at start "
          "(others at their first goal)"),
    Param("step_log_path", "", "write the engine's serving steps (JSON lines) here at cleanup"),
    Param("warm_up", False, "prefill each robot type's prompt prefix (vLLM: and compile) before serving"),
    Param("heartbeat_period_s", DEFAULT_HEARTBEAT_S, "period of this planner instance's heartbeat, s (executors: "
          "planner_lease_s; at most half of it)", min=0.001, max=60.0),
    Param("executor_lease_s", DEFAULT_EXECUTOR_LEASE_S, "an executor silent this long fails its goals in flight, s (>= 2 x "
          "heartbeat_period_s; 0 = executors not supervised; 2 s: a falsely lost executor fails a "
          "request, and a dead one is still noticed within 3 s)", min=0.0, max=3600.0),
    Param("allowed_robots", "", "comma-separated robot ids a request may name ('' = any); others are "
          "rejected with the reason"),
)

EXECUTOR_PARAMS: tuple[Param, ...] = (
    AUTOSTART,
    Param("robot_id", "", "robot id ('' = the node's namespace: drone1 for /drone1/executor)"),
    Param("robot_type", "tello", "robots/<type>.yaml key"),
    Param("robots_dir", "", "directory of robot YAMLs ('' = robots/ of the source tree or share/timelyllm)"),
    Param("backend", "simulated", "simulated robot or a real Tello through djitellopy",
          choices=("simulated", "tello")),
    Param("time_scale", 1.0, "simulated: wall seconds per robot second", min=0.0, max=1000.0),
    Param("seed", 0, "simulated: random seed (execution-time jitter, perception)", min=0, max=INT_MAX),
    Param("visible_objects", "", "simulated perception: comma-separated object names"),
    Param("timeout_s", 120.0, "hard limit per segment, s (live: goals accepted after the change)", live=True,
          min=0.001, max=86400.0),
    Param("timeout_factor", 0.0, "> 0: limit = max(timeout_min_s, factor x estimated time), capped by "
          "timeout_s (live)", live=True, min=0.0, max=1000.0),
    Param("timeout_min_s", 5.0, "lower bound of that limit, s (live)", live=True, min=0.0, max=86400.0),
    Param("tello_host", "192.168.10.1", "tello: the drone's IP"),
    Param("tello_port", 8889, "tello: its UDP command port", min=1, max=65535),
    Param("takeoff_on_first_goal", True, "tello: take off before the first goal"),
    Param("land_on_close", True, "tello: land at cleanup / shutdown"),
    Param("keepalive_s", 5.0, "tello: keep-alive period while idle, s (it lands after 15 s; 0 = none)",
          min=0.0, max=14.0),
    Param("response_timeout_s", 7, "tello: seconds to wait for a command's answer", min=1, max=600),
    Param("retry_count", 3, "tello: retries of a command", min=0, max=100),
    Param("move_settle_s", 0.5, "tello: pause after a move, s", min=0.0, max=60.0),
    Param("turn_settle_s", 2.5, "tello: pause after a turn, s", min=0.0, max=60.0),
    Param("planner_lease_s", DEFAULT_LEASE_S, "a planner instance silent this long is lost: its running goal stops per "
          "the robot YAML's on_planner_lost, queued ones abort, s (>= 2 x heartbeat_period_s, here and at "
          "the planners)", min=0.002, max=3600.0),
    Param("heartbeat_period_s", DEFAULT_HEARTBEAT_S, "period of this executor's heartbeat, s (watched by the planner's "
          "executor_lease_s; at most half of planner_lease_s)", min=0.001, max=60.0),
    Param("allowed_planners", "", "comma-separated planner node names whose goals are accepted, e.g. "
          "/timelyllm/planner ('' = any)"),
    Param("flight_window_s", 0.0, "the robot's flight envelope (robot YAML envelope.flight) is charged over "
          "every goal it runs, whoever sent it: 0 = since takeoff (backends that report flying: tello; a "
          "simulated robot then has no flight account), > 0 = over a sliding window of that many seconds, "
          "any backend", min=0.0, max=3.2e9),
)


def defaults(specs: Sequence[Param]) -> dict[str, Any]:
    return {p.name: p.default for p in specs}


def coerce(specs: Sequence[Param], values: dict[str, Any]) -> dict[str, Any]:
    """Given values (`-p name:=value` is YAML-typed) -> every parameter, of its declared type and in
    range; a name that is not a parameter, a wrong type or a bad value is a ConfigError."""

    by_name = {p.name: p for p in specs}
    unknown = sorted(set(values) - set(by_name) - {"use_sim_time"})
    if unknown:
        raise ConfigError(f"unknown parameters {unknown}; `--help` lists them")
    out: dict[str, Any] = {}
    for p in specs:
        v = values.get(p.name, p.default)
        if isinstance(p.default, bool):
            ok, want = isinstance(v, bool), "true or false"
        elif isinstance(p.default, int):
            ok, want = isinstance(v, int) and not isinstance(v, bool), "an integer"
        elif isinstance(p.default, float):
            ok, want = isinstance(v, (int, float)) and not isinstance(v, bool), "a number"
            v = float(v) if ok else v
        else:
            ok, want = isinstance(v, str), "a string"
        if not ok:
            raise ConfigError(f"parameter {p.name!r} must be {want}, got {v!r}")
        why = p.check(v)
        if why and not (p.name == "policy"):  # the policy check names the registered ones itself
            raise ConfigError(why)
        out[p.name] = v
    return out


def descriptor(p: Param) -> Any:
    from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor, ParameterType

    ptype = {bool: ParameterType.PARAMETER_BOOL, int: ParameterType.PARAMETER_INTEGER,
             float: ParameterType.PARAMETER_DOUBLE, str: ParameterType.PARAMETER_STRING}[type(p.default)]
    d = ParameterDescriptor(name=p.name, type=ptype, description=p.description, read_only=not p.live,
                            dynamic_typing=False)
    if p.min is not None and isinstance(p.default, int) and not isinstance(p.default, bool):
        d.integer_range = [IntegerRange(from_value=int(p.min), to_value=int(p.max), step=0)]
    elif p.min is not None and isinstance(p.default, float):
        d.floating_point_range = [FloatingPointRange(from_value=float(p.min), to_value=float(p.max), step=0.0)]
    ch = p.choice_list()
    if ch:
        d.additional_constraints = "one of: " + ", ".join(ch)
    return d


def declare(node: Any, specs: Sequence[Param]) -> dict[str, Any]:
    """Declare `specs` on an rclpy node with their descriptors; return the values in force (the
    overrides given at start, converted and checked, else the defaults)."""
    given = {name: getattr(param, "value", param)
             for name, param in getattr(node, "_parameter_overrides", {}).items()}  # -p / params files
    values = coerce(specs, given)
    for p in specs:
        node.declare_parameter(p.name, values[p.name], descriptor(p), ignore_override=True)
    return values


def current(node: Any, specs: Sequence[Param]) -> dict[str, Any]:
    return {p.name: node.get_parameter(p.name).value for p in specs}


class LiveParameters:
    """The on-set callback of a node: `apply(changes)` (the node's) returns '' when it takes the
    changes (checked now, in force from the next scheduling point) or the reason it refuses them."""

    def __init__(self, node: Any, specs: Sequence[Param], apply: Callable[[dict[str, Any]], str]) -> None:
        self._specs = {p.name: p for p in specs}
        self._apply = apply
        node.add_on_set_parameters_callback(self)

    def __call__(self, params: list) -> Any:
        from rcl_interfaces.msg import SetParametersResult

        changes: dict[str, Any] = {}
        for prm in params:
            spec = self._specs.get(prm.name)
            if spec is None:
                return SetParametersResult(successful=False, reason=f"{prm.name!r} is not a parameter of this node")
            if not spec.live:  # read_only already refuses these; kept for descriptors replaced by hand
                return SetParametersResult(successful=False,
                                           reason=f"{prm.name!r} cannot change while the node runs")
            why = spec.check(prm.value)
            if why:
                return SetParametersResult(successful=False, reason=why)
            changes[prm.name] = prm.value
        try:
            why = self._apply(changes)
        except Exception as e:  # noqa: BLE001 - a refusal, never a dead parameter service
            why = f"{type(e).__name__}: {e}"
        return SetParametersResult(successful=not why, reason=why)


def help_text(command: str, specs: Sequence[Param], summary: str) -> str:
    lines = [f"usage: {command} [--ros-args [-r __ns:=/NS] [-p NAME:=VALUE]... [--params-file FILE]]", "",
             summary, "", "Parameters (-p NAME:=VALUE; `live`: may be set while it runs, the rest are read-only):"]
    w = max(len(p.name) for p in specs)
    for p in specs:
        rng = ""
        if p.min is not None:
            lo, hi = (int(p.min), int(p.max)) if isinstance(p.default, int) else (p.min, p.max)
            rng = f" [{lo:g}..{hi:g}]" if isinstance(lo, float) else f" [{lo}..{hi}]"
        ch = p.choice_list()
        if ch:
            rng = " {" + "|".join(ch) + "}"
        default = repr(p.default) if isinstance(p.default, str) else str(p.default).lower() \
            if isinstance(p.default, bool) else str(p.default)
        lines.append(f"  {p.name:<{w}}  {p.type_name:<7} {default}{rng}{'  live' if p.live else ''}")
        lines.append(f"  {'':<{w}}    {p.description}")
    return "\n".join(lines) + "\n"


def print_help(command: str, specs: Sequence[Param], summary: str) -> int:
    sys.stdout.write(help_text(command, specs, summary))
    return 0

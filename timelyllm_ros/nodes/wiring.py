"""Node parameters -> objects, and the `main()` of the ROS node scripts.

The builders take plain parameter dicts (what `ros2 run ... --ros-args -p ...` / config/planner.yaml
provide) so they are testable without ROS; `main_*` read the parameters through rclpy and spin.
The planner itself is assembled by `timelyllm_ros/assembly.py` (`NodePlanner.make_planner`).
"""

from __future__ import annotations

import logging
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from timelyllm_ros import PACKAGE
from timelyllm_ros.assembly import PlannerBuilder, PlannerParts, ServingEngines, warm_up
from timelyllm_ros.core.clock import Clock
from timelyllm_ros.core.planner import Planner
from timelyllm_ros.core.robots import RobotSpec, RobotSpecError, load_robots
from timelyllm_ros.inputs import InputError
from timelyllm_ros.paths import data_dir
from timelyllm_ros.signals import stop_on_signals
from timelyllm_ros.transport.base import join_name

from .params import EXECUTOR_PARAMS, PLANNER_PARAMS, ConfigError, coerce, defaults

if TYPE_CHECKING:
    from timelyllm_ros.journal import Journal, RecoveryReport

    from .dispatcher import ActionDispatcher
    from .planner_node import PlannerNodeConfig, RecoveryListener

log = logging.getLogger(__name__)

# every parameter, its type, range and meaning: nodes/params.py (declared and read there only)
EXECUTOR_DEFAULTS: dict[str, Any] = defaults(EXECUTOR_PARAMS)
PLANNER_DEFAULTS: dict[str, Any] = defaults(PLANNER_PARAMS)


def share_dir(sub: str) -> Path:
    """A data directory (timelyllm_ros.paths: the source tree's, else the installed
    share/timelyllm/<sub>); ConfigError where neither has it."""
    d = data_dir(sub)
    if not d.is_dir():
        raise ConfigError(f"cannot find the {sub}/ directory (source tree or share/{PACKAGE})")
    return d


def robots_from(params: dict[str, Any]) -> dict[str, RobotSpec]:
    d = params.get("robots_dir") or ""
    path = Path(d) if d else share_dir("robots")
    try:
        return load_robots(path)
    except RobotSpecError as e:
        raise ConfigError(f"robots_dir: {e}") from None


def _checked(name: str, check: Callable[[], Any]) -> Any:
    """Run one of timelyllm_ros.inputs' checks, its error as this node's ConfigError."""
    try:
        return check()
    except InputError as e:
        raise ConfigError(str(e) if str(e).startswith(name) else f"{name}: {e}") from None  # "": as is


def executor_supervision(params: dict[str, Any]) -> Any:
    """ExecutorSupervisionConfig from executor parameters (ConfigError naming the problem)."""
    from .supervision import ExecutorSupervisionConfig

    p = {**EXECUTOR_DEFAULTS, **params}
    try:
        return ExecutorSupervisionConfig(
            lease_s=float(p["planner_lease_s"]), heartbeat_period_s=float(p["heartbeat_period_s"]),
            allowed_planners=tuple(n.strip() for n in str(p["allowed_planners"]).split(",") if n.strip()))
    except ValueError as e:
        raise ConfigError(str(e)) from None


def build_executor(params: dict[str, Any], *, namespace: str = "") -> tuple[Any, str]:
    """(SegmentExecutor, robot_id) from executor parameters."""
    from timelyllm_ros.executors.base import ExecutorConfig, SegmentExecutor, SimulatedPerception

    p = coerce(EXECUTOR_PARAMS, params)  # every value typed and in its declared range (one validation)
    robots = robots_from(p)
    robot = robots.get(p["robot_type"])
    if robot is None:
        raise ConfigError(f"robot_type {p['robot_type']!r} is not one of {sorted(robots)}")
    robot_id = p["robot_id"] or namespace.strip("/")
    if not robot_id:
        raise ConfigError("robot_id is empty and the node has no namespace")
    visible = [v.strip() for v in str(p["visible_objects"]).split(",") if v.strip()]
    perception = SimulatedPerception(visible, seed=int(p["seed"]))
    if p["backend"] == "simulated":
        from timelyllm_ros.executors.simulated import SimulatedBackend

        backend: Any = SimulatedBackend(robot, seed=int(p["seed"]), time_scale=float(p["time_scale"]),
                                        perception=perception)
    elif p["backend"] == "tello":
        if robot.hardware != "tello":  # tello, or a skill set on it (robots/tello_typefly.yaml: platform tello)
            raise ConfigError(f"backend tello needs a tello robot type, got {robot.robot_type!r}")
        from timelyllm_ros.executors.tello import TelloBackend, TelloConfig

        backend = TelloBackend(robot, TelloConfig(
            host=str(p["tello_host"]), control_port=int(p["tello_port"]),
            takeoff_on_first_goal=bool(p["takeoff_on_first_goal"]), land_on_close=bool(p["land_on_close"]),
            keepalive_s=float(p["keepalive_s"]), response_timeout_s=int(p["response_timeout_s"]),
            retry_count=int(p["retry_count"]), move_settle_s=float(p["move_settle_s"]),
            turn_settle_s=float(p["turn_settle_s"])), perception=perception)
    else:
        raise ConfigError(f"backend must be simulated or tello, got {p['backend']!r}")
    cfg = ExecutorConfig(timeout_s=float(p["timeout_s"]), timeout_factor=float(p["timeout_factor"]),
                         timeout_min_s=float(p["timeout_min_s"]), flight_window_s=float(p["flight_window_s"]))
    return SegmentExecutor(robot, backend, cfg), robot_id


PolicyParams = Sequence[tuple[str | None, str, Any]]  # [(policy, or None: any policy; name; value)]


def policy_param_list(text: str) -> list[tuple[str | None, str, Any]]:
    """The `policy_params` parameter ("[POLICY:]NAME=VALUE, ...") parsed; a scoped item must name
    a registered policy and one of its parameters (its values are checked when that policy is
    built: `planner_policy`); else a ConfigError."""
    from timelyllm_ros.inputs import check_policies, check_policy_param_names, parse_policy_param

    items = [x.strip() for x in str(text).split(",") if x.strip()]
    parsed = [_checked("policy_params", lambda x=x: parse_policy_param(x)) for x in items]
    for pol, name, _ in parsed:
        if pol is not None:
            _checked("policy_params", lambda: check_policies([pol], arg="policy_params"))
            _checked("policy_params", lambda: check_policy_param_names(pol, [name], arg="policy_params"))
    return parsed


def planner_policy(name: str, policy_params: PolicyParams = ()) -> Any:
    """The policy `name` (a registered one, with its model when it needs one) built with the
    parsed `policy_params` (`policy_param_list`) that reach it, or a ConfigError."""
    from timelyllm_ros.core.policies import make_policy
    from timelyllm_ros.inputs import check_policies, check_policy_params, params_for

    _checked("policy", lambda: check_policies([name], arg="policy"))
    extra = {"model_dir": str(share_dir("models") / "length-predictor")} if name == "trail" else {}
    extra.update(params_for(name, policy_params))
    _checked("policy_params", lambda: check_policy_params(name, extra, arg="policy_params"))
    return make_policy(name, **extra)  # installed: models/ lives in share/timelyllm


class PlannerSetup:
    """A planner node's configuration, checked (lifecycle `configure`): robots, policy, engine
    settings, profile, journal.  `start()` (lifecycle `activate`) builds the engine."""

    def __init__(self, params: dict[str, Any]) -> None:
        p = {**PLANNER_DEFAULTS, **params}
        unknown = set(params) - set(PLANNER_DEFAULTS)
        if unknown:
            raise ConfigError(f"unknown planner parameters {sorted(unknown)}")
        self.params = p
        self.robots = robots_from(p)
        self.policy_params = policy_param_list(str(p["policy_params"]))  # parsed once: configure, live switches
        self.policy = planner_policy(str(p["policy"]), self.policy_params)
        if isinstance(p["max_batch"], bool) or not isinstance(p["max_batch"], int) or p["max_batch"] < 0:
            raise ConfigError(f"max_batch: must be an integer >= 0 (0: latency-guided), got {p['max_batch']!r}")
        if p["engines"] and p["engine"] != "vllm":
            raise ConfigError(f"engines is for engine: vllm (real engines), not engine: {p['engine']}")
        if float(p["executor_lease_s"]) != 0:  # 0: executors not supervised (ones without heartbeats)
            from .supervision import check_lease

            try:
                check_lease(float(p["executor_lease_s"]), float(p["heartbeat_period_s"]), "executor_lease_s")
            except ValueError as e:
                raise ConfigError(str(e)) from None
        self.latency: Any = None
        self.entries: list = []
        self.vllm_cfg: dict = {}
        if p["engine"] == "simulated":
            from timelyllm_ros.engines.simulated import LatencyProfile

            profile = Path(p["profile"]) if p["profile"] else share_dir("profiles") / "rtx4090_llama3_8b.yaml"
            try:
                self.latency = LatencyProfile.from_yaml(profile)
            except (OSError, ValueError) as e:
                raise ConfigError(f"profile: {e}") from None
        elif p["engine"] == "vllm":
            from timelyllm_ros.engines.fleet_config import parse_engines
            from timelyllm_ros.inputs import vllm_config

            self.vllm_cfg = _checked("", lambda: vllm_config(  # its messages name engine_config or model
                p["engine_config"] or None, p["model"] or None, default_model=share_dir("models") / "tiny-planner",
                config_arg="engine_config", model_arg="model"))
            try:
                self.entries = parse_engines(p["engines"]) if p["engines"] else [{"kind": "vllm", **self.vllm_cfg}]
            except ValueError as e:
                raise ConfigError(str(e)) from e
        else:
            raise ConfigError(f"engine must be simulated or vllm, got {p['engine']!r}")
        self.journal: Any = None
        if p["journal_path"]:
            from timelyllm_ros.journal import Journal, JournalError

            try:
                self.journal = Journal(str(p["journal_path"]), retention_s=float(p["journal_retention_s"]))
            except JournalError as e:
                raise ConfigError(f"journal_path: {e}") from e

    def update(self, changes: dict[str, Any]) -> None:
        """Live parameters changed while configured but not serving: the next start uses them."""
        if "policy" in changes:
            self.policy = changes["policy"]
        self.params.update({k: (v.name if k == "policy" else v) for k, v in changes.items()})

    def close(self) -> None:
        if self.journal is not None:
            self.journal.close()
            self.journal = None

    def start(self) -> NodePlanner:
        """The engine starts (lifecycle `activate`); the node builds the planner with
        `NodePlanner.make_planner`."""
        from timelyllm_ros.core.planner import PlannerConfig

        from .dispatcher import DispatcherConfig
        from .planner_node import PlannerNodeConfig

        p, robots, policy = self.params, self.robots, self.policy
        engines: ServingEngines | None = None
        if p["engine"] == "simulated":
            from timelyllm_ros.core.clock import VirtualClock
            from timelyllm_ros.engines.simulated import SimulatedEngine
            from timelyllm_ros.sim.prompts import SimPromptSource

            clock: Any = VirtualClock()  # the simulated engine does not die: no restart
            engine: Any = SimulatedEngine(clock, self.latency, scheduling_policy=policy.engine_scheduling)
            prompts: Any = SimPromptSource(engine, robots=robots)
        else:
            from timelyllm_ros.core.clock import WallClock
            from timelyllm_ros.engines.fleet_config import with_scheduling
            from timelyllm_ros.prompts import PromptBuilder

            clock = WallClock()
            # vllm-priority: vLLM's own priority scheduling
            engines = ServingEngines.start(with_scheduling(self.entries, policy.engine_scheduling),
                                           vllm_defaults=self.vllm_cfg)
            engine = engines.engine
            prompts = PromptBuilder(robots, engine.tokenizer)
        if p["warm_up"]:  # as the in-process demo: no request pays for a robot type's first prefill
            warm_up(engine, prompts, sorted(robots))
        step_log: list | None = [] if p["step_log_path"] else None
        engine.step_log = step_log  # serving steps only (not the warm-up)
        parts = PlannerParts(
            clock=clock, engine=engine, robots=robots, policy=policy, prompts=prompts,
            config=PlannerConfig(max_tokens=int(p["max_tokens"]), max_live=int(p["max_live"]),
                                 max_queued=int(p["max_queued"]), max_per_agent=int(p["max_per_agent"]),
                                 agent_rate_per_s=float(p["agent_rate_per_s"]), agent_burst=int(p["agent_burst"])),
            max_batch=int(p["max_batch"]) if int(p["max_batch"]) > 0 else None, journal=self.journal,
            engine_restart=None if engines is None else engines.restart)
        node_cfg = PlannerNodeConfig(
            status_period_s=float(p["status_period_s"]), frame_id=str(p["frame_id"]), max_batch=int(p["max_batch"]),
            executors=tuple(r.strip() for r in str(p["executors"]).split(",") if r.strip()),
            heartbeat_period_s=float(p["heartbeat_period_s"]),
            allowed_robots=tuple(r.strip() for r in str(p["allowed_robots"]).split(",") if r.strip()),
            dispatcher=DispatcherConfig(timeout_factor=float(p["goal_timeout_factor"]),
                                        timeout_margin_s=float(p["goal_timeout_margin_s"]),
                                        server_wait_s=float(p["server_wait_s"]),
                                        executor_lease_s=float(p["executor_lease_s"])))
        return NodePlanner(parts=parts, node_config=node_cfg, engines=engines, step_log=step_log,
                           step_log_path=str(p["step_log_path"]))


@dataclass
class NodePlanner:
    """A started planner node's planner side: its parts (the engine runs), the node's config, and
    what `shutdown` ends (`PlannerSetup.start`)."""

    parts: PlannerParts
    node_config: PlannerNodeConfig
    engines: ServingEngines | None  # None: the simulated engine (it does not die)
    step_log: list | None  # the engine's serving steps, written to step_log_path at shutdown
    step_log_path: str

    @property
    def clock(self) -> Clock:
        return self.parts.clock

    def make_planner(self, dispatcher: ActionDispatcher, listeners: list[RecoveryListener]) -> Planner:
        """`PlannerNode(transport, make_planner, ...)`: the planner on the node's dispatcher (built
        by the node: it posts results into this planner), the node as its listener; with a
        journal, what it held unfinished recovered first (its executors asked where their robots
        were left) and the node told (it reports the failed ones; ids seen are answered from it)."""
        from .supervision import ask_goal_states

        built = PlannerBuilder(self.parts).build(
            dispatcher, listeners, goal_states=lambda robot: ask_goal_states(dispatcher.transport, robot))
        if built.journal is not None:
            assert built.recovery is not None
            for listener in listeners:
                listener.on_recovery(built.recovery)
                listener.on_journal(built.journal)
        return built.planner

    def shutdown(self) -> None:
        if self.step_log is not None:
            from timelyllm_ros.engines.base import save_step_log

            save_step_log(self.step_log_path, self.step_log)
        (self.engines.engine if self.engines is not None else self.parts.engine).shutdown()


def build_planner(params: dict[str, Any]) -> NodePlanner:
    """A started planner (`PlannerSetup.start`) from planner parameters."""
    return PlannerSetup(params).start()


def _spin_until_signal() -> None:
    """Until SIGINT or SIGTERM (logged: a shutdown that then hangs shows how far it got).  The
    handler takes no lock (`signals.StopFlag`)."""
    stop = stop_on_signals()
    stop.wait()
    log.info("%s received: shutting down (deactivate, cleanup)", signal.Signals(stop.signal).name)


def _stray_args(args: list[str]) -> list[str]:
    """Arguments that are not ROS arguments: before `--ros-args`, or after its closing `--`."""
    rest = args[1:]
    if "--ros-args" not in rest:
        return rest
    i = rest.index("--ros-args")
    stray = rest[:i]
    if "--" in rest[i:]:
        stray += rest[i + rest[i:].index("--") + 1:]
    return stray


class _Lifecycle:
    """What a node does on each lifecycle transition; `apply` takes live parameter changes."""

    def configure(self, params: dict[str, Any]) -> None: ...
    def activate(self) -> None: ...
    def deactivate(self) -> None: ...
    def cleanup(self) -> None: ...
    def apply(self, changes: dict[str, Any]) -> str: ...


def _run_node(node_name: str, argv: list[str] | None, specs: Any, summary: str,
              make: Callable[[Any], _Lifecycle]) -> int:
    """A managed (lifecycle) node from `argv` (`--ros-args ...`): parameters declared
    (nodes/params.py), transitions wired to `make(transport)`'s methods; with `autostart` it
    configures and activates itself.  Spins until SIGINT/SIGTERM, then shuts down in order (SIGUSR1
    prints every thread's stack to stderr and the node goes on: where a node that hangs stands).  A bad
    parameter or argument ends in one line on stderr and exit code 2, never a traceback;
    `--help` prints the parameters and starts nothing."""
    from . import params as P

    args = list(sys.argv if argv is None else argv)
    prog = args[0] if args else node_name
    stray = _stray_args(args)
    if "-h" in stray or "--help" in stray:
        return P.print_help(prog, specs, summary)
    if stray:
        print(f"error: unexpected arguments {stray}: node parameters go after --ros-args, e.g. "
              f"`{prog} --ros-args -p engine:=vllm` (--help lists them)", file=sys.stderr)
        return 2
    from timelyllm_ros.transport.rclpy_transport import RclpyTransport, RclpyUnavailable

    logging.basicConfig(level=logging.INFO, format="[%(levelname)s] [%(name)s]: %(message)s")
    import faulthandler

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1`: every thread's stack to stderr
    try:
        t = RclpyTransport(node_name, args=args, managed=True)
    except RclpyUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # rcl rejects malformed --ros-args here
        print(f"error: cannot start the ROS node: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
              file=sys.stderr)
        return 2
    try:
        try:
            values = P.declare(t.node, specs)
        except InputError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        life = make(t)
        P.LiveParameters(t.node, specs, life.apply)
        t.on_transitions(configure=lambda: life.configure(P.current(t.node, specs)), activate=life.activate,
                         deactivate=life.deactivate, cleanup=life.cleanup)
        if values["autostart"]:
            t.node.log_failures = False  # the one-line error below says it
            for step in ("configure", "activate"):
                if not t.transition(step):
                    print(f"error: {t.transition_error or step + ' failed'}", file=sys.stderr)
                    return 2
            t.node.log_failures = True
        else:
            log.info("%s is unconfigured: waiting for lifecycle transitions (autostart false)",
                     t.node.get_fully_qualified_name())
        _spin_until_signal()
    finally:
        try:
            t.transition("shutdown")  # deactivate + cleanup from whatever state it is in
        finally:
            t.close()
    return 0


class _ExecutorLifecycle(_Lifecycle):
    """configure: the robot and its backend (not connected); activate: the action server, connect
    to the robot; deactivate: new goals are rejected, queued and running ones finish; cleanup: the
    action server goes, the backend closes (a Tello lands)."""

    def __init__(self, t: Any) -> None:
        self.t = t
        self.executor: Any = None
        self.robot_id = ""
        self.supervision: Any = None
        self.node: Any = None

    def configure(self, params: dict[str, Any]) -> None:
        self.supervision = executor_supervision(params)  # checked before the backend is built
        self.executor, self.robot_id = build_executor(params, namespace=self.t.node.get_namespace())

    def activate(self) -> None:
        from timelyllm_ros.executors.base import ExecError

        from .executor_node import ExecutorNode

        if self.node is None:
            self.node = ExecutorNode(self.t, self.executor, robot_id=self.robot_id, supervision=self.supervision)
            try:
                self.executor.start()  # connect now (Tello: `command`); on failure, each goal retries
            except ExecError as e:
                log.error("%s: robot not reachable yet (%s); goals will retry the connection", self.robot_id, e)
        self.node.accepting = True
        log.info("executor for %s (%s) serving %s", self.robot_id, self.executor.robot.robot_type,
                 join_name(self.t.node.get_namespace(), "execute_segment"))

    def deactivate(self) -> None:
        if self.node is not None:
            self.node.accepting = False
            log.info("%s: inactive: new goals are rejected, queued and running goals finish", self.robot_id)

    def cleanup(self) -> None:
        node, self.node = self.node, None
        if node is not None:
            node.close()
        elif self.executor is not None:
            self.executor.close()
        self.executor = None

    def apply(self, changes: dict[str, Any]) -> str:
        if self.executor is not None:  # goals accepted from now on
            for k, v in changes.items():
                setattr(self.executor.config, k, v)
            log.info("%s: parameters set: %s", self.robot_id, changes)
        return ""


class _PlannerLifecycle(_Lifecycle):
    """configure: robots, profile, engine settings, policy, journal checked (no engine yet);
    activate: the engine starts, then the node serves; deactivate: new requests are rejected with
    a reason while admitted plans run to their end (generation, dispatch, results); cleanup: what
    is still running is cancelled (its robot's goal too: it stops where it is), the engine is freed."""

    def __init__(self, t: Any) -> None:
        self.t = t
        self.setup: PlannerSetup | None = None
        self.node: Any = None
        self.shutdown: Callable[[], None] = lambda: None

    def configure(self, params: dict[str, Any]) -> None:
        self.setup = PlannerSetup(params)

    def activate(self) -> None:
        from .planner_node import PlannerNode

        assert self.setup is not None
        if self.node is None:
            from .supervision import new_instance_id

            started = self.setup.start()
            cfg = started.node_config
            # each activation is a new planner instance, named after the node (allowed_planners)
            cfg.dispatcher.planner_id = new_instance_id(self.t.node.get_fully_qualified_name())
            try:
                self.node = PlannerNode(self.t, started.make_planner, clock=started.clock, config=cfg).start()
            except BaseException:
                started.shutdown()
                raise
            self.shutdown = started.shutdown
        self.node.set_accepting(True)
        from timelyllm_ros.inputs import params_for

        pol = self.node.planner.policy  # with the policy_params that reached it, as the policy holds them
        given = params_for(pol.name, self.setup.policy_params)
        log.info("planner (%s engine, policy %s%s) serving %s", self.setup.params["engine"], pol.name,
                 "".join(f", {k}={pol.params().get(k)!r}" for k in given),
                 join_name(self.t.node.get_namespace(), self.node.config.request_topic))

    def deactivate(self) -> None:
        if self.node is not None:
            self.node.set_accepting(False, "planner inactive (lifecycle deactivate): not accepting requests")
            log.info("planner inactive: new requests are rejected, admitted plans run to their end")

    def cleanup(self) -> None:
        node, self.node = self.node, None
        try:
            if node is not None:
                node.close(cancel_reason="planner cleaned up (lifecycle cleanup)")
        finally:
            shutdown, self.shutdown = self.shutdown, lambda: None
            try:
                shutdown()
            finally:
                if self.setup is not None:
                    self.setup.close()
                self.setup = None

    def apply(self, changes: dict[str, Any]) -> str:
        changes = dict(changes)
        if "policy" in changes:
            try:
                changes["policy"] = planner_policy(str(changes["policy"]),
                                                   self.setup.policy_params if self.setup is not None else [])
            except ConfigError as e:
                return str(e)
        if self.node is not None:
            self.node.apply_parameters(changes)  # at its next scheduling point
        elif self.setup is not None:
            self.setup.update(changes)
        return ""


PLANNER_SUMMARY = ("The TimelyLLM planner as a managed ROS 2 node (lifecycle: configure loads and checks robots, "
                   "profile, engine settings and policy; activate starts the engine and serving; deactivate "
                   "rejects new requests while admitted plans finish; cleanup frees the engine). Topics in its "
                   "namespace: plan_requests, cancel_requests, request_status, segment_status, planner_status; "
                   "service get_request_state; /diagnostics.")
EXECUTOR_SUMMARY = ("A robot's executor as a managed ROS 2 node: the <namespace>/execute_segment action server "
                    "(lifecycle: configure builds the backend, activate serves and connects, deactivate rejects "
                    "new goals while queued and running ones finish, cleanup closes the backend).")


def main_executor(argv: list[str] | None = None) -> int:
    """`timelyllm ros executor --ros-args -r __ns:=/drone1 -p robot_type:=tello`
    (= `ros2 run timelyllm executor_node ...` on a ROS install)."""
    return _run_node("executor", argv, EXECUTOR_PARAMS, EXECUTOR_SUMMARY, _ExecutorLifecycle)


def main_planner(argv: list[str] | None = None) -> int:
    """`timelyllm ros planner --ros-args -r __ns:=/timelyllm -p engine:=vllm`
    (= `ros2 run timelyllm planner_node ...` on a ROS install)."""
    return _run_node("planner", argv, PLANNER_PARAMS, PLANNER_SUMMARY, _PlannerLifecycle)

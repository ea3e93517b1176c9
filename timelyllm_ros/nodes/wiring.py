"""Node parameters -> objects, and the `main()` of the ROS node scripts.

The builders take plain parameter dicts (what `ros2 run ... --ros-args -p ...` / config/planner.yaml
provide) so they are testable without ROS; `main_*` read the parameters through rclpy and spin.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from timelyllm_ros.core.policies import DEFAULT_POLICY
from timelyllm_ros.core.robots import ROBOTS_DIR, RobotSpec, RobotSpecError, load_robots
from timelyllm_ros.inputs import InputError
from timelyllm_ros.transport.base import join_name

log = logging.getLogger(__name__)

PACKAGE = "timelyllm"

EXECUTOR_DEFAULTS: dict[str, Any] = {
    "robot_id": "",  # default: the node's namespace (drone1 for /drone1/executor)
    "robot_type": "tello",
    "robots_dir": "",  # default: robots/ of the source tree or share/timelyllm/robots
    "backend": "simulated",  # simulated | tello
    "time_scale": 1.0,  # simulated: wall seconds per robot second
    "seed": 0,
    "visible_objects": "",  # simulated perception: comma-separated object names
    "timeout_s": 120.0,
    "timeout_factor": 0.0,
    "timeout_min_s": 5.0,
    "tello_host": "192.168.10.1",
    "tello_port": 8889,
    "takeoff_on_first_goal": True,
    "land_on_close": True,
    "keepalive_s": 5.0,
    "response_timeout_s": 7,
    "retry_count": 3,
    "move_settle_s": 0.5,
    "turn_settle_s": 2.5,
    # supervision (nodes/supervision.py): a planner silent this long is lost (robot YAML on_planner_lost)
    "planner_lease_s": 1.0,
    "heartbeat_period_s": 0.2,  # this executor's heartbeat (the planner fails its goals when it stops)
    "allowed_planners": "",  # comma-separated planner node names (e.g. /timelyllm/planner); "" = any
}

PLANNER_DEFAULTS: dict[str, Any] = {
    "engine": "simulated",  # simulated | vllm
    "model": "",  # vllm: model directory (default: the bundled tiny planner model)
    "engine_config": "",  # vllm: YAML mapping of engine settings (see engines/vllm_engine.py)
    # vllm: several engines behind this planner, a YAML list (inline or a .yaml path) such as
    # "[{kind: vllm, model: models/tiny-planner}, {kind: openai, url: http://gpu1:8000/v1}]"
    # (see engines/fleet_config.py); "" = one in-process engine from model/engine_config
    "engines": "",
    "profile": "",  # simulated: latency profile YAML (default: profiles/rtx4090_llama3_8b.yaml)
    "policy": DEFAULT_POLICY,  # core/policies/default.py
    "robots_dir": "",
    "max_batch": 0,  # 0: the policy's own batching (Policy.batching: latency-guided or continuous, 256)
    "max_tokens": 256,
    "status_period_s": 0.5,
    "frame_id": "map",
    "goal_timeout_factor": 3.0,
    "goal_timeout_margin_s": 10.0,
    "server_wait_s": 2.0,
    "journal_path": "",  # SQLite request journal ("" = off); unfinished requests recovered at start
    "journal_retention_s": 604800.0,  # terminal requests kept in the journal (7 days)
    "executors": "",  # comma-separated robot ids whose action servers are discovered at start
    "step_log_path": "",  # write the engine's serving steps (StepRecords, JSON lines) here at shutdown
    "warm_up": False,  # prefill each robot type's prompt prefix (vLLM: and compile) before serving
    "heartbeat_period_s": 0.2,  # this planner instance's heartbeat (executors: planner_lease_s)
    "executor_lease_s": 1.0,  # an executor silent this long fails its goals in flight (0: off)
    "allowed_robots": "",  # comma-separated robot ids a request may name ("" = any); others rejected
}


class ConfigError(InputError):
    """A node parameter is invalid; the message (one line) names it."""


def coerce_parameters(defaults: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """Parameter values as given (`-p name:=value` is YAML-typed: `1` is an int, `1.5` a float)
    -> values of the defaults' types.  An int for a float parameter is that float
    (`-p time_scale:=1`); anything else of the wrong type is a ConfigError naming it.  Names
    that are not in `defaults` pass through: the builders refuse them."""
    out: dict[str, Any] = {}
    for name, default in defaults.items():
        v = values.get(name, default)
        if isinstance(default, bool):
            ok = isinstance(v, bool)
            want = "true or false"
        elif isinstance(default, int):
            ok = isinstance(v, int) and not isinstance(v, bool)
            want = "an integer"
        elif isinstance(default, float):
            ok = isinstance(v, (int, float)) and not isinstance(v, bool)
            v = float(v) if ok else v
            want = "a number"
        else:
            ok = isinstance(v, str)
            want = "a string"
        if not ok:
            raise ConfigError(f"parameter {name!r} must be {want}, got {v!r}")
        out[name] = v
    out.update({k: v for k, v in values.items() if k not in defaults})
    return out


def share_dir(sub: str) -> Path:
    """A data directory: the source tree's, else the installed share/timelyllm/<sub>."""
    src = Path(__file__).resolve().parents[2] / sub
    if src.is_dir():
        return src
    try:
        from ament_index_python.packages import get_package_share_directory

        return Path(get_package_share_directory(PACKAGE)) / sub
    except Exception as e:
        raise ConfigError(f"cannot find the {sub}/ directory (source tree or share/{PACKAGE})") from e


def robots_from(params: dict[str, Any]) -> dict[str, RobotSpec]:
    d = params.get("robots_dir") or ""
    path = Path(d) if d else (ROBOTS_DIR if ROBOTS_DIR.is_dir() else share_dir("robots"))
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

    p = {**EXECUTOR_DEFAULTS, **params}
    unknown = set(params) - set(EXECUTOR_DEFAULTS)
    if unknown:
        raise ConfigError(f"unknown executor parameters {sorted(unknown)}")
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
        if robot.robot_type != "tello":
            raise ConfigError(f"backend tello needs robot_type tello, got {robot.robot_type!r}")
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
                         timeout_min_s=float(p["timeout_min_s"]))
    return SegmentExecutor(robot, backend, cfg), robot_id


def build_planner(params: dict[str, Any]) -> tuple[Callable, Any, Any, Callable[[], None]]:
    """(make_planner(dispatcher, listeners), clock, node config, shutdown) from planner parameters."""
    from timelyllm_ros.core.exec_time import ExecTimeEstimator
    from timelyllm_ros.core.planner import Planner, PlannerConfig
    from timelyllm_ros.core.policies import make_policy

    from .planner_node import DispatcherConfig, PlannerNodeConfig

    p = {**PLANNER_DEFAULTS, **params}
    unknown = set(params) - set(PLANNER_DEFAULTS)
    if unknown:
        raise ConfigError(f"unknown planner parameters {sorted(unknown)}")
    robots = robots_from(p)
    from timelyllm_ros.inputs import check_policies, check_policy_params

    _checked("policy", lambda: check_policies([str(p["policy"])], arg="policy"))
    extra = {"model_dir": str(share_dir("models") / "length-predictor")} if p["policy"] == "trail" else {}
    _checked("policy", lambda: check_policy_params(str(p["policy"]), extra, arg="policy"))
    policy = make_policy(str(p["policy"]), **extra)  # installed: models/ lives in share/timelyllm
    if isinstance(p["max_batch"], bool) or not isinstance(p["max_batch"], int) or p["max_batch"] < 0:
        raise ConfigError(f"max_batch: must be an integer >= 0 (0: latency-guided), got {p['max_batch']!r}")
    if p["engines"] and p["engine"] != "vllm":
        raise ConfigError(f"engines is for engine: vllm (real engines), not engine: {p['engine']}")
    if p["engine"] == "simulated":
        from timelyllm_ros.core.clock import VirtualClock
        from timelyllm_ros.engines.simulated import LatencyProfile, SimulatedEngine
        from timelyllm_ros.sim.prompts import SimPromptSource

        restart_engine = None  # the simulated engine does not die
        clock: Any = VirtualClock()
        profile = Path(p["profile"]) if p["profile"] else share_dir("profiles") / "rtx4090_llama3_8b.yaml"
        try:
            latency = LatencyProfile.from_yaml(profile)
        except (OSError, ValueError) as e:
            raise ConfigError(f"profile: {e}") from None
        engine: Any = SimulatedEngine(clock, latency)
        prompts: Any = SimPromptSource(engine, robots=robots)
    elif p["engine"] == "vllm":
        from timelyllm_ros.core.clock import WallClock
        from timelyllm_ros.engines.fleet_config import build_engine, parse_engines
        from timelyllm_ros.inputs import vllm_config
        from timelyllm_ros.prompts import PromptBuilder

        cfg = _checked("", lambda: vllm_config(  # its messages name engine_config or model
            p["engine_config"] or None, p["model"] or None, default_model=share_dir("models") / "tiny-planner",
            config_arg="engine_config", model_arg="model"))
        try:
            entries = parse_engines(p["engines"]) if p["engines"] else [{"kind": "vllm", **cfg}]
        except ValueError as e:
            raise ConfigError(str(e)) from e
        clock = WallClock()
        engine = build_engine(entries, vllm_defaults=cfg)

        def restart_engine(old: Any) -> Any:
            """Supervisor: rebuild a dead engine from the same settings (running generations are
            re-queued by the planner and resume from their token ids)."""
            try:
                old.shutdown()
            except Exception:  # noqa: BLE001 - it is dead already
                pass
            new = build_engine(entries, vllm_defaults=cfg)
            if hasattr(new, "step_log"):
                new.step_log = old.step_log  # the serving steps go on in one log
            return new
        prompts = PromptBuilder(robots, engine.tokenizer)
    else:
        raise ConfigError(f"engine must be simulated or vllm, got {p['engine']!r}")
    if p["warm_up"]:  # as the in-process demo: no request pays for a robot type's first prefill
        from timelyllm_ros.serve import warm_up

        warm_up(engine, prompts, sorted(robots))
    step_log: list | None = [] if p["step_log_path"] else None
    engine.step_log = step_log  # serving steps only (not the warm-up)

    journal = None
    if p["journal_path"]:
        from timelyllm_ros.journal import Journal, JournalError

        try:
            journal = Journal(str(p["journal_path"]), retention_s=float(p["journal_retention_s"]))
        except JournalError as e:
            raise ConfigError(f"journal_path: {e}") from e

    def make_planner(dispatcher: Any, listeners: list) -> Planner:
        planner = Planner(clock=clock, engine=engine, dispatcher=dispatcher, robots=robots, policy=policy,
                          estimator=ExecTimeEstimator(robots), prompts=prompts,
                          config=PlannerConfig(max_tokens=int(p["max_tokens"])),
                          listeners=list(listeners) + ([journal] if journal else []),
                          engine_restart=restart_engine)
        if journal is not None:
            from timelyllm_ros.journal import recover

            journal.prune()
            from .supervision import ask_goal_states

            # resubmit what dispatched nothing, fail the rest saying where each robot was left
            transport = getattr(dispatcher, "transport", None)  # the node's ActionDispatcher: ask the executors
            report = recover(journal, planner, goal_states=None if transport is None else
                             (lambda robot: ask_goal_states(transport, robot)))
            for listener in listeners:  # the node reports the failed ones on its status topic
                getattr(listener, "on_recovery", lambda _r: None)(report)
                getattr(listener, "on_journal", lambda _j: None)(journal)  # ids it has seen: idempotent
        planner.use_batching(int(p["max_batch"]) if int(p["max_batch"]) > 0 else None)
        return planner

    from .supervision import check_lease

    try:
        if float(p["executor_lease_s"]) != 0:  # 0: executors not supervised (ones without heartbeats)
            check_lease(float(p["executor_lease_s"]), float(p["heartbeat_period_s"]), "executor_lease_s")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    node_cfg = PlannerNodeConfig(
        heartbeat_period_s=float(p["heartbeat_period_s"]),
        allowed_robots=tuple(r.strip() for r in str(p["allowed_robots"]).split(",") if r.strip()),
        status_period_s=float(p["status_period_s"]), frame_id=str(p["frame_id"]),
        executors=tuple(r.strip() for r in str(p["executors"]).split(",") if r.strip()),
        dispatcher=DispatcherConfig(timeout_factor=float(p["goal_timeout_factor"]),
                                    timeout_margin_s=float(p["goal_timeout_margin_s"]),
                                    server_wait_s=float(p["server_wait_s"]),
                                    executor_lease_s=float(p["executor_lease_s"])))
    def shutdown() -> None:
        if step_log is not None:
            from timelyllm_ros.engines.base import save_step_log

            save_step_log(str(p["step_log_path"]), step_log)
        engine.shutdown()

    return make_planner, clock, node_cfg, shutdown


def _spin_until_signal() -> None:
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    # timed: a signal delivered to another thread only runs its Python handler when the main
    # thread wakes up, which an untimed wait never does
    while not done.wait(0.2):
        pass


def _node_params(t: Any, defaults: dict[str, Any]) -> dict[str, Any]:
    return coerce_parameters(defaults, t.parameters(defaults))


def _run_node(node_name: str, argv: list[str] | None, serve: Callable[[Any], Callable[[], None]]) -> int:
    """Create the rclpy transport from `argv` (`--ros-args ...`), let `serve(transport)` build
    the node (it returns the node's close), spin until SIGINT/SIGTERM, close in order.  A bad
    parameter or argument ends in one line on stderr and exit code 2, never a traceback."""
    from timelyllm_ros.transport.rclpy_transport import RclpyTransport, RclpyUnavailable

    logging.basicConfig(level=logging.INFO, format="[%(levelname)s] [%(name)s]: %(message)s")
    args = list(sys.argv if argv is None else argv)
    try:
        t = RclpyTransport(node_name, args=args)
    except RclpyUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # rcl rejects malformed --ros-args here
        print(f"error: cannot start the ROS node: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
              file=sys.stderr)
        return 2
    close: Callable[[], None] = lambda: None  # noqa: E731
    try:
        close = serve(t)
        _spin_until_signal()
    except InputError as e:  # ConfigError and the checks of timelyllm_ros.inputs
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        try:
            close()
        finally:
            t.close()
    return 0


def main_executor(argv: list[str] | None = None) -> int:
    """`timelyllm ros executor --ros-args -r __ns:=/drone1 -p robot_type:=tello`
    (= `ros2 run timelyllm executor_node ...` on a ROS install)."""
    from timelyllm_ros.executors.base import ExecError

    from .executor_node import ExecutorNode

    def serve(t: Any) -> Callable[[], None]:
        params = _node_params(t, EXECUTOR_DEFAULTS)
        executor, robot_id = build_executor(params, namespace=t.node.get_namespace())
        node = ExecutorNode(t, executor, robot_id=robot_id, supervision=executor_supervision(params))
        log.info("executor for %s (%s) serving %s", robot_id, executor.robot.robot_type,
                 join_name(t.node.get_namespace(), "execute_segment"))
        try:
            executor.start()  # connect now (Tello: `command`); on failure, each goal retries
        except ExecError as e:
            log.error("%s: robot not reachable yet (%s); goals will retry the connection", robot_id, e)
        return node.close

    return _run_node("executor", argv, serve)


def main_planner(argv: list[str] | None = None) -> int:
    """`timelyllm ros planner --ros-args -r __ns:=/timelyllm -p engine:=vllm`
    (= `ros2 run timelyllm planner_node ...` on a ROS install)."""
    from .planner_node import PlannerNode

    def serve(t: Any) -> Callable[[], None]:
        make_planner, clock, cfg, shutdown = build_planner(_node_params(t, PLANNER_DEFAULTS))
        from .supervision import new_instance_id  # this start's instance id names the node (allowed_planners)

        cfg.dispatcher.planner_id = new_instance_id(t.node.get_fully_qualified_name())
        try:
            node = PlannerNode(t, make_planner, clock=clock, config=cfg).start()
        except BaseException:
            shutdown()
            raise
        log.info("planner (%s engine) serving %s", t.node.get_parameter("engine").value,
                 join_name(t.node.get_namespace(), node.config.request_topic))

        def close() -> None:
            try:
                node.close()
            finally:
                shutdown()
        return close

    return _run_node("planner", argv, serve)

"""Packaging checks that need no ROS: package.xml, CMakeLists.txt, launch/config and the node
parameter wiring agree with each other and with the code."""

from __future__ import annotations

import ast
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from timelyllm_ros.nodes import wiring
from timelyllm_ros.nodes.params import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def test_package_xml():
    root = ET.parse(ROOT / "package.xml").getroot()
    assert root.get("format") == "3" and root.findtext("name") == "timelyllm"
    tags = {}
    for el in root:
        tags.setdefault(el.tag, set()).add((el.text or "").strip())
    assert {"ament_cmake", "ament_cmake_python", "rosidl_default_generators"} <= tags["buildtool_depend"]
    assert {"action_msgs", "builtin_interfaces", "diagnostic_msgs", "visualization_msgs", "geometry_msgs",
            "std_msgs"} <= tags["depend"]
    assert {"rosidl_default_runtime", "rclpy"} <= tags["exec_depend"]
    assert tags["member_of_group"] == {"rosidl_interface_packages"}
    assert root.find("export/build_type").text == "ament_cmake"


def test_cmakelists_generates_every_interface_and_installs_the_python_package():
    text = (ROOT / "CMakeLists.txt").read_text()
    assert re.search(r"^project\(timelyllm\)", text, re.M)
    gen = re.search(r"rosidl_generate_interfaces\(\$\{PROJECT_NAME\}(.*?)\)", text, re.S).group(1)
    listed = set(re.findall(r'"((?:msg|action)/[^"]+)"', gen))
    on_disk = {str(p.relative_to(ROOT)) for d in ("msg", "action") for p in (ROOT / d).iterdir()}
    assert listed == on_disk
    # the Python package must not be installed under the ROS package name (rosidl_python#141)
    assert "ament_python_install_package(timelyllm_ros)" in text
    assert "ament_python_install_package(${PROJECT_NAME})" not in text
    for script in re.findall(r"(scripts/ros/\S+)", text):
        path = ROOT / script
        assert path.is_file() and os.access(path, os.X_OK), script
        compile(path.read_text(), str(path), "exec")
    installed = re.search(r"install\(DIRECTORY ([^\n]+)", text).group(1).split()
    for d in ("launch", "robots", "config"):
        assert d in installed and (ROOT / d).is_dir()
    for test in re.findall(r"(tests/test_\S+\.py)", text):
        assert (ROOT / test).is_file(), test


def _ros_params(node_key):
    doc = yaml.safe_load((ROOT / "config" / "planner.yaml").read_text())
    return doc[node_key]["ros__parameters"]


@pytest.mark.parametrize("key,defaults", [("/**/planner", wiring.PLANNER_DEFAULTS),
                                          ("/**/executor", wiring.EXECUTOR_DEFAULTS)])
def test_config_parameters_exist_and_keep_their_declared_type(key, defaults):
    """rclpy refuses a parameter override of another type than the declared default (1 vs 1.0)."""
    params = _ros_params(key)
    assert set(params) <= set(defaults), set(params) - set(defaults)
    for name, value in params.items():
        assert type(value) is type(defaults[name]), (name, value, defaults[name])


def test_launch_file_declares_the_arguments_and_sets_known_parameters():
    tree = ast.parse((ROOT / "launch" / "planner.launch.py").read_text())
    declared = {n.args[0].value for n in ast.walk(tree) if isinstance(n, ast.Call)
                and getattr(n.func, "id", "") == "DeclareLaunchArgument"}
    assert {"engine", "model", "policy", "robots_config", "num_drones", "num_arms", "tello_hosts"} <= declared
    keys = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Dict):
            keys |= {k.value for k in n.keys if isinstance(k, ast.Constant)}
        if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "update" and n.args \
                and isinstance(n.args[0], ast.Dict):
            keys |= {k.value for k in n.args[0].keys if isinstance(k, ast.Constant)}
    assert keys <= set(wiring.PLANNER_DEFAULTS) | set(wiring.EXECUTOR_DEFAULTS), keys
    assert {"engine", "backend", "tello_host", "robot_type"} <= keys


def test_build_executor_from_parameters():
    ex, rid = wiring.build_executor({"robot_type": "arm", "time_scale": 0.5, "visible_objects": "cup, bin"},
                                    namespace="/arm2")
    assert rid == "arm2" and ex.robot.robot_type == "arm" and ex.backend.time_scale == 0.5
    assert ex.backend.perception.visible == {"cup", "bin"}
    tello, rid = wiring.build_executor({"backend": "tello", "robot_id": "drone7", "tello_host": "127.0.0.5",
                                        "response_timeout_s": 2})
    assert rid == "drone7" and tello.backend.config.host == "127.0.0.5" and tello.backend.tello is None
    for bad in ({"backend": "teleport"}, {"robot_type": "boat"}, {"backend": "tello", "robot_type": "arm"},
                {"robot_typo": "tello"}):
        with pytest.raises(ConfigError):
            wiring.build_executor(bad, namespace="/x")
    with pytest.raises(ConfigError, match="namespace"):
        wiring.build_executor({})


def test_executor_parameter_flight_window_s_sets_the_envelope_window():
    """Issue 26 item 4: the executor node's envelope over everything the robot flies, since takeoff
    (default) or over a sliding window (`flight_window_s`): a simulated robot has a flight account
    only with a window, and 30 foreign mf(500) goals then fly at most the 5,000 cm envelope."""
    from timelyllm_ros.core.types import ResultCode, SegmentGoal, SkillCall

    plain, _ = wiring.build_executor({"robot_type": "tello", "time_scale": 0.0}, namespace="/d1")
    ex, _ = wiring.build_executor({"robot_type": "tello", "time_scale": 0.0, "flight_window_s": 600.0},
                                  namespace="/d1")
    assert plain.flight is None and ex.config.flight_window_s == 600.0 and ex.flight.window_s == 600.0
    codes = [ex.execute(SegmentGoal(f"foreign{i}", "d1", "tello", 0, "mf(500);",
                                    (SkillCall("move_forward", "mf", (500,)),), 1.0, False)).code
             for i in range(30)]
    assert codes.count(ResultCode.OK) == 10 and codes.count(ResultCode.REJECTED) == 20
    with pytest.raises(ConfigError, match="flight_window_s"):
        wiring.build_executor({"robot_type": "tello", "flight_window_s": -1.0}, namespace="/d1")


def test_build_planner_from_parameters():
    started = wiring.build_planner({"policy": "fcfs", "max_batch": 4, "status_period_s": 0.25})
    p = started.make_planner(dispatcher=None, listeners=[])
    assert p.policy.name == "fcfs"
    assert p.batcher.max_batch == 4 and started.node_config.status_period_s == 0.25
    started.shutdown()
    for bad in ({"engine": "gpt"}, {"policy": "nope"}, {"engin": "vllm"}):
        with pytest.raises(ConfigError):
            wiring.build_planner(bad)


def test_setup_py_is_a_thin_shim_over_pyproject():
    """ament/colcon tooling looks for setup.py; the metadata stays in pyproject.toml only."""
    import subprocess
    import sys

    tree = ast.parse((ROOT / "setup.py").read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup"]
    assert len(calls) == 1 and not calls[0].args and not calls[0].keywords
    out = subprocess.run([sys.executable, "setup.py", "--name", "--version"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-2:] == ["timelyllm_ros", "0.1.0"]


# ----------------------------------------------------------------------------- parameter contracts

def test_every_parameter_has_a_description_a_type_and_a_sane_range():
    from timelyllm_ros.nodes import params as P

    for specs in (P.PLANNER_PARAMS, P.EXECUTOR_PARAMS):
        names = [p.name for p in specs]
        assert len(names) == len(set(names)) and "autostart" in names
        for p in specs:
            assert p.description and p.type_name in ("bool", "integer", "double", "string"), p
            assert p.check(p.default) == "" or p.name == "policy", p  # the defaults are valid
            if p.min is not None:
                assert isinstance(p.default, (int, float)) and p.min <= p.default <= p.max, p
    live = {p.name for p in P.PLANNER_PARAMS if p.live}
    assert {"policy", "max_batch", "status_period_s", "max_live", "max_queued", "max_per_agent",
            "agent_rate_per_s", "goal_timeout_factor"} <= live
    assert not {"engine", "model", "profile", "robots_dir", "journal_path", "autostart"} & live
    assert set(P.PLANNER_PARAMS[i].name for i in range(len(P.PLANNER_PARAMS))) == set(wiring.PLANNER_DEFAULTS)


def test_policy_params_reach_the_policy_and_bad_ones_fail_configure_and_live_changes_with_the_reason():
    """`policy_params` ("[POLICY:]NAME=VALUE, ..."): scoped items reach that policy, unscoped ones
    whichever runs; a bad name, value or policy fails configure in one line; a live `policy`
    change the unscoped items do not fit is refused with the reason (the policy in use stays)."""
    setup = wiring.PlannerSetup({"policy_params": "default:roomy_ratio=3, trail:c=0.5, lead_steps=6"})
    try:
        assert (setup.policy.name, setup.policy.roomy_ratio, setup.policy.lead_steps) == ("default", 3.0, 6.0)
        life = wiring._PlannerLifecycle(None)
        life.setup = setup
        assert "unknown parameter 'lead_steps'" in life.apply({"policy": "fcfs"})  # unscoped: not fcfs'
        assert setup.policy.name == "default"
    finally:
        setup.close()
    setup = wiring.PlannerSetup({"policy_params": "default:step_ratio=inf"})
    try:
        life = wiring._PlannerLifecycle(None)
        life.setup = setup
        assert life.apply({"policy": "fcfs"}) == "" and setup.policy.name == "fcfs"  # scoped: default's only
    finally:
        setup.close()
    for text, msg in [("default:nope=1", "policy_params: bad parameters for policy 'default': unknown parameter 'nope'"),
                      ("roomy_ratio=1", "roomy_ratio must be a number > 1"),
                      ("teleport:x=1", "policy_params: unknown policy 'teleport'; choose from"),
                      ("trail:cc=0.5", "policy_params: bad parameters for policy 'trail': unknown parameter 'cc'"),
                      ("roomy_ratio", "policy_params: expected [policy:]name=value, got 'roomy_ratio'"),
                      ("pace=[1", "policy_params: bad value in 'pace=[1'")]:
        with pytest.raises(ConfigError, match=re.escape(msg)):
            wiring.PlannerSetup({"policy_params": text})
    assert wiring.PLANNER_DEFAULTS["policy_params"] == ""


def test_coerce_converts_ints_for_doubles_and_refuses_the_rest_in_one_line():
    from timelyllm_ros.nodes import params as P

    v = P.coerce(P.EXECUTOR_PARAMS, {"time_scale": 1, "seed": 3})
    assert v["time_scale"] == 1.0 and isinstance(v["time_scale"], float) and v["seed"] == 3
    for bad, msg in [({"seed": 1.5}, "must be an integer"), ({"time_scale": "fast"}, "must be a number"),
                     ({"tello_port": 70000}, "must be in [1, 65535]"), ({"backend": "teleport"}, "one of"),
                     ({"robot_typo": "x"}, "unknown parameters ['robot_typo']")]:
        with pytest.raises(ConfigError, match=re.escape(msg)):
            P.coerce(P.EXECUTOR_PARAMS, bad)


def test_descriptors_carry_type_range_choices_and_read_only():
    pytest.importorskip("rcl_interfaces")
    from rcl_interfaces.msg import ParameterType

    from timelyllm_ros.nodes import params as P

    by = {p.name: P.descriptor(p) for p in P.PLANNER_PARAMS}
    assert by["engine"].read_only and by["engine"].type == ParameterType.PARAMETER_STRING
    assert by["engine"].additional_constraints == "one of: simulated, vllm"
    assert not by["policy"].read_only and "fcfs" in by["policy"].additional_constraints
    assert by["max_batch"].integer_range[0].from_value == 0 and by["max_batch"].integer_range[0].to_value == 4096
    assert by["status_period_s"].floating_point_range[0].from_value == 0.01
    assert not any(d.dynamic_typing for d in by.values())


@pytest.mark.parametrize("main", ["main_planner", "main_executor"])
def test_help_prints_the_parameters_and_starts_nothing(main, capsys, monkeypatch):
    import timelyllm_ros.transport.rclpy_transport as rt

    monkeypatch.setattr(rt, "RclpyTransport", None)  # a node would need it: --help must not get there
    assert getattr(wiring, main)(["timelyllm ros x", "--help"]) == 0
    out = capsys.readouterr().out
    specs = wiring.PLANNER_DEFAULTS if main == "main_planner" else wiring.EXECUTOR_DEFAULTS
    for name in specs:
        assert re.search(rf"^  {name} +(bool|integer|double|string) ", out, re.M), name
    assert "live" in out and "--ros-args" in out


def test_arguments_outside_ros_args_are_an_error(capsys, monkeypatch):
    import timelyllm_ros.transport.rclpy_transport as rt

    monkeypatch.setattr(rt, "RclpyTransport", None)
    for argv in (["p", "-p", "engine:=vllm"], ["p", "--ros-args", "-p", "a:=b", "--", "extra"], ["p", "vllm"]):
        assert wiring.main_planner(argv) == 2
        err = capsys.readouterr().err
        assert "unexpected arguments" in err and "--ros-args" in err
    assert wiring._stray_args(["p", "--ros-args", "-r", "__ns:=/x", "-p", "a:=1"]) == []


def test_request_refuses_a_robot_name_that_is_not_a_ros_name():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "timelyllm_ros.cli", "request", "--robot", "drone 1!",
                          "--task", "x"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 2 and "--robot 'drone 1!'" in out.stderr and "request_id" not in out.stderr


def test_status_lines_to_a_reader_that_went_away_end_quietly():
    """`timelyllm request --wait | head -3` printed two BrokenPipeError tracebacks."""
    import subprocess
    import sys

    code = "from timelyllm_ros.nodes.cli import _print\nfor i in range(100000): _print('status line %d' % i)"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    assert p.stdout.readline().startswith(b"status line 0")
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(60) == 0 and "Traceback" not in err and "BrokenPipe" not in err, err


# ----------------------------------------------------------------------------- installed layout

def _install_layout(prefix, *extra):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "install_ros_layout.py"), "--prefix", str(prefix),
                          "--python", sys.executable, *extra], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out


@pytest.mark.parametrize("copy", [False, True])
def test_install_layout_in_a_temporary_prefix(tmp_path, copy):
    """What `make env` lays out in the venv (here in a temporary prefix): the ament install of the
    ROS package, found by ament_index_python from a fresh interpreter with nothing sourced."""
    import subprocess
    import sys

    prefix = tmp_path / "prefix"
    sp = prefix / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    sp.mkdir(parents=True)
    _install_layout(prefix, *(["--copy"] if copy else []))
    _install_layout(prefix, *(["--copy"] if copy else []))  # idempotent
    share = prefix / "share" / "timelyllm"
    for d in ("config", "robots", "launch", "profiles", "models", "workloads", "msg", "srv", "action"):
        assert (share / d).is_dir(), d
        assert (share / d).is_symlink() is (not copy)
    assert (share / "launch" / "planner.launch.py").is_file() and (share / "config" / "planner.yaml").is_file()
    assert (share / "package.xml").read_text() == (ROOT / "package.xml").read_text()
    assert (prefix / "share" / "ament_index" / "resource_index" / "packages" / "timelyllm").is_file()
    for exe in ("planner_node", "executor_node"):
        f = prefix / "lib" / "timelyllm" / exe
        assert os.access(f, os.X_OK) and f.read_text().startswith(f"#!{sys.executable}\n")
    env = {k: v for k, v in os.environ.items() if k != "AMENT_PREFIX_PATH"}
    found = subprocess.run([sys.executable, "-c", f"import site; site.addsitedir({str(sp)!r}); "
                            "from ament_index_python.packages import get_package_share_directory as g; "
                            "print(g('timelyllm'))"], capture_output=True, text=True, env=env, timeout=60)
    assert found.returncode == 0 and found.stdout.strip() == str(share), found.stdout + found.stderr
    helped = subprocess.run([str(prefix / "lib" / "timelyllm" / "planner_node"), "--help"], capture_output=True,
                            text=True, env=env, timeout=60)
    assert helped.returncode == 0 and "status_period_s" in helped.stdout, helped.stderr


def test_install_layout_matches_cmakelists():
    """`colcon build` (CMakeLists.txt) and `make env` (scripts/install_ros_layout.py) lay out the same."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("install_ros_layout", ROOT / "scripts" / "install_ros_layout.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = (ROOT / "CMakeLists.txt").read_text()
    installed = re.search(r"install\(DIRECTORY ([^\n]+)", text).group(1).split()
    assert set(installed) == set(mod.SHARE_DIRS)
    programs = re.search(r"install\(PROGRAMS(.*?)DESTINATION", text, re.S).group(1).split()
    assert [Path(p).name for p in programs] == list(mod.EXECUTABLES)


def test_launch_file_arguments_and_exit_handling():
    """launch/launch_ros have no wheels here, so generate_launch_description() cannot run in CI;
    its structure is checked instead."""
    text = (ROOT / "launch" / "planner.launch.py").read_text()
    tree = ast.parse(text)
    declared = {n.args[0].value: n for n in ast.walk(tree) if isinstance(n, ast.Call)
                and getattr(n.func, "id", "") == "DeclareLaunchArgument"}
    assert {"namespace", "params_file", "autostart", "policy"} <= set(declared)
    default_policy = [k.value.value for k in declared["policy"].keywords if k.arg == "default_value"][0]
    assert default_policy == wiring.PLANNER_DEFAULTS["policy"]
    assert "OnProcessExit(target_action=planner" in text and "Shutdown(" in text
    assert 'namespace=arg("namespace")' in text
    for arg in ("namespace", "params_file", "autostart", "policy", "engine", "num_drones", "tello_hosts"):
        assert f"`{arg}`" in (ROOT / "docs" / "ros.md").read_text(), arg

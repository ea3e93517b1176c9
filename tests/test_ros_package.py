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


@pytest.mark.parametrize("key,defaults", [("/timelyllm/planner", wiring.PLANNER_DEFAULTS),
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
        with pytest.raises(wiring.ConfigError):
            wiring.build_executor(bad, namespace="/x")
    with pytest.raises(wiring.ConfigError, match="namespace"):
        wiring.build_executor({})


def test_build_planner_from_parameters():
    make_planner, clock, cfg, shutdown = wiring.build_planner({"policy": "fcfs", "max_batch": 4,
                                                              "status_period_s": 0.25})
    p = make_planner(dispatcher=None, listeners=[])
    assert p.policy.name == "fcfs"
    assert p.batcher.max_batch == 4 and cfg.status_period_s == 0.25
    shutdown()
    for bad in ({"engine": "gpt"}, {"policy": "nope"}, {"engin": "vllm"}):
        with pytest.raises(wiring.ConfigError):
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

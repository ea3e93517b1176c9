"""What a ROS 2 user's own tools see of the planner and executor nodes, from a separate process
over DDS: the standard parameter services (rcl_interfaces Describe/Get/SetParameters, what
`ros2 param` calls), the lifecycle services (lifecycle_msgs GetState/ChangeState, what
`ros2 lifecycle` and Nav2's lifecycle manager call) with requests in flight, and a client that
joins after a request ended (get_request_state; request_status kept TRANSIENT_LOCAL)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from timelyllm_ros.nodes.agent import RequestClient, plan_request_fields, request_state
from timelyllm_ros.ros import interfaces as ifc
from timelyllm_ros.transport.rclpy_transport import RclpyTransport

from nodeproc import Collector, NodeProcess, wait_for

NS = "/contracts"
LNS = "/managed"
# drone_c: mf(100) takes (1.0 + 100 x 0.02) s x time_scale 0.5 = 1.5 s
EXECUTOR_ARGS = ["-r", "__ns:=/drone_c", "-p", "time_scale:=0.5"]
PLAN3 = "mf(100);mf(100);mf(100);"


def _call(t: RclpyTransport, name: str, srv: str, *, query: bool = False, **request) -> dict:
    """`query` (safe to handle twice): sent again every second while no answer came — over DDS a
    new client's first request can be answered before the server has matched the client's reader,
    and that answer is lost (a CI run once lost a GetState that way)."""
    ans = t.call_service(name, srv, request, timeout_s=20.0, resend_s=1.0 if query else 0.0)
    assert ans is not None, f"no answer from {name}"
    return ans


def _param_value(v: dict):
    from rcl_interfaces.msg import ParameterType as T

    return {T.PARAMETER_BOOL: v["bool_value"], T.PARAMETER_INTEGER: v["integer_value"],
            T.PARAMETER_DOUBLE: v["double_value"], T.PARAMETER_STRING: v["string_value"]}.get(v["type"])


def get(t, node: str, name: str):
    ans = _call(t, f"{node}/get_parameters", "rcl_interfaces/srv/GetParameters", query=True, names=[name])
    return _param_value(ans["values"][0])


def set_(t, node: str, name: str, value) -> dict:
    from rcl_interfaces.msg import ParameterType as T

    if isinstance(value, bool):
        v = {"type": T.PARAMETER_BOOL, "bool_value": value}
    elif isinstance(value, int):
        v = {"type": T.PARAMETER_INTEGER, "integer_value": value}
    elif isinstance(value, float):
        v = {"type": T.PARAMETER_DOUBLE, "double_value": value}
    else:
        v = {"type": T.PARAMETER_STRING, "string_value": value}
    ans = _call(t, f"{node}/set_parameters", "rcl_interfaces/srv/SetParameters",
                parameters=[{"name": name, "value": v}])
    return ans["results"][0]


def state(t, node: str) -> str:
    return _call(t, f"{node}/get_state", "lifecycle_msgs/srv/GetState", query=True)["current_state"]["label"]


def change(t, node: str, transition: str) -> bool:
    from lifecycle_msgs.msg import Transition

    tid = getattr(Transition, f"TRANSITION_{transition.upper()}")
    return _call(t, f"{node}/change_state", "lifecycle_msgs/srv/ChangeState",
                 transition={"id": tid})["success"]


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    logs = tmp_path_factory.mktemp("contract_nodes")
    procs = {"planner": NodeProcess("planner", ["-r", f"__ns:={NS}", "-p", "status_period_s:=0.2"], logs, "planner"),
             "drone_c": NodeProcess("executor", EXECUTOR_ARGS, logs, "drone_c"),
             "managed": NodeProcess("planner", ["-r", f"__ns:={LNS}", "-p", "autostart:=false"], logs, "managed")}
    t = None
    try:
        procs["planner"].serving()
        procs["drone_c"].serving()
        assert procs["managed"].wait_for_log("waiting for lifecycle transitions"), procs["managed"].text()
        t = RclpyTransport("contract_client")
        yield t, procs
    finally:
        if t is not None:
            t.close()
        for p in procs.values():
            p.kill()


def _request(client: RequestClient, plan: str, rid: str, robot: str = "drone_c") -> str:
    client.submit(plan_request_fields(request_id=rid, robot_id=robot, robot_type="tello", task="contract test",
                                      plan=plan))
    return rid


def _diag_value(diag: Collector, key: str):
    for m in reversed(diag.snapshot()):
        for st in m["status"]:
            if st["name"] == "timelyllm: planner" and st["hardware_id"] == "timelyllm":
                for kv in st["values"]:
                    if kv["key"] == key:
                        return kv["value"]
    return None


def test_parameters_describe_get_set_over_the_standard_services(nodes):
    t, procs = nodes
    node = f"{NS}/planner"
    d = _call(t, f"{node}/describe_parameters", "rcl_interfaces/srv/DescribeParameters", query=True,
              names=["policy", "engine", "max_batch", "status_period_s"])["descriptors"]
    by = {x["name"]: x for x in d}
    assert by["engine"]["read_only"] and not by["policy"]["read_only"]
    assert all(x["description"] and not x["dynamic_typing"] for x in d)
    assert "fcfs" in by["policy"]["additional_constraints"]
    assert by["max_batch"]["integer_range"][0]["from_value"] == 0
    assert by["status_period_s"]["floating_point_range"][0]["from_value"] > 0

    diag = Collector()
    t.subscribe("/diagnostics", ifc.DIAGNOSTIC_ARRAY, diag)
    assert wait_for(lambda: _diag_value(diag, "policy") == "default", 15)
    assert get(t, node, "policy") == "default"

    # another registered policy: applied at the next scheduling point, shown by the status
    r = set_(t, node, "policy", "fcfs")
    assert r["successful"], r
    assert get(t, node, "policy") == "fcfs"
    assert wait_for(lambda: _diag_value(diag, "policy") == "fcfs", 15), _diag_value(diag, "policy")
    assert procs["planner"].wait_for_log("parameters applied at scheduling point")
    client = RequestClient(t, NS)
    assert client.wait_for_planner(20)
    rid = _request(client, "mf(20);", "fcfs-1")
    assert client.wait_terminal(rid, 60)["state"] == "finished"

    # refused, with a reason; `get` still returns the value in use
    for name, value, why in [("policy", "nonsense", "nonsense"), ("max_batch", "four", "type"),
                             ("engine", "vllm", "read-only"), ("status_period_s", 5000.0, "range"),
                             ("status_period_s", 1, "type"), ("no_such_parameter", 1, "")]:
        before = get(t, node, name) if name != "no_such_parameter" else None
        r = set_(t, node, name, value)
        assert not r["successful"] and r["reason"], (name, r)
        assert why.lower() in r["reason"].lower(), (name, r["reason"])
        if before is not None:
            assert get(t, node, name) == before
    assert _diag_value(diag, "policy") == "fcfs"

    # admission limits are live too: one unfinished request per robot
    assert set_(t, node, "max_per_agent", 1)["successful"]
    assert wait_for(lambda: "max_per_agent" in procs["planner"].text(), 10)
    a = _request(client, PLAN3, "limit-a")
    assert wait_for(lambda: client.statuses(a), 10)
    b = _request(client, "mf(20);", "limit-b")
    rb = client.wait_terminal(b, 20)
    assert rb["state"] == "rejected" and "1 unfinished requests" in rb["reason"], rb
    assert client.wait_terminal(a, 60)["state"] == "finished"
    assert set_(t, node, "max_per_agent", 16)["successful"]
    # back to the default policy
    assert set_(t, node, "policy", "default")["successful"]


def test_lifecycle_transitions_from_another_process_with_requests_in_flight(nodes):
    t, procs = nodes
    node = f"{LNS}/planner"
    assert state(t, node) == "unconfigured"
    assert change(t, node, "configure") and state(t, node) == "inactive"
    assert not change(t, node, "deactivate")  # not a transition from inactive
    assert change(t, node, "activate") and state(t, node) == "active"
    client = RequestClient(t, LNS)
    assert client.wait_for_planner(20)

    # deactivate with a plan in flight: new requests rejected with a reason, the running plan finishes
    running = _request(client, PLAN3, "life-running")
    assert wait_for(lambda: any(m["state"] == "running" or m["segments_dispatched"] for m in client.statuses(running)),
                    20), client.statuses(running)
    assert change(t, node, "deactivate") and state(t, node) == "inactive"
    late = client.wait_terminal(_request(client, "mf(20);", "life-late"), 20)
    assert late["state"] == "rejected" and "inactive" in late["reason"], late
    done = client.wait_terminal(running, 60)
    assert done["state"] == "finished" and done["segments_done"] == 3, done

    # activate again: served
    assert change(t, node, "activate")
    assert client.wait_terminal(_request(client, "mf(20);", "life-again"), 60)["state"] == "finished"

    # cleanup with a plan in flight: it ends cancelled with the reason, the engine is freed
    inflight = _request(client, PLAN3, "life-cleanup")
    assert wait_for(lambda: any(m["segments_dispatched"] for m in client.statuses(inflight)), 20)
    assert change(t, node, "deactivate") and change(t, node, "cleanup")
    assert state(t, node) == "unconfigured"
    end = client.wait_terminal(inflight, 20)
    assert end["state"] == "cancelled" and "cleaned up" in end["reason"], end

    # configure + activate again from scratch, then shut down: finalized, and the process exits 0
    assert change(t, node, "configure") and change(t, node, "activate")
    assert client.wait_terminal(_request(client, "mf(20);", "life-reborn"), 60)["state"] == "finished"
    assert change(t, node, "active_shutdown")
    assert state(t, node) == "finalized"
    assert procs["managed"].stop() == 0, procs["managed"].text()
    assert "Traceback" not in procs["managed"].text()


def test_executor_lifecycle_deactivate_rejects_new_goals(nodes, tmp_path):
    t, procs = nodes
    ex = NodeProcess("executor", ["-r", "__ns:=/drone_m", "-p", "autostart:=false", "-p", "time_scale:=0.2"],
                     tmp_path, "drone_m")
    try:
        assert ex.wait_for_log("waiting for lifecycle transitions")
        node = "/drone_m/executor"
        assert state(t, node) == "unconfigured"
        assert change(t, node, "configure") and change(t, node, "activate")
        client = RequestClient(t, NS)
        assert client.wait_for_planner(20)
        assert client.wait_terminal(_request(client, "mf(20);", "exec-on", "drone_m"), 60)["state"] == "finished"
        assert change(t, node, "deactivate")
        off = client.wait_terminal(_request(client, "mf(20);", "exec-off", "drone_m"), 60)
        assert off["state"] == "failed" and "rejected" in off["reason"], off
    finally:
        ex.stop()


def test_a_client_that_joins_after_the_end_gets_the_terminal_state_and_the_plan(nodes):
    t, _ = nodes
    client = RequestClient(t, NS)
    assert client.wait_for_planner(20)
    rid = _request(client, "mf(30);tc(90);", "late-joiner-1")
    assert client.wait_terminal(rid, 60)["state"] == "finished"

    # a separate process, started after the end: `timelyllm request-state`
    out = subprocess.run([sys.executable, "-m", "timelyllm_ros.cli", "request-state", rid, "--planner-ns", NS],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "finished" in out.stdout and "segment 0: mf(30);" in out.stdout and "tc(90);" in out.stdout, out.stdout
    missing = subprocess.run([sys.executable, "-m", "timelyllm_ros.cli", "request-state", "never-sent",
                              "--planner-ns", NS], capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and "not known" in missing.stderr

    ans = request_state(t, NS, rid)
    assert ans["found"] and ans["status"]["terminal"] and ans["status"]["segments_done"] == len(ans["segments"])

    # a TRANSIENT_LOCAL subscriber that joins now still receives the terminal status
    got = Collector()
    sub = t.subscribe(f"{NS}/request_status", ifc.REQUEST_STATUS, got, qos="history")
    try:
        assert wait_for(lambda: any(m["request_id"] == rid and m["terminal"] for m in got.snapshot()), 15)
    finally:
        sub.close()


def test_the_installed_executable_starts_a_node(nodes, tmp_path):
    """lib/timelyllm/executor_node of the ament layout (scripts/install_ros_layout.py, here in a
    temporary prefix) is what launch_ros runs: it starts an active executor node."""
    import os
    import signal

    from timelyllm_ros.paths import SOURCE_ROOT as REPO_ROOT

    t, _ = nodes
    prefix = tmp_path / "prefix"
    prefix.mkdir()
    subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "install_ros_layout.py"), "--prefix", str(prefix),
                    "--python", sys.executable, "--quiet"], check=True, timeout=120)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    log = tmp_path / "installed.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(prefix / "lib" / "timelyllm" / "executor_node"), "--ros-args", "-r",
                                 "__ns:=/drone_inst"], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    try:
        assert wait_for(lambda: " serving " in log.read_text() or proc.poll() is not None, 60), log.read_text()
        assert proc.poll() is None, f"the installed node exited ({proc.returncode}):\n{log.read_text()}"
        try:  # (a CI run once got no answer here: the node's own log then says whether it was serving)
            label = state(t, "/drone_inst/executor")
        except AssertionError as e:
            raise AssertionError(f"{e}\n--- the installed node's log:\n{log.read_text()}") from e
        assert label == "active"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)

"""`timelyllm demo` as a ROS 2 graph, end to end with real processes over DDS.

The planner node runs the simulated engine here (`--engine simulated`: each request carries its
plan; vLLM's 40-90 s start stays with `make demo`), with three short requests; executors, the
djitellopy drone against the Tello emulator (when UDP 8889/8890 are free on this machine), the
agents node and the demo's own monitor/recorder are all separate processes or nodes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from timelyllm_ros.rosgraph.bag import read_bag
from timelyllm_ros.rosgraph.processes import free_domain_id


WORKLOAD = """\
name: graph_test
duration_s: 1
seed: 3
events: {rate_per_s: 0.001, max_tasks_per_event: 1}
agents: {tello: 2, chat: 1}
traces: [T7]
tuf:
  normal: {ert: 1.0, alpha: -2.0, beta: 1.0}
  urgent: {ert: 0.2, alpha: -6.67, beta: 2.0}
  chat: {ert: 1.0, alpha: -2.0, beta: 1.0}
requests:
  - {time: 0.5, task: T7, robot_id: tello0, request_id: t-urgent}
  - {time: 0.6, task: C1, robot_id: chat0, request_id: t-chat}
  - {time: 1.0, task: T6, robot_id: tello1, request_id: t-move}
"""
IDS = {"t-urgent", "t-chat", "t-move"}


def _demo(tmp_path: Path, domain: int, *extra: str) -> tuple[list[str], Path]:
    wl = tmp_path / "wl.yaml"
    wl.write_text(WORKLOAD)
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "timelyllm_ros.cli", "demo", "--engine", "simulated", "--workload", str(wl),
            "--out", str(out), "--domain-id", str(domain), "--baseline", "none", *extra]
    return argv, out


def _launch(argv: list[str], out: Any = subprocess.PIPE, sigint_ignored: bool = False) -> subprocess.Popen:
    pre = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None
    return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, text=True, preexec_fn=pre)


def _serving(argv: list[str], log: Path, sigint_ignored: bool = False) -> subprocess.Popen:
    """The demo started, once it says it is serving (its log in `log`)."""
    with open(log, "w") as f:
        p = _launch(argv, f, sigint_ignored)
    end = time.monotonic() + 120
    while "; serving" not in log.read_text() and time.monotonic() < end and p.poll() is None:
        time.sleep(0.2)
    if "; serving" not in log.read_text():
        p.kill()
        raise AssertionError(log.read_text()[-2000:])
    return p


def _run(argv: list[str], timeout: float) -> tuple[int, str]:
    p = _launch(argv)
    try:
        text, _ = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            p.kill()
    return p.returncode, text


def _graph_processes(domain: int) -> list[str]:
    """Processes of this machine whose environment holds our ROS_DOMAIN_ID (the graph's)."""
    me = os.getpid()
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == me:
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if f"ROS_DOMAIN_ID={domain}".encode() in env and "timelyllm" in cmd:
            found.append(f"{d.name}: {cmd[:120]}")
    return found


def test_demo_runs_the_ros_graph_end_to_end(tmp_path: Path) -> None:
    domain = free_domain_id(150 + os.getpid() % 50)
    argv, out = _demo(tmp_path, domain, "--param", "roomy_ratio=3")  # reaches the node: policy_params
    rc, text = _run(argv, 240)
    assert rc == 0, text[-3000:]
    assert "all 3 requests terminal" in text, text[-3000:]
    doc = json.loads((out / "results.json").read_text())
    assert doc["mode"] == "ROS 2 graph" and doc["engine"] == "simulated" and doc["ros_domain_id"] == domain
    assert "policy default, roomy_ratio=3.0) serving" in (out / "logs" / "planner.log").read_text()
    rows = {r["request_id"]: r for r in doc["metrics"]["requests"]}
    assert set(rows) == IDS
    assert all(r["state"] == "finished" and r["response_s"] is not None for r in rows.values()), rows
    # every node process exited by itself on SIGINT (no abort: rc 134; no kill)
    assert doc["node_exit_codes"] and all(rc == 0 for rc in doc["node_exit_codes"].values()), doc["node_exit_codes"]
    assert set(doc["node_exit_codes"]) >= {"planner", "agents", "executor_tello0", "executor_tello1", "executor_chat0"}
    assert (out / "timeline.png").stat().st_size > 0 and (out / "demo.png").stat().st_size > 0
    assert {t["request_id"] for t in doc["timeline"]} == IDS
    assert all(s["exec_end"] is not None for t in doc["timeline"] for s in t["segments"])
    assert not _graph_processes(domain)

    # the MCAP bag reads back (rosbags) and holds what the results were built from
    assert list((out / "bag").glob("*.mcap")), list((out / "bag").iterdir())
    msgs = list(read_bag(out / "bag"))
    by_topic: dict[str, list[dict]] = {}
    for topic, _typ, _stamp, fields in msgs:
        by_topic.setdefault(topic, []).append(fields)
    assert {m["request_id"] for m in by_topic["/plan_requests"]} == IDS
    terminal = {m["request_id"]: m["state"] for m in by_topic["/request_status"] if m["terminal"]}
    assert terminal == {rid: "finished" for rid in IDS}
    done = {(m["request_id"], m["index"]) for m in by_topic["/segment_status"] if m["done"]}
    assert done == {(t["request_id"], s["index"]) for t in doc["timeline"] for s in t["segments"]}
    assert by_topic["/planner_status"] and by_topic["/diagnostics"] and by_topic["/demo_start"]
    assert doc["bag_counts"]["/request_status"] == len(by_topic["/request_status"])
    # with UDP 8889/8890 held by another program here, the demo runs its graph in a private
    # network namespace; only where none can be made is the drone simulated (and it says why)
    if doc["tello_drone"] is None:
        assert any("no private network is possible" in n for n in doc["notes"]), doc["notes"]
    else:  # djitellopy flew tello0 against the emulator over UDP, and landed it on shutdown
        assert doc["tello_drone"] == "tello0"
        log = (out / "logs" / "executor_tello0.log").read_text()
        assert "Send command: 'takeoff'" in log and "Response land: 'ok'" in log, log[-2000:]


def test_ctrl_c_stops_every_node(tmp_path: Path) -> None:
    """SIGINT to the demo while it serves: it exits 130 and no process of its graph is left — also
    when it was started with SIGINT ignored, as a shell starts a background job (`make demo &`):
    Python then installs no KeyboardInterrupt handler, and the demo used to run on to the end."""
    domain = free_domain_id(120 + os.getpid() % 30)
    argv, out = _demo(tmp_path, domain)
    log = tmp_path / "demo.log"
    p = _serving(argv, log, sigint_ignored=True)
    try:
        assert _graph_processes(domain), "the graph's nodes should be running now"
        assert p.poll() is None, "the demo ended before the test could interrupt it: " + log.read_text()[-1500:]
        p.send_signal(signal.SIGINT)
        rc = p.wait(timeout=90)
    finally:
        if p.poll() is None:
            p.kill()
    assert rc == 130, log.read_text()[-2000:]
    left = _graph_processes(domain)
    assert not left, left


def test_timeout_cancels_what_is_open_and_reports_it(tmp_path: Path) -> None:
    """--timeout shorter than the plans: the open requests are cancelled over DDS and end
    `cancelled` with the reason; none is left without a terminal state."""
    domain = free_domain_id(100 + os.getpid() % 20)
    argv, out = _demo(tmp_path, domain, "--timeout", "2.5", "--tello-drone", "none")
    rc, text = _run(argv, 240)
    assert rc == 0, text[-3000:]
    rows = {r["request_id"]: r for r in json.loads((out / "results.json").read_text())["metrics"]["requests"]}
    assert set(rows) == IDS
    assert rows["t-move"]["state"] == "cancelled" and rows["t-move"]["reason"], rows["t-move"]  # 5 s of moves
    assert all(r["state"] in ("finished", "cancelled", "failed") for r in rows.values()), rows
    assert not _graph_processes(domain)


def test_planner_killed_mid_run_fails_every_open_request_with_the_reason(tmp_path: Path) -> None:
    domain = free_domain_id(60 + os.getpid() % 20)
    argv, out = _demo(tmp_path, domain, "--tello-drone", "none")
    log = tmp_path / "demo.log"
    p = _serving(argv, log)
    try:
        time.sleep(3.0)  # the requests are out (1.5-2 s after "serving"), t-move's 5 s of moves still running
        planner = [ln.split(":")[0] for ln in _graph_processes(domain) if "ros planner" in ln]
        assert planner, _graph_processes(domain)
        os.kill(int(planner[0]), signal.SIGKILL)
        rc = p.wait(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert rc == 0, log.read_text()[-3000:]
    doc = json.loads((out / "results.json").read_text())
    rows = {r["request_id"]: r for r in doc["metrics"]["requests"]}
    assert set(rows) == IDS
    open_ones = [r for r in rows.values() if r["state"] != "finished"]
    assert open_ones and all(r["state"] == "failed" and "planner process died" in r["reason"] for r in open_ones), rows
    assert doc["node_exit_codes"]["planner"] == -signal.SIGKILL
    assert not _graph_processes(domain)

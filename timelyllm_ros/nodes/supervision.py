"""Supervision over the ROS graph: who is alive, and what an executor does when its planner is not.

Heartbeats over the transport port (std_msgs/String, data = the sender's id, best effort): each
planner *instance* (a new id per start, `new_instance_id`, sent in every ExecuteSegment goal as
`planner_id`) publishes on `PLANNER_HEARTBEAT`; each executor publishes its robot id on
`EXECUTOR_HEARTBEAT`.  A `LeaseWatcher` keeps the last time each id was heard and reports an id
*that it supervises* once, when it has been silent for longer than the lease.

* Executor side (`ExecutorSupervisor`): a planner is supervised while it has goals queued or
  running here (from its first goal; an instance never heard before gets `first_contact_s` to be
  heard).  When its lease runs out it is *lost*: the running goal is stopped the robot's way
  (`on_planner_lost` in the robot YAML: hover = halt now, land = halt then land, finish_goal = let
  the running segment end), queued goals are aborted with the reason, and every later goal of
  that instance is refused with the reason.  It also remembers the goals it has seen (state,
  calls done, reason) and serves them on `<robot_id>/get_goal_states` (srv GetGoalStates) for a
  restarted planner; `allowed_planners` (node names) refuses goals of any other planner.
* Planner side (`ExecutorLeases`): an executor is supervised from the acceptance of a goal while
  it has goals in flight (never heard yet: `first_contact_s`); a lost one fails its in-flight
  goals at once (DISCONNECTED, with the reason) instead of after the goal watchdog.

Heartbeats cannot be authenticated without SROS2 (docs/ros.md "Security"): an id is a claim.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Protocol, runtime_checkable

from timelyllm_ros.core.robots import RobotSpec
from timelyllm_ros.core.types import ResultCode
from timelyllm_ros.ros import convert
from timelyllm_ros.ros import interfaces
from timelyllm_ros.ros import walker
from timelyllm_ros.transport.base import QOS_SENSOR, Fields, Transport

log = logging.getLogger(__name__)

PLANNER_HEARTBEAT = "/timelyllm/planner_heartbeat"
EXECUTOR_HEARTBEAT = "/timelyllm/executor_heartbeat"
GOAL_STATES_SERVICE = "get_goal_states"  # in the executor's namespace: /<robot_id>/get_goal_states
DEFAULT_LEASE_S = 2.0  # planner_lease_s: how long an executor flies a silent planner's goal (docs/ros.md: why 2 s)
DEFAULT_EXECUTOR_LEASE_S = 2.0  # the planner's executor_lease_s (a false loss fails a request)
DEFAULT_HEARTBEAT_S = 0.2
GOALS_KEPT = 10_000  # goal records an executor remembers (newest kept)


def new_instance_id(node_name: str = "planner") -> str:
    """A planner instance id: `<node name>:<host>:<pid>:<random>` (new on every start; the node
    name part is what `allowed_planners` matches)."""
    return f"{node_name}:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def planner_node_name(planner_id: str) -> str:
    return planner_id.split(":", 1)[0]


def check_lease(lease_s: float, heartbeat_s: float, what: str = "lease_s") -> None:
    if not (lease_s > 0 and heartbeat_s > 0):
        raise ValueError(f"{what} and heartbeat_period_s must be > 0, got {lease_s} and {heartbeat_s}")
    if heartbeat_s * 2 > lease_s:
        raise ValueError(f"heartbeat_period_s ({heartbeat_s:g}) must be at most half of {what} ({lease_s:g}): "
                         f"one late heartbeat would lose the lease")


class Heartbeat:
    """Publishes `ident` every `period_s` from its own thread (not the node's executor: a busy
    callback pool must not make a live node look dead)."""

    def __init__(self, transport: Transport, topic: str, ident: str, period_s: float) -> None:
        self._pub = transport.publisher(topic, interfaces.STRING, qos=QOS_SENSOR)
        self.ident = ident
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period_s,), name="heartbeat", daemon=True)
        self._thread.start()

    def _run(self, period_s: float) -> None:
        while not self._stop.is_set():
            try:
                self._pub.publish({"data": self.ident})
            except Exception as e:  # transport closing
                log.debug("heartbeat not sent: %s", e)
            self._stop.wait(period_s)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


class LeaseWatcher:
    """Last-heard times of ids on a heartbeat topic; `on_lost(ident, silent_s)` once for each
    supervised id whose lease ran out (from the watcher's own thread).

    A stall of this process is not a silence of the others: when a check comes more than a
    quarter lease after the previous one (this process, or this thread, got no CPU — a loaded
    host), heartbeats may be waiting unread in the transport.  Each supervised id whose lease
    would end within half a lease then gets half a lease from now (a live sender beats at least
    every half lease, `check_lease`) — once per silence: only a heartbeat heard re-arms it, so a
    watcher starved at every check still reports a dead sender, at most half a lease late."""

    def __init__(self, transport: Transport | None, topic: str, lease_s: float,
                 on_lost: Callable[[str, float], None], *, clock: Callable[[], float] = time.monotonic,
                 poll_s: float | None = None) -> None:
        self.lease_s = float(lease_s)
        self.on_lost = on_lost
        self.clock = clock
        self._lock = threading.Lock()
        self._heard: dict[str, float] = {}  # id -> last heard
        self._deadline: dict[str, float] = {}  # supervised id -> lease end
        self._graced: set[str] = set()  # ids given the stall grace since they were last heard
        self._checked: float | None = None  # the previous check's time
        self._stop = threading.Event()
        self._sub = None if transport is None else transport.subscribe(topic, interfaces.STRING, self._on_beat, qos=QOS_SENSOR)
        self._poll = poll_s if poll_s is not None else min(0.05, self.lease_s / 10)
        self._thread = threading.Thread(target=self._run, name="lease-watch", daemon=True)
        self._thread.start()

    def _on_beat(self, m: Fields) -> None:
        ident = m.get("data", "")
        if isinstance(ident, str) and ident:
            self.heard(ident)

    def heard(self, ident: str) -> None:
        now = self.clock()
        with self._lock:
            self._heard[ident] = now
            self._graced.discard(ident)
            if len(self._heard) > 4096:  # ids of long-gone nodes
                for k in [k for k, t in self._heard.items() if now - t > 60 and k not in self._deadline]:
                    del self._heard[k]
            if ident in self._deadline:
                self._deadline[ident] = now + self.lease_s

    def ever_heard(self, ident: str) -> bool:
        with self._lock:
            return ident in self._heard

    def heard_ids(self) -> list[str]:
        with self._lock:
            return list(self._heard)

    def supervise(self, ident: str, first_contact_s: float | None = None) -> None:
        """Start watching `ident` (no-op if watched); never heard: it has `first_contact_s`."""
        now = self.clock()
        with self._lock:
            if ident in self._deadline:
                return
            last = self._heard.get(ident)
            if last is not None:
                self._deadline[ident] = last + self.lease_s
            else:
                self._deadline[ident] = now + max(self.lease_s, first_contact_s or 0.0)

    def release(self, ident: str) -> None:
        with self._lock:
            self._deadline.pop(ident, None)
            self._graced.discard(ident)

    def silent_for(self, ident: str) -> float | None:
        with self._lock:
            t = self._heard.get(ident)
        return None if t is None else self.clock() - t

    def check(self) -> list[str]:
        """Report (and stop watching) the supervised ids whose lease ran out; returns them."""
        now = self.clock()
        with self._lock:
            prev, self._checked = self._checked, now
            if prev is not None and now - prev > self.lease_s / 4:  # this process stalled (class doc)
                grace = now + self.lease_s / 2
                for k, end in self._deadline.items():
                    if end < grace and k not in self._graced:
                        self._deadline[k] = grace
                        self._graced.add(k)
            gone = [k for k, end in self._deadline.items() if now > end]
            for k in gone:
                del self._deadline[k]
                self._graced.discard(k)
            silent = {k: (now - self._heard[k]) if k in self._heard else None for k in gone}
        for k in gone:
            try:
                self.on_lost(k, silent[k] if silent[k] is not None else -1.0)
            except Exception:
                log.exception("lease-lost handler failed for %s", k)
        return gone

    def _run(self) -> None:
        while not self._stop.wait(self._poll):
            self.check()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        if self._sub is not None:
            self._sub.close()


def lost_text(what: str, ident: str, silent_s: float, lease_s: float) -> str:
    if silent_s < 0:
        return f"{what} {ident} lost: never heard within its first-contact time"
    return f"{what} {ident} lost: no heartbeat for {silent_s:.1f} s (lease {lease_s:g} s)"


# ================================================================================== executor


@runtime_checkable
class Lands(Protocol):
    """A backend that can land / park its robot (on_planner_lost: land)."""

    def land(self, reason: str) -> str: ...


@dataclass
class GoalRecord:
    planner_id: str
    request_id: str
    segment_index: int
    state: str  # queued | running | succeeded | aborted | cancelled | stopped | refused
    calls_done: int = 0
    reason: str = ""
    value: str = ""  # a succeeded goal's return value as text (convert.value_to_text)
    value_type: str = "none"

    def fields(self) -> Fields:
        return {"planner_id": self.planner_id, "request_id": self.request_id,
                "segment_index": self.segment_index, "state": self.state, "calls_done": self.calls_done,
                "reason": self.reason, "value": self.value, "value_type": self.value_type}


@dataclass
class ExecutorSupervisionConfig:
    lease_s: float = DEFAULT_LEASE_S  # a planner silent this long is lost
    heartbeat_period_s: float = DEFAULT_HEARTBEAT_S  # this executor's own heartbeat
    first_contact_s: float = 3.0  # a planner instance never heard yet: time to hear it
    allowed_planners: tuple[str, ...] = ()  # planner node names; () = any

    def __post_init__(self) -> None:
        check_lease(self.lease_s, self.heartbeat_period_s, "planner_lease_s")


class ExecutorSupervisor:
    """The executor half (see the module doc).  `robot_state` is what the robot was last left
    doing, as the executor knows it."""

    def __init__(self, transport: Transport, robot: RobotSpec, robot_id: str, backend: Any,
                 config: ExecutorSupervisionConfig | None = None) -> None:
        self.robot, self.robot_id, self.backend = robot, robot_id, backend
        self.config = cfg = config or ExecutorSupervisionConfig()
        self._lock = threading.Lock()
        self._lost: dict[str, str] = {}  # planner id -> reason (refused from then on)
        self._active: dict[str, int] = {}  # planner id -> goals queued or running here
        self._goals: OrderedDict[tuple[str, int], GoalRecord] = OrderedDict()
        self.robot_state = "idle"
        self.planners = LeaseWatcher(transport, PLANNER_HEARTBEAT, cfg.lease_s, self._on_lost)
        self.heartbeat = Heartbeat(transport, EXECUTOR_HEARTBEAT, robot_id, cfg.heartbeat_period_s)
        self._service = transport.service(GOAL_STATES_SERVICE, interfaces.GET_GOAL_STATES, self.goal_states)

    def close(self) -> None:
        self.heartbeat.close()
        self.planners.close()
        self._service.close()

    # -- goals ---------------------------------------------------------------------------------
    def admit(self, planner_id: str, request_id: str, segment_index: int) -> str | None:
        """Called when a goal arrives: None = run it (supervised from now), else why it is refused."""
        why = None
        if self.config.allowed_planners and planner_node_name(planner_id) not in self.config.allowed_planners:
            why = (f"planner {planner_id or '(none)'} is not allowed on {self.robot_id} "
                   f"(allowed_planners: {', '.join(self.config.allowed_planners)})")
        with self._lock:
            why = why or self._lost.get(planner_id)
            if why is None and planner_id:
                self._active[planner_id] = self._active.get(planner_id, 0) + 1
        if why is None and planner_id:
            self.planners.supervise(planner_id, self.config.first_contact_s)
        self.record(planner_id, request_id, segment_index, "refused" if why else "queued", reason=why or "")
        return why

    def done(self, planner_id: str) -> None:
        """A goal of `planner_id` ended: an instance with nothing left here is not supervised."""
        if not planner_id:
            return
        with self._lock:
            n = self._active.get(planner_id, 0) - 1
            if n > 0:
                self._active[planner_id] = n
                return
            self._active.pop(planner_id, None)
        self.planners.release(planner_id)

    def lost(self, planner_id: str) -> str | None:
        with self._lock:
            return self._lost.get(planner_id) if planner_id else None

    def wait_fresh(self, planner_id: str, give_up: Callable[[], bool], poll_s: float = 0.01) -> bool:
        """Before a goal's first command: wait until its planner was heard within half the lease
        (True), or `give_up()` (False).  A planner silent that long may be dead: a goal it sent
        is not started on its word -- if it is lost the goal is aborted with nothing sent, and a
        restarted planner can go on from the goals that ran."""
        if not planner_id:
            return True  # not supervised
        while True:
            silent = self.planners.silent_for(planner_id)
            if silent is not None and silent <= self.config.lease_s / 2:
                return True
            if give_up():
                return False
            time.sleep(poll_s)

    def must_stop(self, planner_id: str) -> bool:
        return self.robot.on_planner_lost != "finish_goal" and self.lost(planner_id) is not None

    def _on_lost(self, planner_id: str, silent_s: float) -> None:
        with self._lock:
            if planner_id not in self._active:  # nothing of it here any more: forget it
                return
            why = lost_text("planner", planner_id, silent_s, self.config.lease_s)
            self._lost[planner_id] = why
        log.warning("%s: %s; running goal: %s, queued goals aborted, its later goals refused",
                    self.robot_id, why, self.robot.on_planner_lost)

    def stopped(self, planner_id: str, error: str) -> str:
        """The running goal was stopped because its planner was lost: land if the robot says
        so; the result text says why and where the robot was left."""
        why = self.lost(planner_id) or "planner lost"
        where = error.split("; ", 1)[1] if "; " in error else ""
        if self.robot.on_planner_lost == "land" and isinstance(self.backend, Lands):
            try:
                where = self.backend.land(why)
            except Exception as e:  # noqa: BLE001 - the text says it
                where = f"landing failed: {type(e).__name__}: {e}"
        self.robot_state = where or "stopped"
        return f"{why}: goal stopped ({self.robot.on_planner_lost})" + (f"; {where}" if where else "")

    # -- goal records (GetGoalStates) -----------------------------------------------------------
    def record(self, planner_id: str, request_id: str, segment_index: int, state: str, *,
               calls_done: int = 0, reason: str = "", value: Any = None) -> None:
        key = (request_id, segment_index)
        text, typ = convert.value_to_text(value) if value is not None else ("", "none")
        with self._lock:
            self._goals.pop(key, None)
            self._goals[key] = GoalRecord(planner_id, request_id, segment_index, state, calls_done, reason, text, typ)
            while len(self._goals) > GOALS_KEPT:
                self._goals.popitem(last=False)
            if state == "running":
                self.robot_state = f"running {request_id}/{segment_index}"

    def ended(self, planner_id: str, request_id: str, segment_index: int, code: ResultCode, *,
              calls_done: int, reason: str, stopped: bool, value: Any = None) -> None:
        """The goal ended (`value`: its return value; kept for a restarted planner when it succeeded)."""
        with self._lock:
            prior = self._goals.get((request_id, segment_index))
        never_ran = prior is not None and prior.state == "queued"  # aborted before its turn came
        # "refused": nothing of it was sent to the robot (refused on arrival or before its first
        # command, or aborted while it waited), so a restarted planner may generate it anew
        state = ("stopped" if stopped else "succeeded" if code == ResultCode.OK else
                 "cancelled" if code == ResultCode.CANCELLED else "refused" if calls_done == 0 and
                 (code == ResultCode.REJECTED or never_ran) else "aborted")
        self.record(planner_id, request_id, segment_index, state, calls_done=calls_done, reason=reason,
                    value=value if state == "succeeded" else None)
        if not stopped:
            where = reason.rsplit("; ", 1)[1] if "; " in reason else ""
            with self._lock:
                if self.robot_state.startswith("running ") or where:
                    self.robot_state = where or self._idle()

    def _idle(self) -> str:
        """Between goals: a Tello backend knows whether it is airborne (it hovers between goals)."""
        flying = getattr(self.backend, "flying", None)
        if isinstance(flying, bool):
            return "drone hovering" if flying else "drone landed"
        return "idle"

    def goal_states(self, request: Fields) -> Fields:
        rid = request.get("request_id", "")
        with self._lock:
            goals = [g.fields() for g in self._goals.values() if not rid or g.request_id == rid]
            state = self.robot_state
        return {"goals": goals, "robot_state": state}


# ================================================================================== planner


class ExecutorLeases:
    """The planner half: executors with goals in flight are supervised from their acceptance;
    `on_lost(robot_id, reason)` fails their in-flight goals.  `lease_s` 0: off."""

    def __init__(self, transport: Transport, lease_s: float, on_lost: Callable[[str, str], None], *,
                 first_contact_s: float = 3.0) -> None:
        self.lease_s = lease_s
        self.first_contact_s = first_contact_s
        self._on_lost = on_lost
        self.watcher = LeaseWatcher(transport, EXECUTOR_HEARTBEAT, lease_s if lease_s > 0 else 3600.0, self._lost)

    def busy(self, robot_id: str) -> None:
        """`robot_id` accepted a goal: supervise its lease (an executor not heard yet gets
        `first_contact_s`; executors that send no heartbeat need `executor_lease_s:=0`)."""
        if self.lease_s > 0:
            self.watcher.supervise(robot_id, self.first_contact_s)

    def idle(self, robot_id: str) -> None:
        self.watcher.release(robot_id)

    def _lost(self, robot_id: str, silent_s: float) -> None:
        self._on_lost(robot_id, lost_text("executor", robot_id, silent_s, self.lease_s))

    def close(self) -> None:
        self.watcher.close()


def ask_goal_states(transport: Transport, robot_id: str, timeout_s: float = 10.0) -> Any:
    """A restarted planner asks `/<robot_id>/get_goal_states`: a journal.RobotAccount, or None
    when the executor did not answer within `timeout_s` (discovery of a just-started planner
    included: on a loaded host it takes seconds; the query is re-sent every second, since over
    DDS a new client's first answer can be lost)."""
    from timelyllm_ros.journal import RobotAccount
    from timelyllm_ros.transport.base import join_name

    resp = transport.call_service(join_name(robot_id, GOAL_STATES_SERVICE), interfaces.GET_GOAL_STATES,
                                  {"request_id": ""}, timeout_s=timeout_s, resend_s=1.0)
    if resp is None:
        return None
    goals = list(resp.get("goals", ()))
    values = {}
    for g in goals:
        if g["state"] == "succeeded" and g.get("value_type", "none") not in ("", "none"):
            try:
                values[(g["request_id"], int(g["segment_index"]))] = convert.value_from_text(g["value"], g["value_type"])
            except walker.MessageError as e:  # a bad record: that value is not known
                log.warning("%s: goal state of %s/%s has a bad value: %s", robot_id, g["request_id"],
                            g["segment_index"], e)
    return RobotAccount(str(resp.get("robot_state", "")),
                        {(g["request_id"], int(g["segment_index"])): g["state"] for g in goals}, values)

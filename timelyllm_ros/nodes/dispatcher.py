"""ActionDispatcher: the planner's segments sent to the robots as ExecuteSegment action goals.

`core.ports.Dispatcher` over the transport port: one action client per robot
(`/<robot_id>/execute_segment`), one sender thread per robot (goals in dispatch order, after a
bounded wait for the executor's action server), a watchdog thread, the executors' leases
(nodes/supervision.py).  Exactly one SegmentResult is posted back for every dispatched goal,
whatever happens (no executor, goal rejected, aborted, cancelled, no result within the watchdog
time).  Used by the planner node (nodes/planner_node.py).
"""

from __future__ import annotations

import logging
import queue
import re
import threading
import time
from dataclasses import dataclass
from typing import Callable

from timelyllm_ros.core.clock import Clock
from timelyllm_ros.core.types import ResultCode, SegmentGoal, SegmentResult
from timelyllm_ros.ros import convert
from timelyllm_ros.ros import interfaces
from timelyllm_ros.transport.base import ActionClient, ClientGoal, GoalOutcome, GoalStatus, Transport

from .supervision import DEFAULT_EXECUTOR_LEASE_S, ExecutorLeases, Heartbeat, new_instance_id

log = logging.getLogger(__name__)

# ROS 2 names: tokens of letters, digits and underscores, not starting with a digit
_ROS_NAME = re.compile(r"^/?[A-Za-z_][A-Za-z0-9_]*(/[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass
class DispatcherConfig:
    action_name: str = "execute_segment"  # per robot: /<robot_id>/<action_name>
    timeout_factor: float = 3.0  # watchdog: factor x estimated execution (of this goal and the
    timeout_margin_s: float = 10.0  # ones queued ahead of it on the robot) + margin
    server_wait_s: float = 2.0  # how long a goal waits for its robot's action server to appear
    planner_id: str = ""  # this planner instance, sent in every goal (executors supervise its lease)
    executor_lease_s: float = DEFAULT_EXECUTOR_LEASE_S  # an executor silent this long fails its goals in flight


@dataclass
class _InFlight:
    goal: SegmentGoal
    deadline: float  # monotonic
    handle: ClientGoal | None = None
    posted: bool = False
    timed_out: bool = False
    # planner clock at dispatch: the start of a result the planner makes up (executor lost,
    # watchdog), as the request's status has shown it while it ran (response time unchanged)
    sent: float | None = None


class ActionDispatcher:
    """core.ports.Dispatcher over ExecuteSegment actions.  Exactly one SegmentResult is posted
    per dispatched goal.  Goals for one robot are sent in dispatch order by that robot's sender
    thread, which also waits (bounded) for the executor's action server to be discovered."""

    def __init__(self, transport: Transport, clock: Clock, post_result: Callable[[SegmentResult], None],
                 config: DispatcherConfig | None = None, heartbeat: Heartbeat | None = None) -> None:
        self.transport = transport
        self.heartbeat = heartbeat  # this instance's (a new instance id is announced on it)
        self.clock = clock
        self.post_result = post_result
        self.config = config or DispatcherConfig()
        self._lock = threading.Lock()
        self._clients: dict[str, ActionClient] = {}
        self._senders: dict[str, queue.SimpleQueue] = {}
        self.pinned: set[str] = set()  # robots whose clients stay (PlannerNodeConfig.executors)
        self._inflight: dict[tuple[str, int], _InFlight] = {}
        self._closed = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="dispatch-watchdog", daemon=True)
        self._watchdog.start()
        self.leases = ExecutorLeases(transport, self.config.executor_lease_s, self.fail_robot)

    def action_name(self, robot_id: str) -> str:
        return f"/{robot_id.strip('/')}/{self.config.action_name}"

    def client(self, robot_id: str) -> ActionClient:
        with self._lock:
            c = self._clients.get(robot_id)
            if c is None:
                c = self.transport.action_client(self.action_name(robot_id), interfaces.EXECUTE_SEGMENT)
                self._clients[robot_id] = c
            return c

    def robots(self) -> list[str]:
        with self._lock:
            return sorted(self._clients)

    # -- Dispatcher port ---------------------------------------------------------------------
    def dispatch(self, goal: SegmentGoal) -> None:
        now = time.monotonic()
        problem = ""
        if not _ROS_NAME.match(goal.robot_id) or "__" in goal.robot_id:
            problem = f"robot_id {goal.robot_id!r} is not a valid ROS namespace"
        else:
            try:
                self.client(goal.robot_id)
            except Exception as e:
                problem = f"cannot create an action client for {self.action_name(goal.robot_id)}: {e}"
        if problem:
            self._post(_InFlight(goal, now), ResultCode.REJECTED, problem)
            return
        with self._lock:
            ahead = sum(f.goal.est_exec_s for f in self._inflight.values()
                        if f.goal.robot_id == goal.robot_id and not f.posted)
            limit = self.config.timeout_factor * (ahead + goal.est_exec_s) + self.config.timeout_margin_s
            rec = _InFlight(goal, now + self.config.server_wait_s + limit, sent=self.clock.now())
            self._inflight[(goal.request_id, goal.segment_index)] = rec
            q = self._senders.get(goal.robot_id)
            if q is None:
                q = queue.SimpleQueue()
                self._senders[goal.robot_id] = q
                threading.Thread(target=self._sender, args=(goal.robot_id, q), name=f"send-{goal.robot_id}",
                                 daemon=True).start()
        q.put(rec)

    def cancel(self, request_id: str) -> None:
        with self._lock:
            recs = [r for (rid, _), r in self._inflight.items() if rid == request_id and not r.posted]
        for r in recs:
            if r.handle is not None:
                r.handle.cancel()  # the executor answers CANCELED; that result is posted
            else:
                self._post(r, ResultCode.CANCELLED, "cancelled before it was sent")

    def fail_robot(self, robot_id: str, reason: str) -> None:
        """`robot_id`'s executor is lost: every goal in flight there ends DISCONNECTED now (and is
        cancelled, in case the executor is alive but unheard)."""
        with self._lock:
            recs = [r for r in self._inflight.values() if r.goal.robot_id == robot_id and not r.posted]
        if recs:
            log.warning("%s: %d goal(s) in flight fail", reason, len(recs))
        for r in recs:
            r.timed_out = True  # a late answer changes nothing
            self._post(r, ResultCode.DISCONNECTED, reason)
            if r.handle is not None:
                r.handle.cancel()

    def close(self) -> None:
        self._closed.set()
        self.leases.close()
        with self._lock:
            for q in self._senders.values():
                q.put(None)

    # -- internals ---------------------------------------------------------------------------
    def _sender(self, robot_id: str, q: queue.SimpleQueue) -> None:
        client = self.client(robot_id)
        while True:
            rec = q.get()
            if rec is None:
                return
            if rec.posted:
                continue
            end = time.monotonic() + self.config.server_wait_s
            while not client.server_is_ready() and time.monotonic() < end and not self._closed.is_set():
                time.sleep(0.02)
            if not client.server_is_ready():
                self._post(rec, ResultCode.REJECTED, f"no executor: action server {self.action_name(robot_id)} "
                                                     f"not available")
                if self._forget(robot_id):
                    return
                continue
            try:
                fields = convert.segment_goal_to_fields(rec.goal, planner_id=self.config.planner_id)
                rec.handle = client.send_goal(fields,
                                              on_result=lambda o, rec=rec: self._on_outcome(rec, o),
                                              on_feedback=lambda _fb, rec=rec: self._on_feedback(rec),
                                              on_accepted=lambda ok, rec=rec: self._on_accepted(rec, ok))
            except Exception as e:  # a goal that cannot be sent still gets a result
                self._post(rec, ResultCode.REJECTED, f"cannot send goal: {e}")

    def _forget(self, robot_id: str) -> bool:
        """A robot without an executor and with nothing in flight: drop its action client and
        sender (the next goal for it makes new ones), so ids that were only ever asked about,
        typos included, are not kept for the planner's lifetime.  True if dropped."""
        with self._lock:
            if robot_id in self.pinned or any(f.goal.robot_id == robot_id for f in self._inflight.values()):
                return False
            client = self._clients.pop(robot_id, None)
            self._senders.pop(robot_id, None)
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - already gone with the transport
                pass
        return True
    def _new_instance(self) -> None:
        """Executors declared this instance lost (its heartbeats were late: an overloaded host, a
        partition): they stopped and refuse its goals, whose plans fail with that reason.  Later
        goals go out as a new instance, which they supervise afresh."""
        with self._lock:
            old = self.config.planner_id
            if not old:
                return
            self.config.planner_id = new_instance_id(old.split(":", 1)[0])
            if self.heartbeat is not None:
                self.heartbeat.ident = self.config.planner_id
        log.warning("executors lost planner instance %s: later goals are sent as %s", old, self.config.planner_id)

    def _on_accepted(self, rec: _InFlight, ok: bool) -> None:
        """The executor took the goal: from now on its lease is supervised."""
        if ok and not rec.posted:
            self.leases.busy(rec.goal.robot_id)

    def _on_feedback(self, rec: _InFlight) -> None:
        if not rec.posted:  # its executor is running it: supervise its lease
            self.leases.busy(rec.goal.robot_id)

    def _on_outcome(self, rec: _InFlight, o: GoalOutcome) -> None:
        if rec.timed_out:
            return  # TIMEOUT already posted; this is the late answer to our cancel
        g = rec.goal
        now = self.clock.now()
        if o.result is not None and f"planner {self.config.planner_id} lost" in str(o.result.get("error_message", "")):
            self._new_instance()
        if o.status == GoalStatus.REJECTED:
            self._post(rec, ResultCode.REJECTED, o.error or f"goal rejected by {self.action_name(g.robot_id)}")
            return
        if o.status == GoalStatus.UNKNOWN or o.result is None:
            self._post(rec, ResultCode.DISCONNECTED, o.error or "lost contact with the executor")
            return
        res = convert.segment_result_from_fields(o.result, request_id=g.request_id,
                                                 segment_index=g.segment_index, received_at=now)
        if o.status != GoalStatus.SUCCEEDED and res.ok:
            code = ResultCode.CANCELLED if o.status == GoalStatus.CANCELED else ResultCode.ABORTED
            why = o.error or f"goal {o.status.value} but its result claims success"
            res = SegmentResult(g.request_id, g.segment_index, code, res.exec_start, res.exec_end,
                                res.call_durations_s, res.calls_done, None, why)
        self._post_result(rec, res)

    def _post(self, rec: _InFlight, code: ResultCode, error: str) -> None:
        now = self.clock.now()
        start = rec.sent if rec.sent is not None and rec.handle is not None else now  # sent: as its status said
        self._post_result(rec, SegmentResult(rec.goal.request_id, rec.goal.segment_index, code, start, now,
                                             error=error))

    def _post_result(self, rec: _InFlight, res: SegmentResult) -> None:
        with self._lock:
            if rec.posted:
                return
            rec.posted = True
            self._inflight.pop((rec.goal.request_id, rec.goal.segment_index), None)
            idle = not any(f.goal.robot_id == rec.goal.robot_id for f in self._inflight.values())
        if idle:
            self.leases.idle(rec.goal.robot_id)
        self.post_result(res)

    def _watch(self) -> None:
        while not self._closed.wait(0.05):
            now = time.monotonic()
            with self._lock:
                late = [r for r in self._inflight.values() if not r.posted and now > r.deadline]
            for r in late:
                r.timed_out = True
                waited = now - (r.deadline - self.config.server_wait_s)
                self._post(r, ResultCode.TIMEOUT, f"no result from {self.action_name(r.goal.robot_id)} "
                                                  f"within the watchdog limit")
                if r.handle is not None:
                    r.handle.cancel()
                log.warning("segment %s/%d timed out (%.1f s)", r.goal.request_id, r.goal.segment_index, waited)

"""Executor node: the `<robot_id>/execute_segment` action server over the transport port.

A thin shell around `SegmentExecutor`: validate the goal message, run segments one at a time in
the order their goals were accepted (segment k+1 of a plan may arrive while k still runs), turn
the report into the action result and a terminal goal state.  Cancellation arrives through the
goal handle while the segment runs (transports execute goals on their own threads).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any

from timelyllm_ros.core.types import ResultCode
from timelyllm_ros.executors.base import ExecReport, SegmentExecutor
from timelyllm_ros.ros import convert
from timelyllm_ros.ros import interfaces
from timelyllm_ros.ros import walker
from timelyllm_ros.transport.base import Fields, ServerGoalHandle, Transport

from .supervision import ExecutorSupervisionConfig, ExecutorSupervisor

log = logging.getLogger(__name__)

ACTION_NAME = "execute_segment"


class _Turns:
    """Goals run in acceptance order; a goal that gives up its turn (cancelled while queued)
    is skipped without holding up the others."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._next = 0
        self._serving = 0
        self._left: set[int] = set()

    def take(self) -> int:
        with self._cv:
            t = self._next
            self._next += 1
            return t

    def wait(self, ticket: int, give_up: Any) -> bool:
        """Block until it is `ticket`'s turn; False (turn released) if give_up() became true."""
        with self._cv:
            while self._serving != ticket:
                if give_up():
                    self._left.add(ticket)
                    return False
                self._cv.wait(0.05)
            return True

    def release(self, ticket: int) -> None:
        with self._cv:
            if ticket == self._serving:
                self._serving += 1
                while self._serving in self._left:
                    self._left.discard(self._serving)
                    self._serving += 1
            else:
                self._left.add(ticket)
            self._cv.notify_all()


class ExecutorNode:
    def __init__(self, transport: Transport, executor: SegmentExecutor, *, robot_id: str,
                 action_name: str = ACTION_NAME, supervision: ExecutorSupervisionConfig | None = None) -> None:
        self.transport = transport
        self.executor = executor
        self.robot_id = robot_id
        self._turns = _Turns()
        self.accepting = True  # False (lifecycle inactive): new goals are rejected, accepted ones run
        self._tickets: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()
        self._closing = threading.Event()  # close(): goals still here stop
        self._running = 0  # execute callbacks in progress
        # (request, segment, report) of the last segments run, newest last (introspection)
        self.reports: deque[tuple[str, int, ExecReport]] = deque(maxlen=1000)
        # planner leases, on_planner_lost, goal records (get_goal_states): nodes/supervision.py
        self.supervisor = ExecutorSupervisor(transport, executor.robot, robot_id, executor.backend,
                                             supervision or ExecutorSupervisionConfig())
        self._server = transport.action_server(action_name, interfaces.EXECUTE_SEGMENT, self._execute,
                                               goal_callback=self._on_goal)

    def close(self, wait_s: float = 5.0) -> None:
        """Stop the goals still queued or running (the robot is halted: a goal that ended after
        the node's executor shut down raised "'NoneType' object has no attribute 'trigger'" in
        rclpy, never retrieved), wait for them, then take the server down."""
        import time

        self._closing.set()
        end = time.monotonic() + wait_s
        while time.monotonic() < end:
            with self._lock:
                if not self._running:
                    break
            time.sleep(0.02)
        self._server.close()
        self.supervisor.close()
        self.executor.close()

    def _on_goal(self, request: Fields) -> bool:
        """Accept well-formed goals for this robot; the ticket fixes the execution order."""
        if not self.accepting:
            log.warning("%s: rejecting goal: executor inactive (lifecycle)", self.robot_id)
            return False
        try:
            goal = convert.segment_goal_from_fields(request)
        except walker.MessageError as e:
            log.warning("%s: rejecting malformed goal: %s", self.robot_id, e)
            return False
        if goal.robot_id and goal.robot_id != self.robot_id:
            log.warning("%s: rejecting goal for robot %r", self.robot_id, goal.robot_id)
            return False
        key = (goal.request_id, goal.segment_index)
        with self._lock:
            if key in self._tickets:
                log.warning("%s: rejecting duplicate goal %s", self.robot_id, key)
                return False
            self._tickets[key] = self._turns.take()
        return True

    def _execute(self, handle: ServerGoalHandle) -> Fields:
        try:
            goal = convert.segment_goal_from_fields(handle.request)
            pid = convert.goal_planner_id(handle.request)
        except walker.MessageError as e:  # the goal callback normally catches this
            handle.abort()
            return convert.execute_result_fields(code=ResultCode.REJECTED, error=str(e))
        key = (goal.request_id, goal.segment_index)
        with self._lock:
            self._running += 1
        try:
            return self._run_goal(handle, goal, pid, key)
        finally:
            with self._lock:
                self._running -= 1

    def _run_goal(self, handle: ServerGoalHandle, goal: Any, pid: str, key: tuple[str, int]) -> Fields:
        sup = self.supervisor
        refusal = sup.admit(pid, goal.request_id, goal.segment_index)
        with self._lock:
            ticket = self._tickets.get(key)
        if ticket is None:  # a transport without goal callbacks: take a turn now
            ticket = self._turns.take()
        stopped = False

        def give_up() -> bool:
            return handle.is_cancel_requested or sup.lost(pid) is not None or self._closing.is_set()
        try:
            if refusal:
                self._turns.release(ticket)
                log.warning("%s: refusing %s/%d: %s", self.robot_id, goal.request_id, goal.segment_index, refusal)
                report = ExecReport(ResultCode.REJECTED, refusal)
            elif (not self._turns.wait(ticket, give_up)
                  or not sup.wait_fresh(pid, give_up)  # its planner silent: not started on its word
                  or sup.lost(pid) is not None or self._closing.is_set()):  # its planner was lost / we close
                self._turns.release(ticket)
                lost = sup.lost(pid)
                report = (ExecReport(ResultCode.CANCELLED, "cancelled before it started") if handle.is_cancel_requested
                          else ExecReport(ResultCode.ABORTED, f"{lost}: queued goal aborted, nothing sent") if lost
                          else ExecReport(ResultCode.ABORTED, "executor shutting down: goal aborted, nothing sent"))
            else:
                handle.executing()  # its turn: EXECUTING (queued goals stay ACCEPTED)
                log.info("%s: executing %s/%d: %s", self.robot_id, goal.request_id, goal.segment_index, goal.text)
                sup.record(pid, goal.request_id, goal.segment_index, "running")
                try:
                    report = self.executor.execute(
                        goal, cancel_requested=lambda: (handle.is_cancel_requested or sup.must_stop(pid)
                                                        or self._closing.is_set()),
                        on_feedback=lambda n, cur, el: handle.publish_feedback(
                            convert.feedback_fields(n, cur, el)))
                finally:
                    self._turns.release(ticket)
                if report.code != ResultCode.OK and not handle.is_cancel_requested and sup.must_stop(pid):
                    stopped = True  # stopped by the lost lease, not by its sender
                    report = ExecReport(ResultCode.ABORTED, sup.stopped(pid, report.error), report.call_durations_s,
                                        report.calls_done, None, report.exec_duration_s)
                elif report.code != ResultCode.OK and not handle.is_cancel_requested and self._closing.is_set():
                    where = report.error.split("; ", 1)[1] if "; " in report.error else ""
                    report = ExecReport(ResultCode.ABORTED, "executor shutting down: goal stopped"
                                        + (f"; {where}" if where else ""), report.call_durations_s,
                                        report.calls_done, None, report.exec_duration_s)
        finally:
            with self._lock:
                self._tickets.pop(key, None)
            if not refusal:
                sup.done(pid)
        sup.ended(pid, goal.request_id, goal.segment_index, report.code, calls_done=report.calls_done,
                  reason=report.error, stopped=stopped, value=report.value)
        self.reports.append((goal.request_id, goal.segment_index, report))
        if report.code == ResultCode.OK:
            handle.succeed()
        elif report.code == ResultCode.CANCELLED and handle.is_cancel_requested:
            handle.canceled()
        else:
            handle.abort()
        return convert.execute_result_fields(
            code=report.code, error=report.error, call_durations_s=report.call_durations_s,
            calls_done=report.calls_done, value=report.value, exec_duration_s=report.exec_duration_s)

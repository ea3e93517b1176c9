"""Agent side of the planner's topics: publish PlanRequests, follow their RequestStatus.

What a robot agent or an operator does (`timelyllm request ...`), over the transport port so it
runs over rclpy (a real ROS graph) and in-process alike.  Requests go to
`<planner_ns>/plan_requests`, cancels to `<planner_ns>/cancel_requests`, status comes back on
`<planner_ns>/request_status` (every state change of every request; this client keeps its own).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from timelyllm_ros.ros import convert
from timelyllm_ros.ros import interfaces
from timelyllm_ros.transport.base import QOS_RELIABLE_ALL, QOS_RELIABLE_DEEP, Fields, Transport, join_name


class RequestClient:
    def __init__(self, transport: Transport, planner_ns: str = "/") -> None:
        self.planner_ns = planner_ns
        self._cv = threading.Condition()
        self._status: dict[str, list[Fields]] = {}
        self._mine: set[str] = set()
        self._listeners: list[Callable[[Fields], None]] = []
        # keep all: a planner that falls behind back-pressures this publisher, nothing is overwritten
        self._pub = transport.publisher(join_name(planner_ns, "plan_requests"), interfaces.PLAN_REQUEST,
                                        qos=QOS_RELIABLE_ALL)
        self._cancel = transport.publisher(join_name(planner_ns, "cancel_requests"), interfaces.STRING, qos=QOS_RELIABLE_DEEP)
        self._sub = transport.subscribe(join_name(planner_ns, "request_status"), interfaces.REQUEST_STATUS,
                                        self._on_status, qos=QOS_RELIABLE_ALL)

    def wait_for_planner(self, timeout_s: float) -> bool:
        """True once a planner subscribes to our requests and we hear its status publisher
        (a request published before discovery would be lost, and so would its first states)."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self._pub.matched_count() > 0 and self._sub.matched_count() > 0:
                return True
            time.sleep(0.02)
        return self._pub.matched_count() > 0 and self._sub.matched_count() > 0

    def on_status(self, fn: Callable[[Fields], None]) -> None:
        """Call `fn` with each status of a request this client submitted."""
        self._listeners.append(fn)

    def submit(self, fields: Fields) -> str:
        rid = str(fields.get("request_id", ""))
        with self._cv:
            self._mine.add(rid)
            self._status.setdefault(rid, [])
        self._pub.publish(fields)
        return rid

    def cancel(self, request_id: str) -> None:
        self._cancel.publish({"data": request_id})

    def statuses(self, request_id: str) -> list[Fields]:
        with self._cv:
            return list(self._status.get(request_id, ()))

    def wait_terminal(self, request_id: str, timeout_s: float) -> Fields | None:
        """The request's terminal status, or None if none came within `timeout_s`."""
        end = time.monotonic() + timeout_s
        with self._cv:
            while True:
                term = [m for m in self._status.get(request_id, ()) if m["terminal"]]
                if term:
                    return term[0]
                left = end - time.monotonic()
                if left <= 0:
                    return None
                self._cv.wait(left)

    def wait_first(self, request_id: str, timeout_s: float) -> Fields | None:
        """The request's first status (queued, or rejected), or None."""
        end = time.monotonic() + timeout_s
        with self._cv:
            while not self._status.get(request_id):
                left = end - time.monotonic()
                if left <= 0:
                    return None
                self._cv.wait(left)
            return self._status[request_id][0]

    def _on_status(self, m: Fields) -> None:
        rid = m.get("request_id", "")
        with self._cv:
            if rid not in self._mine:
                return
            self._status[rid].append(m)
            self._cv.notify_all()
        for fn in self._listeners:
            fn(m)


def request_state(transport: Transport, planner_ns: str, request_id: str,
                  timeout_s: float = 10.0) -> Fields | None:
    """Ask the planner for a request's latest state (`<planner_ns>/get_request_state`): None if no
    planner answered; else {found, status (RequestStatus fields), segments (the plan's dispatched
    segment texts)} -- for a client that joined after the request ended."""
    return transport.call_service(join_name(planner_ns, "get_request_state"), interfaces.GET_REQUEST_STATE,
                                  {"request_id": request_id}, timeout_s, resend_s=1.0)


def plan_request_fields(*, request_id: str, robot_id: str, robot_type: str, task: str, scene: str = "",
                        plan: str = "", category: str = "normal", task_type: str = "",
                        tuf: Any = None) -> Fields:
    """A PlanRequest message's fields, stamped now; `tuf` is a core TUF (default: NORMAL).
    Not validated here: the planner is the one place that decides (and answers `rejected`)."""
    from timelyllm_ros.core.tuf import NORMAL
    from timelyllm_ros.core.types import PlanRequest

    req = PlanRequest(request_id=request_id, robot_id=robot_id, robot_type=robot_type, task=task, scene=scene,
                      tuf=tuf or NORMAL, arrival=0.0, task_type=task_type, category=category,
                      reference_plan=plan or None)
    return convert.plan_request_to_fields(req)


def status_line(m: Fields, t0: float) -> str:
    """One line per status for an operator's terminal."""
    rt = m["response_time_s"]
    parts = [f"{time.monotonic() - t0:7.2f}s", m["request_id"], f"{m['state']:<9}",
             f"segments {m['segments_done']}/{m['segments_dispatched']}",
             f"response {rt:.2f}s" if rt >= 0 else "response -", f"utility {m['utility']:.3f}"]
    if m.get("reason"):
        parts.append(f"({m['reason']})")
    return "  ".join(parts)

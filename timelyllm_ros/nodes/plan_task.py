"""The planner's `plan_task` action (action/PlanTask.action): a plan request whose client learns
what became of it -- accepted (feedback: each RequestStatus), rejected with the reason, and the
terminal state with the plan as dispatched, segment by segment.  It sits beside the
`plan_requests` topic (fire-and-forget agents) and uses the same path into the planner: the goal's
PlanRequest is submitted like a topic message, and everything the node publishes on
`request_status` / `segment_status` is also routed here (`Tee`), so the two can never disagree.

Ids are idempotent: a goal whose request id this server already follows attaches to that
request (a client that resends after a lost answer gets the one request's outcome, not a second
plan); an id that already ended is answered at once with its terminal status.  Goals are
deferred on the transport (no thread is held while a plan runs), so thousands can be open.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Any, Callable

from timelyllm_ros.ros import convert
from timelyllm_ros.ros import interfaces
from timelyllm_ros.transport.base import DeferredGoal, Fields, GoalStatus, Transport

log = logging.getLogger(__name__)

ACTION_NAME = "plan_task"  # in the planner's namespace


class Tee:
    """A publisher that also hands every message to `also` (after publishing it)."""

    def __init__(self, pub: Any, also: Callable[[Fields], None]) -> None:
        self._pub, self._also = pub, also

    def publish(self, fields: Fields) -> None:
        self._pub.publish(fields)
        try:
            self._also(fields)
        except Exception:
            log.exception("status tee failed")

    def matched_count(self) -> int:
        return self._pub.matched_count()


def _outcome(status: Fields, cancel_requested: bool) -> GoalStatus:
    state = status.get("state", "")
    if state == "finished":
        return GoalStatus.SUCCEEDED
    if state == "cancelled" and cancel_requested:
        return GoalStatus.CANCELED
    return GoalStatus.ABORTED  # rejected, failed, cancelled by someone else: the reason says


class PlanTaskServer:
    def __init__(self, transport: Transport, submit: Callable[[Fields], None], cancel: Callable[[str], None], *,
                 name: str = ACTION_NAME, ended_kept: int = 10_000) -> None:
        self._submit, self._cancel = submit, cancel
        self._ended_kept = ended_kept
        self._lock = threading.Lock()
        self._goals: dict[str, list[DeferredGoal]] = {}  # open goals per request id
        self._last: OrderedDict[str, Fields] = OrderedDict()  # last status per request id
        self._ended: OrderedDict[str, None] = OrderedDict()  # ended ids, oldest first
        self._segments: dict[str, dict[int, str]] = {}
        self._submitted: set[str] = set()  # ids sent to the planner by this server, no status yet
        self._server = transport.deferred_action_server(name, interfaces.PLAN_TASK, self._on_goal,
                                                        cancel_callback=self._on_cancel)

    def close(self) -> None:
        self._server.close()

    # -- goals ---------------------------------------------------------------------------------
    def _on_goal(self, goal: DeferredGoal) -> None:
        fields = goal.request.get("request", {})
        rid = fields.get("request_id", "") if isinstance(fields, dict) else ""
        if not isinstance(rid, str) or not rid:  # nothing to follow: answer now, with the reason
            rid = rid if isinstance(rid, str) else ""
            goal.finish(GoalStatus.ABORTED, {"status": convert.rejected_status_fields(
                rid, str(fields.get("robot_id", "")) if isinstance(fields, dict) else "",
                "malformed request: missing 'request_id'"), "segments": []})
            return
        with self._lock:
            last = self._last.get(rid)
            known = last is not None or rid in self._submitted
            if last is None or not last["terminal"]:
                self._goals.setdefault(rid, []).append(goal)
            if not known:
                self._submitted.add(rid)
            segments = self._plan(rid)
        if last is not None and last["terminal"]:  # a resend of a request that ended: its answer
            goal.finish(_outcome(last, False), {"status": last, "segments": segments})
            return
        if last is not None:
            goal.publish_feedback({"status": last})
        if not known:
            self._submit(fields)

    def _on_cancel(self, goal: DeferredGoal) -> bool:
        rid = goal.request.get("request", {}).get("request_id", "")
        if rid:
            self._cancel(rid)  # the planner answers "cancelled": that status ends the goal
        return True

    # -- what the node publishes ------------------------------------------------------------------
    def on_status(self, status: Fields) -> None:
        rid = status.get("request_id", "")
        with self._lock:
            prev = self._last.get(rid)
            if status["state"] == "rejected" and prev is not None and prev["state"] != "rejected":
                return  # a duplicate submission of a request that was admitted: not its answer
            if prev is not None and prev["terminal"]:
                return  # the first terminal status is the answer
            self._submitted.discard(rid)
            self._last[rid] = status
            goals = self._goals.pop(rid, []) if status["terminal"] else list(self._goals.get(rid, ()))
            segments = self._plan(rid) if status["terminal"] else []
            if status["terminal"]:
                self._ended[rid] = None
                while len(self._ended) > self._ended_kept:
                    old, _ = self._ended.popitem(last=False)
                    self._last.pop(old, None)
                    self._segments.pop(old, None)
        for g in goals:
            if status["terminal"]:
                g.finish(_outcome(status, g.is_cancel_requested), {"status": status, "segments": segments})
            else:
                g.publish_feedback({"status": status})

    def on_segment(self, seg: Fields) -> None:
        rid = seg.get("request_id", "")
        with self._lock:
            last = self._last.get(rid)
            if last is not None and last["terminal"]:
                return
            self._segments.setdefault(rid, {})[int(seg.get("index", 0))] = str(seg.get("text", ""))

    def _plan(self, rid: str) -> list[str]:
        segs = self._segments.get(rid, {})
        return [segs[i] for i in sorted(segs)]

    def open_goals(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._goals.values())


# ================================================================================== client


class PlanAnswer:
    """What `request_plan` learned: the terminal status (None: no answer in time), the plan's
    segments, and how many times the goal was sent."""

    def __init__(self, status: Fields | None, segments: list[str], sends: int, error: str = "") -> None:
        self.status, self.segments, self.sends, self.error = status, segments, sends, error


class PlannerWatch:
    """The planner instances of one namespace, from their heartbeats (one per client process is
    enough; `request_plan` makes its own if given none)."""

    def __init__(self, transport: Transport, planner_ns: str, lease_s: float = 1.0) -> None:
        from .supervision import PLANNER_HEARTBEAT, LeaseWatcher

        self.ns = "/" + planner_ns.strip("/") if planner_ns.strip("/") else ""
        self.lease_s = lease_s
        self._losses = 0
        self.watcher = LeaseWatcher(transport, PLANNER_HEARTBEAT, lease_s, self._lost)

    def _lost(self, _ident: str, _silent_s: float) -> None:
        self._losses += 1  # heard again later (a late heartbeat, not a crash): live again

    def live(self) -> list[str]:
        """Instances of this namespace heard within the lease (each is then supervised: its loss
        is counted in `losses`)."""
        from .supervision import planner_node_name

        out = []
        for i in self.watcher.heard_ids():
            if planner_node_name(i).rsplit("/", 1)[0] != self.ns:
                continue
            silent = self.watcher.silent_for(i)
            if silent is not None and silent < self.lease_s:
                self.watcher.supervise(i)
                out.append(i)
        return out

    def losses(self) -> int:
        return self._losses

    def close(self) -> None:
        self.watcher.close()


def request_plan(transport: Transport, planner_ns: str, request: Fields, *, timeout_s: float,
                 discovery_timeout_s: float, on_status: Callable[[Fields], None] | None = None,
                 lease_s: float = 1.0, first_only: bool = False, watch: PlannerWatch | None = None,
                 ack_timeout_s: float = 3.0, quiet_resend_s: float = 10.0) -> PlanAnswer:
    """Send `request` as a PlanTask goal to `<planner_ns>/plan_task` and wait for its answer.
    The goal is sent again with the same request id (idempotent; any send's answer is the
    answer) when a planner instance of that namespace stops its heartbeat (a crash: its goals
    would never be answered), the goal could not be delivered, or
    it was not acknowledged within `ack_timeout_s` (right after a restart DDS may still match
    only the dead server's endpoints), or nothing came for `quiet_resend_s` (a service response
    that DDS could not deliver: "failed to send response (timeout)" on a loaded host), until
    `timeout_s`.  `first_only`: return at the first status (the acknowledgement: queued,
    or rejected with the reason)."""
    import time

    from timelyllm_ros.transport.base import join_name

    client = transport.action_client(join_name(planner_ns, ACTION_NAME), interfaces.PLAN_TASK)
    own = watch is None
    watch = watch or PlannerWatch(transport, planner_ns, lease_s)
    end = time.monotonic() + timeout_s
    sends = 0
    done = threading.Event()  # any send's answer answers the request (one request id)
    box: list = []
    statuses: list[Fields] = []
    lock = threading.Lock()

    def on_result(o: Any, again: threading.Event) -> None:
        if o.result is not None and o.status in (GoalStatus.SUCCEEDED, GoalStatus.ABORTED, GoalStatus.CANCELED):
            with lock:
                box.append(o)
            done.set()
        else:
            again.set()  # not delivered (no server, transport failure): send again

    heard = [time.monotonic()]  # last sign of the planner following this request

    def feedback(fb: Fields) -> None:
        heard[0] = time.monotonic()
        with lock:
            statuses.append(fb["status"])
        if on_status:
            on_status(fb["status"])
        if first_only:
            done.set()

    try:
        first = time.monotonic() + discovery_timeout_s
        while time.monotonic() < end and not done.is_set():
            watch.live()  # supervise the instances heard so far
            if not client.server_is_ready():
                if sends == 0 and time.monotonic() > first:
                    return PlanAnswer(None, [], sends, f"no planner action server {join_name(planner_ns, ACTION_NAME)} "
                                                       f"within {discovery_timeout_s:g} s")
                time.sleep(0.05)
                continue
            losses = watch.losses()
            acked, again = threading.Event(), threading.Event()
            sent_at = heard[0] = time.monotonic()
            sends += 1
            client.send_goal({"request": request}, on_result=lambda o, a=again: on_result(o, a),
                             on_feedback=feedback, on_accepted=lambda ok, a=acked, g=again: a.set() if ok else g.set())
            while not done.wait(0.05):
                if time.monotonic() >= end or again.is_set():
                    break
                watch.live()
                if watch.losses() > losses:
                    break  # a planner instance died: its goals are never answered; again, same id
                if not acked.is_set() and time.monotonic() - sent_at > ack_timeout_s:
                    break  # not acknowledged: it went only to a dead server still matched; again
                if time.monotonic() - heard[0] > quiet_resend_s:
                    break  # nothing for a while: the answer may have been lost; ask again (same id)
            if again.is_set() and not done.is_set():
                time.sleep(0.2)
        with lock:
            if box:
                st = box[0].result["status"]
                if on_status:
                    on_status(st)
                return PlanAnswer(st, list(box[0].result["segments"]), sends)
            if first_only and statuses:
                return PlanAnswer(statuses[0], [], sends)
        return PlanAnswer(None, [], sends, f"no answer within {timeout_s:g} s")
    finally:
        if own:
            watch.close()

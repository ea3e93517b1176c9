"""Planner node: the TimelyLLM planner as a ROS-shaped node over the transport port.

* subscribes `plan_requests` (timelyllm/PlanRequest); a malformed or refused request is answered
  with a RequestStatus in state "rejected" and the reason -- never dropped;
* subscribes `cancel_requests` (std_msgs/String: a request id) to cancel a plan;
* `ActionDispatcher` (nodes/dispatcher.py) sends each segment as an ExecuteSegment goal to `/<robot_id>/execute_segment`
  and posts a SegmentResult back for every goal, whatever happens (no executor, goal rejected,
  aborted, cancelled, no result within the watchdog time);
* publishes RequestStatus on every change (TRANSIENT_LOCAL, the last `STATUS_HISTORY` kept for
  late joiners), PlannerStatus and /diagnostics at a fixed rate, and a MarkerArray with each
  drone's planned path (from its move/turn skills: nodes/geometry.py);
* serves `get_request_state` (timelyllm/GetRequestState): a request's latest status and its plan
  (the dispatched segments) for a client that joined late or missed the terminal status;
* `set_accepting(False, reason)` (lifecycle deactivate) rejects new requests with the reason while
  admitted plans run on; `apply_parameters` takes live parameter changes (policy, batching,
  admission limits, status period, watchdog) at the next scheduling point.

One loop thread owns the planner (submit + step); transport threads only enqueue.  With the
simulated engine (virtual clock) the loop paces virtual time to the wall clock, so the simulated
LLM takes real time and real executors can serve it.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from timelyllm_ros.core.clock import Clock, VirtualClock
from timelyllm_ros.core.planner import Planner
from timelyllm_ros.core.ports import PlannerListener
from timelyllm_ros.core.types import (
    GenState,
    Generation,
    PlanRequest,
    RequestError,
    Segment,
    SegmentResult,
)
from timelyllm_ros.ros import convert
from timelyllm_ros.ros import interfaces
from timelyllm_ros.ros import walker
from timelyllm_ros.transport.base import (
    QOS_HISTORY,
    QOS_LATCHED,
    QOS_RELIABLE_ALL,
    QOS_RELIABLE_DEEP,
    Transport,
)

from .dispatcher import ActionDispatcher, DispatcherConfig
from .geometry import Pose, moves, path_points
from .plan_task import PlanTaskServer, Tee
from .supervision import DEFAULT_HEARTBEAT_S, PLANNER_HEARTBEAT, Heartbeat, new_instance_id

log = logging.getLogger(__name__)

DIAG_OK, DIAG_WARN, DIAG_ERROR = b"\x00", b"\x01", b"\x02"


def _batching_label(batcher: Any) -> str:
    cap = getattr(batcher, "max_batch", "?")
    return f"fixed({cap})" if type(batcher).__name__ == "FixedBatch" else f"latency-guided({cap})"


# ============================================================================ node


@dataclass
class PlannerNodeConfig:
    request_topic: str = "plan_requests"
    cancel_topic: str = "cancel_requests"
    status_topic: str = "request_status"
    segment_status_topic: str = "segment_status"
    planner_status_topic: str = "planner_status"
    markers_topic: str = "planned_paths"
    state_service: str = "get_request_state"
    diagnostics_topic: str = "/diagnostics"
    status_period_s: float = 0.5
    max_batch: int = 0  # the batching the planner was built with (0: the policy's own); live
    frame_id: str = "map"
    idle_wait_s: float = 0.005  # loop sleep when the engine has nothing to do
    # after a restart on a journal: how long to wait for a status subscriber before reporting
    # the recovered requests (a status published before discovery reaches nobody)
    recovery_wait_s: float = 5.0
    dispatcher: DispatcherConfig = field(default_factory=DispatcherConfig)
    # robot ids whose executors are looked up at start (action clients created, so DDS discovery
    # is done before their first goal); others are found at their first goal
    executors: tuple[str, ...] = ()
    # ended requests whose terminal status is remembered, newest kept (a late result for one of
    # them publishes nothing); live requests are always remembered (the planner bounds them)
    ended_status_kept: int = 10_000
    heartbeat_period_s: float = DEFAULT_HEARTBEAT_S  # this instance's heartbeat (nodes/supervision.py)
    # robot ids (agents) a request may name; () = any.  Not authentication: see docs/ros.md "Security"
    allowed_robots: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        n = self.ended_status_kept
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"ended_status_kept must be an int >= 0, got {n!r}")


class RecoveryListener(PlannerListener):
    """What the planner node is to its planner (`wiring.NodePlanner.make_planner`): a listener that is
    also told what the journal's recovery did and handed the journal itself."""

    def on_recovery(self, report: Any) -> None:
        """report (journal.RecoveryReport): the requests recovery failed, resubmitted or resumed."""

    def on_journal(self, journal: Any) -> None:
        """journal (journal.Journal): where a resent request id's journaled outcome is looked up."""


class PlannerNode(RecoveryListener):
    """Build with `PlannerNode(transport, make_planner, clock=...)` where
    `make_planner(dispatcher, listeners)` returns the Planner (it needs the dispatcher, and the
    dispatcher posts into the planner)."""

    def __init__(self, transport: Transport, make_planner: Callable[[ActionDispatcher, list], Planner], *,
                 clock: Clock, config: PlannerNodeConfig | None = None) -> None:
        self.transport = transport
        self.clock = clock
        self.config = cfg = config or PlannerNodeConfig()
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._recovery: Any = None  # journal.RecoveryReport of a restart, reported by the loop
        self._journal: Any = None  # journal.Journal (on_journal): a resent id gets its journaled outcome
        self._wake = threading.Event()
        self._stop = threading.Event()
        # a new instance id on every start (unless given): executors supervise its lease
        pid = cfg.dispatcher.planner_id or new_instance_id("planner")
        self.heartbeat = Heartbeat(transport, PLANNER_HEARTBEAT, pid, cfg.heartbeat_period_s)
        self.dispatcher = ActionDispatcher(transport, clock, self._post_result,
                                           dataclasses.replace(cfg.dispatcher, planner_id=pid), self.heartbeat)
        self.rejected: list[tuple[str, str]] = []  # (request id, reason), never admitted: the newest
        self.rejected_total = 0
        self._last_status: dict[str, tuple] = {}  # last published status key: live + recently ended
        self._state: dict[str, tuple[dict, list[str]]] = {}  # id -> (last status, segment texts): same ids
        self._state_lock = threading.Lock()  # _state is read by the get_request_state service
        self._accepting = True
        self._not_accepting_reason = ""
        self._ended: collections.deque[str] = collections.deque()  # ended ids in _last_status, oldest first
        self._poses: dict[str, Pose] = {}
        self._paths: dict[str, list[dict[str, float]]] = {}
        self._path_request: dict[str, str] = {}
        self._markers_dirty = False
        # the plan_task action beside the topic: it sees every status the topic gets (Tee)
        self.plan_task = PlanTaskServer(transport, self._on_request, self._cancel_request)
        self._pub_status = Tee(transport.publisher(cfg.status_topic, interfaces.REQUEST_STATUS, qos=QOS_HISTORY),
                               self.plan_task.on_status)
        self._pub_segments = Tee(transport.publisher(cfg.segment_status_topic, interfaces.SEGMENT_STATUS,
                                                     qos=QOS_RELIABLE_DEEP), self.plan_task.on_segment)
        self._pub_planner = transport.publisher(cfg.planner_status_topic, interfaces.PLANNER_STATUS, qos=QOS_LATCHED)
        self._pub_diag = transport.publisher(cfg.diagnostics_topic, interfaces.DIAGNOSTIC_ARRAY)
        self._pub_markers = transport.publisher(cfg.markers_topic, interfaces.MARKER_ARRAY, qos=QOS_LATCHED)
        # after the state and publishers: a journal recovery in make_planner already reports to us
        self.planner = make_planner(self.dispatcher, [self])
        self._subs = [
            # keep all: a burst back-pressures its senders instead of being overwritten in the history
            transport.subscribe(cfg.request_topic, interfaces.PLAN_REQUEST, self._on_request, qos=QOS_RELIABLE_ALL),
            transport.subscribe(cfg.cancel_topic, interfaces.STRING, self._on_cancel, qos=QOS_RELIABLE_DEEP),
            transport.service(cfg.state_service, interfaces.GET_REQUEST_STATE, self._on_get_state),
        ]
        self._timer = transport.timer(cfg.status_period_s, self._publish_periodic)
        self._thread = threading.Thread(target=self._loop, name="planner-loop", daemon=True)
        self.dispatcher.pinned = set(cfg.executors)
        for robot in cfg.executors:
            self.dispatcher.client(robot)

    @property
    def planner_id(self) -> str:
        """This planner's instance id now (sent in every goal; see ActionDispatcher._new_instance)."""
        return self.dispatcher.config.planner_id

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> "PlannerNode":
        self._thread.start()
        return self

    def set_accepting(self, accepting: bool, reason: str = "") -> None:
        """False: every new request is rejected with `reason` (admitted ones run to their end)."""
        self._not_accepting_reason = reason or "planner is not accepting requests"
        self._accepting = accepting

    def apply_parameters(self, changes: dict[str, Any]) -> None:
        """Live parameter changes (checked by the caller; `policy` is a Policy object), applied
        by the loop at its next scheduling point and logged there."""
        self._inbox.put(("params", dict(changes), self.clock.now()))
        self._wake.set()

    def close(self, cancel_reason: str = "", wait_s: float = 5.0) -> None:
        """Stop serving.  With `cancel_reason` the requests still live are cancelled first (their
        robots' goals too) and their terminal statuses published (waits up to `wait_s`)."""
        if cancel_reason and self._thread.is_alive():
            self.set_accepting(False, cancel_reason)
            self._inbox.put(("cancel_all", cancel_reason, self.clock.now()))
            self._wake.set()
            end = time.monotonic() + wait_s
            while time.monotonic() < end and (self.planner.busy() or not self._inbox.empty()):
                time.sleep(0.02)
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self._timer.close()
        for s in self._subs:
            s.close()
        self.heartbeat.close()
        self.plan_task.close()
        self.dispatcher.close()

    # -- transport callbacks (any thread): enqueue only ----------------------------------------
    def _on_request(self, fields: dict) -> None:
        self._inbox.put(("request", fields, self.clock.now()))
        self._wake.set()

    def _on_cancel(self, fields: dict) -> None:
        rid = fields.get("data", "")
        if isinstance(rid, str) and rid:
            self._cancel_request(rid)

    def _cancel_request(self, rid: str) -> None:
        planner = getattr(self, "planner", None)  # None while make_planner runs
        if planner is not None:
            planner.cancel(rid, "cancelled by request")
            self._wake.set()

    def _post_result(self, res: SegmentResult) -> None:
        self.planner.post_result(res)
        self._wake.set()

    # -- the loop (the only thread that touches the planner's state) ----------------------------
    def on_recovery(self, report: Any) -> None:
        """Called by make_planner after recovering a journal (before the loop starts)."""
        self._recovery = report

    def on_journal(self, journal: Any) -> None:
        """Called by make_planner with its journal: ids it has seen are answered from it, never
        run twice (a client resending after a crash, a topic duplicate days later)."""
        self._journal = journal

    def _journaled(self, rid: str) -> bool:
        """A request this planner does not hold but its journal knows: publish its journaled
        outcome (terminal) or refuse it as a duplicate; True if answered so."""
        if self._journal is None or rid in self.planner.generations:
            return False
        row = self._journal.lookup(rid)
        if row is None:
            return False
        state, reason, robot = row
        if state in (GenState.FINISHED.value, GenState.FAILED.value, GenState.CANCELLED.value):
            self._pub_status.publish(convert.rejected_status_fields(
                rid, robot, f"{reason} (journaled outcome of this request id)", state=state))
        else:
            self._reject(rid, robot, f"duplicate request_id {rid!r} (journaled, {state})")
        return True

    def _report_recovery(self) -> None:
        rep, self._recovery = self._recovery, None
        if rep is None or not (rep.failed or rep.resubmitted or rep.resumed):
            return
        log.info("recovery: %d resubmitted, %d resumed, %d failed", len(rep.resubmitted), len(rep.resumed),
                 len(rep.failed))
        for rid in rep.resumed:
            log.info("recovered request %s resumed from its journaled token ids", rid)
        end = time.monotonic() + self.config.recovery_wait_s
        while self._pub_status.matched_count() == 0 and time.monotonic() < end and not self._stop.is_set():
            time.sleep(0.02)
        for rid, reason in rep.failed:
            log.warning("recovered request %s failed: %s", rid, reason)
            st = convert.rejected_status_fields(rid, rep.robots.get(rid, ""), reason, state=GenState.FAILED.value)
            self._remember(rid, st, ended=True)  # get_request_state answers for it too
            self._pub_status.publish(st)

    def _loop(self) -> None:
        self._report_recovery()  # before any step: the resubmitted requests' states are seen too
        virtual = isinstance(self.clock, VirtualClock)
        wall0 = time.monotonic() - self.clock.now()
        while not self._stop.is_set():
            if virtual:  # pace simulated time to the wall clock
                self.clock.advance_to(time.monotonic() - wall0)  # type: ignore[attr-defined]
            self._drain_inbox()
            try:
                ran = self.planner.step()
            except Exception:
                log.exception("planner step failed")
                ran = False
            if virtual:
                ahead = self.clock.now() - (time.monotonic() - wall0)
                if ahead > 0:  # the simulated engine charged time the wall has not yet spent
                    self._stop.wait(ahead)
            if self._markers_dirty:
                self._publish_markers()
            if not ran:
                self._wake.wait(self.config.idle_wait_s)
                self._wake.clear()

    def _drain_inbox(self) -> None:
        while True:
            try:
                kind, fields, t_recv = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "request":
                self._submit(fields, t_recv)
            elif kind == "params":
                self._apply(fields)
            elif kind == "cancel_all":
                for g in self.planner.live():
                    self.planner.cancel(g.request.request_id, fields)

    def _apply(self, changes: dict[str, Any]) -> None:
        """Live parameters, at a scheduling point (nothing is mid-step)."""
        p, d = self.planner, self.dispatcher.config
        if "policy" in changes:
            p.policy = changes["policy"]
        if "policy" in changes or "max_batch" in changes:  # the new policy's own batching, or the cap
            self.config.max_batch = int(changes.get("max_batch", self.config.max_batch))
            p.use_batching(self.config.max_batch or None)
        for k in ("max_tokens", "max_live", "max_queued", "max_per_agent", "agent_rate_per_s", "agent_burst"):
            if k in changes:
                setattr(p.config, k, changes[k])
        for k, attr in (("goal_timeout_factor", "timeout_factor"), ("goal_timeout_margin_s", "timeout_margin_s"),
                        ("server_wait_s", "server_wait_s")):
            if k in changes:
                setattr(d, attr, float(changes[k]))
        if "status_period_s" in changes:
            self.config.status_period_s = float(changes["status_period_s"])
            old, self._timer = self._timer, self.transport.timer(self.config.status_period_s, self._publish_periodic)
            old.close()
        shown = {k: (v.name if k == "policy" else v) for k, v in changes.items()}
        log.info("parameters applied at scheduling point %d: %s", p.iteration, shown)
        if self._journal is not None:  # journaled with the requests (journal.parameter_changes())
            self._journal.record_parameters(p.iteration, shown)

    def _submit(self, fields: dict, t_recv: float) -> None:
        rid = fields.get("request_id", "") if isinstance(fields, dict) else ""
        robot = fields.get("robot_id", "") if isinstance(fields, dict) else ""
        if not self._accepting:
            self._reject(str(rid), str(robot), self._not_accepting_reason)
            return
        try:
            m = convert.plan_request_mapping(fields)
            req = PlanRequest.from_mapping(m, arrival=t_recv, robot_types=set(self.planner.robots))
        except (walker.MessageError, RequestError) as e:
            self._reject(str(rid), str(robot), f"malformed request: {e}")
            return
        if self.config.allowed_robots and req.robot_id not in self.config.allowed_robots:
            self._reject(req.request_id, req.robot_id, f"robot_id {req.robot_id!r} is not in this planner's "
                                                       f"allowed_robots")
            return
        if self._journaled(req.request_id):
            return
        res = self.planner.submit(req)
        if not res.accepted:
            self._reject(req.request_id, req.robot_id, res.reason)

    def _reject(self, rid: str, robot: str, reason: str) -> None:
        self.rejected.append((rid, reason))
        self.rejected_total += 1
        del self.rejected[:-self.config.ended_status_kept or len(self.rejected)]  # the newest kept
        log.warning("rejected request %r: %s", rid, reason)
        st = convert.rejected_status_fields(rid, robot, reason)
        if rid and rid not in self._state and rid not in self.planner.generations:  # not a duplicate's id
            self._remember(rid, st, ended=True)
        self._pub_status.publish(st)

    def _remember(self, rid: str, st: dict, *, ended: bool, segment: str | None = None) -> None:
        with self._state_lock:
            old = self._state.get(rid)
            plan = old[1] if old else []
            if segment is not None:
                plan.append(segment)
            self._state[rid] = (st if st else old[0], plan)
        if ended:  # remembered while it is among the `ended_status_kept` newest
            self._ended.append(rid)
            while len(self._ended) > self.config.ended_status_kept:
                gone = self._ended.popleft()
                self._last_status.pop(gone, None)
                with self._state_lock:
                    self._state.pop(gone, None)

    # -- get_request_state (service thread) ------------------------------------------------------
    def _on_get_state(self, request: dict) -> dict:
        rid = str(request.get("request_id", ""))
        with self._state_lock:
            rec = self._state.get(rid)
            if rec is None:
                return {"found": False}
            return {"found": True, "status": dict(rec[0]), "segments": list(rec[1])}

    # -- PlannerListener -----------------------------------------------------------------------
    def on_request_update(self, gen: Generation) -> None:
        self._publish_status(gen)

    def on_segment_result(self, gen: Generation, seg: Segment) -> None:
        self._pub_segments.publish(convert.segment_status_fields(gen, seg, now=self.clock.now()))
        self._publish_status(gen)

    def on_segment_dispatched(self, gen: Generation, seg: Segment) -> None:
        self._pub_segments.publish(convert.segment_status_fields(gen, seg, now=self.clock.now()))
        if gen.gen_id in self._state:
            self._remember(gen.gen_id, {}, ended=False, segment=seg.text)
        robot = gen.request.robot_id
        if not moves(seg.calls):
            return
        if self._path_request.get(robot) != gen.gen_id:  # a new plan: a new path from the last pose
            self._path_request[robot] = gen.gen_id
            start = self._poses.get(robot, Pose())
            self._paths[robot] = [{"x": start.x, "y": start.y, "z": start.z}]
        pts, self._poses[robot] = path_points(seg.calls, self._poses.get(robot, Pose()))
        self._paths[robot].extend(pts)
        self._markers_dirty = True

    def _publish_status(self, gen: Generation) -> None:
        """On every change, until the terminal status: that one is the last message a request
        gets (results that come back after a cancel or a failure change nothing for it)."""
        last = self._last_status.get(gen.gen_id)
        if last is not None and last[0]:
            return
        st = convert.request_status_fields(gen)
        key = (st["terminal"], st["state"], st["segments_dispatched"], st["segments_done"], st["reason"])
        if last == key:
            return
        self._last_status[gen.gen_id] = key
        self._remember(gen.gen_id, st, ended=key[0])  # terminal: kept while among the newest ended
        self._pub_status.publish(st)

    # -- periodic ------------------------------------------------------------------------------
    def _publish_periodic(self) -> None:
        st = self.planner.status()
        self._pub_planner.publish(convert.planner_status_fields(
            {"queues": st.counts, "batch_size": st.batch_size, "kv_usage": st.kv_usage,
             "tokens_per_s": st.tokens_per_s, "accrued_utility": st.accrued_utility}))
        self._pub_diag.publish(self.diagnostics(st))

    def diagnostics(self, st: Any) -> dict:
        waiting = st.counts.get(GenState.QUEUED.value, 0)
        level, msg = DIAG_OK, "serving"
        if not st.engine_healthy:
            level, msg = DIAG_ERROR, "engine unavailable"
        elif st.deadline_misses:
            level, msg = DIAG_WARN, f"{st.deadline_misses} first segments after their ERT"
        values = {"policy": self.planner.policy.name, "batching": _batching_label(self.planner.batcher),
                  "accepting": self._accepting, "queued": waiting, "batch_size": st.batch_size,
                  "kv_usage": f"{st.kv_usage:.3f}",
                  "tokens_per_s": f"{st.tokens_per_s:.1f}", "accrued_utility": f"{st.accrued_utility:.3f}",
                  "submitted": st.submitted, "rejected": st.rejected + self.rejected_total,
                  "deadline_misses": st.deadline_misses}
        values.update({f"state_{k}": v for k, v in st.counts.items()})
        status = [{"level": level, "name": "timelyllm: planner", "message": msg, "hardware_id": "timelyllm",
                   "values": [{"key": k, "value": str(v)} for k, v in values.items()]}]
        for robot in self.dispatcher.robots():
            ready = self.dispatcher.client(robot).server_is_ready()
            status.append({"level": DIAG_OK if ready else DIAG_WARN, "name": f"timelyllm: executor {robot}",
                           "message": "action server available" if ready else "no action server",
                           "hardware_id": robot, "values": []})
        return {"header": {"stamp": convert.time_fields(), "frame_id": ""}, "status": status}

    def _publish_markers(self) -> None:
        self._markers_dirty = False
        markers = []
        for i, (robot, pts) in enumerate(sorted(self._paths.items())):
            hue = (i * 0.61803) % 1.0
            markers.append({
                "header": {"stamp": convert.time_fields(), "frame_id": self.config.frame_id},
                "ns": robot, "id": 0, "type": 4, "action": 0,  # LINE_STRIP, ADD
                "pose": {"orientation": {"w": 1.0}},
                "scale": {"x": 0.03}, "color": {"r": hue, "g": 1.0 - hue, "b": 0.5, "a": 1.0},
                "points": [dict(p) for p in pts],
            })
        self._pub_markers.publish({"markers": markers})

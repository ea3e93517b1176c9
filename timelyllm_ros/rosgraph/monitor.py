"""What an operator sees of a running ROS graph, rebuilt from its topics only.

`GraphMonitor` subscribes (over the transport port) to the agents' `plan_requests`, the planner's
`request_status`, `segment_status`, `planner_status` and `/diagnostics`, and rebuilds from them
the core `Generation` records the in-process demo reads from its planner: the request as the
agent published it (its stamp is the arrival), each segment's generation / dispatch / execution
times as the planner published them, the state and reason of the last RequestStatus.  So the live
table, `core.metrics.summarize` and the Fig. 6 timeline are computed by the same code in both
demo modes, here from what crossed DDS.

Times are seconds since `t0`, a wall-clock epoch (ROS stamps are wall time; every process of the
graph runs on this machine).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from timelyllm_ros.core.types import Generation, GenState, PlanRequest, RequestError
from timelyllm_ros.ros import convert
from timelyllm_ros.ros import interfaces
from timelyllm_ros.ros import walker
from timelyllm_ros.serve import Progress, drain_eta
from timelyllm_ros.transport.base import QOS_LATCHED, QOS_RELIABLE_DEEP, Fields, Transport, join_name

TERMINAL = {s.value for s in GenState if s.terminal} | {"rejected"}


@dataclass
class _Request:
    fields: Fields  # PlanRequest as published
    arrival: float  # its stamp, seconds since t0
    status: Fields | None = None  # last RequestStatus
    status_at: float | None = None  # when that status was stamped (s since t0)
    segments: dict[int, Fields] = field(default_factory=dict)  # index -> last SegmentStatus
    forced: tuple[str, str] | None = None  # (state, reason) set here: no terminal status came


class GraphMonitor:
    def __init__(self, transport: Transport, *, t0: float, planner_ns: str = "/") -> None:
        self.t0 = t0
        self._lock = threading.Lock()
        self._requests: dict[str, _Request] = {}
        self._early: dict[str, list[tuple[str, Fields]]] = {}  # status before its request was seen
        self.planner_status: Fields | None = None
        self.diagnostics: Fields | None = None
        self.status_messages = 0
        ns = planner_ns
        self._subs = [
            transport.subscribe(join_name(ns, "plan_requests"), interfaces.PLAN_REQUEST, self._on_request,
                                qos=QOS_RELIABLE_DEEP),
            transport.subscribe(join_name(ns, "request_status"), interfaces.REQUEST_STATUS, self._on_status,
                                qos=QOS_RELIABLE_DEEP),
            transport.subscribe(join_name(ns, "segment_status"), interfaces.SEGMENT_STATUS, self._on_segment,
                                qos=QOS_RELIABLE_DEEP),
            transport.subscribe(join_name(ns, "planner_status"), interfaces.PLANNER_STATUS, self._on_planner,
                                qos=QOS_LATCHED),
            transport.subscribe("/diagnostics", interfaces.DIAGNOSTIC_ARRAY, self._on_diagnostics),
        ]

    def close(self) -> None:
        for s in self._subs:
            s.close()

    def matched(self) -> dict[str, int]:
        """Publishers matched per subscription (discovery check before the first request)."""
        return {name: s.matched_count() for name, s in zip(
            ("plan_requests", "request_status", "segment_status", "planner_status", "diagnostics"), self._subs)}

    # -- callbacks (transport threads) ------------------------------------------------------------
    def _since_t0(self, stamp: Fields) -> float:
        return convert.time_from_fields(stamp) - self.t0

    def _on_request(self, m: Fields) -> None:
        rid = str(m.get("request_id", ""))
        with self._lock:
            if rid in self._requests:
                return  # a duplicate id: the planner answers it; the first one is the request
            self._requests[rid] = _Request(m, self._since_t0(m["stamp"]))
            early = self._early.pop(rid, [])
        for kind, f in early:
            (self._on_status if kind == "status" else self._on_segment)(f)

    def _park(self, kind: str, m: Fields) -> bool:
        """Keep a message whose request was not seen yet (DDS orders per topic, not across)."""
        rid = str(m.get("request_id", ""))
        if rid in self._requests:
            return False
        self._early.setdefault(rid, []).append((kind, m))
        return True

    def _on_status(self, m: Fields) -> None:
        with self._lock:
            self.status_messages += 1
            if self._park("status", m):
                return
            r = self._requests[str(m["request_id"])]
            if r.status is not None and r.status["terminal"]:
                return  # the first terminal status is the one that counts
            r.status, r.status_at = m, self._since_t0(m["stamp"])

    def _on_segment(self, m: Fields) -> None:
        with self._lock:
            if self._park("segment", m):
                return
            r = self._requests[str(m["request_id"])]
            old = r.segments.get(int(m["index"]))
            if old is None or not old["done"]:
                r.segments[int(m["index"])] = m

    def _on_planner(self, m: Fields) -> None:
        self.planner_status = m

    def _on_diagnostics(self, m: Fields) -> None:
        if any(s.get("name") == "timelyllm: planner" for s in m.get("status", ())):
            self.diagnostics = m

    # -- views -----------------------------------------------------------------------------------
    def request_ids(self) -> list[str]:
        with self._lock:
            return list(self._requests)

    def state(self, rid: str) -> str | None:
        with self._lock:
            r = self._requests.get(rid)
            if r is None:
                return None
            if r.forced:
                return r.forced[0]
            return None if r.status is None else str(r.status["state"])

    def terminal(self, rid: str) -> bool:
        return self.state(rid) in TERMINAL

    def executors_ready(self) -> set[str]:
        """Robots whose action server the planner reports available (its /diagnostics)."""
        d = self.diagnostics or {}
        prefix = "timelyllm: executor "
        return {s["name"][len(prefix):] for s in d.get("status", ())
                if s.get("name", "").startswith(prefix) and s.get("message") == "action server available"}

    def give_up(self, rid: str, reason: str) -> None:
        """Report a request that got no terminal status as failed, with the reason (never dropped)."""
        with self._lock:
            r = self._requests.get(rid)
            if r is not None and not (r.status is not None and r.status["terminal"]):
                r.forced = ("failed", reason)

    def add_missing(self, fields: Fields, reason: str) -> None:
        """A request the agents were to publish but that never showed up on plan_requests:
        reported failed with the reason, from the fields it should have had."""
        rid = str(fields.get("request_id", ""))
        with self._lock:
            if rid not in self._requests:
                self._requests[rid] = _Request(fields, self._since_t0(fields["stamp"]), forced=("failed", reason))

    def rejected(self) -> list[tuple[str, str]]:
        with self._lock:
            return [(rid, str(r.status["reason"])) for rid, r in self._requests.items()
                    if r.status is not None and r.status["state"] == "rejected" and not r.forced]

    def generations(self, now: float | None = None) -> list[Generation]:
        """Every admitted (not rejected) request as a core Generation, times since t0."""
        now = time.time() - self.t0 if now is None else now
        out = []
        with self._lock:
            items = list(self._requests.values())
            for r in items:
                if r.status is not None and r.status["state"] == "rejected" and not r.forced:
                    continue
                try:
                    req = PlanRequest.from_mapping(convert.plan_request_mapping(r.fields), arrival=r.arrival)
                except (walker.MessageError, RequestError):
                    continue  # malformed: the planner answered it rejected
                g = Generation(request=req)
                for i in sorted(r.segments):
                    s = r.segments[i]
                    g.segments.append(convert.segment_from_status_fields(
                        s, arrival=self._since_t0(s["arrival"])))
                if r.forced:
                    g.state, g.reason, g.finished_at = GenState(r.forced[0]), r.forced[1], now
                elif r.status is not None:
                    g.state, g.reason = GenState(str(r.status["state"])), str(r.status["reason"])
                    g.finished_at = r.status_at if g.state.terminal else None
                g.text = "".join(s.text for s in g.segments)
                out.append(g)
        return out

    def progress(self, total: int, *, now: float, next_arrival_s: float | None, final: bool = False) -> Progress:
        """The live table's row (serve.Progress), as the in-process demo shows it."""
        gens = self.generations(now)
        ps = self.planner_status or {}
        p = Progress(total=total)
        p.done = sum(1 for g in gens if g.state.terminal) + len(self.rejected())
        p.segments = sum(1 for g in gens for s in g.segments if s.dispatched_at is not None)
        p.counts = {s.value: int(ps.get(s.value, 0)) for s in GenState if not s.terminal}
        p.batch = int(ps.get("batch_size", 0))
        p.kv_usage, p.tokens_per_s = float(ps.get("kv_usage", 0.0)), float(ps.get("tokens_per_s", 0.0))
        p.elapsed_s, p.next_arrival_s, p.final = now, next_arrival_s, final
        live = [g for g in gens if not g.state.terminal]
        p.drain_eta_s = None if final or next_arrival_s is not None else drain_eta(live, now)
        return p


__all__ = ["GraphMonitor", "TERMINAL"]

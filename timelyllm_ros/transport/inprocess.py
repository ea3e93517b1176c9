"""In-process implementation of the transport port (tests and single-process mode).

An `InProcessBus` plays the ROS graph; each `InProcessTransport` is one "node" on it with its own
namespace.  Delivery is asynchronous, like a ROS executor: each subscription and each action
client has its own serial callback worker (order kept per subscriber, a slow subscriber does not
stall the others), every accepted goal executes on its own thread (rclpy MultiThreadedExecutor +
ReentrantCallbackGroup, so cancels arrive while a goal executes).

With `wire_check` (the default) every message is serialised to CDR and read back through rosbags
on its way, using the real msg/ and action/ definitions: a field the ROS message does not have,
or a value of the wrong type, fails here as it would over DDS, and no two nodes ever share a
mutable dict.
"""

from __future__ import annotations

import logging
import queue
import threading
import traceback
from typing import Any, Callable

from .base import (
    QOS_LATCHED,
    QOS_NAMES,
    CancelCallback,
    Closer,
    SubscriptionCloser,
    ExecuteCallback,
    Fields,
    GoalCallback,
    GoalOutcome,
    GoalStatus,
    join_name,
)

log = logging.getLogger(__name__)


class TransportError(RuntimeError):
    """Misuse of the transport (type clash on a topic, bad message fields, closed transport)."""


class _SerialWorker:
    """One thread running callbacks in submission order; exceptions are logged, never lost."""

    def __init__(self, name: str) -> None:
        self._q: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._t = threading.Thread(target=self._run, name=name, daemon=True)
        self._t.start()

    def submit(self, fn: Callable[[], None]) -> None:
        self._q.put(fn)

    def _run(self) -> None:
        while True:
            fn = self._q.get()
            if fn is None:
                return
            try:
                fn()
            except Exception:  # a callback bug must not kill delivery for everyone else
                log.error("callback failed:\n%s", traceback.format_exc())

    def stop(self, wait: bool = True) -> None:
        self._q.put(None)
        if wait and threading.current_thread() is not self._t:
            self._t.join(timeout=5)


class InProcessBus:
    """The shared "graph": topics, latched values, action servers."""

    def __init__(self, *, wire_check: bool = True) -> None:
        self.wire_check = wire_check
        self.lock = threading.RLock()
        self.topic_types: dict[str, str] = {}
        self.subs: dict[str, list["_Subscription"]] = {}
        self.latched: dict[str, Fields] = {}
        self.servers: dict[str, "_ActionServer"] = {}
        self.services: dict[str, tuple[str, Callable[[Fields], Fields]]] = {}  # name -> (type, handler)
        self.published: dict[str, int] = {}  # topic -> messages published (introspection)
        self.publishers: dict[str, int] = {}  # topic -> publishers created

    def check(self, msg_type: str, fields: Fields) -> Fields:
        """Copy `fields` through CDR (wire_check) so types are checked and nothing is shared."""
        if not isinstance(fields, dict):
            raise TransportError(f"{msg_type}: message must be a field dict, got {type(fields).__name__}")
        if not self.wire_check:
            return dict(fields)
        from timelyllm_ros.ros.cdr import cdr_roundtrip

        try:
            return cdr_roundtrip(msg_type, fields)
        except KeyError as e:
            raise TransportError(f"unknown message type {msg_type!r}: {e}") from e
        except Exception as e:
            raise TransportError(f"{msg_type}: fields do not fit the message: {e}") from e

    def bind_type(self, topic: str, msg_type: str) -> None:
        with self.lock:
            known = self.topic_types.setdefault(topic, msg_type)
        if known != msg_type:
            raise TransportError(f"topic {topic} carries {known}, not {msg_type}")


class _Subscription:
    def __init__(self, topic: str, callback: Callable[[Fields], None]) -> None:
        self.topic = topic
        self.callback = callback
        self.worker = _SerialWorker(f"sub{topic}")
        self.open = True

    def deliver(self, fields: Fields) -> None:
        if self.open:
            self.worker.submit(lambda: self.open and self.callback(fields))


class _Publisher:
    def __init__(self, bus: InProcessBus, topic: str, msg_type: str, latched: bool) -> None:
        self.bus, self.topic, self.msg_type, self.latched = bus, topic, msg_type, latched

    def publish(self, fields: Fields) -> None:
        msg = self.bus.check(self.msg_type, fields)
        with self.bus.lock:
            if self.latched:
                self.bus.latched[self.topic] = msg
            subs = list(self.bus.subs.get(self.topic, ()))
            self.bus.published[self.topic] = self.bus.published.get(self.topic, 0) + 1
        for s in subs:
            s.deliver(self.bus.check(self.msg_type, msg) if len(subs) > 1 else msg)

    def matched_count(self) -> int:
        with self.bus.lock:
            return len(self.bus.subs.get(self.topic, ()))



class _ServerGoal:
    """Server-side goal handle with rcl_action's state machine (EXECUTING/CANCELING -> terminal)."""

    def __init__(self, server: "_ActionServer", request: Fields, client: "_ClientGoal") -> None:
        self._server, self._request, self._client = server, request, client
        self._lock = threading.Lock()
        self._state = "executing"  # executing | canceling | succeeded | aborted | canceled

    @property
    def request(self) -> Fields:
        return self._request

    @property
    def is_cancel_requested(self) -> bool:
        return self._state == "canceling"

    @property
    def is_active(self) -> bool:
        return self._state in ("executing", "canceling")

    def publish_feedback(self, feedback: Fields) -> None:
        fb = self._server.bus.check(self._server.action_type + "_Feedback", feedback)
        if self.is_active:
            self._client.feedback(fb)

    def executing(self) -> None:
        """No ACCEPTED state here: a goal is executing from its acceptance."""

    def _terminal(self, new: str) -> None:
        with self._lock:
            if self._state not in ("executing", "canceling"):
                raise RuntimeError(f"goal already {self._state}; cannot become {new}")
            if new == "canceled" and self._state != "canceling":
                raise RuntimeError("goal cannot be canceled: no cancel was requested")
            self._state = new

    def succeed(self) -> None:
        self._terminal("succeeded")

    def abort(self) -> None:
        self._terminal("aborted")

    def canceled(self) -> None:
        self._terminal("canceled")

    def request_cancel(self) -> bool:
        with self._lock:
            if self._state != "executing":
                return False
        cb = self._server.cancel_callback
        try:
            ok = True if cb is None else bool(cb(self))
        except Exception:
            log.error("cancel callback failed:\n%s", traceback.format_exc())
            ok = False
        if ok:
            with self._lock:
                if self._state == "executing":
                    self._state = "canceling"
        return ok

    def run(self, execute: ExecuteCallback) -> None:
        result: Fields | None = None
        error = ""
        try:
            raw = execute(self)
            result = self._server.bus.check(self._server.action_type + "_Result", raw or {})
        except Exception as e:
            log.error("execute callback of %s failed:\n%s", self._server.name, traceback.format_exc())
            error = f"execute callback raised {type(e).__name__}: {e}"
            result = self._server.bus.check(self._server.action_type + "_Result", {})
        if self.is_active:  # rclpy: "Goal state not set, assuming aborted"
            if not error:
                error = "execute callback returned without a terminal state (assumed aborted)"
            with self._lock:
                self._state = "aborted"
        status = {"succeeded": GoalStatus.SUCCEEDED, "aborted": GoalStatus.ABORTED,
                  "canceled": GoalStatus.CANCELED}[self._state]
        self._client.finish(GoalOutcome(status, result, error))


class _ActionServer:
    def __init__(self, bus: InProcessBus, name: str, action_type: str, execute: ExecuteCallback,
                 goal_callback: GoalCallback | None, cancel_callback: CancelCallback | None) -> None:
        self.bus, self.name, self.action_type = bus, name, action_type
        self.execute, self.goal_callback, self.cancel_callback = execute, goal_callback, cancel_callback
        self.goals: set[_ServerGoal] = set()
        self.lock = threading.Lock()

    def handle_goal(self, request: Fields, client: "_ClientGoal",
                    on_decided: Callable[[bool], None] | None = None) -> _ServerGoal | None:
        try:
            accepted = True if self.goal_callback is None else bool(self.goal_callback(request))
        except Exception:
            log.error("goal callback of %s failed:\n%s", self.name, traceback.format_exc())
            accepted = False
        if on_decided is not None:  # the goal response precedes any feedback or result (as in ROS)
            on_decided(accepted)
        if not accepted:
            return None
        goal = _ServerGoal(self, request, client)
        with self.lock:
            self.goals.add(goal)

        def run() -> None:
            try:
                goal.run(self.execute)
            finally:
                with self.lock:
                    self.goals.discard(goal)

        threading.Thread(target=run, name=f"goal{self.name}", daemon=True).start()
        return goal


class _ClientGoal:
    """Client-side goal: every callback goes through the client's serial worker, and exactly one
    `on_result` is delivered."""

    def __init__(self, client: "_ActionClient", on_result: Callable[[GoalOutcome], None],
                 on_feedback: Callable[[Fields], None] | None) -> None:
        self._client, self._on_result, self._on_feedback = client, on_result, on_feedback
        self._server_goal: _ServerGoal | None = None
        self._done = False
        self._cancel_pending = False
        self._lock = threading.Lock()

    def attach(self, server_goal: _ServerGoal) -> None:
        with self._lock:
            self._server_goal = server_goal
            cancel = self._cancel_pending
        if cancel:
            server_goal.request_cancel()

    def feedback(self, fb: Fields) -> None:
        if self._on_feedback is not None:
            cb = self._on_feedback
            self._client.worker.submit(lambda: cb(fb))

    def finish(self, outcome: GoalOutcome) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        self._client.worker.submit(lambda: self._on_result(outcome))

    def cancel(self) -> None:
        with self._lock:
            g = self._server_goal
            if g is None:
                self._cancel_pending = True
                return
        g.request_cancel()


class _ActionClient:
    def __init__(self, bus: InProcessBus, name: str, action_type: str) -> None:
        self.bus, self.name, self.action_type = bus, name, action_type
        self.worker = _SerialWorker(f"client{name}")

    def server_is_ready(self) -> bool:
        with self.bus.lock:
            return self.name in self.bus.servers

    def send_goal(self, goal: Fields, *, on_result: Callable[[GoalOutcome], None],
                  on_feedback: Callable[[Fields], None] | None = None,
                  on_accepted: Callable[[bool], None] | None = None) -> _ClientGoal:
        request = self.bus.check(self.action_type + "_Goal", goal)
        cg = _ClientGoal(self, on_result, on_feedback)
        with self.bus.lock:
            server = self.bus.servers.get(self.name)
        if server is None or server.action_type != self.action_type:
            why = f"no action server {self.name}" if server is None else \
                f"action server {self.name} serves {server.action_type}, not {self.action_type}"
            if on_accepted is not None:
                self.worker.submit(lambda: on_accepted(False))
            cg.finish(GoalOutcome(GoalStatus.REJECTED, None, why))
            return cg
        decided = None if on_accepted is None else (lambda ok: self.worker.submit(lambda: on_accepted(ok)))
        sg = server.handle_goal(request, cg, decided)
        if sg is None:
            cg.finish(GoalOutcome(GoalStatus.REJECTED, None, f"goal rejected by {self.name}"))
        else:
            cg.attach(sg)
        return cg

    def close(self) -> None:
        self.worker.stop(wait=False)


class _InProcessDeferred:
    def __init__(self, goal: _ServerGoal) -> None:
        self._goal = goal
        self.done = threading.Event()
        self.outcome: tuple[GoalStatus, Fields] | None = None
        self._lock = threading.Lock()

    @property
    def request(self) -> Fields:
        return self._goal.request

    @property
    def is_cancel_requested(self) -> bool:
        return self._goal.is_cancel_requested

    def publish_feedback(self, feedback: Fields) -> None:
        if not self.done.is_set():
            self._goal.publish_feedback(feedback)

    def finish(self, status: GoalStatus, result: Fields) -> None:
        with self._lock:
            if self.outcome is not None:
                return
            self.outcome = (status, result)
        self.done.set()


class InProcessTransport:
    """One node on an `InProcessBus` (a private bus when none is given)."""

    def __init__(self, bus: InProcessBus | None = None, namespace: str = "", *, wire_check: bool = True) -> None:
        self.bus = bus if bus is not None else InProcessBus(wire_check=wire_check)
        self.namespace = namespace
        self._handles: list[Any] = []
        self._closed = False

    def resolve(self, name: str) -> str:
        return join_name(self.namespace, name)

    def _track(self, h: Any) -> Any:
        if self._closed:
            raise TransportError("transport is closed")
        self._handles.append(h)
        return h

    def publisher(self, topic: str, msg_type: str, *, qos: str = "default") -> _Publisher:
        if qos not in QOS_NAMES:
            raise TransportError(f"unknown QoS {qos!r}; known: {QOS_NAMES}")
        topic = self.resolve(topic)
        self.bus.bind_type(topic, msg_type)
        with self.bus.lock:
            self.bus.publishers[topic] = self.bus.publishers.get(topic, 0) + 1
        return _Publisher(self.bus, topic, msg_type, latched=qos == QOS_LATCHED)

    def publish(self, topic: str, msg_type: str, fields: Fields, *, qos: str = "default") -> None:
        self.publisher(topic, msg_type, qos=qos).publish(fields)

    def subscribe(self, topic: str, msg_type: str, callback: Callable[[Fields], None], *,
                  qos: str = "default") -> Closer:
        if qos not in QOS_NAMES:
            raise TransportError(f"unknown QoS {qos!r}; known: {QOS_NAMES}")
        topic = self.resolve(topic)
        self.bus.bind_type(topic, msg_type)
        sub = _Subscription(topic, callback)
        with self.bus.lock:
            self.bus.subs.setdefault(topic, []).append(sub)
            last = self.bus.latched.get(topic) if qos == QOS_LATCHED else None
        if last is not None:
            sub.deliver(self.bus.check(msg_type, last))

        def close() -> None:
            sub.open = False
            with self.bus.lock:
                if sub in self.bus.subs.get(topic, []):
                    self.bus.subs[topic].remove(sub)
            sub.worker.stop(wait=False)

        return self._track(SubscriptionCloser(close, matched=lambda: self.bus.publishers.get(topic, 0)))

    def action_client(self, name: str, action_type: str) -> _ActionClient:
        return self._track(_ActionClient(self.bus, self.resolve(name), action_type))

    def action_server(self, name: str, action_type: str, execute: ExecuteCallback, *,
                      goal_callback: GoalCallback | None = None,
                      cancel_callback: CancelCallback | None = None) -> Closer:
        name = self.resolve(name)
        server = _ActionServer(self.bus, name, action_type, execute, goal_callback, cancel_callback)
        with self.bus.lock:
            if name in self.bus.servers:
                raise TransportError(f"action server {name} already exists")
            self.bus.servers[name] = server

        def close() -> None:
            with self.bus.lock:
                if self.bus.servers.get(name) is server:
                    del self.bus.servers[name]

        return self._track(Closer(close))

    def deferred_action_server(self, name: str, action_type: str, on_goal: Callable[[Any], None], *,
                               cancel_callback: Callable[[Any], bool] | None = None) -> Closer:
        """In-process: one waiting thread per goal (not for scale; the rclpy one holds none)."""

        def execute(goal: _ServerGoal) -> Fields:
            d = _InProcessDeferred(goal)
            on_goal(d)
            d.done.wait()
            status, result = d.outcome  # type: ignore[misc]
            if status == GoalStatus.SUCCEEDED:
                goal.succeed()
            elif status == GoalStatus.CANCELED and goal.is_cancel_requested:
                goal.canceled()
            else:
                goal.abort()
            return result

        cancel = None if cancel_callback is None else (lambda g: cancel_callback(_InProcessDeferred(g)))
        return self.action_server(name, action_type, execute, cancel_callback=cancel)

    def service(self, name: str, srv_type: str, handler: Callable[[Fields], Fields]) -> Closer:
        name = self.resolve(name)
        with self.bus.lock:
            if name in self.bus.services:
                raise TransportError(f"service {name} already exists")
            self.bus.services[name] = (srv_type, handler)

        def close() -> None:
            with self.bus.lock:
                if self.bus.services.get(name, (None, None))[1] is handler:
                    del self.bus.services[name]

        return self._track(Closer(close))

    def call_service(self, name: str, srv_type: str, request: Fields, timeout_s: float = 5.0, *,
                     resend_s: float = 0.0) -> Fields | None:
        """Call a service on the bus (the handler runs on the caller's thread); None if none serves
        it.  A handler that raises answers the default response, as over ROS.  The bus loses no
        answer, so `resend_s` never applies."""
        name = self.resolve(name)
        with self.bus.lock:
            entry = self.bus.services.get(name)
        if entry is None:
            return None
        try:
            response = entry[1](self.bus.check(srv_type + "_Request", dict(request)))
            return self.bus.check(srv_type + "_Response", response or {})
        except Exception:
            log.error("service %s failed:\n%s", name, traceback.format_exc())
            return self.bus.check(srv_type + "_Response", {})

    def timer(self, period_s: float, callback: Callable[[], None]) -> Closer:
        if not period_s > 0:
            raise TransportError(f"timer period must be > 0, got {period_s}")
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(period_s):
                try:
                    callback()
                except Exception:
                    log.error("timer callback failed:\n%s", traceback.format_exc())

        threading.Thread(target=loop, name="timer", daemon=True).start()
        return self._track(Closer(stop.set))

    def close(self) -> None:
        if self._closed:
            return
        for h in reversed(self._handles):
            try:
                h.close()
            except Exception:
                log.error("closing %r failed:\n%s", h, traceback.format_exc())
        self._handles.clear()
        self._closed = True

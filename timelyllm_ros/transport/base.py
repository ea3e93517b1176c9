"""The transport port: topics, actions and timers, the only ROS-shaped surface nodes touch.

Nodes are written against this port so the same node code runs over rclpy (a real ROS 2 graph)
and over the in-process implementation (tests, single-process mode).  Messages cross the port as
*field dicts* shaped like the ROS interfaces (see `timelyllm_ros.ros.convert`); `msg_type` is the
ROS type name, e.g. "timelyllm/msg/PlanRequest" or "timelyllm/action/ExecuteSegment".

The action half mirrors rclpy's semantics on purpose (goal/cancel callbacks, a server goal handle
with publish_feedback / is_cancel_requested / succeed / abort / canceled, "execute callback
returned without a terminal state" = aborted) so in-process tests exercise what rclpy would do.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

Fields = dict[str, Any]

# QoS names the port understands; each implementation maps them to its own profiles.
QOS_DEFAULT = "default"  # reliable, keep last 10
QOS_RELIABLE_DEEP = "reliable_deep"  # reliable, keep last 1000: requests/results must not be dropped
QOS_LATCHED = "latched"  # reliable, transient local, keep last 1: late joiners get the last value
QOS_SENSOR = "sensor"  # best effort, keep last 5
# reliable, transient local, keep last STATUS_HISTORY: a late subscriber that asks for transient
# local gets the recent messages (request_status); volatile subscribers are served as with
# reliable_deep.  In-process: as reliable_deep (no replay).
QOS_HISTORY = "history"
STATUS_HISTORY = 1000
# reliable, keep all: nothing is overwritten in a history; a reader that falls behind
# back-pressures its writers (their publish blocks) instead of losing samples -- plan requests
QOS_RELIABLE_ALL = "reliable_all"
QOS_NAMES = (QOS_DEFAULT, QOS_RELIABLE_DEEP, QOS_LATCHED, QOS_SENSOR, QOS_HISTORY, QOS_RELIABLE_ALL)


class GoalStatus(enum.Enum):
    """Terminal status of an action goal as the client sees it (action_msgs/GoalStatus)."""

    SUCCEEDED = "succeeded"
    ABORTED = "aborted"
    CANCELED = "canceled"
    REJECTED = "rejected"  # the server refused the goal, or there is no server
    UNKNOWN = "unknown"  # transport failure: the result could not be obtained


@dataclass(frozen=True, slots=True)
class GoalOutcome:
    status: GoalStatus
    result: Fields | None = None  # the action's Result fields (None when rejected/unknown)
    error: str = ""  # transport-level reason (no server, exception in the server, ...)


class ServerGoalHandle(Protocol):
    """What an action server's execute callback gets (same surface as rclpy's)."""

    @property
    def request(self) -> Fields: ...

    @property
    def is_cancel_requested(self) -> bool: ...

    def publish_feedback(self, feedback: Fields) -> None: ...

    def executing(self) -> None:
        """The goal starts now (until here it waited its turn, ACCEPTED); call once, before the
        work; later calls are ignored."""
        ...

    def succeed(self) -> None: ...

    def abort(self) -> None: ...

    def canceled(self) -> None: ...


ExecuteCallback = Callable[[ServerGoalHandle], Fields]
GoalCallback = Callable[[Fields], bool]  # True = accept
CancelCallback = Callable[[ServerGoalHandle], bool]  # True = accept the cancel request


class ClientGoal(Protocol):
    """Handle of a goal sent by an action client."""

    def cancel(self) -> None:
        """Ask the server to cancel (asynchronous; the outcome still arrives via on_result)."""
        ...


class ActionClient(Protocol):
    def server_is_ready(self) -> bool: ...

    def send_goal(self, goal: Fields, *, on_result: Callable[[GoalOutcome], None],
                  on_feedback: Callable[[Fields], None] | None = None,
                  on_accepted: Callable[[bool], None] | None = None) -> ClientGoal:
        """Send a goal; exactly one `on_result` call follows, whatever happens (rejection and
        transport failures included)."""
        ...

    def close(self) -> None:
        """Drop the client (idempotent; the transport closes the ones still open)."""
        ...


class DeferredGoal(Protocol):
    """An accepted goal that is answered later, from any thread, without holding a thread while
    it waits (an action that follows work done elsewhere: the planner's PlanTask)."""

    @property
    def request(self) -> Fields: ...

    @property
    def is_cancel_requested(self) -> bool: ...

    def publish_feedback(self, feedback: Fields) -> None: ...

    def finish(self, status: GoalStatus, result: Fields) -> None:
        """End the goal SUCCEEDED, ABORTED or CANCELED (CANCELED only after a cancel request)
        with `result`; later calls are ignored."""
        ...


ServiceHandler = Callable[[Fields], Fields]  # request fields -> response fields


class Handle(Protocol):
    def close(self) -> None: ...


class Publisher(Protocol):
    def publish(self, fields: Fields) -> None: ...

    def matched_count(self) -> int:
        """Subscriptions matched with this publisher now (0 until discovery has found them;
        a message published before that is not delivered to them)."""
        ...


class Subscription(Protocol):
    def close(self) -> None: ...

    def matched_count(self) -> int:
        """Publishers matched with this subscription now."""
        ...


class Transport(Protocol):
    def publisher(self, topic: str, msg_type: str, *, qos: str = QOS_DEFAULT) -> Publisher: ...

    def subscribe(self, topic: str, msg_type: str, callback: Callable[[Fields], None], *,
                  qos: str = QOS_DEFAULT) -> Subscription: ...

    def action_client(self, name: str, action_type: str) -> ActionClient: ...

    def service(self, name: str, srv_type: str, handler: ServiceHandler) -> Handle:
        """Serve `srv_type` (e.g. "timelyllm/srv/GetGoalStates") at `name`; `handler` maps the
        request's fields to the response's (an exception answers the default response)."""
        ...

    def call_service(self, name: str, srv_type: str, request: Fields, timeout_s: float = 5.0, *,
                     resend_s: float = 0.0) -> Fields | None:
        """Call a service: the response's fields, or None if no server answered within
        `timeout_s` (no server, server gone, transport failure).  `resend_s` > 0, for queries only
        (a request the server may handle twice): while no answer came, the request is sent again
        every `resend_s` (over DDS a new client's first request can be answered before the server
        has matched the client's reader, and that answer is lost); the first answer is returned."""
        ...

    def action_server(self, name: str, action_type: str, execute: ExecuteCallback, *,
                      goal_callback: GoalCallback | None = None,
                      cancel_callback: CancelCallback | None = None) -> Handle: ...

    def deferred_action_server(self, name: str, action_type: str, on_goal: Callable[[DeferredGoal], None], *,
                               cancel_callback: Callable[[DeferredGoal], bool] | None = None) -> Handle:
        """An action server that accepts every goal and hands it to `on_goal`, which must return
        at once; the goal stays active until its `finish`."""
        ...

    def timer(self, period_s: float, callback: Callable[[], None]) -> Handle: ...

    def close(self) -> None: ...


def join_name(namespace: str, name: str) -> str:
    """ROS-style name resolution for relative names: ("drone1", "execute_segment") ->
    "/drone1/execute_segment"; absolute names are kept."""
    if name.startswith("/"):
        return name
    ns = "/" + namespace.strip("/") if namespace.strip("/") else ""
    return f"{ns}/{name}"


@dataclass
class Closer:
    """A Handle made of a close function (idempotent)."""

    fn: Callable[[], None]
    closed: bool = field(default=False)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.fn()


@dataclass
class SubscriptionCloser(Closer):
    """A Subscription made of a close function and a matched-publishers count."""

    matched: Callable[[], int] = lambda: 0

    def matched_count(self) -> int:
        return int(self.matched())

"""The transport port over rclpy (a real ROS 2 graph).

One `RclpyTransport` = one rclpy Node spun by a MultiThreadedExecutor on a background thread.
Actions and timers share one ReentrantCallbackGroup: an action server's execute callback can then
run for seconds while cancel requests, other goals, subscriptions and timers are served on other
threads.  Each subscription has its own mutually exclusive group, so its messages are handled one
at a time in arrival order (as the in-process transport does).

Field dicts are turned into the generated message classes and back by
`timelyllm_ros.ros.message_fields` (from the classes' own type information; the input is never
mutated).  An exception in a callback is logged and the node keeps serving; `close()` stops and
joins the spin thread before the node and the context go away.  rclpy is imported lazily: this
module imports without ROS, and `RclpyTransport` raises a clear error when rclpy is missing.

rclpy comes from the ROS 2 Jazzy wheels on PyPI that `make env` installs into `.venv` (with this
package's interfaces built by rosidl); tests_ros2/ runs nodes in separate processes over DDS.

Why ~650 lines in one file: it implements one port (transport/base.py) on one rclpy node; topics,
actions (servers with their goal threads, clients), services, timers and lifecycle share the node,
its executor and its callback groups.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from typing import Any, Callable

from timelyllm_ros.ros.message_fields import from_msg, message_class, to_msg

from .base import (
    QOS_DEFAULT,
    QOS_HISTORY,
    QOS_LATCHED,
    QOS_NAMES,
    QOS_RELIABLE_ALL,
    QOS_RELIABLE_DEEP,
    QOS_SENSOR,
    STATUS_HISTORY,
    CancelCallback,
    Closer,
    SubscriptionCloser,
    ExecuteCallback,
    Fields,
    GoalCallback,
    GoalOutcome,
    GoalStatus,
)

log = logging.getLogger(__name__)

__all__ = ["RclpyTransport", "RclpyUnavailable", "from_msg", "message_class", "to_msg"]


class RclpyUnavailable(ImportError):
    """rclpy (ROS 2) is not installed in this Python."""


def _rclpy():
    try:
        import rclpy  # noqa: F401
        import rclpy.action  # noqa: F401
        import rclpy.callback_groups  # noqa: F401
        import rclpy.executors  # noqa: F401
        import rclpy.node  # noqa: F401
        import rclpy.qos  # noqa: F401
    except ImportError as e:
        raise RclpyUnavailable(
            "rclpy is not importable in this Python: run `make env` (it installs the ROS 2 Jazzy "
            "wheels and this package's interfaces into .venv) and use .venv/bin/python or "
            f".venv/bin/timelyllm. Original error: {e}") from e
    return rclpy


def _guarded(what: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """A callback that logs its exception instead of raising it into the executor (rclpy's
    executor re-raises it from spin(), which would end the spin thread: a live but deaf node)."""

    def call(*args: Any) -> Any:
        try:
            return fn(*args)
        except Exception:
            log.exception("%s callback failed", what)
            return None

    return call


def qos_profile(name: str) -> Any:
    from rclpy.qos import (
        DurabilityPolicy,
        HistoryPolicy,
        QoSProfile,
        ReliabilityPolicy,
        qos_profile_sensor_data,
    )

    if name == QOS_DEFAULT:
        return QoSProfile(depth=10)
    if name == QOS_RELIABLE_DEEP:
        return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1000, reliability=ReliabilityPolicy.RELIABLE)
    if name == QOS_RELIABLE_ALL:
        return QoSProfile(history=HistoryPolicy.KEEP_ALL, reliability=ReliabilityPolicy.RELIABLE)
    if name == QOS_LATCHED:
        return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1, reliability=ReliabilityPolicy.RELIABLE,
                          durability=DurabilityPolicy.TRANSIENT_LOCAL)
    if name == QOS_HISTORY:
        return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=STATUS_HISTORY,
                          reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
    if name == QOS_SENSOR:
        return qos_profile_sensor_data
    raise ValueError(f"unknown QoS {name!r}; known: {QOS_NAMES}")


def _managed_node_class() -> Any:
    """A LifecycleNode whose transitions run the handlers given to RclpyTransport.on_transitions."""
    from rclpy.lifecycle import LifecycleNode, TransitionCallbackReturn

    class ManagedNode(LifecycleNode):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.handlers: dict[str, Callable[[], None]] = {}
            self.error = ""
            self.log_failures = True  # False: the caller reports `error` itself (autostart)
            super().__init__(*args, **kwargs)
            # rclpy raises out of change_state for a transition the current state does not have,
            # so the caller never gets an answer: answer success=False instead (as rclcpp does)
            srv = self._service_change_state
            change = srv.callback

            def change_state(request: Any, response: Any) -> Any:
                try:
                    return change(request, response)
                except Exception as e:  # noqa: BLE001 - RCLError: no such transition from here
                    log.warning("%s: change_state %d refused: %s", self.get_fully_qualified_name(),
                                request.transition.id, str(e).splitlines()[0] if str(e) else type(e).__name__)
                    response.success = False
                    return response

            srv.callback = change_state

        @property
        def state(self) -> str:
            return str(self._state_machine.current_state[1])

        def _run(self, *names: str) -> Any:
            for name in names:
                fn = self.handlers.get(name)
                if fn is None:
                    continue
                try:
                    fn()
                except Exception as e:  # noqa: BLE001 - the transition fails, the node lives on
                    self.error = str(e).splitlines()[0] if str(e) else type(e).__name__
                    if not isinstance(e, ValueError):  # InputError/ConfigError: the line says it all
                        log.exception("%s failed", name)
                    elif self.log_failures:
                        log.error("%s: %s failed: %s", self.get_fully_qualified_name(), name, self.error)
                    return TransitionCallbackReturn.FAILURE
            self.error = ""
            return TransitionCallbackReturn.SUCCESS

        def on_configure(self, state: Any) -> Any:
            return self._run("configure")

        def on_activate(self, state: Any) -> Any:
            return self._run("activate")

        def on_deactivate(self, state: Any) -> Any:
            return self._run("deactivate")

        def on_cleanup(self, state: Any) -> Any:
            return self._run("cleanup")

        def on_shutdown(self, state: Any) -> Any:
            # from active: stop serving first; from unconfigured nothing was built
            steps = {"active": ("deactivate", "cleanup"), "inactive": ("cleanup",)}.get(state.label, ())
            return self._run(*steps)

        def on_error(self, state: Any) -> Any:
            self._run("cleanup")
            return TransitionCallbackReturn.SUCCESS  # back to unconfigured

    return ManagedNode


_STATUS = {4: GoalStatus.SUCCEEDED, 5: GoalStatus.CANCELED, 6: GoalStatus.ABORTED}  # action_msgs/GoalStatus


class _ServerGoal:
    """Port goal handle over rclpy's ServerGoalHandle."""

    def __init__(self, handle: Any, action_cls: Any) -> None:
        self._h, self._cls = handle, action_cls
        self._request = from_msg(handle.request)

    @property
    def request(self) -> Fields:
        return self._request

    @property
    def is_cancel_requested(self) -> bool:
        return bool(self._h.is_cancel_requested)

    def publish_feedback(self, feedback: Fields) -> None:
        self._h.publish_feedback(to_msg(self._cls.Feedback, feedback))

    def succeed(self) -> None:
        self._h.succeed()

    def abort(self) -> None:
        self._h.abort()

    def canceled(self) -> None:
        self._h.canceled()


class _ThreadedGoal(_ServerGoal):
    """A goal whose execute callback runs on a thread of its own (`RclpyTransport.action_server`):
    ACCEPTED while it waits its turn, EXECUTING from `executing()`, when one executor thread starts
    waiting for its end (`run`); the terminal state it chose is applied there."""

    def __init__(self, handle: Any, action_cls: Any) -> None:
        super().__init__(handle, action_cls)
        self._lock = threading.Lock()
        self._started = False
        self._ended = threading.Event()
        self._end = "abort"
        self._result: Fields = {}
        handle._timelyllm_goal = self

    def executing(self) -> None:
        with self._lock:
            if self._started:
                return
            self._started = True
        self._h.execute()  # EXECUTING now; `run` on the executor waits for the end

    def succeed(self) -> None:
        self._end = "succeed"

    def abort(self) -> None:
        self._end = "abort"

    def canceled(self) -> None:
        self._end = "canceled"

    def work(self, execute: Callable[[Any], Fields | None]) -> None:
        try:
            self._result = execute(self) or {}
        except Exception:  # as rclpy does with an execute callback that raises
            log.exception("execute callback failed; aborting the goal")
            self._end, self._result = "abort", {}
        self._ended.set()
        self.executing()  # a goal that never started ends here

    @staticmethod
    def run(handle: Any) -> Any:
        """The server's execute callback: wait for the goal's thread, apply its terminal state."""
        g: _ThreadedGoal = handle._timelyllm_goal
        g._ended.wait()
        if g._end == "succeed":
            handle.succeed()
        elif g._end == "canceled" and handle.is_cancel_requested:
            handle.canceled()
        else:
            handle.abort()
        return to_msg(g._cls.Result, g._result)


class _DeferredGoal:
    def __init__(self, handle: Any, action_cls: Any, run: Callable[[Any], Any]) -> None:
        self._h, self._cls, self._run = handle, action_cls, run
        self._request = from_msg(handle.request)
        self._lock = threading.Lock()
        self.outcome: tuple[GoalStatus, Fields] | None = None

    @property
    def request(self) -> Fields:
        return self._request

    @property
    def is_cancel_requested(self) -> bool:
        return bool(self._h.is_cancel_requested)

    def publish_feedback(self, feedback: Fields) -> None:
        with self._lock:
            if self.outcome is not None:
                return
        try:
            self._h.publish_feedback(to_msg(self._cls.Feedback, feedback))
        except Exception as e:  # the goal ended meanwhile
            log.debug("feedback not published: %s", e)

    def finish(self, status: GoalStatus, result: Fields) -> None:
        with self._lock:
            if self.outcome is not None:
                return
            self.outcome = (status, result)
        self._h.execute(self._run)


class _ClientGoal:
    def __init__(self, on_result: Callable[[GoalOutcome], None]) -> None:
        self._on_result = on_result
        self._lock = threading.Lock()
        self._handle: Any = None  # rclpy keeps only a weak reference: hold it here
        self._cancel_pending = False
        self._done = False

    def attach(self, handle: Any) -> None:
        with self._lock:
            self._handle = handle
            cancel = self._cancel_pending
        if cancel:
            handle.cancel_goal_async()

    def finish(self, outcome: GoalOutcome) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
            self._handle = None
        try:
            self._on_result(outcome)
        except Exception:
            log.exception("action result callback failed")

    def cancel(self) -> None:
        with self._lock:
            h, done = self._handle, self._done
            if h is None and not done:
                self._cancel_pending = True
        if h is not None and not done:
            h.cancel_goal_async()


@functools.cache
def _race_free_action_client_class() -> Any:
    """rclpy's ActionClient (7.1, the Jazzy wheels here) sends a goal, cancel or result request
    and only then records its sequence number; a response handled on another executor thread in
    that window is dropped ("Ignoring unexpected goal response ...") and its future never
    completes: a goal that runs but whose result never comes (ros2/rclpy#1123, fixed upstream by
    #1308 / #1519, not in these wheels).  Here each request is sent and recorded under one lock,
    and a response is handled only after taking that lock: it is taken after its request was
    sent, so the lock is then held by that send or already released, with the number recorded."""
    from rclpy.action import ActionClient

    class RaceFreeActionClient(ActionClient):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._timelyllm_send_lock = threading.Lock()
            super().__init__(*args, **kwargs)

        def send_goal_async(self, *args: Any, **kwargs: Any) -> Any:
            with self._timelyllm_send_lock:
                return super().send_goal_async(*args, **kwargs)

        def _cancel_goal_async(self, *args: Any, **kwargs: Any) -> Any:
            with self._timelyllm_send_lock:
                return super()._cancel_goal_async(*args, **kwargs)

        def _get_result_async(self, *args: Any, **kwargs: Any) -> Any:
            with self._timelyllm_send_lock:
                return super()._get_result_async(*args, **kwargs)

        async def execute(self, taken_data: Any) -> None:
            with self._timelyllm_send_lock:  # a barrier only: callbacks below run without it
                pass
            await super().execute(taken_data)

    return RaceFreeActionClient


class _ActionClient:
    def __init__(self, t: "RclpyTransport", name: str, action_type: str) -> None:
        self._cls = message_class(action_type)
        self._client = _race_free_action_client_class()(t.node, self._cls, name, callback_group=t.group)
        self._t = t

    def server_is_ready(self) -> bool:
        return self._client is not None and bool(self._client.server_is_ready())

    def send_goal(self, goal: Fields, *, on_result: Callable[[GoalOutcome], None],
                  on_feedback: Callable[[Fields], None] | None = None,
                  on_accepted: Callable[[bool], None] | None = None) -> _ClientGoal:
        msg = to_msg(self._cls.Goal, goal)
        cg = _ClientGoal(on_result)
        # rclpy hands the FeedbackMessage (goal_id + feedback) to the callback
        fb_cb = None if on_feedback is None else _guarded("feedback", lambda m: on_feedback(from_msg(m.feedback)))

        def on_response(fut: Any) -> None:
            try:
                handle = fut.result()
            except Exception as e:
                if on_accepted:
                    on_accepted(False)
                cg.finish(GoalOutcome(GoalStatus.UNKNOWN, None, f"sending the goal failed: {e}"))
                return
            accepted = handle is not None and handle.accepted
            if on_accepted:
                on_accepted(accepted)
            if not accepted:
                cg.finish(GoalOutcome(GoalStatus.REJECTED, None, "goal rejected by the action server"))
                return
            cg.attach(handle)
            handle.get_result_async().add_done_callback(on_result_response)

        def on_result_response(fut: Any) -> None:
            try:
                resp = fut.result()  # GetResult response: status + result
                status = _STATUS.get(int(resp.status), GoalStatus.UNKNOWN)
                cg.finish(GoalOutcome(status, from_msg(resp.result),
                                      "" if status != GoalStatus.UNKNOWN else f"goal status {resp.status}"))
            except Exception as e:
                cg.finish(GoalOutcome(GoalStatus.UNKNOWN, None, f"getting the result failed: {e}"))

        self._client.send_goal_async(msg, feedback_callback=fb_cb).add_done_callback(on_response)
        return cg

    def close(self) -> None:  # idempotent: the planner may drop a client before the transport closes
        if self._client is not None:
            client, self._client = self._client, None
            self._t._between_spins(client.destroy)


class RclpyTransport:
    """One ROS 2 node (a lifecycle node with `managed=True`).  The entry scripts declare its
    parameters on `.node` (nodes/params.py); the node code itself never sees rclpy."""

    def __init__(self, node_name: str, namespace: str = "", *, args: list[str] | None = None,
                 num_threads: int | None = None, managed: bool = False) -> None:
        rclpy = _rclpy()
        from rclpy.callback_groups import ReentrantCallbackGroup
        from rclpy.executors import MultiThreadedExecutor
        from rclpy.node import Node
        from rclpy.signals import SignalHandlerOptions

        self._owns_context = False
        if not rclpy.ok():
            # the node scripts handle SIGINT/SIGTERM themselves (orderly close, exit code 0)
            rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
            self._owns_context = True
        # managed: an rclpy LifecycleNode (get_state / change_state services; `on_transitions`)
        self.node = (_managed_node_class() if managed else Node)(node_name, namespace=namespace or None)
        self.group = ReentrantCallbackGroup()
        # Execute callbacks block for a whole segment (and queued goals wait for their turn), so
        # the pool must be larger than the goals a robot may have queued, or cancel requests and
        # result requests wait for a free thread.  rclpy's default is the CPU count.
        self.executor = MultiThreadedExecutor(num_threads=num_threads or max(16, os.cpu_count() or 1))
        self.executor.add_node(self.node)
        self._publishers: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._handles: list[Any] = []
        self._stopping = threading.Event()
        # entity destroys waiting for the spin thread (`_between_spins`)
        self._destroys: list[tuple[Callable[[], None], threading.Event]] = []
        self._spin = threading.Thread(target=self._spin_loop, name=f"spin-{node_name}", daemon=True)
        self._spin.start()

    def _spin_loop(self) -> None:
        """Spin until close(); an exception from a callback is logged, never the end of the node
        (callbacks are guarded already; this also covers rclpy's own internal callbacks)."""
        from rclpy.executors import ExternalShutdownException

        while not self._stopping.is_set():
            self._run_destroys()
            try:
                self.executor.spin_once(timeout_sec=0.1)
            except ExternalShutdownException:
                return
            except Exception:
                if self._stopping.is_set():
                    return
                log.exception("a callback of node %s failed; the node keeps serving", self.node.get_name())
        self._run_destroys()

    def _run_destroys(self) -> None:
        with self._lock:
            destroys, self._destroys = self._destroys, []
        for fn, done in destroys:
            try:
                fn()
            except Exception:
                log.exception("destroying an entity of node %s failed", self.node.get_name())
            finally:
                done.set()

    def _between_spins(self, fn: Callable[[], None], timeout_s: float = 5.0) -> None:
        """Run an entity's destroy on the spin thread, between two waits.  rclpy's executor
        gathers the node's entities and then adds them to its wait set; an action server destroyed
        by another thread in between (a lifecycle cleanup, a transition from another process)
        fails that wait set with "action server pointer is invalid" (rclpy keeps an entity whose
        handle it found destroyed in its list).  Called on the spin thread itself, or once the
        spin thread has stopped, it runs at once — also where the spin thread stopped after this
        call queued it (past its last drain, at close): the caller then runs what is left."""
        if threading.current_thread() is self._spin or not self._spin.is_alive():
            fn()
            return
        done = threading.Event()
        with self._lock:
            self._destroys.append((fn, done))
        self.executor.wake()
        deadline = time.monotonic() + timeout_s
        while not done.wait(0.05):
            if not self._spin.is_alive():  # stopped past its last drain: nobody else will run it
                self._run_destroys()  # ours, unless another caller's drain took it (it sets `done`)
                done.wait(max(0.0, deadline - time.monotonic()))
                return
            if time.monotonic() > deadline:  # pragma: no cover - a spin thread stuck inside rcl
                log.warning("spin thread of %s did not run a destroy within %.1f s", self.node.get_name(), timeout_s)
                return

    # -- lifecycle (not part of the port) -----------------------------------------------------
    def on_transitions(self, **handlers: Callable[[], None]) -> None:
        """What a managed node (`managed=True`) runs on each lifecycle transition: configure,
        activate, deactivate, cleanup.  A handler that raises fails the transition (the node stays
        in its state; the one-line reason is logged and kept in `transition_error`)."""
        self.node.handlers.update(handlers)

    def transition(self, name: str) -> bool:
        """Trigger a transition from this process (autostart, orderly shutdown): configure,
        activate, deactivate, cleanup or shutdown (from any state).  True if it succeeded."""
        from rclpy.lifecycle import TransitionCallbackReturn

        if name == "shutdown" and self.node.state in ("finalized", ""):
            return True
        try:
            return getattr(self.node, f"trigger_{name}")() == TransitionCallbackReturn.SUCCESS
        except Exception as e:  # a transition not possible from this state
            self.transition_error = f"{name}: {e}"
            return False

    @property
    def transition_error(self) -> str:
        return self.node.error

    @transition_error.setter
    def transition_error(self, why: str) -> None:
        self.node.error = why

    # -- services (a handler gets the request's fields and returns the response's) --------------
    def service(self, name: str, srv_type: str, handler: Callable[[Fields], Fields]) -> Closer:
        cls = message_class(srv_type)

        def on_request(request: Any, response: Any) -> Any:
            try:
                return to_msg(cls.Response, handler(from_msg(request)) or {})
            except Exception:
                log.exception("service %s failed; answering the default response", name)
                return response

        srv = self.node.create_service(cls, name, on_request, callback_group=self.group)
        h = Closer(lambda: self._between_spins(lambda: self.node.destroy_service(srv)))
        self._handles.append(h)
        return h

    def call_service(self, name: str, srv_type: str, request: Fields, timeout_s: float = 5.0, *,
                     resend_s: float = 0.0) -> Fields | None:
        """Call a service; the response's fields, or None if no server answered within timeout_s.
        resend_s > 0 (queries only): sent again every resend_s while no answer came (Transport)."""
        import time

        cls = message_class(srv_type)
        client = self.node.create_client(cls, name, callback_group=self.group)
        futures: list[Any] = []
        try:
            end = time.monotonic() + timeout_s
            if not client.wait_for_service(timeout_sec=timeout_s):
                return None
            msg = to_msg(cls.Request, request)
            while True:
                futures.append(client.call_async(msg))
                resend_at = time.monotonic() + resend_s if resend_s > 0 else end
                while time.monotonic() < min(end, resend_at):
                    done = next((f for f in futures if f.done()), None)
                    if done is not None:
                        ok = done.exception() is None and done.result() is not None
                        return from_msg(done.result()) if ok else None
                    time.sleep(0.01)
                if time.monotonic() >= end:
                    return None
        finally:
            for f in futures:
                if not f.done():
                    f.cancel()  # no answer in time: nobody waits for it any more
            self._between_spins(lambda: self.node.destroy_client(client))

    # -- topics ------------------------------------------------------------------------------
    def publisher(self, topic: str, msg_type: str, *, qos: str = QOS_DEFAULT) -> Any:
        key = f"{topic}|{msg_type}|{qos}"
        with self._lock:
            pub = self._publishers.get(key)
            if pub is None:
                cls = message_class(msg_type)
                ros_pub = self.node.create_publisher(cls, topic, qos_profile(qos))
                pub = _Publisher(ros_pub, cls)
                self._publishers[key] = pub
        return pub

    def publish(self, topic: str, msg_type: str, fields: Fields, *, qos: str = QOS_DEFAULT) -> None:
        self.publisher(topic, msg_type, qos=qos).publish(fields)

    def subscribe(self, topic: str, msg_type: str, callback: Callable[[Fields], None], *,
                  qos: str = QOS_DEFAULT) -> Closer:
        from rclpy.callback_groups import MutuallyExclusiveCallbackGroup

        cls = message_class(msg_type)
        # its own mutually exclusive group: one message at a time, in arrival order (in the shared
        # reentrant group two messages of one topic could be handled at once, and out of order)
        sub = self.node.create_subscription(cls, topic, _guarded(f"subscription {topic}", lambda m: callback(from_msg(m))),
                                            qos_profile(qos), callback_group=MutuallyExclusiveCallbackGroup())
        h = SubscriptionCloser(lambda: self._between_spins(lambda: self.node.destroy_subscription(sub)), matched=sub.get_publisher_count)
        self._handles.append(h)
        return h

    # -- actions -----------------------------------------------------------------------------
    def action_client(self, name: str, action_type: str) -> _ActionClient:
        c = _ActionClient(self, name, action_type)
        self._handles.append(c)
        return c

    def action_server(self, name: str, action_type: str, execute: ExecuteCallback, *,
                      goal_callback: GoalCallback | None = None,
                      cancel_callback: CancelCallback | None = None) -> Closer:
        from rclpy.action import ActionServer, CancelResponse, GoalResponse

        cls = message_class(action_type)

        def on_goal(request: Any) -> Any:
            if goal_callback is None:
                return GoalResponse.ACCEPT
            try:
                return GoalResponse.ACCEPT if goal_callback(from_msg(request)) else GoalResponse.REJECT
            except Exception:
                log.exception("goal callback failed; rejecting")
                return GoalResponse.REJECT

        def on_cancel(handle: Any) -> Any:
            # rclpy's default rejects every cancel; the port's default accepts.
            if cancel_callback is None:
                return CancelResponse.ACCEPT
            try:
                return CancelResponse.ACCEPT if cancel_callback(_ServerGoal(handle, cls)) else CancelResponse.REJECT
            except Exception:
                log.exception("cancel callback failed; rejecting the cancel")
                return CancelResponse.REJECT

        def accepted(handle: Any) -> None:
            # `execute` on a thread of its own: goals queued behind a running one (a robot runs one
            # at a time) hold no executor thread, so heartbeats, services and cancels stay served
            # whatever the number of goals (they starved once every executor thread held a goal)
            g = _ThreadedGoal(handle, cls)
            threading.Thread(target=g.work, args=(execute,), name=f"goal-{name}", daemon=True).start()

        server = ActionServer(self.node, cls, name, _ThreadedGoal.run, callback_group=self.group,
                              goal_callback=on_goal, cancel_callback=on_cancel, handle_accepted_callback=accepted)
        h = Closer(lambda: self._between_spins(server.destroy))
        self._handles.append(h)
        return h

    def deferred_action_server(self, name: str, action_type: str, on_goal: Callable[[Any], None], *,
                               cancel_callback: Callable[[Any], bool] | None = None) -> Closer:
        """Goals are accepted and left ACCEPTED (no thread waits on them); `finish` runs the goal's
        execute step, which only sets the terminal state and returns the result."""
        from rclpy.action import ActionServer, CancelResponse

        cls = message_class(action_type)

        def run(handle: Any) -> Any:  # after finish(): as a short task on the executor
            d = getattr(handle, "_timelyllm_deferred", None)
            status, result = d.outcome if d is not None and d.outcome else (GoalStatus.ABORTED, {})
            if status == GoalStatus.SUCCEEDED:
                handle.succeed()
            elif status == GoalStatus.CANCELED and handle.is_cancel_requested:
                handle.canceled()
            else:
                handle.abort()
            return to_msg(cls.Result, result)

        def accepted(handle: Any) -> None:
            d = _DeferredGoal(handle, cls, run)
            handle._timelyllm_deferred = d
            try:
                on_goal(d)
            except Exception:
                log.exception("deferred goal handler of %s failed; aborting the goal", name)
                d.finish(GoalStatus.ABORTED, {})

        def on_cancel(handle: Any) -> Any:
            d = getattr(handle, "_timelyllm_deferred", None)
            if cancel_callback is None or d is None:
                return CancelResponse.ACCEPT
            try:
                return CancelResponse.ACCEPT if cancel_callback(d) else CancelResponse.REJECT
            except Exception:
                log.exception("cancel callback failed; rejecting the cancel")
                return CancelResponse.REJECT

        server = ActionServer(self.node, cls, name, run, callback_group=self.group,
                              handle_accepted_callback=accepted, cancel_callback=on_cancel)
        h = Closer(lambda: self._between_spins(server.destroy))
        self._handles.append(h)
        return h

    # -- timers ------------------------------------------------------------------------------
    def timer(self, period_s: float, callback: Callable[[], None]) -> Closer:
        t = self.node.create_timer(period_s, _guarded("timer", callback), callback_group=self.group)
        h = Closer(lambda: self._between_spins(lambda: self.node.destroy_timer(t)))
        self._handles.append(h)
        return h

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop spinning (the spin thread is joined: a thread still inside rcl while the process
        exits aborts it), destroy the entities and the node, shut the context down if ours."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self.executor.wake()
        self._spin.join(timeout_s)
        if self._spin.is_alive():  # pragma: no cover - a wait that rcl did not end
            log.warning("spin thread of %s did not stop within %.1f s", self.node.get_name(), timeout_s)
        # callbacks still running on the pool (an execute callback mid-segment) get timeout_s
        self.executor.shutdown(timeout_sec=timeout_s)
        for h in reversed(self._handles):
            try:
                h.close()
            except Exception:
                log.exception("closing %r failed", h)
        self._handles.clear()
        self.node.destroy_node()
        if self._owns_context:
            import rclpy

            rclpy.try_shutdown()


class _Publisher:
    def __init__(self, pub: Any, cls: Any) -> None:
        self._pub, self._cls = pub, cls

    def publish(self, fields: Fields) -> None:
        self._pub.publish(to_msg(self._cls, fields))

    def matched_count(self) -> int:
        return int(self._pub.get_subscription_count())


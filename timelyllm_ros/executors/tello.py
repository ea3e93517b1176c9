"""DJI Tello backend over djitellopy 2.5.0.

MiniSpec skills map to SDK calls (mf -> move_forward, tc -> rotate_clockwise, ...); perception
skills (iv, ox, ...) are answered by a pluggable `Perception` (simulated by default, since the
video pipeline is not part of this project); high-level skills (scan, orienting, approach, goto)
run TypeFly's macros through the SDK and the perception source.

Safety rules:
* every argument is validated against the robot YAML *and* the Tello SDK's own limits (moves
  20-500 cm, turns 1-360 degrees, ints only) before any SDK command of the segment is sent, and
  `TelloBackend.call` checks again whoever calls it: a bool, a float (50.7, 50.0) or an
  out-of-range value never reaches djitellopy (nothing is converted with int());
* motion is never re-sent blindly: djitellopy re-sends a command `retry_count` times when its
  reply is lost, so a drone that moved but whose `ok` was lost would move again.  Motion commands
  (takeoff, land, moves, turns, ...) are sent exactly once; a lost reply stops the drone (`stop`:
  it hovers) and fails the goal -- except takeoff / land, whose outcome the state stream shows
  (height), so the backend reads it instead of guessing.  Idempotent commands (`command`,
  `keepalive`, reads) keep djitellopy's retries;
* one SDK command at a time (a lock shared with the keep-alive thread);
* cancel / timeout / failure sends `stop` at once (the Tello hovers), the goal ends with a result
  right away, and the result says whether the drone is hovering or landed; the interrupted SDK
  call finishes on its worker thread;
* a busy local UDP port or an absent drone ends the goal DISCONNECTED with the reason.

djitellopy details this relies on (read from its 2.5.0 source): `send_control_command`'s timeout
default is bound at import (7 s) so `Tello.RESPONSE_TIMEOUT` changes nothing, and `timeout` must be
an int (`@enforce_types`); takeoff uses `Tello.TAKEOFF_TIMEOUT` (20 s).  Our subclass passes the
configured timeouts explicitly.  Replies are queued per drone IP and popped FIFO, so a stale reply
(e.g. to `stop`, or one that came after a timeout) is dropped before each new command.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from timelyllm_ros.core.robots import RobotSpec, SkillSpec
from timelyllm_ros.core.types import SegmentGoal, SkillCall, Value

from .base import (
    CallContext,
    Disconnected,
    ExecError,
    Perception,
    SimulatedPerception,
    SkillFailed,
    SkillRejected,
    SkillTimeout,
)

log = logging.getLogger(__name__)

# Tello SDK commands that move the drone: sent once, never retried (module doc).
MOTION_WORDS = frozenset({"takeoff", "land", "forward", "back", "left", "right", "up", "down", "cw", "ccw",
                          "flip", "go", "curve", "jump", "motoron", "throwfly"})

# MiniSpec skill (full name) -> (djitellopy method, min, max)
MOTION = {
    "move_forward": ("move_forward", 20, 500),
    "move_backward": ("move_back", 20, 500),
    "move_left": ("move_left", 20, 500),
    "move_right": ("move_right", 20, 500),
    "move_up": ("move_up", 20, 500),
    "move_down": ("move_down", 20, 500),
    "turn_cw": ("rotate_clockwise", 1, 360),
    "turn_ccw": ("rotate_counter_clockwise", 1, 360),
}
TURNS = ("turn_cw", "turn_ccw")
# TypeFly's current signed skills (robots/tello_typefly.yaml) -> (least, largest |amount| of one SDK
# command, whether 0 is allowed): each nonzero component becomes one of the commands above
SIGNED = {"move": (20, 500, True), "lift": (20, 500, False), "rotate": (1, 360, False)}
PERCEPTION = {"is_visible", "object_x", "object_y", "object_width", "object_height", "probe"}
LOCAL = {"log", "delay", "take_picture", "re_plan"}
MACROS = {"scan", "scan_abstract", "scan_description", "orienting", "approach", "goto"}


@dataclass
class TelloConfig:
    host: str = "192.168.10.1"  # the drone's IP (its own Wi-Fi AP by default)
    control_port: int = 8889  # the drone's command port (emulator: 9889)
    takeoff_on_first_goal: bool = True
    land_on_close: bool = True
    keepalive_s: float = 5.0  # send `keepalive` after this long without a command (Tello lands at 15 s)
    response_timeout_s: int = 7  # per SDK command (djitellopy wants an int)
    takeoff_timeout_s: int = 20
    retry_count: int = 3  # djitellopy attempts per idempotent command (motion: always exactly one)
    move_settle_s: float = 0.5  # TypeFly waits after moves / turns before the next perception
    turn_settle_s: float = 2.5
    wait_for_state: bool = True  # connect() waits for the first state packet
    state_wait_s: float = 1.5  # how long to wait for a fresh state packet after a lost reply


class ReplyLost(Exception):
    """A motion command was sent once and its reply never came: it may or may not have happened."""

    def __init__(self, command: str, timeout: float) -> None:
        super().__init__(f"'{command}' got no reply within {timeout:g} s; not re-sent")
        self.command = command


class MotionUnconfirmed(SkillTimeout):
    """The drone did not confirm a motion; the backend did not re-send it."""


def _tello_class() -> Any:
    """djitellopy's Tello with explicit per-command timeouts, stale-reply dropping and motion
    commands sent exactly once (`motion_log`: every motion command as sent, for audits)."""
    from djitellopy import Tello, TelloException

    class _Tello(Tello):  # type: ignore[misc, valid-type]
        response_timeout_s = 7
        takeoff_timeout_s = 20

        def send_command_without_return(self, command: str) -> None:
            # its reply still comes: remembered, so the next command does not take it for its own
            self.__dict__["unanswered"] = self.__dict__.get("unanswered", 0) + 1
            Tello.send_command_without_return(self, command)

        def _drop_late_replies(self, wait_s: float = 1.0) -> None:
            """Never take an old reply for the next command: drop what is queued, and first wait (up
            to wait_s) for the replies of commands sent without waiting (a `stop`), which may still
            be on their way -- taken as the next motion's "ok", they would confirm a motion the
            drone has not made."""
            responses = self.get_own_udp_object()["responses"]
            end = time.monotonic() + wait_s
            while self.__dict__.get("unanswered", 0) > 0 and time.monotonic() < end:
                if responses:
                    responses.pop(0)
                    self.__dict__["unanswered"] -= 1
                else:
                    time.sleep(0.005)
            self.__dict__["unanswered"] = 0
            responses.clear()

        def send_control_command(self, command: str, timeout: int | None = None) -> bool:
            timeout = self.takeoff_timeout_s if command == "takeoff" else self.response_timeout_s
            self._drop_late_replies()
            if command.split(" ", 1)[0] not in MOTION_WORDS:
                return Tello.send_control_command(self, command, timeout=int(timeout))
            self.__dict__.setdefault("motion_log", []).append(command)
            reply = self.send_command_with_return(command, timeout=int(timeout))
            if reply.strip().lower() == "ok":
                return True
            if reply.startswith("Aborting command"):
                raise ReplyLost(command, int(timeout))
            raise TelloException(f"Command '{command}' was unsuccessful (sent once, not retried): {reply!r}")

    return _Tello


class TelloBackend:
    def __init__(self, robot: RobotSpec, config: TelloConfig | None = None, *,
                 perception: Perception | None = None, tello_factory: Callable[[], Any] | None = None) -> None:
        self.robot = robot
        self.config = config or TelloConfig()
        self.perception = perception or SimulatedPerception()
        self._factory = tello_factory
        self.tello: Any = None
        self._sdk_lock = threading.Lock()
        self._worker = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tello-sdk")
        self._last_cmd = time.monotonic()
        self._closing = threading.Event()
        self._keepalive: threading.Thread | None = None
        self.flying = False
        self._takeoff_pending = False  # a takeoff was sent and has not been answered yet
        self.log_lines: list[str] = []  # `l(...)` output
        self.pictures = 0

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        c = self.config
        try:
            if self._factory is not None:
                t = self._factory()
            else:
                cls = _tello_class()
                t = cls(host=c.host, retry_count=c.retry_count)  # binds local UDP 8889 / 8890 once
                t.address = (c.host, c.control_port)  # djitellopy assumes 8889; emulators listen elsewhere
                t.response_timeout_s = c.response_timeout_s
                t.takeoff_timeout_s = c.takeoff_timeout_s
        except OSError as e:
            raise Disconnected(f"Tello at {c.host}: cannot open djitellopy's local UDP port "
                               f"(is another program using port 8889?): {e}") from e
        except Exception as e:  # noqa: BLE001 - any construction failure is "not connected"
            raise Disconnected(f"Tello at {c.host}: cannot create the SDK client: {type(e).__name__}: {e}") from e
        self.tello = t
        try:
            self._sdk(lambda: t.connect(c.wait_for_state), "connect")
        except ExecError as e:
            raise Disconnected(f"Tello at {c.host}: {e}") from e
        if c.keepalive_s > 0:
            self._keepalive = threading.Thread(target=self._keepalive_loop, name="tello-keepalive", daemon=True)
            self._keepalive.start()

    def close(self) -> None:
        self._closing.set()
        if self.tello is not None and self.flying and self.config.land_on_close:
            try:
                self._sdk(self.tello.land, "land")
                self.flying = False
            except MotionUnconfirmed as e:
                height = self._fresh_height()
                self.flying = height != 0
                log.error("landing on close: %s; state shows height %s: %s", e, height,
                          "landed" if not self.flying else "still airborne")
            except ExecError as e:
                log.error("landing on close failed: %s", e)
        if self._keepalive is not None:
            self._keepalive.join(timeout=2)
        self._worker.shutdown(wait=False, cancel_futures=True)

    def _keepalive_loop(self) -> None:
        period = min(0.5, self.config.keepalive_s / 2)
        while not self._closing.wait(period):
            if not self.flying or time.monotonic() - self._last_cmd < self.config.keepalive_s:
                continue
            if not self._sdk_lock.acquire(blocking=False):
                continue  # a command is in flight: the drone is not idle
            try:
                self.tello.send_keepalive()
                self._last_cmd = time.monotonic()
            except Exception as e:
                log.warning("Tello keepalive failed: %s", e)
            finally:
                self._sdk_lock.release()

    # ------------------------------------------------------------------ SDK access

    def _sdk(self, fn: Callable[[], Any], what: str) -> Any:
        """Run one SDK call under the SDK lock, mapping djitellopy errors to ExecErrors."""
        with self._sdk_lock:
            try:
                return fn()
            except ReplyLost as e:
                raise MotionUnconfirmed(f"{what}: Tello did not answer: {e} (the motion may have happened)") from e
            except TypeError as e:  # @enforce_types: a non-int reached the SDK (validation bug)
                raise SkillRejected(f"{what}: {e}") from e
            except Exception as e:
                text = str(e)
                if "Did not receive a response" in text or "Aborting command" in text:
                    raise SkillTimeout(f"{what}: Tello did not answer ({text})") from e
                if "state packet" in text:
                    raise SkillTimeout(f"{what}: {text}") from e
                raise SkillFailed(f"{what}: {text}") from e
            finally:
                self._last_cmd = time.monotonic()

    def _sdk_wait(self, fn: Callable[[], Any], what: str, ctx: CallContext) -> Any:
        """An SDK call on the worker thread; the goal stops waiting on cancel / deadline (the
        drone is told to `stop` by halt())."""
        fut = self._worker.submit(self._sdk, fn, what)
        while True:
            try:
                return fut.result(timeout=0.02)
            except cf.TimeoutError:
                ctx.check()

    def halt(self, reason: str) -> str | None:
        """Hover now; returns where the drone was left.  `stop` is sent without taking the SDK lock
        (the interrupted command holds it) and without waiting for the reply (dropped before the
        next command)."""
        if self.tello is None:
            return "drone not connected"
        if not self.flying and self._takeoff_pending:  # interrupted while taking off: look
            height = self._fresh_height()
            if height != 0:
                self.flying = True  # airborne, or unknown: stop it and land it on close
            elif self._takeoff_pending:
                return "drone taking off (a Tello hovers when takeoff ends; landed on close)"
        if not self.flying:
            return "drone landed"
        log.info("Tello stop: %s", reason)
        try:
            self.tello.send_command_without_return("stop")
        except Exception as e:
            log.error("sending stop failed: %s", e)
            return f"drone airborne, stop could not be sent ({e})"
        return "drone hovering (stop sent)"

    def land(self, reason: str) -> str:
        """Land now (on_planner_lost: land, after halt()); returns where the drone was left."""
        if self.tello is None:
            return "drone not connected"
        if not self.flying:
            return "drone landed"
        log.info("Tello land: %s", reason)
        try:
            self._sdk(self.tello.land, "land")
        except ExecError as e:
            return f"drone airborne, landing failed ({e})"
        self.flying = False
        return "drone landed"

    def _fresh_height(self) -> int | None:
        """Height (cm) from a state packet that arrived after now; None if none came in time."""
        try:
            udp = self.tello.get_own_udp_object()
        except Exception:
            return None
        old = udp.get("state")
        end = time.monotonic() + self.config.state_wait_s
        while time.monotonic() < end:
            state = udp.get("state")
            if state is not old and isinstance(state, dict) and isinstance(state.get("h"), int):
                return state["h"]
            time.sleep(0.02)
        return None

    # ------------------------------------------------------------------ validation

    def validate(self, call: SkillCall, spec: SkillSpec) -> str | None:
        """What the SDK must never see, whoever calls: wrong arity, non-int / bool / out-of-range
        numbers (the Tello SDK's limits, whatever the YAML says), non-string object names."""
        if len(call.args) != len(spec.args):
            return f"Tello {spec.name} takes {len(spec.args)} argument(s), got {len(call.args)}"
        if spec.name == "delay" and spec.args and spec.args[0].unit == "s":  # TypeFly: seconds
            v = call.args[0]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 10:
                return f"Tello delay needs a number of seconds within 0..10, got {v!r}"
            return None
        if spec.name in MOTION or spec.name == "delay":
            _, lo, hi = MOTION.get(spec.name, ("", 0, 10000))
            v = call.args[0]
            if type(v) is not int:
                return f"Tello {spec.name} needs an int, got {v!r}"
            if not lo <= v <= hi:
                return f"Tello {spec.name} must be within {lo}..{hi}, got {v}"
            return None
        if spec.name in SIGNED:
            least, most, zero_ok = SIGNED[spec.name]
            for v in call.args:
                if type(v) is not int:
                    return f"Tello {spec.name} needs ints, got {v!r}"
                if not (least <= abs(v) <= most or (zero_ok and v == 0)):
                    return (f"Tello {spec.name}: each amount must be {'0 or ' if zero_ok else ''}"
                            f"{least}..{most} either way, got {v}")
            return None
        if spec.name in PERCEPTION | LOCAL | MACROS:
            for a, v in zip(spec.args, call.args):
                if a.type == "str" and type(v) is not str:
                    return f"Tello {spec.name}: argument {a.name!r} must be a string, got {v!r}"
            return None
        return f"Tello backend has no implementation of skill {spec.name!r}"

    # ------------------------------------------------------------------ execution

    def _takeoff(self) -> None:
        """On the SDK worker: a takeoff the goal stopped waiting for still updates `flying`."""
        self._takeoff_pending = True
        try:
            self.tello.takeoff()
            self.flying = True
        finally:
            self._takeoff_pending = False

    def begin_goal(self, goal: SegmentGoal, ctx: CallContext) -> None:
        if not self.flying and self.config.takeoff_on_first_goal:
            try:
                self._sdk_wait(self._takeoff, "takeoff", ctx)
            except MotionUnconfirmed as e:  # sent once; the state stream tells whether it flew
                height = self._fresh_height()
                if height is None or height > 0:
                    self.flying = True  # airborne (or unknown: treat as airborne so halt/close act)
                    if height is None:
                        raise MotionUnconfirmed(f"{e}; no state packet either: treated as airborne") from e
                    log.warning("%s; state shows height %d cm: airborne, goal continues", e, height)
                else:
                    raise MotionUnconfirmed(f"{e}; state shows height 0: still on the ground") from e
            self.flying = True

    def _motion(self, name: str, amount: int, ctx: CallContext) -> None:
        method, lo, hi = MOTION[name]
        if type(amount) is not int or not lo <= amount <= hi:  # macros pass constants; stay strict
            raise SkillRejected(f"Tello {name} needs an int within {lo}..{hi}, got {amount!r}")
        fn = getattr(self.tello, method)
        self._sdk_wait(lambda: fn(amount), f"{method}({amount})", ctx)
        ctx.sleep(self.config.turn_settle_s if name in TURNS else self.config.move_settle_s)

    def _perceive(self, name: str, obj: Value) -> Value:
        spec = self.robot.skills[name]
        return self.perception.query(SkillCall(name, spec.abbr, (obj,)), spec)

    def call(self, call: SkillCall, spec: SkillSpec, ctx: CallContext) -> Value:
        name = spec.name
        problem = self.validate(call, spec)
        if problem:
            raise SkillRejected(f"{call}: {problem}; nothing sent")
        if name in MOTION or name in SIGNED:
            if not self.flying:
                raise SkillFailed(f"{call}: the Tello is not flying (takeoff_on_first_goal is off)")
            if name in MOTION:
                self._motion(name, call.args[0], ctx)  # type: ignore[arg-type]
            else:
                self._signed(name, call.args, ctx)
            return None
        if name in PERCEPTION:
            return self.perception.query(call, spec)
        if name == "log":
            self.log_lines.append(str(call.args[0]))
            log.info("plan log: %s", call.args[0])
            return None
        if name == "delay":
            seconds = bool(spec.args) and spec.args[0].unit == "s"  # TypeFly: seconds; ours: ms
            ctx.sleep(call.args[0] if seconds else call.args[0] / 1000.0)  # type: ignore[operator]
            return None
        if name == "take_picture":
            self.pictures += 1
            return None
        if name == "re_plan":
            return None
        return self._macro(name, call, spec, ctx)

    def _signed(self, name: str, args: tuple[Value, ...], ctx: CallContext) -> None:
        """TypeFly's move(dx, dy) / rotate(deg) / lift(dist): one SDK command per nonzero amount."""
        if name == "move":  # dx +forward/-backward, then dy +left/-right (TypeFly's order)
            dx, dy = args
            if dx:
                self._motion("move_forward" if dx > 0 else "move_backward", abs(dx), ctx)  # type: ignore[arg-type]
            if dy:
                self._motion("move_left" if dy > 0 else "move_right", abs(dy), ctx)  # type: ignore[arg-type]
        elif name == "rotate":  # +left (counter-clockwise) / -right
            deg = args[0]
            self._motion("turn_ccw" if deg > 0 else "turn_cw", abs(deg), ctx)  # type: ignore[operator, arg-type]
        else:  # lift: +up / -down
            dist = args[0]
            self._motion("move_up" if dist > 0 else "move_down", abs(dist), ctx)  # type: ignore[operator, arg-type]

    def _macro(self, name: str, call: SkillCall, spec: SkillSpec, ctx: CallContext) -> Value:
        """TypeFly's high-level skills, through the SDK and the perception source."""
        arg = call.args[0] if call.args else None
        if name == "scan":  # 8{?iv($1)==True{->True}tc(45)}->False
            for _ in range(8):
                if self._perceive("is_visible", arg) is True:
                    return True
                self._motion("turn_cw", 45, ctx)
            return False
        if name in ("scan_abstract", "scan_description"):  # like scan, answering a question about the view
            for _ in range(8):
                answer = self.perception.query(call, spec)
                if answer:
                    return answer
                self._motion("turn_cw", 45, ctx)
            return ""
        if name == "orienting":
            return self._orient(arg, ctx)
        if name == "approach":
            return self._approach(arg, ctx)
        if name == "goto":
            return self._orient(arg, ctx) and self._approach(arg, ctx)
        raise SkillRejected(f"{call}: no Tello implementation")

    def _orient(self, obj: Value, ctx: CallContext) -> bool:
        """Turn by 15 degrees until the object is horizontally centred (0.4 < x < 0.6)."""
        for _ in range(4):
            x = self._perceive("object_x", obj)
            if not isinstance(x, float) or x < 0:
                return False
            if 0.4 <= x <= 0.6:
                return True
            self._motion("turn_ccw" if x < 0.5 else "turn_cw", 15, ctx)
        return False

    def _approach(self, obj: Value, ctx: CallContext) -> bool:
        """6{?oh($1)<0.5{mf(40)};->True}->False, as TypeFly writes it."""
        h = self._perceive("object_height", obj)
        if not isinstance(h, float) or h < 0:
            return False
        if h < 0.5:
            self._motion("move_forward", 40, ctx)
        return True

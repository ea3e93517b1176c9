"""A DJI Tello emulator speaking the Tello SDK 2.0 text protocol over real UDP.

It binds `host:port` (a loopback address per drone, e.g. 127.0.0.2:9889, because djitellopy
binds local UDP 8889/8890 itself and tells drones apart by source IP), answers commands with
`ok` / `error ...` / a value, and once in SDK mode streams state lines
(`pitch:0;roll:0;yaw:0;...;bat:87;...`) to the client's state port from the same address.

Motion commands take `move_s_per_cm * distance` (turns: `turn_s_per_deg * degrees`) before the
reply, as a real Tello only answers when the motion is done; `stop` / `emergency` are handled at
once and interrupt a motion in progress (the interrupted command answers `error interrupted` --
the emulator's choice; the SDK documents only that `stop` hovers "at any time").  The drone
lands itself after `auto_land_s` without any command, like a Tello after 15 s.

Every command received is recorded (`commands()`; `events()` adds the time, the reply and whether
it was dropped; `log_path` appends the same as JSON lines), `responding = False` makes it go
silent (commands still recorded) to test timeouts, and `drop_replies=p` loses each reply with
probability p (seeded) -- the command was executed, only its `ok` never arrives, as over a lossy
Wi-Fi link (`drop_words`: always for these commands).  `is_invalid(cmd)` says whether a command is one the Tello SDK must never be sent.
"""

from __future__ import annotations

import json
import logging
import math
import random
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)

MOVES = {"forward": (1, 0, 0), "back": (-1, 0, 0), "left": (0, -1, 0), "right": (0, 1, 0),
         "up": (0, 0, 1), "down": (0, 0, -1)}
READS = ("battery?", "speed?", "time?", "height?", "temp?", "attitude?", "baro?", "tof?", "wifi?",
         "sdk?", "sn?")


@dataclass
class DroneState:
    sdk_mode: bool = False
    flying: bool = False
    x: float = 0.0  # cm, body frame at takeoff
    y: float = 0.0
    h: int = 0  # height cm
    yaw: int = 0  # degrees, -180..180
    bat: int = 87
    speed: int = 100  # cm/s
    flight_time_s: float = 0.0
    auto_landed: int = 0


class TelloEmulator:
    def __init__(self, host: str = "127.0.0.2", port: int = 9889, *, state_port: int = 8890,
                 state_hz: float = 10.0, battery: int = 87, move_s_per_cm: float = 0.0,
                 turn_s_per_deg: float = 0.0, takeoff_s: float = 0.0, auto_land_s: float = 15.0,
                 drop_replies: float = 0.0, seed: int = 0, log_path: str | None = None,
                 drop_words: tuple[str, ...] = ()) -> None:
        if not 0.0 <= drop_replies < 1.0:
            raise ValueError(f"drop_replies must be in [0, 1), got {drop_replies!r}")
        self.host, self.port, self.state_port = host, port, state_port
        self.state_hz = state_hz
        self.move_s_per_cm, self.turn_s_per_deg, self.takeoff_s = move_s_per_cm, turn_s_per_deg, takeoff_s
        self.auto_land_s = auto_land_s
        self.state = DroneState(bat=battery)
        self.responding = True
        self.drop_replies = drop_replies
        self.drop_words = set(drop_words)  # replies to these commands (first word) are always lost
        self._rng = random.Random(seed)
        self._log_path = log_path
        self._log: list[str] = []
        self._events: list[dict] = []
        self._lock = threading.Lock()
        self._stop_motion = threading.Event()
        self._closed = threading.Event()
        self._busy = threading.Lock()  # one motion at a time, as on the drone
        self._client: tuple[str, int] | None = None
        self._last_cmd = self._t0 = time.monotonic()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self._sock.settimeout(0.1)
        self._threads = [threading.Thread(target=self._recv_loop, name=f"tello-emu-{host}", daemon=True),
                         threading.Thread(target=self._state_loop, name=f"tello-state-{host}", daemon=True)]

    # ------------------------------------------------------------------ control

    def start(self) -> "TelloEmulator":
        for t in self._threads:
            t.start()
        return self

    def close(self) -> None:
        self._closed.set()
        self._stop_motion.set()
        for t in self._threads:
            t.join(timeout=2)
        self._sock.close()

    def __enter__(self) -> "TelloEmulator":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def commands(self) -> list[str]:
        with self._lock:
            return list(self._log)

    def events(self) -> list[dict]:
        """Every command with its arrival time (s since start), reply and whether the reply was dropped."""
        with self._lock:
            return [dict(e) for e in self._events]

    def busy(self) -> bool:
        """True while a command (a motion) is being carried out."""
        return self._busy.locked()

    def clear(self) -> None:
        with self._lock:
            self._log.clear()
            self._events.clear()

    # ------------------------------------------------------------------ protocol

    def _reply(self, event: dict, text: str, addr: tuple[str, int]) -> None:
        with self._lock:
            dropped = (self.drop_replies > 0 and self._rng.random() < self.drop_replies) \
                or event["cmd"].split(" ", 1)[0] in self.drop_words
            event["reply"], event["dropped"] = text, dropped or not self.responding
            if self._log_path:  # under the lock: lines from concurrent handlers never interleave
                with open(self._log_path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(event) + "\n")
        if not dropped:
            self._send(text, addr)

    def _send(self, text: str, addr: tuple[str, int]) -> None:
        if self.responding and not self._closed.is_set():
            try:
                self._sock.sendto(text.encode(), addr)
            except OSError as e:
                log.warning("emulator %s: send failed: %s", self.host, e)

    def _recv_loop(self) -> None:
        while not self._closed.is_set():
            try:
                data, addr = self._sock.recvfrom(1024)
            except socket.timeout:
                self._check_auto_land()
                continue
            except OSError:
                return
            try:
                cmd = data.decode("utf-8").strip()
            except UnicodeDecodeError:
                self._send("error", addr)
                continue
            with self._lock:
                self._log.append(cmd)
                self._last_cmd = time.monotonic()
                event = {"t": round(self._last_cmd - self._t0, 4), "cmd": cmd, "reply": None, "dropped": False}
                self._events.append(event)
            if cmd in ("stop", "emergency"):  # "works at any time": interrupts a motion
                self._stop_motion.set()
                if cmd == "emergency":
                    self.state.flying, self.state.h = False, 0
                self._reply(event, "ok", addr)
                continue
            # Everything else runs on its own thread so the receiver stays free for `stop`.
            threading.Thread(target=self._handle, args=(cmd, addr, event), daemon=True).start()

    def _handle(self, cmd: str, addr: tuple[str, int], event: dict) -> None:
        with self._busy:
            reply = self._execute(cmd, addr)
        if reply is not None:
            self._reply(event, reply, addr)

    def _motion(self, seconds: float) -> bool:
        """Wait out a motion; False if it was interrupted by stop/emergency."""
        self._stop_motion.clear()
        if seconds <= 0:
            return True
        return not self._stop_motion.wait(seconds)

    def _execute(self, cmd: str, addr: tuple[str, int]) -> str | None:
        s = self.state
        parts = cmd.split()
        if not parts:
            return "error"
        word, args = parts[0], parts[1:]
        if word == "command":
            s.sdk_mode = True
            self._client = (addr[0], self.state_port)
            return "ok"
        if not s.sdk_mode:
            return "error not in SDK mode"
        if word in READS and not args:
            return {"battery?": str(s.bat), "speed?": f"{s.speed:.1f}", "time?": f"{int(s.flight_time_s)}s",
                    "height?": f"{s.h // 10}dm", "temp?": "60~63C", "attitude?": f"pitch:0;roll:0;yaw:{s.yaw};",
                    "baro?": "1.23", "tof?": f"{max(s.h, 10) * 10}mm", "wifi?": "90", "sdk?": "20",
                    "sn?": "0TQZEMU" + self.host.replace(".", "")}[word]
        if word in ("keepalive", "streamon", "streamoff", "motoron", "motoroff"):
            return "ok"
        if word == "speed":
            v = _int(args, 10, 100)
            if v is None:
                return "error out of range"
            s.speed = v
            return "ok"
        if word == "takeoff":
            if s.flying:
                return "error already flying"
            if not self._motion(self.takeoff_s):
                return "error interrupted"
            s.flying, s.h = True, 80
            return "ok"
        if word == "land":
            if not s.flying:
                return "error not flying"
            s.flying, s.h = False, 0
            return "ok"
        if word in MOVES:
            d = _int(args, 20, 500)
            if d is None:
                return "error out of range"
            if not s.flying:
                return "error not flying"
            done = self._motion(d * self.move_s_per_cm)
            fx, fy, fz = MOVES[word]
            yaw = math.radians(s.yaw)
            s.x += d * (fx * math.cos(yaw) - fy * math.sin(yaw))
            s.y += d * (fx * math.sin(yaw) + fy * math.cos(yaw))
            s.h = max(0, s.h + fz * d)
            return "ok" if done else "error interrupted"
        if word in ("cw", "ccw"):
            a = _int(args, 1, 360)
            if a is None:
                return "error out of range"
            if not s.flying:
                return "error not flying"
            done = self._motion(a * self.turn_s_per_deg)
            s.yaw = ((s.yaw + (a if word == "cw" else -a) + 180) % 360) - 180
            return "ok" if done else "error interrupted"
        return f"unknown command: {cmd}"

    def _check_auto_land(self) -> None:
        with self._lock:
            idle = time.monotonic() - self._last_cmd
        if self.state.flying and idle > self.auto_land_s and not self._busy.locked():
            self.state.flying, self.state.h = False, 0
            self.state.auto_landed += 1
            log.info("emulator %s: no command for %.1f s, landing", self.host, idle)

    def state_line(self) -> str:
        s = self.state
        return (f"mid:-1;x:0;y:0;z:0;mpry:0,0,0;pitch:0;roll:0;yaw:{s.yaw};vgx:0;vgy:0;vgz:0;"
                f"templ:60;temph:63;tof:{max(s.h, 10)};h:{s.h};bat:{s.bat};baro:1.23;"
                f"time:{int(s.flight_time_s)};agx:0.00;agy:0.00;agz:-1000.00;\r\n")

    def _state_loop(self) -> None:
        period = 1.0 / self.state_hz
        last = time.monotonic()
        while not self._closed.wait(period):
            now = time.monotonic()
            if self.state.flying:
                self.state.flight_time_s += now - last
            last = now
            self._check_auto_land()
            if self._client is not None:
                self._send(self.state_line(), self._client)


_VALID = re.compile(r"^(?:(?:forward|back|left|right|up|down) (?:[2-9][0-9]|[1-4][0-9]{2}|500)"
                    r"|(?:cw|ccw) (?:[1-9]|[1-9][0-9]|[1-2][0-9]{2}|3[0-5][0-9]|360))$")


def is_invalid(cmd: str) -> bool:
    """True for a move / turn the SDK must never be sent: out of range, not an integer, malformed."""
    word = cmd.split(" ", 1)[0]
    if word in MOVES or word in ("cw", "ccw"):
        return _VALID.match(cmd) is None
    return False


def _int(args: list[str], lo: int, hi: int) -> int | None:
    if len(args) != 1:
        return None
    try:
        v = int(args[0])
    except ValueError:
        return None
    return v if lo <= v <= hi else None


def main(argv: list[str] | None = None) -> int:
    """`python -m timelyllm_ros.executors.tello_emulator --host 127.0.0.2`: one emulated drone
    until SIGINT/SIGTERM (what `timelyllm demo` runs beside its djitellopy executor node)."""
    import argparse
    from timelyllm_ros.signals import stop_on_signals

    ap = argparse.ArgumentParser(description="DJI Tello emulator (SDK 2.0 text protocol over UDP)")
    ap.add_argument("--host", default="127.0.0.2", help="loopback address of this drone (default 127.0.0.2)")
    ap.add_argument("--port", type=int, default=9889, help="command port (default 9889)")
    ap.add_argument("--state-port", type=int, default=8890, help="client's state port (default 8890)")
    ap.add_argument("--move-s-per-cm", type=float, default=0.02, help="motion time per cm (default 0.02)")
    ap.add_argument("--turn-s-per-deg", type=float, default=0.011, help="turn time per degree (default 0.011)")
    ap.add_argument("--takeoff-s", type=float, default=1.0, help="takeoff time (default 1.0)")
    ap.add_argument("--log", default=None, help="append every command as a JSON line to this file")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    done = stop_on_signals()  # (its handler takes no lock: signals.py)
    try:
        emu = TelloEmulator(args.host, args.port, state_port=args.state_port, move_s_per_cm=args.move_s_per_cm,
                            turn_s_per_deg=args.turn_s_per_deg, takeoff_s=args.takeoff_s, log_path=args.log)
    except OSError as e:
        print(f"tello emulator: cannot bind {args.host}:{args.port}: {e}", file=sys.stderr)
        return 2
    with emu:
        log.info("emulated Tello listening on %s:%d", args.host, args.port)
        done.wait()
        log.info("emulated Tello %s stopping", args.host)
    return 0


if __name__ == "__main__":
    sys.exit(main())

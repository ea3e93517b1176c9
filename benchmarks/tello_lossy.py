#!/usr/bin/env python3
"""The djitellopy Tello backend against the Tello emulator with replies dropped at random.

Runs `--goals` segments (moves, turns, perception into variables, arithmetic arguments, scans)
through SegmentExecutor -> TelloBackend -> djitellopy -> UDP -> TelloEmulator(drop_replies=p) and
prints, from the emulator's own command log: motion commands sent, motion commands sent more
than once for one call (must be 0: the backend's log of what it sent equals what the drone
received), invalid commands (must be 0), goals ended within their timeout (must be all), the
drone's state after every failed goal vs what the result said (hovering / landed), and the state
at the end.  djitellopy binds local UDP 8889; if another process holds it run this under
`unshare -rn sh -c 'ip link set lo up; python benchmarks/tello_lossy.py'`.

    python benchmarks/tello_lossy.py [--goals 200] [--drop 0.2] [--seed 1]
"""

from __future__ import annotations

import argparse
import logging
import random
import time
from collections import Counter

from timelyllm_ros.core.minispec import parse_program  # noqa: E402
from timelyllm_ros.core.robots import load_robots  # noqa: E402
from timelyllm_ros.core.types import ResultCode, SegmentGoal  # noqa: E402
from timelyllm_ros.executors.base import ExecutorConfig, SegmentExecutor, SimulatedPerception  # noqa: E402
from timelyllm_ros.executors.tello import MOTION_WORDS, TelloBackend, TelloConfig  # noqa: E402
from timelyllm_ros.executors.tello_emulator import TelloEmulator, is_invalid  # noqa: E402

PLANS = ["mf(60);tc(45)", "_1=ox('cat');?_1>0.5{tc(20)}:{tu(20)}", "mu(40);md(40)", "_2=3;mb(_2*20);tc(_2*30)",
         "2{ml(30);mr(30)}", "s('cat')", "_1=oh('cat');?_1>0{mf(20+_1*0)}", "tu(90);tp", "g('cat')"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--goals", type=int, default=200)
    ap.add_argument("--drop", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=6.0, help="per-goal limit (s)")
    a = ap.parse_args()
    if a.goals <= 0 or not 0 <= a.drop < 1 or a.timeout <= 0:
        ap.error("--goals > 0, 0 <= --drop < 1, --timeout > 0")
    from djitellopy import Tello

    Tello.LOGGER.setLevel(logging.CRITICAL)
    tello = load_robots()["tello"]
    host = "127.0.3.7"
    emu = TelloEmulator(host, drop_replies=a.drop, seed=a.seed, auto_land_s=1e9).start()
    backend = TelloBackend(tello, TelloConfig(host=host, control_port=9889, response_timeout_s=1, takeoff_timeout_s=2,
                                              keepalive_s=0, move_settle_s=0, turn_settle_s=0, state_wait_s=1.0),
                           perception=SimulatedPerception(("cat",), seed=a.seed))
    ex = SegmentExecutor(tello, backend, ExecutorConfig(timeout_s=a.timeout))
    rng = random.Random(a.seed)
    codes: Counter[str] = Counter()
    late, said_wrong, longest = 0, 0, 0.0
    t_start = time.perf_counter()
    for i in range(a.goals):
        t0 = time.monotonic()
        if i % 3 == 0:
            ex.new_flight()  # one emulated drone flies every plan: each plan counts as its own flight
        text = rng.choice(PLANS)
        calls = parse_program(text, tello, check=False)[1]  # a goal carries the calls of its text
        rep = ex.execute(SegmentGoal(f"plan{i // 3}", "d1", "tello", i % 3, text, calls, 1.0, False))
        took = time.monotonic() - t0
        longest = max(longest, took)
        late += took > a.timeout + 0.5
        codes[rep.code.name] += 1
        if rep.code is not ResultCode.OK:
            time.sleep(0.05)  # let `stop` reach the drone
            says_hover = rep.error.endswith("drone hovering (stop sent)")
            says_landed = rep.error.endswith("drone landed")
            if not (says_hover or says_landed) or emu.state.flying != says_hover or emu.busy():
                said_wrong += 1
                print("  ! result does not match the drone:", rep.error[-80:], emu.state)
    ex.close()
    time.sleep(0.2)
    wall = time.perf_counter() - t_start
    sent = [c for c in emu.commands() if c.split(" ", 1)[0] in MOTION_WORDS]
    log = getattr(backend.tello, "motion_log", [])
    dropped = sum(e["dropped"] for e in emu.events())
    resent = 0 if sent == log else abs(len(sent) - len(log)) or 1
    invalid = sum(is_invalid(c) for c in emu.commands())
    final = "landed" if not emu.state.flying else ("hovering" if not emu.busy() else "MOVING")
    print(f"tello_lossy: {a.goals} goals, replies dropped with p={a.drop} (seed {a.seed}), {wall:.1f} s wall")
    print(f"  results: {dict(codes)}; longest goal {longest:.2f} s (limit {a.timeout:g} s), late: {late}")
    print(f"  emulator: {len(emu.commands())} commands, {dropped} replies dropped, {len(sent)} motion commands")
    print(f"  motion commands sent more than once for one call: {resent}; invalid commands: {invalid}")
    print(f"  failed goals whose result misstated the drone's state: {said_wrong}; drone at the end: {final} "
          f"(backend believes {'flying' if backend.flying else 'landed'})")
    emu.close()
    ok = resent == 0 and invalid == 0 and late == 0 and said_wrong == 0 and final != "MOVING" \
        and (emu.state.flying == backend.flying) and codes["OK"] > 0
    print("RESULT:", "OK" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

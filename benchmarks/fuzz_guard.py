"""Large fuzz run of the segmenter -> guard -> executor path (tests/test_fuzz_guard.py runs 2000
examples per property with Hypothesis; this runs a seeded random generator for many more).

Each input is a random or mutated MiniSpec program (drone with TypeFly's paper-era skills
(robots/tello.yaml) or its current ones (robots/tello_typefly.yaml: conditions may start with an
assignment, `&&` / `||`), or arm) or chat reply, with injection-
like strings ('; rm -rf /, nested and escaped quotes, unicode, bidi controls, huge numbers, NaN,
negative values, newlines), variables bound to perception results and literals, and expressions
(arithmetic, parentheses, unary minus, value skills) as skill arguments; one input in ten also holds a
*deep* statement (issue 26): operator chains of up to 1,500 operators, parentheses / unary minus /
value calls nested up to 500 deep, blocks nested up to 60 deep -- the front end must reject what
passes its limits with a reason, never crash (a RecursionError counts as a crash).  It is fed to the
segmenter in random token pieces; every valid cut goes through the guard as the planner would do
before dispatch (with the plan's state), every literal call is checked by an independent oracle
(schema + Tello SDK ranges), and valid statements are also sent with tampered call lists.

Dispatched MiniSpec segments then run on a SegmentExecutor, which resolves computed arguments at
run time: with `--exec simulated` (default) on the project's simulated backend (every resolved call
the backend receives is checked by the oracle), with `--exec tello` on the djitellopy Tello
backend against the Tello UDP emulator (every command in the emulator's log is checked by
`tello_emulator.is_invalid`) for the first `--tello-inputs` drone inputs (UDP round trips make that
path ~0.1-0.3 s per input; `--tello-drones K` runs K emulated drones in parallel threads, plans dealt
round-robin, each drone's plans in order, progress printed every `--progress-every` plans; djitellopy binds local UDP 8889: if another process holds it, run under
`unshare -rn sh -c 'ip link set lo up; ...'`).  Prints counts; invalid calls/commands and crashes must be 0 (exit 1
otherwise).

    python benchmarks/fuzz_guard.py [--inputs 100000] [--seed 1] [--exec simulated|tello|none]
                                    [--tello-inputs 1000] [--tello-drones 1] [--progress-every 5000]
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
import traceback
import unicodedata
from pathlib import Path

from timelyllm_ros.core.guard import PlanState, check_segment  # noqa: E402
from timelyllm_ros.core.minispec import MiniSpecError, parse_statement  # noqa: E402
from timelyllm_ros.core.robots import RobotSpec, load_robots  # noqa: E402
from timelyllm_ros.core.segmenter import Segmenter  # noqa: E402
from timelyllm_ros.core.types import ResultCode, SegmentGoal, SkillCall  # noqa: E402
from timelyllm_ros.executors.base import ExecutorConfig, SegmentExecutor, SimulatedPerception  # noqa: E402
from timelyllm_ros.executors.simulated import SimulatedBackend  # noqa: E402

VARS = ["_1", "_2", "_3"]
OBJECTS = ["cat", "door", "box", "red ball", "x"]

INJECTIONS = ["'; rm -rf /", "\\'; mf(500); '", "');mf(500);l('", "}{", "?", ":{", "\x00", "\n", "\r\n",
              "\t", "\u202e", "\u200b", "\u00a0", "NaN", "1e999", "\U0001f408", "\u732b", "'", "\\", "\\\\'",
              "$(reboot)", "%s%n", "\x1b[2J", "{{{{", "))))", ";;;", "-> True", "cat", "red box", "", "x" * 250]
SPECIALS = ";{}()'\\?:_=-<>&|,. \n0123456789\u202e\x00\u00e9\U0001f408"
NUMBERS = [0, -1, 1, 19, 20, 21, 50, 90, 499, 500, 501, 359, 360, 361, -80, 80, 81, 90, 91, -181, 180, 10**25,
           -10**40, 2**63]
LIMIT_WORDS = ("operators (limit", "nested deeper than", "longer than")  # the front end's size limits
CHAT_WORDS = ["Hi", "Dr.", "e.g.", "3.5", "U.S.", "1.", "ok", "\n", "\n\n", "?!", "\"", "...", "A.", "I.", "etc.",
              "\x07", "\u202e", "\U0001f408", "  ", "The", "drone", "is", "here.", "Why?", "Yes!"]


class Gen:
    def __init__(self, rng: random.Random) -> None:
        self.r = rng
        self.deep_statements = 0  # deep statements generated (`deep`)

    def string(self) -> str:
        r = self.r
        k = r.random()
        if k < 0.4:
            return r.choice(INJECTIONS)
        if k < 0.7:
            return "".join(r.choice(INJECTIONS) for _ in range(r.randint(0, 3)))
        return "".join(chr(r.choice([r.randint(32, 126), r.randint(0, 0x2FFF), r.randint(0, 0x10FFFF)]))
                       for _ in range(r.randint(0, 8)))

    def literal(self) -> str:
        r = self.r
        k = r.randint(0, 7)
        if k == 0:
            return str(r.choice(NUMBERS))
        if k == 1:
            return str(r.randint(-1000, 1000))
        if k == 2:
            return repr(r.choice([r.uniform(-1000, 1000), float("nan"), float("inf"), -float("inf"), 1e300]))
        if k == 3:
            return r.choice(["True", "False"])
        if k == 4:
            return r.choice(["_1", "nan", "inf", "1e5", "-", "None", "''", "'\\'"])
        return self.quote(self.string())

    def quote(self, s: str) -> str:
        if self.r.random() < 0.85:
            s = s.replace("\\", "\\\\").replace("'", "\\'")
        return f"'{s}'"

    def value_call(self, robot: RobotSpec) -> str:
        """A call that returns a value (perception), with a plausible object name."""
        r = self.r
        specs = [s for s in robot.skills.values() if s.returns != "none"]
        spec = r.choice(specs)
        args = ",".join(self.quote(r.choice(OBJECTS)) if a.type == "str" else self.expr(robot, 3) for a in spec.args)
        return f"{spec.abbr}({args})"

    def expr(self, robot: RobotSpec, depth: int = 0) -> str:
        """A numeric-looking expression: literals, variables, value skills, + - * /, (), unary -."""
        r = self.r
        k = r.randint(0, 9)
        if depth > 2 or k <= 2:
            return r.choice([str(r.choice(NUMBERS)), str(r.randint(-50, 600)), r.choice(VARS), r.choice(VARS),
                             repr(round(r.uniform(-2, 2), 3))])
        if k <= 4:
            return f"{self.expr(robot, depth + 1)}{r.choice('+-*/')}{self.expr(robot, depth + 1)}"
        if k == 5:
            return f"({self.expr(robot, depth + 1)})"
        if k == 6:
            return f"-{self.expr(robot, depth + 1)}"
        if k == 7:
            return self.value_call(robot)
        return self.literal()

    def call(self, robot: RobotSpec) -> str:
        r = self.r
        spec = r.choice(list(robot.skills.values()))
        name = r.choice([spec.abbr, spec.abbr, spec.abbr, spec.name, "zz", spec.abbr + "x", "say", "pk"])
        if r.random() < 0.85:
            args = []
            for a in spec.args:
                if a.type == "str":
                    args.append(r.choice(VARS) if r.random() < 0.15 else self.quote(self.string()))
                elif r.random() < 0.35:
                    args.append(self.expr(robot))
                elif r.random() < 0.5 and a.min is not None and a.max is not None:
                    args.append(str(r.randint(int(a.min), int(a.max))))
                else:
                    args.append(self.literal())
        else:
            args = [self.literal() for _ in range(r.randint(0, 3))]
        if not args and r.random() < 0.5:
            return name
        return f"{name}({','.join(args)})"

    def operand(self, robot: RobotSpec) -> str:
        k = self.r.randint(0, 4)
        if k == 4:
            return self.expr(robot)
        return self.call(robot) if k < 2 else (self.literal() if k == 2 else self.r.choice(VARS + ["_x"]))

    def test(self, robot: RobotSpec) -> str:
        parts = []
        if self.r.random() < 0.25:  # TypeFly: an assignment as the first operand, ?_1=sd('x'){g(_1)}
            parts.append(self.r.choice(VARS) + "=")
        for i in range(self.r.randint(1, 3)):
            if i:
                parts.append(self.r.choice(["&", "|", "&", "|", "&&", "||"]))
            parts.append(self.operand(robot))
            if self.r.random() < 0.7:
                parts += [self.r.choice(["==", "!=", "<", ">", "<=", ">="]), self.operand(robot)]
        return "".join(parts)

    def statement(self, robot: RobotSpec, depth: int = 0) -> str:
        r = self.r
        k = r.randint(0, 9) if depth < 3 else r.randint(0, 5)
        if k <= 3:
            return self.call(robot)
        if k == 4:
            value = self.operand(robot) if r.random() < 0.4 else (self.value_call(robot) if r.random() < 0.5
                                                                   else self.expr(robot))
            return f"{r.choice(VARS + ['_x'])}={value}"
        if k == 5:
            return "->" + self.operand(robot)
        body = ";".join(self.statement(robot, depth + 1) for _ in range(r.randint(0, 3)))
        if k <= 7:
            n = r.choice(["1", "2", "8", "10", "11", "100", "101", "0", "-1", "2.5"])
            return f"{n}{{{body}}}"
        s = f"?{self.test(robot)}{{{body}}}"
        if r.random() < 0.4:
            s += ":{" + ";".join(self.statement(robot, depth + 1) for _ in range(r.randint(0, 2))) + "}"
        return s

    DEEP_SIZES = (1, 2, 8, 15, 16, 17, 30, 63, 64, 65, 100, 500, 900, 1000, 1000, 1000, 1020, 1500)

    def deep(self, robot: RobotSpec) -> str:
        """A statement with a long operator chain or deep nesting (in or past the parser's limits)."""
        r = self.r
        n = r.choice(self.DEEP_SIZES)
        k = r.randint(0, 7)
        self.deep_statements += k != 7

        short = r.random() < 0.6  # short operands: a 1,000-long chain still fits one statement

        def operand() -> str:
            if short:
                return r.choice("12")
            return r.choice(["1", "2", "_1", "True", "0.5", self.value_call(robot), "(1+1)", "-_2"])

        def chain(ops: str, m: int) -> str:  # one operator throughout (the deepest tree) or mixed
            if r.random() < 0.5:
                ops = r.choice(ops)
            return operand() + "".join(r.choice(ops) + operand() for _ in range(m))

        if k == 0:  # a long condition
            return f"?{chain('&|', n)}{{{self.call(robot) if not short else 'tp'}}}"
        if k == 1:  # a long sum / product as an argument
            spec = r.choice([s for s in robot.skills.values() if s.args and s.args[0].type in ("int", "float")]
                            or list(robot.skills.values()))
            return f"{spec.abbr}({chain('+-*/', n)})"
        if k == 2:  # deep parentheses
            return f"{r.choice(VARS)}=" + "(" * n + chain("+*&", r.randint(0, 3)) + ")" * n
        if k == 3:  # deep unary minus (with and without parentheses)
            return "->" + r.choice(["-" * n + "_1", "-(" * n + "1" + ")" * n])
        if k == 4:  # deep blocks: loops and conditionals
            opener = r.choice(["1{", "?True{", "2{", "?_1>0{"])
            return opener * n + self.call(robot) + "}" * n
        if k == 5:  # nested value calls
            specs = [s for s in robot.skills.values() if s.returns != "none" and s.args]
            if not specs:
                return self.call(robot)
            spec = r.choice(specs)
            return f"{r.choice(VARS)}=" + f"{spec.abbr}(" * n + "'cat'" + ")" * n
        if k == 6:  # a chain of comparisons joined by & / | (the 1,000-long & chain of issue 26)
            return "?" + "&".join(f"{operand()}{r.choice(['<', '>', '==', '!='])}{operand()}"
                                  for _ in range(n // 2 + 1)) + "{tp}"
        return self.mutate(self.deep(robot))

    def var_plan(self, robot: RobotSpec) -> str:
        """A plausible drone plan whose skill arguments come from variables bound to perception
        results / literals through arithmetic (in range or not: the run-time checks decide)."""
        r = self.r
        num_skills = [s for s in robot.skills.values() if s.args and s.args[0].type == "int"]
        out = [f"{v}={r.choice([self.value_call(robot), str(r.randint(-100, 600)), repr(round(r.uniform(0, 2), 3))])}"
               for v in VARS if r.random() < 0.9]
        for _ in range(r.randint(2, 6)):
            k = r.randint(0, 9)
            v = r.choice(VARS)
            if k <= 2:
                value = r.choice([self.value_call(robot), str(r.randint(-100, 600)), repr(round(r.uniform(-1, 2), 3)),
                                  f"{r.choice(VARS)}{r.choice('+-*/')}{r.randint(1, 9)}", self.expr(robot)])
                out.append(f"{v}={value}")
            elif k <= 6:
                spec = r.choice(num_skills)
                arg = r.choice([f"{v}*{r.randint(1, 1000)}", f"{v}*{r.randint(1, 100)}+{r.randint(-50, 300)}",
                                f"({v}+{r.randint(0, 50)})/{r.randint(1, 4)}", f"-{v}", v, self.expr(robot)])
                out.append(f"{spec.abbr}({arg})")
            elif k == 7:
                out.append(f"?{v}{r.choice(['>', '<', '>=', '!='])}{round(r.uniform(-1, 300), 2)}"
                           f"{{{self.call(robot)}}}:{{{self.call(robot)}}}")
            elif k == 8:
                out.append(f"{r.randint(1, 6)}{{{r.choice(num_skills).abbr}({v}*{r.randint(1, 60)})}}")
            else:
                out.append(f"{r.choice(['l', 'g', 'o', 'p'])}({v})")
        return ";".join(out)

    def mutate(self, s: str) -> str:
        r = self.r
        for _ in range(r.randint(0, 3)):
            i = r.randint(0, len(s))
            op = r.randint(0, 3)
            if op == 0:
                s = s[:i] + r.choice(SPECIALS) + s[i:]
            elif op == 1 and s:
                s = s[:i] + s[i + 1:]
            elif op == 2 and s:
                j = r.randint(i, len(s))
                s = s[:i] + s[i:j] * 2 + s[j:]
            else:
                s = s[:i] + r.choice(INJECTIONS) + s[i:]
        return s

    def program(self, robot: RobotSpec) -> str:
        sep = self.r.choice([";", ";\n", "; ", ""])
        stmts = [self.statement(robot) for _ in range(self.r.randint(1, 5))]
        if self.r.random() < 0.2:  # with the tello var_plan half: ~1 input in 10 holds a deep statement
            stmts.insert(self.r.randint(0, len(stmts)), self.deep(robot))
        p = sep.join(stmts)
        if self.r.random() < 0.5:
            p += ";"
        return self.mutate(p) if self.r.random() < 0.5 else p

    def chat(self) -> str:
        return " ".join(self.r.choice(CHAT_WORDS) if self.r.random() < 0.8 else self.string()
                        for _ in range(self.r.randint(0, 30)))

    def pieces(self, text: str) -> list[str]:
        out, i = [], 0
        while i < len(text):
            k = self.r.choice([1, 2, 3, 3, 4, 6, 20])
            out.append(text[i:i + k])
            i += k
        return out


def oracle_problem(robot: RobotSpec, c: SkillCall, *, resolved: bool = False) -> str | None:
    """Independent of guard.py: the schema (ArgSpec.check) plus the Tello SDK's ranges.  A static
    call (resolved=False) may carry None for a computed argument: its value is checked once
    resolved (the executor's backend receives resolved calls only: resolved=True)."""
    spec = robot.skills.get(c.name)
    if spec is None or c.abbr not in (spec.abbr, spec.name):
        return "unknown skill"
    if len(c.args) != len(spec.args):
        return "arity"
    for a, v in zip(spec.args, c.args):
        if v is None and not resolved:
            continue
        if a.check(v) is not None:
            return a.check(v)
        if isinstance(v, float) and not math.isfinite(v):
            return "not finite"
        if a.type == "int" and type(v) is not int:
            return "not int"
        if isinstance(v, str):
            if robot.language == "sentence":  # chat: spaces/format chars fine; controls, bidi not
                ok = all(ch in "\n\t\r" or (unicodedata.category(ch) not in ("Cc", "Cs", "Co", "Cn")
                                             and not "\u202a" <= ch <= "\u202e"
                                             and not "\u2066" <= ch <= "\u2069") for ch in v)
            else:  # robot arguments: printable only
                ok = v.isprintable()
            if not ok or len(v) > a.max_len:
                return "bad string"
    if robot.hardware == "tello" and c.name in ("move", "lift", "rotate"):  # TypeFly's signed skills
        least, zero_ok = {"move": (20, True), "lift": (20, False), "rotate": (1, False)}[c.name]
        most = 360 if c.name == "rotate" else 500
        for v in c.args:
            if v is None and not resolved:
                continue
            if type(v) is not int or not (least <= abs(v) <= most or (zero_ok and v == 0)):
                return f"tello {c.name} amount"
    if robot.hardware == "tello" and c.args and (resolved or c.args[0] is not None):
        v = c.args[0]
        if c.name.startswith("move_") and not (type(v) is int and 20 <= v <= 500):
            return "tello move range"
        if c.name.startswith("turn_") and not (type(v) is int and 1 <= v <= 360):
            return "tello turn range"
    return None


def tamper(rng: random.Random, robot: RobotSpec, calls: list[SkillCall]) -> list[SkillCall] | None:
    calls = list(calls)
    how = rng.randint(0, 4)
    if how == 0 or not calls:
        calls.append(SkillCall("move_forward", "mf", (500,)) if robot.robot_type == "tello"
                     else SkillCall("move", "m", (500, 0)) if robot.robot_type == "tello_typefly"
                     else SkillCall("home", "hm", ()))
    elif how == 1:
        calls.pop(rng.randrange(len(calls)))
    elif how == 2:
        i = rng.randrange(len(calls))
        c = calls[i]
        if not c.args:
            calls[i] = SkillCall(c.name, c.abbr, (1,))
        else:
            a = c.args[0]
            b = float(a) if type(a) is int else (a + "x" if isinstance(a, str) else 7)
            calls[i] = SkillCall(c.name, c.abbr, (b,) + c.args[1:])
    elif how == 3:
        i = rng.randrange(len(calls))
        other = rng.choice([s for s in robot.skills.values() if s.name != calls[i].name])
        calls[i] = SkillCall(other.name, other.abbr, calls[i].args)
    else:
        if len(set(calls)) < 2:
            return None
        calls = calls[1:] + calls[:1]
    return calls


class ExecPath:
    """Dispatched segments of one input, run on a SegmentExecutor (one plan per input)."""

    def __init__(self, robot: RobotSpec, kind: str, rng: random.Random, host: str = "127.0.2.9") -> None:
        self.robot, self.kind, self.rng = robot, kind, rng
        self.emu = None
        if kind == "tello":
            import logging

            from djitellopy import Tello

            from timelyllm_ros.executors.tello import TelloBackend, TelloConfig
            from timelyllm_ros.executors.tello_emulator import TelloEmulator

            Tello.LOGGER.setLevel(logging.CRITICAL)
            self.emu = TelloEmulator(host, auto_land_s=1e9).start()
            self.backend = TelloBackend(robot, TelloConfig(host=host, control_port=9889, response_timeout_s=1,
                                                           keepalive_s=0, move_settle_s=0, turn_settle_s=0),
                                        perception=SimulatedPerception(OBJECTS[:3], seed=rng.randrange(10**6)))
        else:
            self.backend = SimulatedBackend(robot, time_scale=0.0,
                                            perception=SimulatedPerception(OBJECTS[:3], seed=rng.randrange(10**6)))
        self.ex = SegmentExecutor(robot, self.backend, ExecutorConfig(timeout_s=10.0))
        if self.emu is not None:
            try:  # connect now, from one thread: djitellopy binds its process-wide UDP 8889 on first use
                self.ex.start()
            except Exception:  # noqa: BLE001 - the executor retries and reports it on the first goal
                pass
        self.checked = 0  # emulator log entries / backend calls already checked
        self.reasons: dict[str, int] = {}  # why goals did not end OK (first words of the error)

    def run(self, plan_id: str, goals: list[SegmentGoal], st: dict, failures: list[str]) -> None:
        if self.kind == "simulated":
            self.backend.perception = SimulatedPerception(self.rng.sample(OBJECTS[:3], self.rng.randint(0, 3)),
                                                          seed=self.rng.randrange(10**6))
        self.ex.new_flight()  # one emulated drone flies every plan: each plan counts as its own flight
        for g in goals:
            rep = self.ex.execute(g)
            st["exec_goals"] += 1
            st["exec_ok" if rep.code is ResultCode.OK else "exec_refused_or_failed"] += 1
            if rep.code is not ResultCode.OK:
                why = rep.error.split(":")[0][:40]
                self.reasons[why] = self.reasons.get(why, 0) + 1
            if "refused at run time" in rep.error or "flight envelope" in rep.error:
                st["exec_runtime_refusals"] += 1
            if rep.error.startswith("executor error"):
                st["crashes"] += 1
                failures.append(f"EXECUTOR CRASH on {g.text!r}: {rep.error}")
            if rep.code is not ResultCode.OK:
                break  # the planner fails the plan at its first failed segment
        self.ex.forget(plan_id)
        if self.emu is not None:
            self.check_emulator(st, failures)
        else:
            calls = self.backend.calls
            for c, _ in calls:
                st["backend_calls"] += 1
                bad = oracle_problem(self.robot, c, resolved=True)
                if bad:
                    st["invalid_commands"] += 1
                    failures.append(f"INVALID CALL reached the backend: {c}: {bad}")
            calls.clear()

    def check_emulator(self, st: dict, failures: list[str]) -> None:
        """Check the commands the emulator received since the last check (a command that arrives
        after its plan ended, e.g. a late halt, is checked with the next plan or at close)."""
        from timelyllm_ros.executors.tello_emulator import is_invalid

        cmds = self.emu.commands()
        for c in cmds[self.checked:]:
            st["emulator_commands"] += 1
            if is_invalid(c):
                st["invalid_commands"] += 1
                failures.append(f"INVALID COMMAND at the emulator: {c!r}")
        self.checked = len(cmds)

    def close(self, st: dict, failures: list[str]) -> None:
        """Close the executor (it may land the drone), then the emulator, then check every command
        the emulator received that no plan's check saw yet."""
        self.ex.close()
        if self.emu is not None:
            self.emu.close()
            self.check_emulator(st, failures)


class TelloFleet:
    """K emulated Tellos run plans in parallel, one thread each (djitellopy shares one UDP 8889
    socket and tells drones apart by source IP: emulator i listens on 127.0.2.(9+i):9889).  Plan j
    goes to drone j % K, and each drone runs its plans in order, so what every plan does does not
    depend on thread timing (only the wall time does).  Counts are merged under a lock; a progress
    line is printed every `progress_every` plans."""

    def __init__(self, robot: RobotSpec, k: int, seed: int, progress_every: int, gen_st: dict) -> None:
        import queue
        import threading

        self.paths = [ExecPath(robot, "tello", random.Random(seed + 1 + 7919 * i), host=f"127.0.2.{9 + i}")
                      for i in range(k)]
        self.st: dict[str, int] = dict(exec_goals=0, exec_ok=0, exec_refused_or_failed=0, exec_runtime_refusals=0,
                                       emulator_commands=0, invalid_commands=0, crashes=0)
        self.failures: list[tuple[int, str]] = []
        self.plans = self.submitted = 0
        self.busy_s = 0.0  # executor time summed over the drones
        self.progress_every, self.gen_st = progress_every, gen_st
        self._lock = threading.Lock()
        self._t0 = time.perf_counter()
        self._queues = [queue.Queue(maxsize=64) for _ in range(k)]
        self._threads = [threading.Thread(target=self._work, args=(p, q), name=f"fuzz-drone-{i}", daemon=True)
                         for i, (p, q) in enumerate(zip(self.paths, self._queues))]
        for t in self._threads:
            t.start()

    def submit(self, n: int, goals: list[SegmentGoal], text: str) -> None:
        self._queues[self.submitted % len(self._queues)].put((n, goals, text))
        self.submitted += 1

    def _work(self, path: ExecPath, q) -> None:  # noqa: ANN001 - queue.Queue
        while (item := q.get()) is not None:
            n, goals, text = item
            st: dict[str, int] = dict.fromkeys(self.st, 0)
            failures: list[str] = []
            e0 = time.perf_counter()
            try:
                path.run(f"p{n}", goals, st, failures)
            except Exception:  # noqa: BLE001 - counting crashes is the point
                st["crashes"] += 1
                failures.append(f"CRASH on {text!r}:\n{traceback.format_exc()}")
            with self._lock:
                self.busy_s += time.perf_counter() - e0
                for key, v in st.items():
                    self.st[key] += v
                self.failures += [(n, f) for f in failures]
                self.plans += 1
                if self.plans % self.progress_every == 0:
                    el = time.perf_counter() - self._t0
                    print(f"  progress: {self.plans} plans on {len(self.paths)} emulated drones in {el:.0f} s "
                          f"({self.plans / el:.1f} plans/s), inputs generated {self.gen_st['inputs']}, goals "
                          f"{self.st['exec_goals']} ({self.st['exec_ok']} OK), emulator commands "
                          f"{self.st['emulator_commands']}, invalid {self.st['invalid_commands']}, crashes "
                          f"{self.st['crashes']}; load average {_loadavg()}", flush=True)

    def finish(self, st: dict, first_failures: list[str]) -> dict[str, int]:
        """Wait for every plan, close the drones, add the counts to `st`; returns the reasons goals failed."""
        for q in self._queues:
            q.put(None)
        for t in self._threads:
            t.join()
        reasons: dict[str, int] = {}
        for p in self.paths:
            failures: list[str] = []
            p.close(self.st, failures)
            self.failures += [(sys.maxsize, f) for f in failures]  # after every plan's
            for k, v in p.reasons.items():
                reasons[k] = reasons.get(k, 0) + v
        for k, v in self.st.items():
            st[k] += v
        first_failures += [f for _, f in sorted(self.failures, key=lambda nf: nf[0])]
        return reasons


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--exec", choices=["simulated", "tello", "none"], default="simulated",
                    help="run dispatched drone segments on an executor (tello: djitellopy + the UDP emulator)")
    ap.add_argument("--tello-inputs", type=int, default=1000, help="drone inputs run on the emulator (--exec tello)")
    ap.add_argument("--tello-drones", type=int, default=1,
                    help="emulated drones run in parallel threads, plans dealt round-robin (--exec tello)")
    ap.add_argument("--progress-every", type=int, default=5000, help="print counts every N emulator plans")
    args = ap.parse_args()
    if args.inputs <= 0 or args.tello_inputs < 0:
        ap.error("--inputs must be > 0 and --tello-inputs >= 0")
    if not 1 <= args.tello_drones <= 200 or args.progress_every <= 0:
        ap.error("--tello-drones must be in 1..200 and --progress-every > 0")
    rng = random.Random(args.seed)
    gen = Gen(rng)
    robots = load_robots()
    minispec = [robots["tello"], robots["arm"], robots["tello_typefly"]]
    chat = robots["chat"]
    st = dict(inputs=0, cuts=0, valid_cuts=0, dispatched=0, invalid_dispatched=0, guard_rejected_valid_cut=0,
              guard_rejected_with_plan_state=0, split_mismatch=0, tamper_tries=0, tamper_accepted=0, raw_statements=0, raw_accepted=0,
              computed_args_dispatched=0, deep_statements=0, limit_rejected_cuts=0, exec_inputs=0, exec_goals=0, exec_ok=0, exec_refused_or_failed=0,
              exec_runtime_refusals=0, backend_calls=0, emulator_commands=0, invalid_commands=0, crashes=0)
    first_failures: list[str] = []
    execp = fleet = None
    if args.exec == "tello":
        fleet = TelloFleet(robots["tello"], args.tello_drones, args.seed, args.progress_every, st)
    elif args.exec == "simulated":
        execp = {rt: ExecPath(robots[rt], args.exec, random.Random(args.seed + 1 + i))
                 for i, rt in enumerate(("tello", "tello_typefly"))}
    t0 = time.perf_counter()
    exec_s = 0.0
    for n in range(args.inputs):
        st["inputs"] += 1
        robot = chat if n % 5 == 4 else minispec[n % 5 % 3]
        if robot is chat:
            text = gen.chat()
        elif robot.hardware == "tello" and rng.random() < 0.5:
            text = gen.var_plan(robot)
        else:
            text = gen.program(robot)
        try:
            seg = Segmenter(robot, mode=rng.choice(["sentence", "paragraph"]) if robot is chat else None,
                            eager_close=robot is not chat and rng.random() < 0.3)
            cuts = []
            for p in gen.pieces(text):
                cuts.extend(seg.feed(p))
            cuts.extend(seg.finish())
            ref = Segmenter(robot, mode=seg.mode, eager_close=seg.eager_close)
            if ref.feed(text) + ref.finish() != cuts:
                st["split_mismatch"] += 1
                first_failures.append(f"split mismatch: {text!r}")
            plan = PlanState()
            goals: list[SegmentGoal] = []
            for c in cuts:
                st["cuts"] += 1
                if not c.ok:
                    st["limit_rejected_cuts"] += any(w in c.error for w in LIMIT_WORDS)
                    break  # the planner fails the generation at its first invalid statement
                st["valid_cuts"] += 1
                v = check_segment(robot, c.text, c.calls, plan)  # what the planner does before dispatch
                if v.reason.startswith("internal guard error"):
                    raise RuntimeError(v.reason)
                if not v.ok:
                    st["guard_rejected_with_plan_state"] += 1
                    if not v.reason.startswith(("outside the flight envelope: plan", "invalid statement")):
                        st["guard_rejected_valid_cut"] += 1  # only the plan's history may add a reason
                        first_failures.append(f"guard rejected valid cut {c.text!r}: {v.reason}")
                    break
                plan = v.plan
                st["dispatched"] += 1
                st["computed_args_dispatched"] += sum(a is None for k in c.calls for a in k.args)
                bad = [oracle_problem(robot, k) for k in c.calls]
                if any(bad):
                    st["invalid_dispatched"] += 1
                    first_failures.append(f"INVALID DISPATCHED {c.text!r}: {bad}")
                goals.append(SegmentGoal(f"p{n}", "drone1", robot.robot_type, len(goals), c.text, c.calls, 1.0,
                                         c.blocking))
                if robot is not chat:
                    tampered = tamper(rng, robot, list(c.calls))
                    if tampered is not None:
                        st["tamper_tries"] += 1
                        if check_segment(robot, c.text, tampered).ok:
                            st["tamper_accepted"] += 1
                            first_failures.append(f"TAMPERED ACCEPTED {c.text!r}: {tampered}")
            if fleet is not None and robot.robot_type == "tello" and goals and st["exec_inputs"] < args.tello_inputs:
                st["exec_inputs"] += 1
                fleet.submit(n, goals, text)
            elif execp is not None and robot.hardware == "tello" and goals:
                st["exec_inputs"] += 1
                e0 = time.perf_counter()
                execp[robot.robot_type].run(f"p{n}", goals, st, first_failures)
                exec_s += time.perf_counter() - e0
            if robot is not chat:  # the guard alone on a raw (maybe invalid) statement
                stmt = gen.mutate(gen.statement(robot))
                try:
                    calls = parse_statement(stmt, robot, check=False).calls
                except MiniSpecError:
                    calls = ()
                v = check_segment(robot, stmt, calls)
                st["raw_statements"] += 1
                st["raw_accepted"] += v.ok
                if v.reason.startswith("internal guard error"):
                    raise RuntimeError(v.reason)
                if v.ok and any(oracle_problem(robot, k) for k in calls):
                    st["invalid_dispatched"] += 1
                    first_failures.append(f"INVALID ACCEPTED {stmt!r}")
        except Exception:  # noqa: BLE001 - counting crashes is the point
            st["crashes"] += 1
            first_failures.append(f"CRASH on {text!r}:\n{traceback.format_exc()}")
    st["deep_statements"] = gen.deep_statements
    reasons: dict[str, int] = {}
    if execp is not None:
        for p in execp.values():
            p.close(st, first_failures)
            for k, v in p.reasons.items():
                reasons[k] = reasons.get(k, 0) + v
    if fleet is not None:
        reasons = fleet.finish(st, first_failures)
        exec_s = fleet.busy_s
    secs = time.perf_counter() - t0
    cpu = time.process_time()
    print(f"fuzz_guard: seed {args.seed}, exec path {args.exec}, {secs:.1f} s wall ({st['inputs'] / secs:.0f} "
          f"inputs/s), {cpu:.1f} s CPU, executor {exec_s:.1f} s"
          f"{f' (summed over {args.tello_drones} drones)' if fleet else ''}; load average {_loadavg()}")
    for k, v in st.items():
        print(f"  {k:26} {v}")
    if execp is not None or fleet is not None:
        top = sorted(reasons.items(), key=lambda kv: -kv[1])[:6]
        print("  goals not OK, by reason:", "; ".join(f"{k} x{v}" for k, v in top))
    for f in first_failures[:10]:
        print("  !", f[:500])
    failed = st["invalid_dispatched"] or st["crashes"] or st["tamper_accepted"] or st["split_mismatch"] \
        or st["guard_rejected_valid_cut"] or st["invalid_commands"]
    if st["exec_goals"] and not st["exec_ok"]:  # the path never really ran
        print("  ! no goal ran OK on the executor: the robot path was not exercised (port 8889 busy? run in "
              "a private network namespace: unshare -rn sh -c 'ip link set lo up; python ...')")
        failed = True
    print("RESULT:", "FAIL" if failed else "OK (0 invalid statements dispatched, 0 invalid calls/commands "
          "reached the robot, 0 crashes)")
    return 1 if failed else 0


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


if __name__ == "__main__":
    sys.exit(main())

"""Large fuzz run of the segmenter -> guard -> dispatch path (tests/test_fuzz_guard.py runs 2000
examples per property with Hypothesis; this runs a seeded random generator for many more).

Each input is a random or mutated MiniSpec program (drone or arm) or chat reply, with injection-
like strings ('; rm -rf /, nested and escaped quotes, unicode, bidi controls, huge numbers, NaN,
negative values, newlines).  It is fed to the segmenter in random token pieces; every valid cut
goes through the guard as the planner would do before dispatch, and every dispatched call is
checked by an independent oracle (schema + Tello SDK ranges).  Valid statements are also sent
with tampered call lists.  Prints inputs tried, invalid segments dispatched (must be 0) and
crashes (must be 0); exits 1 otherwise.

    python benchmarks/fuzz_guard.py [--inputs 100000] [--seed 1]
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from timelyllm_ros.core.guard import check_segment  # noqa: E402
from timelyllm_ros.core.minispec import MiniSpecError, parse_statement  # noqa: E402
from timelyllm_ros.core.robots import RobotSpec, load_robots  # noqa: E402
from timelyllm_ros.core.segmenter import Segmenter  # noqa: E402
from timelyllm_ros.core.types import SkillCall  # noqa: E402

INJECTIONS = ["'; rm -rf /", "\\'; mf(500); '", "');mf(500);l('", "}{", "?", ":{", "\x00", "\n", "\r\n",
              "\t", "\u202e", "\u200b", "\u00a0", "NaN", "1e999", "\U0001f408", "\u732b", "'", "\\", "\\\\'",
              "$(reboot)", "%s%n", "\x1b[2J", "{{{{", "))))", ";;;", "-> True", "cat", "red box", "", "x" * 250]
SPECIALS = ";{}()'\\?:_=-<>&|,. \n0123456789\u202e\x00\u00e9\U0001f408"
NUMBERS = [0, -1, 1, 19, 20, 21, 50, 90, 499, 500, 501, 359, 360, 361, -80, 80, 81, 90, 91, -181, 180, 10**25,
           -10**40, 2**63]
CHAT_WORDS = ["Hi", "Dr.", "e.g.", "3.5", "U.S.", "1.", "ok", "\n", "\n\n", "?!", "\"", "...", "A.", "I.", "etc.",
              "\x07", "\u202e", "\U0001f408", "  ", "The", "drone", "is", "here.", "Why?", "Yes!"]


class Gen:
    def __init__(self, rng: random.Random) -> None:
        self.r = rng

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

    def call(self, robot: RobotSpec) -> str:
        r = self.r
        spec = r.choice(list(robot.skills.values()))
        name = r.choice([spec.abbr, spec.abbr, spec.abbr, spec.name, "zz", spec.abbr + "x", "say", "pk"])
        if r.random() < 0.85:
            args = []
            for a in spec.args:
                if a.type == "str":
                    args.append(self.quote(self.string()))
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
        k = self.r.randint(0, 3)
        return self.call(robot) if k < 2 else (self.literal() if k == 2 else self.r.choice(["_1", "_x"]))

    def test(self, robot: RobotSpec) -> str:
        parts = []
        for i in range(self.r.randint(1, 3)):
            if i:
                parts.append(self.r.choice("&|"))
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
            return f"{r.choice(['_1', '_x'])}={self.operand(robot)}"
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
        p = sep.join(self.statement(robot) for _ in range(self.r.randint(1, 5)))
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


def oracle_problem(robot: RobotSpec, c: SkillCall) -> str | None:
    """Independent of guard.py: the schema (ArgSpec.check) plus the Tello SDK's ranges."""
    spec = robot.skills.get(c.name)
    if spec is None or c.abbr not in (spec.abbr, spec.name):
        return "unknown skill"
    if len(c.args) != len(spec.args):
        return "arity"
    for a, v in zip(spec.args, c.args):
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
    if robot.robot_type == "tello" and c.args:
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    gen = Gen(rng)
    robots = load_robots()
    minispec = [robots["tello"], robots["arm"]]
    chat = robots["chat"]
    st = dict(inputs=0, cuts=0, valid_cuts=0, dispatched=0, invalid_dispatched=0, guard_rejected_valid_cut=0,
              split_mismatch=0, tamper_tries=0, tamper_accepted=0, raw_statements=0, raw_accepted=0, crashes=0)
    first_failures: list[str] = []
    t0 = time.perf_counter()
    for n in range(args.inputs):
        st["inputs"] += 1
        robot = chat if n % 5 == 4 else minispec[n % 2]
        text = gen.chat() if robot is chat else gen.program(robot)
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
            for c in cuts:
                st["cuts"] += 1
                if not c.ok:
                    continue
                st["valid_cuts"] += 1
                v = check_segment(robot, c.text, c.calls)  # what the planner does before dispatch
                if v.reason.startswith("internal guard error"):
                    raise RuntimeError(v.reason)
                if not v.ok:
                    st["guard_rejected_valid_cut"] += 1
                    first_failures.append(f"guard rejected valid cut {c.text!r}: {v.reason}")
                    continue
                st["dispatched"] += 1
                bad = [oracle_problem(robot, k) for k in c.calls]
                if any(bad):
                    st["invalid_dispatched"] += 1
                    first_failures.append(f"INVALID DISPATCHED {c.text!r}: {bad}")
                if robot is not chat:
                    tampered = tamper(rng, robot, list(c.calls))
                    if tampered is not None:
                        st["tamper_tries"] += 1
                        if check_segment(robot, c.text, tampered).ok:
                            st["tamper_accepted"] += 1
                            first_failures.append(f"TAMPERED ACCEPTED {c.text!r}: {tampered}")
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
    secs = time.perf_counter() - t0
    print(f"fuzz_guard: seed {args.seed}, {secs:.1f} s ({st['inputs'] / secs:.0f} inputs/s)")
    for k, v in st.items():
        print(f"  {k:26} {v}")
    for f in first_failures[:10]:
        print("  !", f[:500])
    failed = st["invalid_dispatched"] or st["crashes"] or st["tamper_accepted"] or st["split_mismatch"] \
        or st["guard_rejected_valid_cut"]
    print("RESULT:", "FAIL" if failed else "OK (0 invalid statements dispatched, 0 crashes)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

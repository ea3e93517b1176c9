"""MiniSpec (TypeFly's robot planning language): parser, schema check and interpreter.

Grammar (one *statement* is the unit the segmenter cuts and a robot executes)::

    statement := call | assign | loop | cond | else | return
    call      := NAME [ '(' [ literal (',' literal)* ] ')' ]     # `tp` == `tp()`
    assign    := VAR '=' ( call | literal | VAR )                # VAR := _1, _x ...
    loop      := INT '{' block '}'                               # 1 <= INT <= MAX_LOOP
    cond      := '?' test '{' block '}'
    else      := ':' ( '{' block '}' | cond )                    # else / else-if of the
                                                                 # preceding conditional
    return    := '->' [ operand ]
    block     := ( statement | ';' )*       # ';' separates statements; after '}' it is optional
    test      := conj ( '|' conj )* ;  conj := cmp ( '&' cmp )*
    cmp       := operand [ ('=='|'!='|'<'|'>'|'<='|'>=') operand ]
    operand   := call | VAR | literal
    literal   := INT | FLOAT | 'string' | True | False           # strings: \\' and \\\\ escapes

An else is its own statement so that a conditional can be dispatched the moment its `}` arrives
(TypeFly stream semantics); the interpreter links it to the preceding conditional through the
executor's per-plan `env`.  Call arguments are literals only, so every call can be checked against
the robot schema before the robot sees it.
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass
from typing import Callable, MutableMapping, NamedTuple, Union

from .robots import RobotSpec, SkillSpec
from .types import SkillCall, Value

MAX_LOOP = 100  # largest loop bound a plan may use (keeps robots safe)
MAX_DEPTH = 8  # nesting of blocks
MAX_CALLS = 32  # skill calls written in one statement
MAX_TEXT = 4096  # characters in one statement
MAX_NUMBER_CHARS = 24  # longer numeric literals are rejected before int()/float()
MAX_STEPS = 1000  # skill calls one run_statement may execute (loops multiply calls)
MAX_LOOP_PRODUCT = 1000  # product of nested loop counts in one statement

RETURNED = "__returned__"  # env key: True once the plan executed `->`
RETURN_VALUE = "__return_value__"
COND_CHAIN = "__cond__"  # env key: whether the preceding top-level if/else chain took a branch


class MiniSpecError(ValueError):
    """A statement is malformed or breaks the robot schema; `pos` is the column in the statement."""

    def __init__(self, message: str, pos: int = 0) -> None:
        super().__init__(f"{message} (at column {pos})")
        self.message = message
        self.pos = pos


class MiniSpecRuntimeError(RuntimeError):
    """A valid statement failed while running (undefined variable, bad comparison, step limit)."""


# ---------------------------------------------------------------- AST


@dataclass(frozen=True, slots=True)
class Lit:
    value: Value
    pos: int


@dataclass(frozen=True, slots=True)
class Var:
    name: str
    pos: int


@dataclass(frozen=True, slots=True)
class Call:
    call: SkillCall
    returns: str  # the skill's return type (none | bool | float | str)
    pos: int


Operand = Union[Lit, Var, Call]


@dataclass(frozen=True, slots=True)
class Compare:
    op: str  # == != < > <= >=
    left: Operand
    right: Operand
    pos: int


@dataclass(frozen=True, slots=True)
class BoolOp:
    op: str  # & |
    left: "Test"
    right: "Test"
    pos: int


Test = Union[Compare, BoolOp, Lit, Var, Call]


@dataclass(frozen=True, slots=True)
class CallStmt:
    call: Call
    pos: int


@dataclass(frozen=True, slots=True)
class Assign:
    var: str
    value: Operand
    pos: int


@dataclass(frozen=True, slots=True)
class Loop:
    count: int
    body: tuple["Stmt", ...]
    pos: int


@dataclass(frozen=True, slots=True)
class Cond:
    test: Test
    body: tuple["Stmt", ...]
    pos: int


@dataclass(frozen=True, slots=True)
class Else:
    cond: Cond | None  # else-if when set, plain else when None
    body: tuple["Stmt", ...]  # plain else body (empty for else-if)
    pos: int


@dataclass(frozen=True, slots=True)
class Return:
    value: Operand | None
    pos: int


Stmt = Union[CallStmt, Assign, Loop, Cond, Else, Return]


class Parsed(NamedTuple):
    stmt: Stmt
    calls: tuple[SkillCall, ...]  # every call written in the statement, in textual order


# ---------------------------------------------------------------- lexer

_TOKEN_RE = re.compile(
    r"""(?P<ws>\s+)
      |(?P<str>'(?:[^'\\]|\\.)*')
      |(?P<num>-?[0-9]+(?:\.[0-9]+)?)
      |(?P<var>_[A-Za-z0-9_]*)
      |(?P<name>[A-Za-z][A-Za-z0-9_]*)
      |(?P<op>->|==|!=|<=|>=|[<>&|=?:;{}(),])""",
    re.VERBOSE | re.ASCII | re.DOTALL,
)
_ESCAPE_RE = re.compile(r"\\(.)", re.DOTALL)


class _Tok(NamedTuple):
    kind: str  # str num var name op end
    text: str
    pos: int


def _lex(text: str) -> list[_Tok]:
    toks: list[_Tok] = []
    i, n = 0, len(text)
    match = _TOKEN_RE.match
    while i < n:
        m = match(text, i)
        if m is None:
            c = text[i]
            if c == "'":
                raise MiniSpecError("unterminated string literal", i)
            raise MiniSpecError(f"unexpected character {c!r}", i)
        kind = m.lastgroup or ""
        if kind != "ws":
            toks.append(_Tok(kind, m.group(), i))
        i = m.end()
    toks.append(_Tok("end", "", n))
    return toks


def _unescape(raw: str, pos: int) -> str:
    def sub(m: re.Match[str]) -> str:
        c = m.group(1)
        if c not in "'\\":
            raise MiniSpecError(f"unknown escape \\{c} in string (only \\' and \\\\)", pos)
        return c

    return _ESCAPE_RE.sub(sub, raw[1:-1])


_BIDI_CONTROLS = frozenset(chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A)))


def text_problem(s: str) -> str | None:
    """None if free text (a chat sentence) is safe to show or speak: no control characters
    except newline/tab/CR, no bidi overrides (spoofing), no surrogates or unassigned code points."""
    for c in s:
        if c.isprintable() or c in "\n\t\r ":
            continue
        if c in _BIDI_CONTROLS or unicodedata.category(c) in ("Cc", "Cs", "Co", "Cn"):
            return f"text contains control character U+{ord(c):04X}"
    return None


def string_problem(s: str, *, allow_newlines: bool = False) -> str | None:
    """None if s is safe to hand to a robot (printable, no control/format characters)."""
    t = s.replace("\n", "").replace("\t", "").replace("\u200d", "") if allow_newlines else s
    if not t.isprintable():
        bad = next(c for c in t if not c.isprintable())
        return f"string contains non-printable character U+{ord(bad):04X}"
    return None


# ---------------------------------------------------------------- parser


class _Parser:
    def __init__(self, text: str, robot: RobotSpec, check: bool, *, max_text: int = MAX_TEXT,
                 max_calls: int = MAX_CALLS) -> None:
        if len(text) > max_text:
            raise MiniSpecError(f"statement longer than {max_text} characters", max_text)
        self.max_calls = max_calls
        self.toks = _lex(text)
        self.i = 0
        self.robot = robot
        self.check = check
        self.calls: list[SkillCall] = []
        self.depth = 0

    # token helpers
    def peek(self, k: int = 0) -> _Tok:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def next(self) -> _Tok:
        t = self.toks[self.i]
        if t.kind != "end":
            self.i += 1
        return t

    def at(self, text: str) -> bool:
        t = self.toks[self.i]
        return t.kind == "op" and t.text == text

    def expect(self, text: str, what: str = "") -> _Tok:
        t = self.toks[self.i]
        if t.kind != "op" or t.text != text:
            raise MiniSpecError(f"expected {text!r}{what}, got {_desc(t)}", t.pos)
        return self.next()

    # statements
    def statement(self) -> Stmt:
        t = self.peek()
        if t.kind == "op":
            if t.text == "?":
                return self.cond()
            if t.text == ":":
                self.next()
                if self.at("?"):
                    return Else(self.cond(), (), t.pos)
                return Else(None, self.block(), t.pos)
            if t.text == "->":
                self.next()
                nt = self.peek()
                if nt.kind == "end" or (nt.kind == "op" and nt.text in (";", "}")):
                    return Return(None, t.pos)
                return Return(self.operand(), t.pos)
        if t.kind == "num":
            return self.loop()
        if t.kind == "var":
            self.next()
            self.expect("=", f" after variable {t.text}")
            value = self.operand()
            if isinstance(value, Call) and value.returns == "none":
                raise MiniSpecError(f"skill {value.call.abbr!r} returns nothing; cannot assign it", value.pos)
            return Assign(t.text, value, t.pos)
        if t.kind == "name" and t.text not in ("True", "False"):
            return CallStmt(self.call(), t.pos)
        raise MiniSpecError(f"expected a statement, got {_desc(t)}", t.pos)

    def loop(self) -> Loop:
        t = self.next()
        if "." in t.text or t.text.startswith("-"):
            raise MiniSpecError(f"loop count must be a positive integer, got {t.text}", t.pos)
        n = self.number(t)
        if not 1 <= n <= MAX_LOOP:  # type: ignore[operator]
            raise MiniSpecError(f"loop count {n} outside 1..{MAX_LOOP}", t.pos)
        return Loop(int(n), self.block(), t.pos)  # type: ignore[arg-type]

    def cond(self) -> Cond:
        t = self.expect("?")
        test = self.test()
        return Cond(test, self.block(), t.pos)

    def block(self) -> tuple[Stmt, ...]:
        t = self.expect("{", " to open a block")
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise MiniSpecError(f"blocks nested deeper than {MAX_DEPTH}", t.pos)
        body = self.stmts(in_block=True)
        self.expect("}")
        self.depth -= 1
        return body

    def stmts(self, in_block: bool) -> tuple[Stmt, ...]:
        """Statements up to the closing '}' (in a block) or the end of text (a program)."""
        body: list[Stmt] = []
        need_sep = False
        while True:
            nt = self.peek()
            if nt.kind == "end":
                if in_block:
                    raise MiniSpecError("missing '}' at end of statement", nt.pos)
                break
            if nt.kind == "op" and nt.text == "}":
                if in_block:
                    break
                raise MiniSpecError("unbalanced '}'", nt.pos)
            if nt.kind == "op" and nt.text == ";":
                self.next()
                need_sep = False
                continue
            if need_sep:
                raise MiniSpecError(f"expected ';' or '}}', got {_desc(nt)}", nt.pos)
            s = self.statement()
            if isinstance(s, Else) and (body or in_block):  # a program may start with the else
                prev = body[-1] if body else None         # of a conditional in an earlier segment
                if not (isinstance(prev, Cond) or (isinstance(prev, Else) and prev.cond is not None)):
                    raise MiniSpecError("':' (else) must follow a conditional", s.pos)
            body.append(s)
            need_sep = not isinstance(s, (Loop, Cond, Else))
        return tuple(body)

    # expressions
    def test(self) -> Test:
        left = self.conj()
        while self.at("|"):
            t = self.next()
            left = BoolOp("|", left, self.conj(), t.pos)
        return left

    def conj(self) -> Test:
        left = self.cmp()
        while self.at("&"):
            t = self.next()
            left = BoolOp("&", left, self.cmp(), t.pos)
        return left

    def cmp(self) -> Test:
        left = self.operand()
        t = self.peek()
        if t.kind == "op" and t.text in ("==", "!=", "<", ">", "<=", ">="):
            self.next()
            return Compare(t.text, left, self.operand(), t.pos)
        return left

    def operand(self) -> Operand:
        t = self.peek()
        if t.kind == "var":
            self.next()
            return Var(t.text, t.pos)
        if t.kind == "name" and t.text not in ("True", "False"):
            c = self.call()
            if c.returns == "none":
                raise MiniSpecError(f"skill {c.call.abbr!r} returns nothing; cannot use its value", c.pos)
            return c
        return Lit(self.literal(), t.pos)

    def literal(self) -> Value:
        t = self.next()
        if t.kind == "str":
            return _unescape(t.text, t.pos)
        if t.kind == "num":
            return self.number(t)
        if t.kind == "name" and t.text in ("True", "False"):
            return t.text == "True"
        raise MiniSpecError(f"expected a value, got {_desc(t)}", t.pos)

    @staticmethod
    def number(t: _Tok) -> int | float:
        if len(t.text) > MAX_NUMBER_CHARS:
            raise MiniSpecError(f"number literal longer than {MAX_NUMBER_CHARS} characters", t.pos)
        if "." in t.text:
            v = float(t.text)
            if not math.isfinite(v):
                raise MiniSpecError(f"number {t.text} is not finite", t.pos)
            return v
        return int(t.text)

    def call(self) -> Call:
        t = self.next()
        spec = self.robot.skill(t.text)
        if spec is None:
            raise MiniSpecError(f"unknown skill {t.text!r} for robot type {self.robot.robot_type!r}", t.pos)
        args: list[Value] = []
        arg_pos: list[int] = []
        if self.at("("):
            self.next()
            if not self.at(")"):
                while True:
                    at = self.peek()
                    if at.kind == "var":
                        raise MiniSpecError(f"arguments of {t.text!r} must be literals, got variable {at.text}",
                                            at.pos)
                    if at.kind == "name" and at.text not in ("True", "False"):
                        raise MiniSpecError(f"arguments of {t.text!r} must be literals, got {at.text!r}", at.pos)
                    arg_pos.append(at.pos)
                    args.append(self.literal())
                    if self.at(","):
                        self.next()
                        continue
                    break
            self.expect(")", f" to close the call of {t.text!r}")
        if self.check:
            bad = _check_args(spec, args)
            if bad:
                i, problem = bad
                raise MiniSpecError(f"{t.text}: {problem}", arg_pos[i] if 0 <= i < len(arg_pos) else t.pos)
        if len(self.calls) >= self.max_calls:
            raise MiniSpecError(f"more than {self.max_calls} skill calls in one statement", t.pos)
        sc = SkillCall(spec.name, t.text, tuple(args))
        self.calls.append(sc)
        return Call(sc, spec.returns, t.pos)


def check_call_args(spec: SkillSpec, args: list[Value] | tuple[Value, ...]) -> str | None:
    """None if args fit the skill's schema (arity, types, ranges, safe strings), else why not."""
    bad = _check_args(spec, args)
    return bad[1] if bad else None


def _check_args(spec: SkillSpec, args: list[Value] | tuple[Value, ...]) -> tuple[int, str] | None:
    if len(args) != len(spec.args):
        want = ", ".join(f"{a.name}:{a.type}" for a in spec.args) or "no arguments"
        return -1, f"takes {len(spec.args)} argument(s) ({want}), got {len(args)}"
    for i, (a, v) in enumerate(zip(spec.args, args)):
        if type(v) is int and not -10**18 < v < 10**18:  # ArgSpec.check would str() it (may raise)
            return i, f"argument {a.name!r} is a huge integer"
        problem = a.check(v)
        if problem is None and isinstance(v, str):
            problem = string_problem(v)
            if problem:
                problem = f"argument {a.name!r}: {problem}"
        if problem:
            return i, problem
    return None


def _desc(t: _Tok) -> str:
    return "end of statement" if t.kind == "end" else repr(t.text)


_PARSED: dict[tuple[str, str, bool], tuple[RobotSpec, Parsed | MiniSpecError]] = {}
_PARSED_MAX = 4096


def parse_statement(text: str, robot: RobotSpec, *, check: bool = True) -> Parsed:
    """Parse exactly one statement (optionally followed by one ';').

    Every call is resolved against the robot (abbreviation or full name) and, with check=True,
    checked against its schema.  Raises MiniSpecError with a message and column.

    Memoised per (text, robot object, check): a segment's statement is parsed by the segmenter,
    the dispatch guard and the executor, and plans repeat statements.  The AST is immutable, and
    a hit requires the very same RobotSpec object, so a changed schema is never served a stale
    verdict.
    """
    key = (text, getattr(robot, "robot_type", ""), check) if isinstance(text, str) else None
    hit = _PARSED.get(key) if key is not None else None
    if hit is not None and hit[0] is robot:
        if isinstance(hit[1], MiniSpecError):
            raise MiniSpecError(hit[1].message, hit[1].pos)
        return hit[1]
    try:
        parsed = _parse_statement(text, robot, check)
    except MiniSpecError as e:
        if key is not None:
            _remember(key, robot, e)
        raise
    if key is not None:
        _remember(key, robot, parsed)
    return parsed


def _remember(key: tuple[str, str, bool], robot: RobotSpec, value: Parsed | MiniSpecError) -> None:
    if len(_PARSED) >= _PARSED_MAX:
        _PARSED.clear()
    _PARSED[key] = (robot, value)


def _parse_statement(text: str, robot: RobotSpec, check: bool) -> Parsed:
    if not isinstance(text, str):
        raise MiniSpecError(f"statement must be a string, got {type(text).__name__}")
    if robot.language != "minispec":
        raise MiniSpecError(f"robot type {robot.robot_type!r} does not speak MiniSpec")
    p = _Parser(text, robot, check)
    if p.peek().kind == "end":
        raise MiniSpecError("empty statement", 0)
    stmt = p.statement()
    if p.at(";"):
        p.next()
    t = p.peek()
    if t.kind != "end":
        raise MiniSpecError(f"expected end of statement, got {_desc(t)} (one statement per segment)", t.pos)
    if check:
        product = max_loop_product((stmt,))
        if product > MAX_LOOP_PRODUCT:
            raise MiniSpecError(f"nested loops repeat {product} times (at most {MAX_LOOP_PRODUCT})", 0)
        steps = statement_calls(stmt)
        if steps > MAX_STEPS:
            raise MiniSpecError(f"statement may execute {steps} skill calls (at most {MAX_STEPS})", 0)
    return Parsed(stmt, tuple(p.calls))


def parse_program(text: str, robot: RobotSpec, *, check: bool = True,
                  max_calls: int = 100 * MAX_CALLS) -> tuple[tuple[Stmt, ...], tuple[SkillCall, ...]]:
    """Parse a whole plan (a sequence of statements), e.g. a reference plan or a test fixture."""
    if not isinstance(text, str):
        raise MiniSpecError(f"program must be a string, got {type(text).__name__}")
    if robot.language != "minispec":
        raise MiniSpecError(f"robot type {robot.robot_type!r} does not speak MiniSpec")
    p = _Parser(text, robot, check, max_text=100 * MAX_TEXT, max_calls=max_calls)
    body = p.stmts(in_block=False)
    return body, tuple(p.calls)


def statement_calls(stmt: Stmt) -> int:
    """Upper bound of skill calls one run of stmt may execute (loop bodies multiplied)."""
    if isinstance(stmt, CallStmt):
        return 1
    if isinstance(stmt, Assign) or isinstance(stmt, Return):
        return 1 if isinstance(stmt.value, Call) else 0
    if isinstance(stmt, Loop):
        return stmt.count * sum(statement_calls(s) for s in stmt.body)
    if isinstance(stmt, Cond):
        return _test_calls(stmt.test) + sum(statement_calls(s) for s in stmt.body)
    if isinstance(stmt, Else):
        return (statement_calls(stmt.cond) if stmt.cond else 0) + sum(statement_calls(s) for s in stmt.body)
    return 0


def _test_calls(t: Test) -> int:
    if isinstance(t, Call):
        return 1
    if isinstance(t, Compare):
        return _test_calls(t.left) + _test_calls(t.right)
    if isinstance(t, BoolOp):
        return _test_calls(t.left) + _test_calls(t.right)
    return 0


def max_loop_product(stmts: tuple[Stmt, ...] | list[Stmt]) -> int:
    """Largest product of nested loop counts (1 when there is no loop)."""
    best = 1
    for s in stmts:
        if isinstance(s, Loop):
            best = max(best, s.count * max_loop_product(s.body))
        elif isinstance(s, Cond):
            best = max(best, max_loop_product(s.body))
        elif isinstance(s, Else):
            best = max(best, max_loop_product(s.body), max_loop_product((s.cond,)) if s.cond else 1)
    return best


# ---------------------------------------------------------------- interpreter


class _ReturnSignal(Exception):
    def __init__(self, value: Value) -> None:
        self.value = value


class _Runner:
    def __init__(self, call_skill: Callable[[SkillCall], Value], env: MutableMapping[str, Value],
                 max_steps: int) -> None:
        self.call_skill = call_skill
        self.env = env
        self.steps = 0
        self.max_steps = max_steps

    def call(self, c: Call) -> Value:
        self.steps += 1
        if self.steps > self.max_steps:
            raise MiniSpecRuntimeError(f"statement exceeded {self.max_steps} skill calls")
        return self.call_skill(c.call)

    def operand(self, o: Operand) -> Value:
        if isinstance(o, Lit):
            return o.value
        if isinstance(o, Var):
            if o.name not in self.env:
                raise MiniSpecRuntimeError(f"variable {o.name} is not defined")
            return self.env[o.name]
        return self.call(o)

    def test(self, t: Test) -> bool:
        if isinstance(t, BoolOp):
            left = self.test(t.left)  # short-circuit: skills in the right side may not run
            if t.op == "&":
                return left and self.test(t.right)
            return left or self.test(t.right)
        if isinstance(t, Compare):
            a, b = self.operand(t.left), self.operand(t.right)
            if t.op == "==":
                return _eq(a, b)
            if t.op == "!=":
                return not _eq(a, b)
            if not (_is_num(a) and _is_num(b)):
                raise MiniSpecRuntimeError(f"cannot compare {a!r} {t.op} {b!r}: both sides must be numbers")
            return {"<": a < b, ">": a > b, "<=": a <= b, ">=": a >= b}[t.op]  # type: ignore[operator]
        return bool(self.operand(t))

    def block(self, body: tuple[Stmt, ...]) -> Value:
        value: Value = None
        chain: bool | None = None  # whether the current if/else-if chain took a branch
        for s in body:
            value, chain = self.stmt(s, chain)
        return value

    def stmt(self, s: Stmt, chain: bool | None) -> tuple[Value, bool | None]:
        """Run one statement; returns its value and the if-chain state for a following else."""
        if isinstance(s, CallStmt):
            return self.call(s.call), None
        if isinstance(s, Assign):
            v = self.operand(s.value)
            self.env[s.var] = v
            return v, None
        if isinstance(s, Return):
            raise _ReturnSignal(None if s.value is None else self.operand(s.value))
        if isinstance(s, Loop):
            value: Value = None
            for _ in range(min(s.count, MAX_LOOP)):
                value = self.block(s.body)
            return value, None
        if isinstance(s, Cond):
            if self.test(s.test):
                return self.block(s.body), True
            return None, False
        if isinstance(s, Else):
            if chain is None:
                raise MiniSpecRuntimeError("':' (else) without a preceding conditional")
            if chain:
                return None, True
            if s.cond is not None:
                return self.stmt(s.cond, None)
            return self.block(s.body), True
        raise MiniSpecRuntimeError(f"unknown statement {s!r}")


def _is_num(v: Value) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _eq(a: Value, b: Value) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):  # True == 1 must not hold in a robot plan
        return type(a) is type(b) and a == b
    return a == b


def run_statement(ast_or_text: Stmt | str, robot: RobotSpec, call_skill: Callable[[SkillCall], Value],
                  env: MutableMapping[str, Value], *, max_steps: int = MAX_STEPS) -> Value:
    """Execute one statement, calling `call_skill` for every skill call it reaches.

    `env` is the executor's per-plan state: variables (`_1`), the if/else chain of the last
    top-level conditional, and whether the plan already returned (after `->` nothing runs).
    Returns the statement's value: a call's result, an assigned value, the last value of a block,
    or the returned value.
    """
    stmt = parse_statement(ast_or_text, robot).stmt if isinstance(ast_or_text, str) else ast_or_text
    if env.get(RETURNED):
        return env.get(RETURN_VALUE)
    chain = env.get(COND_CHAIN)
    runner = _Runner(call_skill, env, max_steps)
    try:
        value, new_chain = runner.stmt(stmt, chain if isinstance(chain, bool) else None)
    except _ReturnSignal as r:
        env[RETURNED] = True
        env[RETURN_VALUE] = r.value
        env.pop(COND_CHAIN, None)
        return r.value
    if new_chain is None:
        env.pop(COND_CHAIN, None)
    else:
        env[COND_CHAIN] = new_chain
    return value


def run_program(text: str, robot: RobotSpec, call_skill: Callable[[SkillCall], Value],
                env: MutableMapping[str, Value] | None = None, *, max_steps: int = MAX_STEPS) -> Value:
    """Parse and run a whole plan statement by statement (the unsegmented baseline)."""
    env = {} if env is None else env
    body, _ = parse_program(text, robot)
    value: Value = None
    for s in body:
        value = run_statement(s, robot, call_skill, env, max_steps=max_steps)
        if env.get(RETURNED):
            break
    return value

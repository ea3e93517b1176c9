"""MiniSpec (TypeFly's robot planning language): lexer, AST and THE parser (syntax + literal schema).

Grammar (one *statement* is the unit the segmenter cuts and a robot executes)::

    statement := call | assign | loop | cond | else | return
    call      := NAME [ '(' [ expr (',' expr)* ] ')' ]               # `tp` == `tp()`
    assign    := VAR '=' expr                                        # VAR := _1, _x ...
    loop      := INT '{' block '}'                                   # 1 <= INT <= MAX_LOOP
    cond      := '?' test '{' block '}'
    test      := expr, whose first operand may be VAR '=' sum      # TypeFly: ?_1=sd('x'){g(_1)}
    else      := ':' ( '{' block '}' | cond )                        # else / else-if of the
                                                                     # preceding conditional
    return    := '->' [ expr ]
    block     := ( statement | ';' )*       # ';' separates statements; after '}' it is optional
    expr      := conj ( '|' conj )* ;       conj := cmp ( '&' cmp )*
    cmp       := sum [ ('=='|'!='|'<'|'>'|'<='|'>=') sum ]
    sum       := term ( ('+'|'-') term )* ; term := unary ( ('*'|'/') unary )*
    unary     := '-' unary | atom
    atom      := call | VAR | literal | '(' expr ')'
    literal   := INT | FLOAT | 'string' | "string" | True | False  # escapes: \\' \\" \\\\
    ('&&' and '||' are spellings of '&' and '|', as TypeFly's current interpreter writes them)

This is TypeFly's grammar (values, variables and value skills such as `ox('x')` or `time()` wherever
a value may stand, `&`/`|` conditions, an assignment as a condition's first operand:
`?_1=sd('edible?'){g(_1)}` assigns `_1` and tests it, `?_1=ox('ball')>0.6{tc(15)}` assigns `_1`
and compares it, as TypeFly's interpreter evaluates them) plus arithmetic and an explicit else.  An else is its own
statement so that a conditional can be dispatched the moment its `}` arrives (TypeFly stream
semantics); the interpreter links it to the preceding conditional through the executor's per-plan
`env`.

One parser for the whole project: the segmenter, the dispatch guard, the executors and the
benchmarks all call `parse_statement` / `parse_program`.  What is checked where:

* here (`check=True`): syntax, skill names, arity, every *literal* argument against the schema;
  then (`parse.py`, the `parse_statement` / `parse_program` everyone calls) static types of
  computed arguments, loop bounds, calls per statement, the segment's envelope (`check.py`);
* `run.py`: every *computed* argument once its value is known (type, int-ness, range),
  before the skill is called.

A call's `SkillCall` (what goals carry) holds the literal value of each literal argument and
`None` for a computed one (the value exists only at run time); `Call.args` keeps the expressions.
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass
from typing import NamedTuple, Union

from ..robots import ArgSpec, RobotSpec, SkillSpec
from ..types import SkillCall, Value

MAX_LOOP = 100  # largest loop bound a plan may use (keeps robots safe)
MAX_DEPTH = 8  # nesting of blocks
MAX_EXPR_DEPTH = 16  # nesting of parentheses / unary minus / calls in one expression
MAX_OPERATORS = 64  # binary operators in one expression (nested parts and call arguments included):
#                     with MAX_EXPR_DEPTH it bounds the depth of every expression tree, so no walker
#                     of the AST (checks, envelope, interpreter) recurses as deep as the input says
MAX_CALLS = 32  # skill calls written in one statement
MAX_TEXT = 4096  # characters in one statement
MAX_NUMBER_CHARS = 24  # longer numeric literals are rejected before int()/float()
MAX_STEPS = 1000  # skill calls one run_statement may execute (loops multiply calls)
MAX_LOOP_PRODUCT = 1000  # product of nested loop counts in one statement

RETURNED = "__returned__"  # env key: True once the plan executed `->`
RETURN_VALUE = "__return_value__"
COND_CHAIN = "__cond__"  # env key: whether the preceding top-level if/else chain took a branch

ARITH_OPS = ("+", "-", "*", "/")
CMP_OPS = ("==", "!=", "<", ">", "<=", ">=")
BOOL_OPS = ("&", "|")


class MiniSpecError(ValueError):
    """A statement is malformed or breaks the robot schema; `pos` is the column in the statement."""

    def __init__(self, message: str, pos: int = 0) -> None:
        super().__init__(f"{message} (at column {pos})")
        self.message = message
        self.pos = pos


class MiniSpecRuntimeError(RuntimeError):
    """A valid statement failed while running (undefined variable, bad comparison, step limit)."""


class ArgumentError(MiniSpecRuntimeError):
    """A computed argument does not fit its skill (type, int-ness, range): the call is not made."""


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
    call: SkillCall  # literal arguments resolved; None where an argument is computed
    returns: str  # the skill's return type (none | bool | float | str)
    pos: int
    args: tuple["Expr", ...] = ()  # the argument expressions as written


@dataclass(frozen=True, slots=True)
class SetVar:
    """`VAR=value` as a condition's first operand: assigns, and stands for the value."""

    var: str
    value: "Expr"
    pos: int


@dataclass(frozen=True, slots=True)
class Neg:
    operand: "Expr"
    pos: int


@dataclass(frozen=True, slots=True)
class BinOp:
    op: str  # + - * /  == != < > <= >=  & |
    left: "Expr"
    right: "Expr"
    pos: int


Expr = Union[Lit, Var, Call, Neg, BinOp, SetVar]
Operand = Expr  # older names for an expression
Test = Expr


@dataclass(frozen=True, slots=True)
class CallStmt:
    call: Call
    pos: int


@dataclass(frozen=True, slots=True)
class Assign:
    var: str
    value: Expr
    pos: int


@dataclass(frozen=True, slots=True)
class Loop:
    count: int
    body: tuple["Stmt", ...]
    pos: int


@dataclass(frozen=True, slots=True)
class Cond:
    test: Expr
    body: tuple["Stmt", ...]
    pos: int


@dataclass(frozen=True, slots=True)
class Else:
    cond: Cond | None  # else-if when set, plain else when None
    body: tuple["Stmt", ...]  # plain else body (empty for else-if)
    pos: int


@dataclass(frozen=True, slots=True)
class Return:
    value: Expr | None
    pos: int


Stmt = Union[CallStmt, Assign, Loop, Cond, Else, Return]


class Parsed(NamedTuple):
    stmt: Stmt
    calls: tuple[SkillCall, ...]  # every call written in the statement, in textual order


# ---------------------------------------------------------------- lexer

_TOKEN_RE = re.compile(
    r"""(?P<ws>\s+)
      |(?P<str>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
      |(?P<num>[0-9]+(?:\.[0-9]+)?)
      |(?P<var>_[A-Za-z0-9_]*)
      |(?P<name>[A-Za-z][A-Za-z0-9_]*)
      |(?P<op>->|==|!=|<=|>=|&&|\|\||[-+*/<>&|=?:;{}(),])""",
    re.VERBOSE | re.ASCII | re.DOTALL,
)
_ESCAPE_RE = re.compile(r"\\(.)", re.DOTALL)


_OP_ALIAS = {"&&": "&", "||": "|"}  # TypeFly's current interpreter writes && and ||


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
            if c in "'\"":
                raise MiniSpecError("unterminated string literal", i)
            raise MiniSpecError(f"unexpected character {c!r}", i)
        kind = m.lastgroup or ""
        if kind != "ws":
            text_ = m.group()
            toks.append(_Tok(kind, _OP_ALIAS.get(text_, text_) if kind == "op" else text_, i))
        i = m.end()
    toks.append(_Tok("end", "", n))
    return toks


def _unescape(raw: str, pos: int) -> str:
    def sub(m: re.Match[str]) -> str:
        c = m.group(1)
        if c not in "'\"\\":
            raise MiniSpecError(f"unknown escape \\{c} in string (only \\', \\\" and \\\\)", pos)
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
        self.edepth = 0
        self.eops = 0  # binary operators in the current top-level expression
        self.set_ok = False  # the next atom may be `VAR=value` (a condition's first operand)

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

    def at_any(self, ops: tuple[str, ...]) -> bool:
        t = self.toks[self.i]
        return t.kind == "op" and t.text in ops

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
                return Return(self.expr(), t.pos)
        if t.kind == "num":
            return self.loop()
        if t.kind == "var":
            self.next()
            self.expect("=", f" after variable {t.text}")
            return Assign(t.text, self.expr(), t.pos)
        if t.kind == "name" and t.text not in ("True", "False"):
            return CallStmt(self.call(), t.pos)
        raise MiniSpecError(f"expected a statement, got {_desc(t)}", t.pos)

    def loop(self) -> Loop:
        t = self.next()
        if "." in t.text:
            raise MiniSpecError(f"loop count must be a positive integer, got {t.text}", t.pos)
        n = self.number(t)
        if not 1 <= n <= MAX_LOOP:
            raise MiniSpecError(f"loop count {n} outside 1..{MAX_LOOP}", t.pos)
        return Loop(int(n), self.block(), t.pos)

    def cond(self) -> Cond:
        t = self.expect("?")
        self.set_ok = True  # TypeFly: `?_1=sd('x'){g(_1)}`, `?_1=ox('a')>0.6{...}`
        try:
            test = self.expr()
        finally:
            self.set_ok = False
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

    # expressions (precedence climbing, lowest first)
    def expr(self) -> Expr:
        if self.edepth == 0:  # a top-level expression (not inside parentheses or a value call)
            self.eops = 0
        return self.binary(0)

    def operator(self) -> _Tok:
        """Consume a binary operator, counting it against MAX_OPERATORS."""
        t = self.next()
        self.eops += 1
        if self.eops > MAX_OPERATORS:
            raise MiniSpecError(f"expression has more than {MAX_OPERATORS} operators (limit; "
                                f"a longer chain or sum is refused, not evaluated)", t.pos)
        return t

    _LEVELS: tuple[tuple[str, ...], ...] = (("|",), ("&",), CMP_OPS, ("+", "-"), ("*", "/"))
    _SUM_LEVEL = 3  # an assignment in a test takes a sum: `_1=ox('a')*2>0.6` assigns ox('a')*2

    def binary(self, level: int) -> Expr:
        if level == len(self._LEVELS):
            return self.unary()
        ops = self._LEVELS[level]
        left = self.binary(level + 1)
        if ops is CMP_OPS:  # one comparison: `a < b < c` is an error, not a chain
            if self.at_any(ops):
                t = self.operator()
                left = BinOp(t.text, left, self.binary(level + 1), t.pos)
            return left
        while self.at_any(ops):
            t = self.operator()
            left = BinOp(t.text, left, self.binary(level + 1), t.pos)
        return left

    def unary(self) -> Expr:
        t = self.peek()
        if t.kind != "var":
            self.set_ok = False  # `?-_1=...`, `?(_1=...)`: an assignment is the test's first token only
        self.edepth += 1
        if self.edepth > MAX_EXPR_DEPTH:
            raise MiniSpecError(f"expression nested deeper than {MAX_EXPR_DEPTH}", t.pos)
        try:
            if t.kind == "op" and t.text == "-":
                self.next()
                nt = self.peek()
                if nt.kind == "num":  # a negative literal stays a literal (schema-checked as one)
                    self.next()
                    return Lit(-self.number(nt), t.pos)
                return Neg(self.unary(), t.pos)
            if t.kind == "op" and t.text == "(":
                self.next()
                inner = self.expr()
                self.expect(")", " to close the parenthesis")
                return inner
            return self.atom()
        finally:
            self.edepth -= 1

    def atom(self) -> Expr:
        t = self.peek()
        set_ok, self.set_ok = self.set_ok, False  # only the test's very first operand
        if t.kind == "var":
            self.next()
            nt = self.peek()
            if set_ok and nt.kind == "op" and nt.text == "=":
                self.next()
                return SetVar(t.text, self.binary(self._SUM_LEVEL), t.pos)  # binds to its operand
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
        exprs: list[Expr] = []
        if self.at("("):
            self.next()
            if not self.at(")"):
                while True:
                    exprs.append(self.expr())
                    if self.at(","):
                        self.next()
                        continue
                    break
            self.expect(")", f" to close the call of {t.text!r}")
        args = tuple(e.value if isinstance(e, Lit) else None for e in exprs)
        if self.check:
            self.check_literals(t, spec, exprs)
        if len(self.calls) >= self.max_calls:
            raise MiniSpecError(f"more than {self.max_calls} skill calls in one statement", t.pos)
        sc = SkillCall(spec.name, t.text, args)
        self.calls.append(sc)
        return Call(sc, spec.returns, t.pos, tuple(exprs))

    @staticmethod
    def check_literals(t: _Tok, spec: SkillSpec, exprs: list[Expr]) -> None:
        if len(exprs) != len(spec.args):
            want = ", ".join(f"{a.name}:{a.type}" for a in spec.args) or "no arguments"
            raise MiniSpecError(f"{t.text}: takes {len(spec.args)} argument(s) ({want}), got {len(exprs)}", t.pos)
        for a, e in zip(spec.args, exprs):
            if isinstance(e, Lit):
                problem = arg_problem(a, e.value)
                if problem:
                    raise MiniSpecError(f"{t.text}: {problem}", e.pos)


def check_call_args(spec: SkillSpec, args: list[Value] | tuple[Value, ...]) -> str | None:
    """None if args fit the skill's schema (arity, types, ranges, safe strings), else why not."""
    if len(args) != len(spec.args):
        want = ", ".join(f"{a.name}:{a.type}" for a in spec.args) or "no arguments"
        return f"takes {len(spec.args)} argument(s) ({want}), got {len(args)}"
    for a, v in zip(spec.args, args):
        problem = arg_problem(a, v)
        if problem:
            return problem
    return None


def arg_problem(a: ArgSpec, v: Value) -> str | None:
    """None if the value v fits the argument (type, range, safe string), else why not."""
    if type(v) is int and not -10**18 < v < 10**18:  # ArgSpec.check would str() it (may raise)
        return f"argument {a.name!r} is a huge integer"
    problem = a.check(v)
    if problem is None and isinstance(v, str):
        problem = string_problem(v)
        if problem:
            problem = f"argument {a.name!r}: {problem}"
    return problem


def _desc(t: _Tok) -> str:
    return "end of statement" if t.kind == "end" else repr(t.text)


def parse_statement_syntax(text: str, robot: RobotSpec, check: bool) -> Parsed:
    """One statement (optionally followed by one ';'), its calls resolved against the robot and,
    with check=True, every literal argument checked against its schema; no static analysis
    (`minispec.parse.parse_statement` adds it)."""
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
    return Parsed(stmt, tuple(p.calls))


def parse_program_syntax(text: str, robot: RobotSpec, check: bool,
                         max_calls: int) -> tuple[tuple[Stmt, ...], tuple[SkillCall, ...]]:
    """A whole plan (a sequence of statements), as `parse_statement_syntax` reads one."""
    if not isinstance(text, str):
        raise MiniSpecError(f"program must be a string, got {type(text).__name__}")
    if robot.language != "minispec":
        raise MiniSpecError(f"robot type {robot.robot_type!r} does not speak MiniSpec")
    p = _Parser(text, robot, check, max_text=100 * MAX_TEXT, max_calls=max_calls)
    body = p.stmts(in_block=False)
    return body, tuple(p.calls)

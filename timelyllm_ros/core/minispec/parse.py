"""The checked parse: `core.minispec`'s `parse_statement` / `parse_program` = the syntax and literal
schema checks (`syntax.py`) followed, with check=True, by the static analysis over the AST
(`check.py`: types, loop product, calls per statement, each statement's envelope).
"""

from __future__ import annotations

from ..robots import RobotSpec
from ..types import SkillCall
from .check import check_static
from .syntax import MAX_CALLS, MiniSpecError, Parsed, Stmt, parse_program_syntax, parse_statement_syntax

_PARSED: dict[tuple[str, str, bool], tuple[RobotSpec, Parsed | MiniSpecError]] = {}
_PARSED_MAX = 4096


def parse_statement(text: str, robot: RobotSpec, *, check: bool = True) -> Parsed:
    """Parse exactly one statement (optionally followed by one ';').

    Every call is resolved against the robot (abbreviation or full name) and, with check=True,
    checked against its schema (literals, static types of computed arguments, loop bounds).
    Raises MiniSpecError with a message and column.

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
    parsed = parse_statement_syntax(text, robot, check)
    if check:
        check_static((parsed.stmt,), robot)  # static analysis over the parser's AST
    return parsed


def parse_program(text: str, robot: RobotSpec, *, check: bool = True,
                  max_calls: int = 100 * MAX_CALLS) -> tuple[tuple[Stmt, ...], tuple[SkillCall, ...]]:
    """Parse a whole plan (a sequence of statements), e.g. a reference plan or a test fixture."""
    body, calls = parse_program_syntax(text, robot, check, max_calls)
    if check:
        check_static(body, robot, per_statement=True)
    return body, calls

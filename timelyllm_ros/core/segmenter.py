"""Incremental stop checker: detokenised text deltas in, complete executable segments out.

The planner feeds each new token's text as it is generated; the segmenter keeps a tiny state
machine (quote / escape, brace depth, paren depth; for chat: sentence-end candidate, newline run)
and parses only the statement that just closed, so the cost per token is constant and the
generation can be suspended the moment a robot has something to execute (paper §4.1).

MiniSpec (TypeFly stream semantics): a top-level statement is complete at its `;`, or at the `}`
closing a top-level block (loop, conditional, else); with `eager_close=True` also at the `)`
closing a top-level call / assignment / return (TypeFly executes those at `)`).  A trailing
statement without `;` (e.g. a final `tp`) completes on `finish()`.  An empty statement (a lone
`;` after a block) is skipped.  A line starting with `#` where a statement would start is a
result annotation the model wrote itself (`#True`, the format `prompts.result_text` feeds back
after a blocking statement): one cut with `note=True` and no calls, ending at its newline; what
it means is the planner's business (core/speculation.py), the segmenter only finds it.

Chat robots (language `sentence`): a segment is a sentence (`.`, `!`, `?` plus closing quotes or
brackets, followed by whitespace; decimals, "e.g.", "Dr." and initials do not end a sentence) or,
with mode='paragraph', a paragraph (ends at a blank line); a blank line ends a sentence too.
Each chat segment is one `say(text)` call.

Offsets are in characters of the cumulative text: `Cut.end` is just past the statement (its `;`
or `}` included), so the planner knows exactly which tokens lie beyond the segment.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from .minispec import MiniSpecError, Stmt, parse_statement, text_problem
from .robots import RobotSpec
from .types import SkillCall

MODES = ("statement", "sentence", "paragraph")
_WS_STR = " \t\n\r\f\v"  # what the MiniSpec lexer treats as whitespace (ASCII only)
_WS = frozenset(_WS_STR)
_SIMPLE_START = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_-")
_CLOSERS = frozenset("\"')]}\u201d\u2019\u00bb")
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st vs cf approx fig figs no nos vol eq eqs ca inc ltd co dept est "
    "jan feb mar apr jun jul aug sep sept oct nov dec al".split()
)
DEFAULT_MAX_STATEMENT_CHARS = 2048
_TAIL = "rest of a statement that was cut for its length (not parsed: never a statement of its own)"


@dataclass(frozen=True, slots=True)
class Cut:
    """One complete segment found in the generated text."""

    start: int  # offset of the segment's first non-whitespace character
    end: int  # offset just past the segment (its ';' or closing '}' included)
    text: str  # the segment text, stripped
    calls: tuple[SkillCall, ...]  # skill calls in textual order (empty when error is set)
    blocking: bool  # some called skill is blocking: the plan needs its value to go on
    error: str = ""  # '' when the segment is valid for the robot
    stmt: Stmt | None = None  # parsed MiniSpec statement (None for chat segments and errors)
    note: bool = False  # a `#...` result annotation written by the model (text without '#'), no calls

    @property
    def ok(self) -> bool:
        """An executable segment: no error, and not a result note (the planner reads notes itself)."""
        return not self.error and not self.note


class Segmenter:
    """Splits one generation's streamed text into executable segments for one robot type."""

    def __init__(self, robot: RobotSpec, *, mode: str | None = None, eager_close: bool = False,
                 max_statement_chars: int | None = None) -> None:
        if mode is None:
            mode = "statement" if robot.language == "minispec" else "sentence"
        if mode not in MODES:
            raise ValueError(f"segmenter mode must be one of {MODES}, got {mode!r}")
        if (mode == "statement") != (robot.language == "minispec"):
            raise ValueError(f"mode {mode!r} does not fit robot {robot.robot_type!r} "
                             f"(language {robot.language!r})")
        self.robot = robot
        self.mode = mode
        self.eager_close = eager_close
        self._say = None
        if mode != "statement":
            self._say = robot.skill("say")
            if self._say is None or len(self._say.args) != 1 or self._say.args[0].type != "str":
                raise ValueError(f"chat robot {robot.robot_type!r} needs a skill say(text: str)")
            limit = self._say.args[0].max_len
        else:
            limit = DEFAULT_MAX_STATEMENT_CHARS
        if max_statement_chars is not None and (isinstance(max_statement_chars, bool) or
                                                not isinstance(max_statement_chars, int) or max_statement_chars <= 0):
            raise ValueError(f"max_statement_chars must be a positive int, got {max_statement_chars!r}")
        chosen = max_statement_chars or limit
        # a chat segment longer than say()'s max_len could never be valid: split it there
        self.max_statement_chars = min(chosen, limit) if self._say else chosen
        self._parts: list[str] = []  # every delta (the cumulative text, for rollback)
        self._clean: list[int] = [0]  # offsets where the scanner state is the initial one
        self._finished = False
        self._reset(0)

    # ------------------------------------------------------------ public API

    @property
    def text(self) -> str:
        """All text fed so far (including injected text)."""
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""

    @property
    def length(self) -> int:
        return self._base + len(self._pending)

    @property
    def pending(self) -> str:
        """Text after the last cut that is not a segment yet."""
        return self._pending

    @property
    def in_segment(self) -> bool:
        """True while a started segment waits for its end (non-whitespace text pending)."""
        return self._first >= 0

    @property
    def finished(self) -> bool:
        return self._finished

    def feed(self, delta: str) -> list[Cut]:
        """Add newly generated text; return the segments it completed, in order."""
        if not isinstance(delta, str):
            raise TypeError(f"delta must be str, got {type(delta).__name__}")
        if self._finished:
            raise ValueError("feed() after finish(): the generation already ended")
        if not delta:
            return []
        self._parts.append(delta)
        if self.mode == "statement":
            return self._scan_statements(delta)
        return self._scan_sentences(delta)

    def finish(self) -> list[Cut]:
        """End of generation: the trailing segment without a terminator, if any."""
        if self._finished:
            return []
        self._finished = True
        if self._first < 0:
            return []
        buf, first = self._pending, self._first
        body = buf[first:].rstrip(_WS_STR if self.mode == "statement" else None)
        if self.mode == "statement":
            if self._kind == "#" and not self._taint:
                cut = self._note(first, len(buf))
            elif self._taint:
                cut = self._error(first, len(buf), _TAIL)
            elif self._quote:
                cut = self._error(first, len(buf), "unterminated string at end of generation")
            elif self._brace > 0:
                cut = self._error(first, len(buf), f"missing {self._brace} '}}' at end of generation")
            elif self._paren > 0:
                cut = self._error(first, len(buf), "missing ')' at end of generation")
            else:
                cut = self._statement(first, first + len(body))
        else:
            cut = self._chat(first, first + len(body))
        self._advance(len(buf))
        return [cut]

    def rollback(self, offset: int) -> None:
        """Forget the text past `offset` (tokens the planner dropped), as if never fed.

        Segments that ended after `offset` are forgotten too; the caller must not have dispatched
        them.  Re-scans at most the text since the last segment end at or before `offset`.
        """
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= self.length:
            raise ValueError(f"rollback offset must be an int in 0..{self.length}, got {offset!r}")
        text = self.text[:offset]
        k = bisect.bisect_right(self._clean, offset)
        point = self._clean[k - 1]
        del self._clean[k:]
        self._parts = [text[:point]]
        self._finished = False
        self._reset(point)
        rest = text[point:]
        if rest:
            self._parts.append(rest)
            scan = self._scan_statements if self.mode == "statement" else self._scan_sentences
            cuts = scan(rest)
            if cuts:  # cannot happen: point is the last segment end at or before offset
                raise AssertionError(f"rollback re-scan produced segments: {cuts}")

    def inject(self, text: str) -> None:
        """Append text that is not plan output (a blocking skill's result shown to the LLM).

        Only allowed between segments; the injected text is never segmented.
        """
        if not isinstance(text, str):
            raise TypeError(f"inject() needs str, got {type(text).__name__}")
        if self._first >= 0:
            raise ValueError("inject() in the middle of a segment; roll back to its start first")
        if not text:
            return
        self._parts.append(text)
        self._reset(self.length + len(text))
        self._clean.append(self._base)

    # ------------------------------------------------------------ internals

    def _reset(self, base: int) -> None:
        self._base = base  # offset of _pending[0] in the cumulative text
        self._pending = ""
        self._first = -1  # index in _pending of the segment's first non-whitespace char
        self._kind = ""  # that character (statement kind)
        self._quote = ""  # the open string's quote character ('' outside strings)
        self._escape = False
        self._taint = False  # the text pending is the tail of a statement cut for its length
        self._brace = 0
        self._paren = 0
        self._last = -1  # chat: index of the last non-whitespace char
        self._cand = -1  # chat: index just past a sentence-end candidate
        self._word = ""  # chat: the word being read
        self._nl = 0  # chat: newlines in the current whitespace run
        self._bol = True  # chat: the next word starts a line
        self._wbol = True  # chat: the current word started a line

    def _advance(self, upto: int, clean: bool = True) -> None:
        """Drop _pending[:upto] (consumed by a cut or an empty statement); clean: the scanner
        is in its initial state there (a rollback point)."""
        self._base += upto
        self._pending = self._pending[upto:]
        self._first = -1
        self._kind = ""
        if clean and self._clean[-1] != self._base:
            self._clean.append(self._base)

    def _error(self, first: int, end: int, message: str) -> Cut:
        text = self._pending[first:end].strip(_WS_STR)
        return Cut(self._base + first, self._base + end, text, (), False,
                   f"{message} (offset {self._base + end - 1})")

    def _note(self, first: int, end: int) -> Cut:
        """A `#...` result annotation from `first` (its '#') to `end` (past its newline)."""
        text = self._pending[first + 1:end].strip(_WS_STR)
        return Cut(self._base + first, self._base + end, text, (), False, "", None, True)

    def _statement(self, first: int, end: int) -> Cut:
        text = self._pending[first:end].rstrip(_WS_STR)
        start = self._base + first
        try:
            stmt, calls = parse_statement(text, self.robot)
        except MiniSpecError as e:
            return Cut(start, self._base + end, text, (), False,
                       f"{e.message} in {text[:80]!r} (offset {start + e.pos})")
        blocking = False
        for c in calls:
            spec = self.robot.skills[c.name]
            if spec.blocking:
                blocking = True
                break
        return Cut(start, self._base + end, text, calls, blocking, "", stmt)

    def _chat(self, first: int, end: int) -> Cut:
        assert self._say is not None
        text = self._pending[first:end].strip()
        start = self._base + first
        problem = self._say.args[0].check(text) or text_problem(text)
        if problem:
            return Cut(start, self._base + end, text, (), False, f"{problem} (offset {start})")
        return Cut(start, self._base + end, text, (SkillCall(self._say.name, self._say.abbr, (text,)),),
                   self._say.blocking)

    def _scan_statements(self, delta: str) -> list[Cut]:
        cuts: list[Cut] = []
        buf = self._pending + delta
        self._pending = buf
        j = len(buf) - len(delta)
        n = len(buf)
        first, kind = self._first, self._kind
        quote, esc, br, pa, taint = self._quote, self._escape, self._brace, self._paren, self._taint
        eager = self.eager_close
        ws = _WS
        maxc = self.max_statement_chars
        while j < n:
            c = buf[j]
            j += 1
            if first >= 0 and j - first > maxc:  # per char, so the cut does not depend on deltas
                self._pending = buf
                cuts.append(self._error(first, j, f"statement longer than {maxc} characters without an end"))
                # The rest of that statement (string text included: quote state kept) is never
                # scanned for statements of its own: it ends as one error cut (_TAIL).
                self._advance(j, clean=False)
                buf, n, j = self._pending, len(self._pending), 0
                first, kind, taint = -1, "", True
                if esc:  # c (in the error cut) still moves the string state
                    esc = False
                elif quote and c == "\\":
                    esc = True
                elif quote and c == quote:
                    quote = ""
                elif not quote and (c == "'" or c == '"'):
                    quote = c
                continue
            if kind == "#" and not taint:  # a result annotation runs to the end of its line
                if c == "\n":
                    self._pending = buf
                    cuts.append(self._note(first, j))
                    self._advance(j)
                    buf, n, j = self._pending, len(self._pending), 0
                    first, kind = -1, ""
                continue
            if quote:
                if first < 0:  # only the tail of a cut statement starts inside a string
                    first, kind = j - 1, quote
                if esc:
                    esc = False
                elif c == "\\":
                    esc = True
                elif c == quote:
                    quote = ""
                continue
            if c in ws:
                continue
            if first < 0:
                first, kind = j - 1, c
                if c == "#" and not taint:
                    continue
            if c == "'" or c == '"':
                quote = c
                continue
            end = 0  # > 0: a statement ends at j; error message in msg
            msg = ""
            if c == "(":
                pa += 1
            elif c == ")":
                pa -= 1
                if pa < 0:
                    end, msg = j, "unbalanced ')'"
                elif eager and pa == 0 and br == 0 and kind in _SIMPLE_START:
                    end = j
            elif c == "{":
                if pa:
                    end, msg = j, "'{' inside a call's parentheses"
                else:
                    br += 1
            elif c == "}":
                if pa:
                    end, msg = j, "'}' inside a call's parentheses"
                else:
                    br -= 1
                    if br == 0:
                        end = j
                    elif br < 0:
                        end, msg = j, "unbalanced '}'"
            elif c == ";":
                if pa:
                    end, msg = j, "';' inside a call's parentheses"
                elif br == 0:
                    if first == j - 1:  # empty statement
                        self._pending, self._first = buf, -1
                        self._advance(j)
                        buf, n, j, first = self._pending, len(self._pending), 0, -1
                        continue
                    end = j
            if end:
                self._pending = buf
                if msg or taint:
                    cuts.append(self._error(first, end, msg or _TAIL))
                else:
                    cuts.append(self._statement(first, end))
                self._advance(end)
                buf, n, j = self._pending, len(self._pending), 0
                first, kind, quote, esc, br, pa, taint = -1, "", "", False, 0, 0, False
        self._pending = buf
        self._first, self._kind = first, kind
        self._quote, self._escape, self._brace, self._paren, self._taint = quote, esc, br, pa, taint
        return cuts

    def _scan_sentences(self, delta: str) -> list[Cut]:
        cuts: list[Cut] = []
        rest: str | None = delta
        while rest is not None:  # iterative, not recursive: a huge delta cannot overflow the stack
            rest = self._scan_sentences_once(rest, cuts)
        return cuts

    def _scan_sentences_once(self, delta: str, cuts: list[Cut]) -> str | None:
        """Scan delta; on an overlong segment cut it and return the text still to scan."""
        buf = self._pending + delta
        j = len(buf) - len(delta)
        n = len(buf)
        first, last, cand, word, nl = self._first, self._last, self._cand, self._word, self._nl
        bol, wbol = self._bol, self._wbol
        sentences = self.mode == "sentence"
        limit = self.max_statement_chars
        while j < n:
            c = buf[j]
            j += 1
            if c.isspace():
                end = 0
                if cand >= 0:
                    end = cand
                elif c == "\n" and first >= 0:
                    nl += 1
                    if nl >= 2:
                        end = last + 1
                if end:
                    self._pending, self._first = buf, first
                    cuts.append(self._chat(first, end))
                    self._advance(end)
                    buf, n, j = self._pending, len(self._pending), j - end
                    first, last, cand = -1, -1, -1
                    nl = 1 if c == "\n" else 0
                if c == "\n":
                    bol = True
                word = ""
                continue
            nl = 0
            if not word:  # a word starts: remember whether it starts a line
                wbol, bol = bol or first < 0, False
            if first < 0:
                first = j - 1
            last = j - 1
            if sentences:
                if c in ".!?":
                    if c == "." and _not_sentence_end(word, wbol):
                        cand = -1
                    else:
                        cand = j
                elif cand == j - 1 and c in _CLOSERS:
                    cand = j
                else:
                    cand = -1
            if len(word) < 24:
                word += c
            if j - first > limit:  # overlong: cut at the last space inside the limit, re-scan the rest
                head = buf[first:first + limit]
                sp = max(head.rfind(" "), head.rfind("\n"))
                end = first + (len(head[:sp].rstrip()) if sp > 0 else limit)
                self._pending, self._first = buf, first
                cuts.append(self._chat(first, end))
                self._advance(end)
                rest = self._pending
                self._reset(self._base)
                return rest
        self._pending = buf
        self._first, self._last, self._cand, self._word, self._nl = first, last, cand, word, nl
        self._bol, self._wbol = bol, wbol
        return None


def _not_sentence_end(word: str, starts_line: bool) -> bool:
    """True if a '.' after `word` is not a sentence end (abbreviation, initial, list number)."""
    if not word:
        return False
    w = word.lower().lstrip("(\"'\u201c\u2018")
    if w in _ABBREVIATIONS:
        return True
    parts = w.split(".")
    if len(parts) >= 2 and all(len(p) == 1 and p.isalpha() for p in parts):
        return True  # e.g / i.e / U.S

    if len(w) == 1 and w.isalpha() and word[-1].isupper() and word[-1] != "I":
        return True  # an initial: "J. Smith"
    return starts_line and word.isdigit()  # a list number: "1. First ..."


def segment_text(robot: RobotSpec, text: str, *, mode: str | None = None, eager_close: bool = False) -> list[Cut]:
    """Segments of a complete text (reference plans, offline checks)."""
    seg = Segmenter(robot, mode=mode, eager_close=eager_close)
    return seg.feed(text) + seg.finish()

"""Durable request journal: no accepted request is forgotten across a crash.

SQLite in WAL mode (stdlib `sqlite3`, no hand-rolled file format).  The planner reports through
the listener hooks; every accepted request, every dispatched segment and every executor result is
committed before the hook returns (`synchronous=FULL`: a committed row survives power loss, not
only a process kill).  After a restart, `recover()` resubmits requests that had dispatched
nothing, resumes plans every dispatched segment of which ran (from the token ids journaled at each
dispatched statement: `Planner.resume`) and ends the others FAILED saying where the robot was left
(continuing a half-executed plan behind the robot's back would be unsafe); either way each ends in
one terminal state the client can read.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .core.ports import PlannerListener
from .core.tuf import TUF
from .core.types import GenState, Generation, PlanRequest, RanSegment, Segment, TokenRecord, prompt_digest

SCHEMA_VERSION = 2  # 2: segment times, token records (a journal of schema 1 is migrated on open)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS requests (
  request_id TEXT PRIMARY KEY, body TEXT NOT NULL, state TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '',
  accepted_wall REAL NOT NULL, updated_wall REAL NOT NULL, incarnation INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS segments (
  request_id TEXT NOT NULL, idx INTEGER NOT NULL, text TEXT NOT NULL, dispatched INTEGER NOT NULL DEFAULT 1,
  ok INTEGER, error TEXT NOT NULL DEFAULT '', value TEXT, dispatched_at REAL, exec_start REAL, exec_end REAL,
  out_len INTEGER, out_text_len INTEGER, text_end INTEGER, PRIMARY KEY (request_id, idx));
CREATE INDEX IF NOT EXISTS requests_state ON requests(state);
CREATE TABLE IF NOT EXISTS parameter_changes (
  wall REAL NOT NULL, iteration INTEGER NOT NULL, incarnation INTEGER NOT NULL, changes TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tokens (
  request_id TEXT PRIMARY KEY, prompt_digest TEXT NOT NULL, output_ids TEXT NOT NULL, text TEXT NOT NULL,
  text_base INTEGER NOT NULL, engine_finished INTEGER NOT NULL DEFAULT 0, truncated TEXT NOT NULL DEFAULT '');
"""
# segment times are journaled in seconds after the request's arrival (the planner's clock does not
# survive a restart; the arrival is anchored to the wall clock by requests.accepted_wall)
_MIGRATE_1 = tuple(f"ALTER TABLE segments ADD COLUMN {c}" for c in (
    "dispatched_at REAL", "exec_start REAL", "exec_end REAL", "out_len INTEGER", "out_text_len INTEGER",
    "text_end INTEGER"))
TERMINAL = tuple(s.value for s in GenState if s.terminal)


class JournalError(RuntimeError):
    """The journal cannot be opened or is corrupt; the message says which file and what to do."""


def journal_path_problem(path: str | Path, *, create_dir: bool = False) -> str | None:
    """Why a journal cannot be kept at `path` (None if it can).  Its folder must exist: a
    mistyped folder is an error, never silently created (an empty journal recovers nothing),
    unless `create_dir`; a path under a file or a folder as the path are errors too."""
    p = Path(path)
    if not str(path).strip():
        return "empty journal path"
    if p.is_dir():
        return f"{str(p)!r} is a directory; give a file path for the journal"
    blocker = next((a for a in p.parents if a.exists()), None)
    if blocker is not None and not blocker.is_dir():
        return f"{str(blocker)!r} is a file, not a folder"
    if not p.parent.is_dir() and not create_dir:
        return (f"folder {str(p.parent)!r} does not exist (a mistyped path would start an empty journal that "
                f"recovers nothing); create it first")
    return None


@dataclass(frozen=True, slots=True)
class Unfinished:
    request: dict[str, Any]
    state: str
    segments_dispatched: int
    segments_done: int
    accepted_wall: float = 0.0


@dataclass(frozen=True, slots=True)
class JournaledSegment:
    """A dispatched segment's row; times in seconds after the request's arrival (None: unknown)."""

    index: int
    text: str
    ok: bool | None  # None: no result journaled
    value: Any
    value_known: bool
    dispatched_at: float | None
    exec_start: float | None
    exec_end: float | None
    out_len: int | None = None  # where it ends in the token record (Segment.out_len, ...)
    out_text_len: int | None = None
    text_end: int | None = None


@dataclass
class RecoveryReport:
    resubmitted: list[str]
    failed: list[tuple[str, str]]
    robots: dict[str, str] = field(default_factory=dict)  # request id -> robot id, all of these
    resumed: list[str] = field(default_factory=list)  # every dispatched segment ran: generation goes on


def request_body(r: PlanRequest) -> dict[str, Any]:
    return {"request_id": r.request_id, "robot_id": r.robot_id, "robot_type": r.robot_type, "task": r.task,
            "scene": r.scene, "tuf": {"ert": r.tuf.ert, "alpha": r.tuf.alpha, "beta": r.tuf.beta},
            "task_type": r.task_type, "category": r.category, "reference_plan": r.reference_plan,
            "consume_rate": r.consume_rate}


class Journal(PlannerListener):
    """Planner listener that journals requests and segments (thread-safe, one connection)."""

    def __init__(self, path: str | Path, *, retention_s: float = 7 * 24 * 3600.0, wall=None,
                 create_dir: bool = False) -> None:
        import time

        self.path = Path(path)
        self.retention_s = float(retention_s)
        self._wall = wall or time.time
        self._lock = threading.Lock()
        problem = journal_path_problem(self.path, create_dir=create_dir)
        if problem:
            raise JournalError(f"journal {str(self.path)!r}: {problem}")
        self.created = not self.path.exists()  # a new, empty journal (nothing to recover)
        try:
            if create_dir:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            ok = self._db.execute("PRAGMA quick_check").fetchone()[0]
            if ok != "ok":
                raise JournalError(f"journal {self.path} is corrupt ({ok}); move it aside to start fresh")
            self._db.executescript(_SCHEMA)
            row = self._db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is None:
                self._db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            elif row[0] == "1":  # add the columns of schema 2 (its tables were created above)
                for stmt in _MIGRATE_1:
                    self._db.execute(stmt)
                self._db.execute("UPDATE meta SET value=? WHERE key='schema'", (str(SCHEMA_VERSION),))
            elif row[0] != str(SCHEMA_VERSION):
                raise JournalError(f"journal {self.path} has schema {row[0]}, this planner needs "
                                   f"{SCHEMA_VERSION}; move it aside or migrate it")
            inc = self._db.execute("SELECT value FROM meta WHERE key='incarnation'").fetchone()
            self.incarnation = int(inc[0]) + 1 if inc else 1
            self._db.execute("INSERT OR REPLACE INTO meta VALUES ('incarnation', ?)", (str(self.incarnation),))
        except sqlite3.DatabaseError as e:
            raise JournalError(f"journal {self.path} is unreadable ({e}); move it aside to start fresh") from e
        except OSError as e:  # permissions, a read-only folder, ...
            raise JournalError(f"journal {self.path}: cannot open it: {e.strerror or e}") from e

    # -- planner listener hooks -----------------------------------------------------------
    def on_request_update(self, g: Generation) -> None:
        now = self._wall()
        with self._lock:
            self._db.execute(
                "INSERT INTO requests (request_id, body, state, reason, accepted_wall, updated_wall, incarnation)"
                " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(request_id) DO UPDATE SET state=excluded.state,"
                " reason=excluded.reason, updated_wall=excluded.updated_wall",
                (g.gen_id, json.dumps(request_body(g.request)), g.state.value, g.reason, now, now,
                 self.incarnation))
            if g.state is GenState.DRAINING and g.segments:  # the LLM ended the plan: nothing to resume
                self._db.execute("UPDATE tokens SET engine_finished=1, truncated=? WHERE request_id=?",
                                 (g.truncated, g.gen_id))

    def on_segment_dispatched(self, g: Generation, seg: Segment) -> None:
        """The segment, and the generation's token ids up to its end (one row, replaced at each
        dispatched statement: what a restarted planner resumes from)."""
        arrival = g.request.arrival
        at = None if seg.dispatched_at is None else seg.dispatched_at - arrival
        ids = json.dumps(g.output_ids[:seg.out_len])
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO segments (request_id, idx, text, dispatched_at, out_len, "
                             "out_text_len, text_end) VALUES (?, ?, ?, ?, ?, ?, ?)",
                             (g.gen_id, seg.index, seg.text, at, seg.out_len, seg.out_text_len, seg.text_end))
            text = g.text[:seg.out_text_len]
            if not self._db.execute("UPDATE tokens SET output_ids=?, text=?, text_base=? WHERE request_id=?",
                                    (ids, text, seg.text_end, g.gen_id)).rowcount:
                # the first dispatched statement: the prompt's digest, once (the prompt never changes)
                self._db.execute("INSERT INTO tokens (request_id, prompt_digest, output_ids, text, text_base)"
                                 " VALUES (?, ?, ?, ?, ?)",
                                 (g.gen_id, prompt_digest(g.prompt_ids), ids, text, seg.text_end))

    def on_segment_result(self, g: Generation, seg: Segment) -> None:
        arrival = g.request.arrival
        start = None if seg.exec_start is None else seg.exec_start - arrival
        end = None if seg.exec_end is None else seg.exec_end - arrival
        with self._lock:
            self._db.execute("UPDATE segments SET ok=?, error=?, value=?, exec_start=?, exec_end=? "
                             "WHERE request_id=? AND idx=?",
                             (int(bool(seg.ok)), seg.error, json.dumps(seg.result), start, end, g.gen_id, seg.index))

    # -- queries -------------------------------------------------------------------------------
    def record_parameters(self, iteration: int, changes: dict[str, Any]) -> None:
        """Live parameter changes the planner applied at scheduling point `iteration` (JSON)."""
        with self._lock:
            self._db.execute("INSERT INTO parameter_changes VALUES (?, ?, ?, ?)",
                             (self._wall(), int(iteration), self.incarnation,
                              json.dumps(changes, sort_keys=True, default=str)))

    def parameter_changes(self) -> list[tuple[int, int, dict[str, Any]]]:
        """(incarnation, scheduling point, changes) of every applied live parameter change, in order."""
        with self._lock:
            rows = self._db.execute("SELECT incarnation, iteration, changes FROM parameter_changes "
                                    "ORDER BY rowid").fetchall()
        return [(int(i), int(it), json.loads(c)) for i, it, c in rows]

    def known(self, request_id: str) -> bool:
        with self._lock:
            return self._db.execute("SELECT 1 FROM requests WHERE request_id=?", (request_id,)).fetchone() is not None

    def lookup(self, request_id: str) -> tuple[str, str, str] | None:
        """(state, reason, robot id) of a journaled request, None if it was never accepted."""
        with self._lock:
            row = self._db.execute("SELECT state, reason, body FROM requests WHERE request_id=?",
                                   (request_id,)).fetchone()
        return None if row is None else (row[0], row[1], str(json.loads(row[2]).get("robot_id", "")))

    def unfinished(self) -> list[Unfinished]:
        with self._lock:
            rows = self._db.execute(
                f"SELECT r.request_id, r.body, r.state,"
                f" (SELECT COUNT(*) FROM segments s WHERE s.request_id=r.request_id),"
                f" (SELECT COUNT(*) FROM segments s WHERE s.request_id=r.request_id AND s.ok IS NOT NULL),"
                f" r.accepted_wall FROM requests r WHERE r.state NOT IN ({','.join('?' * len(TERMINAL))})"
                f" ORDER BY r.accepted_wall, r.request_id", TERMINAL).fetchall()
        return [Unfinished(json.loads(b), st, n, d, float(w)) for _, b, st, n, d, w in rows]

    def segment_rows(self, request_id: str) -> list[JournaledSegment]:
        with self._lock:
            rows = self._db.execute("SELECT idx, text, ok, value, dispatched_at, exec_start, exec_end, out_len,"
                                    " out_text_len, text_end FROM segments WHERE request_id=? ORDER BY idx",
                                    (request_id,)).fetchall()
        return [JournaledSegment(int(i), t, None if ok is None else bool(ok), None if v is None else json.loads(v),
                                 v is not None, d, s, e, n, nt, te) for i, t, ok, v, d, s, e, n, nt, te in rows]

    def token_row(self, request_id: str) -> tuple[str, list[int], str, int, bool, str] | None:
        """(prompt digest, output ids, their text, end of the last dispatched statement in it,
        engine finished, truncation reason) journaled at its last dispatched statement."""
        with self._lock:
            row = self._db.execute("SELECT prompt_digest, output_ids, text, text_base, engine_finished, truncated"
                                   " FROM tokens WHERE request_id=?", (request_id,)).fetchone()
        return None if row is None else (row[0], json.loads(row[1]), row[2], int(row[3]), bool(row[4]), row[5])

    def forget_segments(self, request_id: str, first: int) -> None:
        """Segments from `first` on never ran and will be generated anew (a restart resumed
        before them, or resubmitted the request)."""
        with self._lock:
            self._db.execute("DELETE FROM segments WHERE request_id=? AND idx>=?", (request_id, first))
            if first == 0:
                self._db.execute("DELETE FROM tokens WHERE request_id=?", (request_id,))

    def ran(self, request_id: str, index: int, at: float, value: Any = None, value_known: bool = False) -> None:
        """Record that segment `index` succeeded, learnt after a restart (its executor's record:
        no times, its return value when the executor kept it; `at` seconds after the arrival
        stands for both ends)."""
        with self._lock:
            self._db.execute("UPDATE segments SET ok=1, exec_start=?, exec_end=?, value=? WHERE request_id=? AND idx=?"
                             " AND ok IS NULL", (at, at, json.dumps(value) if value_known else None, request_id, index))

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._db.execute("SELECT state, COUNT(*) FROM requests GROUP BY state").fetchall())

    def rows(self) -> list[tuple[str, str, str]]:
        with self._lock:
            return self._db.execute("SELECT request_id, state, reason FROM requests ORDER BY request_id").fetchall()

    def mark(self, request_id: str, state: GenState, reason: str) -> None:
        with self._lock:
            self._db.execute("UPDATE requests SET state=?, reason=?, updated_wall=? WHERE request_id=?",
                             (state.value, reason, self._wall(), request_id))

    def prune(self) -> int:
        """Drop terminal requests older than the retention period; returns how many."""
        cutoff = self._wall() - self.retention_s
        with self._lock:
            ids = [r[0] for r in self._db.execute(
                f"SELECT request_id FROM requests WHERE updated_wall < ? AND state IN ({','.join('?' * len(TERMINAL))})",
                (cutoff, *TERMINAL)).fetchall()]
            for rid in ids:
                self._db.execute("DELETE FROM segments WHERE request_id=?", (rid,))
                self._db.execute("DELETE FROM tokens WHERE request_id=?", (rid,))
                self._db.execute("DELETE FROM requests WHERE request_id=?", (rid,))
        return len(ids)

    def close(self) -> None:
        with self._lock:
            self._db.close()


def request_from_body(body: dict[str, Any], arrival: float) -> PlanRequest:
    return PlanRequest(request_id=body["request_id"], robot_id=body["robot_id"], robot_type=body["robot_type"],
                       task=body["task"], scene=body["scene"], tuf=TUF.from_mapping(body["tuf"]),
                       arrival=arrival, task_type=body.get("task_type", ""),
                       category=body.get("category", "normal"), reference_plan=body.get("reference_plan"),
                       consume_rate=body.get("consume_rate"))


@dataclass(frozen=True, slots=True)
class RobotAccount:
    """What a robot's executor says after a planner restart (srv GetGoalStates): where the robot
    is, and the last state of each goal it has seen, by (request id, segment index)."""

    robot_state: str
    goals: dict[tuple[str, int], str]
    values: dict[tuple[str, int], Any] = field(default_factory=dict)  # return values of succeeded goals


# robot id -> its executor's account, or None when it did not answer
GoalStatesQuery = Callable[[str], "RobotAccount | None"]


def _after_crash(robot: str, n: int, done: int, account: RobotAccount | None, states: list[str | None]) -> str:
    """The FAILED reason of a plan that had dispatched `n` segments when the planner died;
    `states`: each segment's end (journaled, else its executor's account)."""
    head = f"planner restarted after dispatching {n} segment(s)"
    if account is None:
        return f"{head} ({done} reported); {robot} did not answer get_goal_states: robot state unknown, " \
               f"plan not continued"
    if all(st is None for st in states):
        return f"{head}; {robot}'s executor has no record of them (never received, or it restarted since): " \
               f"robot state unknown, plan not continued"
    ok = sum(1 for st in states if st == "succeeded")
    open_ = [i for i, st in enumerate(states) if st in ("queued", "running")]
    where = f"{robot}: {account.robot_state or 'state unknown'}, after {ok} of {n} dispatched statement(s)"
    if open_:
        return f"{head}; {where}, segment {open_[0]} still {states[open_[0]]} there (it ends on the executor)"
    cut = next(i for i, st in enumerate(states) if st != "succeeded")
    return f"{head}; {where}: segment {cut} {states[cut] or 'never reached the executor'}"


def _token_record(journal: Journal, rid: str, rows: list[JournaledSegment], ran_all: bool, arrival: float,
                  now: float, account: RobotAccount | None = None) -> TokenRecord | str:
    """What `Planner.resume` goes on from, after `rows` (times on the new clock), or why the
    journal lacks it.  `ran_all`: rows are every dispatched segment (else generation goes on
    before the first that never ran, from the token ids at the end of the last that did).  A
    segment that ended after the crash has the return value its executor recorded (`account`)."""
    tok = journal.token_row(rid)
    last = rows[-1]
    if tok is None or not tok[1] or last.out_len is None or last.out_text_len is None or last.text_end is None:
        return "the journal holds no token ids for it (a journal of an older planner)"
    digest, ids, text, _base, finished, truncated = tok
    segs = []
    for r in rows:
        at = arrival + r.dispatched_at if r.dispatched_at is not None else now
        if r.ok and r.exec_start is not None and r.exec_end is not None:
            start, end = arrival + r.exec_start, arrival + r.exec_end
        else:  # it ended after the crash: its times were lost with the planner; the wait runs to now
            start = end = now
        if not r.ok and account is not None and (rid, r.index) in account.values:
            segs.append(RanSegment(r.index, r.text, account.values[(rid, r.index)], True, at, start, end))
        else:
            segs.append(RanSegment(r.index, r.text, r.value, r.value_known and bool(r.ok), at, start, end))
    # token ids only grow along a plan: those at an earlier statement's end are a prefix
    return TokenRecord(digest, tuple(ids[:last.out_len]), text[:last.out_text_len], last.text_end, tuple(segs),
                       finished and ran_all, truncated if ran_all else "")


def _ask_robots(journal: Journal, unfinished: list[Unfinished],
                goal_states: GoalStatesQuery | None) -> dict[str, RobotAccount | None]:
    """Each robot with a dispatched segment whose result is not journaled, asked once, all at
    once (a robot whose executor is gone costs its timeout, not one timeout per robot)."""
    if goal_states is None:
        return {}
    robots = sorted({str(u.request.get("robot_id", "")) for u in unfinished if u.segments_dispatched
                     and not all(r.ok for r in journal.segment_rows(u.request["request_id"]))})
    if not robots:
        return {}
    with ThreadPoolExecutor(max_workers=min(16, len(robots)), thread_name_prefix="goal-states") as pool:
        return dict(zip(robots, pool.map(goal_states, robots)))


def recover(journal: Journal, planner: Any, goal_states: GoalStatesQuery | None = None) -> RecoveryReport:
    """Bring every unfinished journaled request to a defined state in a fresh planner.

    The robot's account of each dispatched segment (journaled result, else its executor's record:
    `goal_states`, asked once per robot) decides:
    - nothing dispatched, or nothing of it ever sent to the robot (its executor "refused" every
      goal: aborted while queued behind the crash) -> resubmitted (same request id; it starts
      over, which is safe because no robot acted on it);
    - the first k segments ran to success and the rest, if any, were never sent -> resumed:
      generation goes on from the token ids journaled at the end of segment k-1
      (`Planner.resume`), with its arrival and TUF (the wait the crash caused counts);
    - otherwise (a segment cut mid-action, still running, or no account) -> FAILED with a reason
      that says where the robot was left, e.g. "drone1 hovering after 2 of 5 dispatched
      statement(s): segment 2 stopped"; the planner does not continue a plan behind the robot's back.
    """
    report = RecoveryReport([], [])
    unfinished = journal.unfinished()
    accounts = _ask_robots(journal, unfinished, goal_states)
    wall_now = journal._wall()
    for u in unfinished:
        rid = u.request["request_id"]
        robot = str(u.request.get("robot_id", ""))
        report.robots[rid] = robot
        now = planner.clock.now()
        arrival = now - max(0.0, wall_now - u.accepted_wall)  # its arrival on the new clock
        n = u.segments_dispatched
        rows = journal.segment_rows(rid) if n else []
        account = accounts.get(robot) if not all(r.ok for r in rows) else None
        states = ["succeeded" if r.ok else account.goals.get((rid, r.index)) if account else None for r in rows]
        k = next((i for i, st in enumerate(states) if st != "succeeded"), n)
        # never sent to the robot: refused by its executor, or never received while it has others
        never_sent = account is not None and any(st is not None for st in states) and \
            all(st in ("refused", None) for st in states[k:])
        if k == 0 and (n == 0 or never_sent):
            if n:
                journal.forget_segments(rid, 0)
            res = planner.submit(request_from_body(u.request, now))
            if res.accepted:
                report.resubmitted.append(rid)
                continue
            reason = f"planner restarted; resubmission refused: {res.reason}"
        elif k == n or (k > 0 and never_sent):
            record = _token_record(journal, rid, rows[:k], k == n, arrival, now, account)
            if isinstance(record, TokenRecord):
                res = planner.resume(request_from_body(u.request, arrival), record)
                if res.accepted:
                    for r in rows[:k]:
                        if not r.ok:
                            known = account is not None and (rid, r.index) in account.values
                            journal.ran(rid, r.index, now - arrival, account.values.get((rid, r.index)) if known
                                        else None, known)
                    journal.forget_segments(rid, k)
                    report.resumed.append(rid)
                    continue
                record = res.reason
            state = f" {account.robot_state or 'state unknown'}," if account else ""
            reason = (f"planner restarted after dispatching {n} segment(s); {robot}:{state} after {k} of {n} "
                      f"dispatched statement(s)" + (": all of them ran" if k == n else ", the rest never sent")
                      + f"; plan not resumed: {record}")
        elif goal_states is None:
            reason = (f"planner restarted after dispatching {n} segment(s) "
                      f"({u.segments_done} reported); robot state unknown, plan not continued")
        else:
            reason = _after_crash(robot, n, u.segments_done, account, states)
        journal.mark(rid, GenState.FAILED, reason)
        report.failed.append((rid, reason))
    return report

"""Durable request journal: no accepted request is forgotten across a crash.

SQLite in WAL mode (stdlib `sqlite3`, no hand-rolled file format).  The planner reports through
the listener hooks; every accepted request, every dispatched segment and every executor result is
committed before the hook returns (`synchronous=FULL`: a committed row survives power loss, not
only a process kill).  After a restart, `recover()` resubmits requests that had dispatched
nothing and ends the others FAILED with a reason (the robot's state after a planner crash is not
known to the planner, so continuing a half-executed plan silently would be unsafe); either way
each ends in one terminal state the client can read.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .core.tuf import TUF
from .core.types import GenState, Generation, PlanRequest, Segment

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS requests (
  request_id TEXT PRIMARY KEY, body TEXT NOT NULL, state TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '',
  accepted_wall REAL NOT NULL, updated_wall REAL NOT NULL, incarnation INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS segments (
  request_id TEXT NOT NULL, idx INTEGER NOT NULL, text TEXT NOT NULL, dispatched INTEGER NOT NULL DEFAULT 1,
  ok INTEGER, error TEXT NOT NULL DEFAULT '', value TEXT, PRIMARY KEY (request_id, idx));
CREATE INDEX IF NOT EXISTS requests_state ON requests(state);
CREATE TABLE IF NOT EXISTS parameter_changes (
  wall REAL NOT NULL, iteration INTEGER NOT NULL, incarnation INTEGER NOT NULL, changes TEXT NOT NULL);
"""
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


@dataclass
class RecoveryReport:
    resubmitted: list[str]
    failed: list[tuple[str, str]]
    robots: dict[str, str] = field(default_factory=dict)  # request id -> robot id, all of the above


def request_body(r: PlanRequest) -> dict[str, Any]:
    return {"request_id": r.request_id, "robot_id": r.robot_id, "robot_type": r.robot_type, "task": r.task,
            "scene": r.scene, "tuf": {"ert": r.tuf.ert, "alpha": r.tuf.alpha, "beta": r.tuf.beta},
            "task_type": r.task_type, "category": r.category, "reference_plan": r.reference_plan,
            "consume_rate": r.consume_rate}


class Journal:
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

    def on_segment_dispatched(self, g: Generation, seg: Segment) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO segments (request_id, idx, text) VALUES (?, ?, ?)",
                             (g.gen_id, seg.index, seg.text))

    def on_segment_result(self, g: Generation, seg: Segment) -> None:
        with self._lock:
            self._db.execute("UPDATE segments SET ok=?, error=?, value=? WHERE request_id=? AND idx=?",
                             (int(bool(seg.ok)), seg.error, json.dumps(seg.result), g.gen_id, seg.index))

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
                f" (SELECT COUNT(*) FROM segments s WHERE s.request_id=r.request_id AND s.ok IS NOT NULL)"
                f" FROM requests r WHERE r.state NOT IN ({','.join('?' * len(TERMINAL))})"
                f" ORDER BY r.accepted_wall, r.request_id", TERMINAL).fetchall()
        return [Unfinished(json.loads(b), st, n, d) for _, b, st, n, d in rows]

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


# robot id -> its executor's account, or None when it did not answer
GoalStatesQuery = Callable[[str], "RobotAccount | None"]


def _after_crash(robot: str, n: int, done: int, account: RobotAccount | None, rid: str) -> str:
    """The FAILED reason of a plan that had dispatched `n` segments when the planner died."""
    head = f"planner restarted after dispatching {n} segment(s)"
    if account is None:
        return f"{head} ({done} reported); {robot} did not answer get_goal_states: robot state unknown, " \
               f"plan not continued"
    states = [account.goals.get((rid, i)) for i in range(n)]
    if all(st is None for st in states):
        return f"{head}; {robot}'s executor has no record of them (never received, or it restarted since): " \
               f"robot state unknown, plan not continued"
    ok = sum(1 for st in states if st == "succeeded")
    open_ = [i for i, st in enumerate(states) if st in ("queued", "running")]
    where = f"{robot}: {account.robot_state or 'state unknown'}, after {ok} of {n} dispatched statement(s)"
    if open_:
        return f"{head}; {where}, segment {open_[0]} still {states[open_[0]]} there (it ends on the executor)"
    if ok == n:
        return f"{head}; {where}: all of them ran; plan not continued (resuming generation is not implemented)"
    cut = next(i for i, st in enumerate(states) if st != "succeeded")
    return f"{head}; {where}: segment {cut} {states[cut] or 'never reached the executor'}"


def recover(journal: Journal, planner: Any, goal_states: GoalStatesQuery | None = None) -> RecoveryReport:
    """Bring every unfinished journaled request to a defined state in a fresh planner.

    Nothing dispatched yet -> resubmitted (same request id; it starts over, which is safe because
    no robot acted on it).  Some segments dispatched -> FAILED with a reason that says where the
    robot was left, from its executor's account (`goal_states`, asked once per robot), e.g.
    "drone1 hovering after 2 of 5 dispatched statement(s): segment 2 stopped"; the planner does
    not continue a plan behind the robot's back.
    """
    report = RecoveryReport([], [])
    accounts: dict[str, RobotAccount | None] = {}
    for u in journal.unfinished():
        rid = u.request["request_id"]
        robot = str(u.request.get("robot_id", ""))
        report.robots[rid] = robot
        if u.segments_dispatched == 0:
            res = planner.submit(request_from_body(u.request, planner.clock.now()))
            if res.accepted:
                report.resubmitted.append(rid)
                continue
            reason = f"planner restarted; resubmission refused: {res.reason}"
        elif goal_states is None:
            reason = (f"planner restarted after dispatching {u.segments_dispatched} segment(s) "
                      f"({u.segments_done} reported); robot state unknown, plan not continued")
        else:
            if robot not in accounts:
                accounts[robot] = goal_states(robot)
            reason = _after_crash(robot, u.segments_dispatched, u.segments_done, accounts[robot], rid)
        journal.mark(rid, GenState.FAILED, reason)
        report.failed.append((rid, reason))
    return report

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
from typing import Any

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
    def known(self, request_id: str) -> bool:
        with self._lock:
            return self._db.execute("SELECT 1 FROM requests WHERE request_id=?", (request_id,)).fetchone() is not None

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


def recover(journal: Journal, planner: Any) -> RecoveryReport:
    """Bring every unfinished journaled request to a defined state in a fresh planner.

    Nothing dispatched yet -> resubmitted (same request id; it starts over, which is safe because
    no robot acted on it).  Some segments dispatched -> FAILED with a reason: the planner cannot
    know what the robot did after the crash, so it does not continue the plan behind its back.
    """
    report = RecoveryReport([], [])
    for u in journal.unfinished():
        rid = u.request["request_id"]
        report.robots[rid] = str(u.request.get("robot_id", ""))
        if u.segments_dispatched == 0:
            res = planner.submit(request_from_body(u.request, planner.clock.now()))
            if res.accepted:
                report.resubmitted.append(rid)
                continue
            reason = f"planner restarted; resubmission refused: {res.reason}"
        else:
            reason = (f"planner restarted after dispatching {u.segments_dispatched} segment(s) "
                      f"({u.segments_done} reported); robot state unknown, plan not continued")
        journal.mark(rid, GenState.FAILED, reason)
        report.failed.append((rid, reason))
    return report

"""Plain data of the planner: requests, skill calls, segments, generations and their states."""

from __future__ import annotations

import enum
import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from .policy_state import PolicyState
from .tuf import TUF, TUFError

Value = int | float | str | bool | None


class RequestError(ValueError):
    """A plan request is malformed; the message says which field and why."""


@dataclass(frozen=True, slots=True)
class SkillCall:
    """One call of a robot skill, as parsed from LLM output and validated against the schema."""

    name: str  # full skill name, e.g. move_forward
    abbr: str  # short name the LLM wrote, e.g. mf
    args: tuple[Value, ...] = ()

    def __str__(self) -> str:
        return f"{self.abbr}({','.join(repr(a) if isinstance(a, str) else str(a) for a in self.args)})"


_ID_RE = re.compile(r"^[A-Za-z0-9_.:/-]{1,128}$")

# What a plan request may hold, whoever sends it (a topic message, the plan_task action): checked
# once, by PlanRequest.from_mapping (ros/convert.py only turns message fields into its mapping).
MAX_TEXT = 4000  # characters of the task and of the scene
MAX_LABEL = 256  # characters of robot_type and task_type (ids: _ID_RE)
MAX_CATEGORY = 64  # characters of category
MAX_PLAN = 1 << 20  # characters of reference_plan (the simulated LLM's scripted text)


@dataclass(frozen=True, slots=True)
class PlanRequest:
    """A robot's plan request: what to do, in which scene, with what time utility."""

    request_id: str
    robot_id: str  # robot instance / ROS namespace, e.g. "drone3"
    robot_type: str  # key of robots/<type>.yaml
    task: str
    scene: str
    tuf: TUF
    arrival: float  # planner clock time the request was received
    task_type: str = ""  # e.g. LRTrace trace id "T1", for per-task-type metrics
    category: str = "normal"  # normal | urgent | chat (reporting only)
    reference_plan: str | None = None  # simulator: the text the simulated LLM will "generate"
    consume_rate: float | None = None  # tokens/s a streamed reply is consumed at (Andes)

    @classmethod
    def from_mapping(cls, m: Any, *, arrival: float, robot_types: set[str] | None = None,
                     max_text: int = MAX_TEXT) -> "PlanRequest":
        """Validate an untrusted request (topic message, workload line) and build it: THE
        validation of a request (field types and the limits above)."""
        if not isinstance(m, dict):
            raise RequestError(f"request must be a mapping, got {type(m).__name__}")
        for key in ("request_id", "robot_id", "robot_type", "task", "tuf"):
            if key not in m or m[key] in (None, ""):
                raise RequestError(f"request is missing {key!r}")
        for key in ("robot_id", "request_id"):  # the robot first: a default id is made from it
            if not isinstance(m[key], str) or not _ID_RE.match(m[key]):
                raise RequestError(f"{key} must match {_ID_RE.pattern}, got {m[key]!r}")
        if robot_types is not None and m["robot_type"] not in robot_types:
            raise RequestError(f"unknown robot_type {m['robot_type']!r}; known: {sorted(robot_types)}")
        for key in ("task", "scene"):
            v = m.get(key, "")
            if not isinstance(v, str):
                raise RequestError(f"{key} must be a string")
            if len(v) > max_text:
                raise RequestError(f"{key} is longer than {max_text} characters")
        for key, limit in (("robot_type", MAX_LABEL), ("task_type", MAX_LABEL), ("category", MAX_CATEGORY),
                           ("reference_plan", MAX_PLAN)):
            v = m.get(key)
            if isinstance(v, str) and len(v) > limit:
                raise RequestError(f"{key} is longer than {limit} characters")
        try:
            tuf = m["tuf"] if isinstance(m["tuf"], TUF) else TUF.from_mapping(m["tuf"])
        except TUFError as e:
            raise RequestError(str(e)) from e
        rate = m.get("consume_rate")
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float)) or rate <= 0):
            raise RequestError(f"consume_rate must be > 0 tokens/s, got {rate!r}")
        return cls(
            request_id=m["request_id"], robot_id=m["robot_id"], robot_type=m["robot_type"],
            task=m["task"], scene=m.get("scene", ""), tuf=tuf, arrival=arrival,
            task_type=str(m.get("task_type", "")), category=str(m.get("category", "normal")),
            reference_plan=m.get("reference_plan"), consume_rate=rate,
        )


class GenState(enum.Enum):
    QUEUED = "queued"  # waiting for its first segment to be generated
    RUNNING = "running"  # in the engine batch
    SUSPENDED = "suspended"  # last segment dispatched; ready to resume (queued by priority)
    WAITING = "waiting"  # a blocking skill's result is awaited before resuming
    DRAINING = "draining"  # generation done; dispatched segments still executing
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (GenState.FINISHED, GenState.FAILED, GenState.CANCELLED)


@dataclass(slots=True)
class Segment:
    """One executable piece of a plan: a complete statement, sent to the robot as one goal."""

    index: int
    text: str
    calls: tuple[SkillCall, ...]
    blocking: bool
    token_count: int
    gen_start: float  # when generation of this segment (re)started
    gen_end: float  # when its last token was generated
    est_exec_s: float  # estimated execution time at dispatch
    dispatched_at: float | None = None
    exec_start: float | None = None  # reported by the executor
    exec_end: float | None = None
    measured_s: tuple[float, ...] = ()  # per call
    result: Value = None
    ok: bool | None = None
    error: str = ""
    # Where the statement ends in the generation's token record (a restart resumes from there):
    out_len: int = 0  # output ids through the token that completes it (earlier results included)
    out_text_len: int = 0  # length of Generation.text those ids decode to (a token may run past the end)
    text_end: int = 0  # offset in Generation.text just past the statement


@dataclass(frozen=True, slots=True)
class RanSegment:
    """A segment of a plan, dispatched by a planner that died since, which ran to success."""

    index: int
    text: str
    value: Value  # its result (`value_known` False: it ended after the crash, the value was lost)
    value_known: bool
    dispatched_at: float  # times on the restarted planner's clock
    exec_start: float
    exec_end: float


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """A generation as a planner restarted on its journal finds it (`Planner.resume`): its token
    ids up to the end of its last dispatched statement and the segments that ran."""

    prompt_digest: str  # `prompt_digest(prompt ids)`: the prompt it was generated from
    output_ids: tuple[int, ...]
    text: str  # what output_ids decode to
    text_base: int  # offset in text just past the last dispatched statement
    segments: tuple[RanSegment, ...]  # every dispatched segment, in order, all succeeded
    engine_finished: bool = False  # the LLM had ended the plan (nothing more to generate)
    truncated: str = ""  # ... cut by max_tokens (the reason), "" otherwise


def prompt_digest(ids: Any) -> str:
    """A short fingerprint of prompt token ids (the journal keeps it, not the prompt)."""
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:32]


@dataclass(slots=True)
class Generation:
    """A request's generation: its token record, segments and state (mutated by the planner only)."""

    request: PlanRequest
    prompt_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)  # generated (and injected) token ids: our record
    text: str = ""  # detokenised output so far (segmenter input)
    state: GenState = GenState.QUEUED
    reason: str = ""  # terminal reason
    segments: list[Segment] = field(default_factory=list)
    seg_start: float | None = None  # when the current segment's generation started
    seg_tokens: int = 0  # tokens generated for the current segment
    ready_since: float = 0.0  # when it last became ready to run (FCFS tie-break)
    engine_finished: bool = False
    priority: float = 0.0  # last value set by the policy (for status/debug)
    resumes: int = 0
    spec_hits: int = 0  # blocking results that matched the speculated value (core/speculation.py)
    spec_misses: int = 0  # ... that did not: the statement generated under it was thrown away
    cached_tokens: list[int] = field(default_factory=list)  # num_cached_tokens per (re)add
    finished_at: float | None = None
    recovered: bool = False  # resumed by a planner restarted on its journal (`Planner.resume`)
    # the planner's own counters and marks (typed: read by policies, the journal, the simulator)
    num_preemptions: int = 0  # times a policy's select preempted it while running
    blocked: str | None = None  # why the batch-size controller refused it at the last scheduling
    # point (None: not refused); a policy that reads it clears it (`policies.base.batch_was_full`)
    kv_released: int = 0  # times its preserved KV was released to break a memory stall
    awaiting_cache_report: bool = False  # (re)added: the engine's next output reports its cached tokens
    truncated: str = ""  # cut by max_tokens: why (the plan is not complete); "" otherwise
    engine_restarts: int = 0  # times it was re-queued because the engine was restarted
    engine_lost: int = 0  # times it was re-queued because its engine-pool member failed
    sched_rev: int = 0  # bumped (`touch`) whenever its segments, seg_tokens or output change: see `touch`
    seg_rev: int = 0  # bumped with it unless only tokens changed (`touch_tokens`): see `touch`
    # policy-private state, typed, one record per owner (core/policy_state.py: the length
    # predictor's, Trail's, LAMPS', Andes' priority, the default's marks); never the planner's
    policy: PolicyState = field(default_factory=PolicyState, repr=False)

    @property
    def gen_id(self) -> str:
        return self.request.request_id

    def touch(self) -> None:
        """Record that what a scheduling point reads of g changed: a segment appended,
        dispatched or executed (`next_due` moves), the current segment's token count or the
        token record (output ids generated or injected).  Whoever changes those calls it (the
        planner does; a test that edits them by hand too): a policy may keep per-generation
        terms until `sched_rev` moves (the default policy does).  Bumps `seg_rev` too: what is
        kept per generation apart from its token counts (its next due time, whether it has
        segments) may be kept until `seg_rev` moves."""
        self.sched_rev += 1
        self.seg_rev += 1

    def touch_tokens(self) -> None:
        """`touch` where only the token record or the current segment's token count changed
        (an engine step's tokens): its segments, and so `next_due`, did not — `seg_rev` stays."""
        self.sched_rev += 1

    @property
    def k(self) -> int:
        """Index of the next segment to generate."""
        return len(self.segments)

    def next_due(self, now: float) -> float:
        """When the next segment is due: the first at arrival + ERT (its TUF starts to fall
        after it), a later one when the robot's dispatched actions are estimated to end (it idles
        after that: `prev_exec_end_estimate`).  THE rule: the planner's batch-size budget, the
        default policy's slack and Eq. 4 (core/policies/timelyllm.py) all read it."""
        if not self.segments:
            req = self.request
            return req.arrival + req.tuf.ert
        prev = self.prev_exec_end_estimate()
        return prev if prev is not None else now

    def prev_exec_end_estimate(self) -> float | None:
        """Estimated end of the last dispatched segment's action (None before the first).

        The robot runs segments in order, so each starts no earlier than the previous one ends;
        measured times replace estimates as executor results arrive.
        """
        segs = self.segments
        if not segs:
            return None
        # A measured end replaces everything before it: start at the last segment that has one
        # (the same arithmetic from there on; a scheduling point asks this of every ready one).
        last = segs[-1]
        if last.exec_end is not None:
            return last.exec_end
        if len(segs) == 1:  # (the loop below for one segment)
            start = last.exec_start if last.exec_start is not None else (last.dispatched_at or last.gen_end)
            return start + last.est_exec_s
        n = len(segs)
        i = n - 2
        while i > 0 and segs[i].exec_end is None:
            i -= 1
        seg = segs[i]  # measured, or the first: every one after it is not measured
        end = seg.exec_end
        if end is None:
            start = seg.exec_start
            end = (start if start is not None else (seg.dispatched_at or seg.gen_end)) + seg.est_exec_s
        for i in range(i + 1, n):
            seg = segs[i]
            start = seg.exec_start
            if start is None:
                start = seg.dispatched_at or seg.gen_end
            if end > start:  # (= max(start, end), NaN alike)
                start = end
            end = start + seg.est_exec_s
        return end


@dataclass(frozen=True, slots=True)
class SegmentGoal:
    """What an executor receives for one segment (the ROS ExecuteSegment action goal)."""

    request_id: str
    robot_id: str
    robot_type: str
    segment_index: int
    text: str  # the statement, e.g. "mf(50);" or "?iv('cat')==True{g('cat');}"
    calls: tuple[SkillCall, ...]  # the skill calls it contains, in textual order
    est_exec_s: float
    blocking: bool  # the generation waits for `value` before resuming


class ResultCode(enum.IntEnum):
    OK = 0
    REJECTED = 1  # executor refused the goal (unknown robot, busy, invalid)
    ABORTED = 2  # failed while executing (SDK error, robot fault)
    TIMEOUT = 3  # no result within the configured time
    CANCELLED = 4
    DISCONNECTED = 5  # robot/executor went away


@dataclass(frozen=True, slots=True)
class SegmentResult:
    """What an executor reports back for one segment (the action result)."""

    request_id: str
    segment_index: int
    code: ResultCode
    exec_start: float  # planner-clock times (executors on the wall clock report durations;
    exec_end: float  # adapters convert)
    call_durations_s: tuple[float, ...] = ()  # measured per call, feeds the estimator
    calls_done: int = 0
    value: Value = None  # return value of the segment (blocking skills)
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.code == ResultCode.OK

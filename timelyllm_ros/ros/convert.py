"""Conversion between the core types and ROS message field dicts.

The transport port carries plain *field dicts* shaped exactly like the ROS messages in msg/ and
action/ (nested messages as dicts, sequences as lists, `byte` fields as 1-byte `bytes`, as rclpy
has them).  One converter per message, here and nowhere else, so the in-process transport, the
rclpy transport and the tests all agree on the wire format.

Untrusted input (a topic message from any node) is validated here before it becomes a core type;
errors name the field.  The ROS type names are in `interfaces`, the message codecs in
`message_fields` (rclpy) and `cdr` (rosbags), the checks both codecs share in `walker`.
"""

from __future__ import annotations

import math
import time as _time
from typing import Any, Iterable, Mapping

from timelyllm_ros.core.types import (
    GenState,
    Generation,
    PlanRequest,
    ResultCode,
    Segment,
    SegmentGoal,
    SegmentResult,
    SkillCall,
    Value,
)
from timelyllm_ros.ros.walker import MessageError, nul_problem

VALUE_TYPES = ("none", "bool", "int", "float", "str")
MAX_ARGS = 16
MAX_TEXT = 4000


def _check_nul(fields: dict[str, Any]) -> dict[str, Any]:
    for k, v in fields.items():
        if isinstance(v, str):
            problem = nul_problem(k, v)
            if problem:
                raise MessageError(problem)
    return fields


# ----------------------------------------------------------------------------- primitives


def time_fields(t: float | None = None) -> dict[str, int]:
    """builtin_interfaces/Time from seconds (wall clock when None: ROS stamps are wall time)."""
    t = _time.time() if t is None else float(t)
    if not math.isfinite(t) or t < 0:
        t = 0.0
    sec = int(math.floor(t))
    nsec = int(round((t - sec) * 1e9))
    if nsec >= 1_000_000_000:
        sec, nsec = sec + 1, nsec - 1_000_000_000
    return {"sec": sec, "nanosec": nsec}


def time_from_fields(d: Mapping[str, Any]) -> float:
    return float(d.get("sec", 0)) + float(d.get("nanosec", 0)) * 1e-9


def value_to_text(v: Value) -> tuple[str, str]:
    """A skill/segment return value as (text, type) for a string message field."""
    if v is None:
        return "", "none"
    if isinstance(v, bool):  # before int: bool is an int subclass
        return ("true" if v else "false"), "bool"
    if isinstance(v, int):
        return str(v), "int"
    if isinstance(v, float):
        return repr(v), "float"
    if isinstance(v, str):
        return v, "str"
    raise MessageError(f"value {v!r} has unsupported type {type(v).__name__}")


def value_from_text(text: str, typ: str) -> Value:
    """Inverse of value_to_text; raises MessageError on a type/text mismatch."""
    if not isinstance(text, str):
        raise MessageError(f"value must be text, got {type(text).__name__}")
    if typ in ("none", ""):
        return None
    if typ == "bool":
        if text not in ("true", "false"):
            raise MessageError(f"bool value must be 'true' or 'false', got {text!r}")
        return text == "true"
    if typ == "int":
        try:
            return int(text)
        except ValueError:
            raise MessageError(f"int value expected, got {text!r}") from None
    if typ == "float":
        try:
            f = float(text)
        except ValueError:
            raise MessageError(f"float value expected, got {text!r}") from None
        if not math.isfinite(f):
            raise MessageError(f"float value must be finite, got {text!r}")
        return f
    if typ == "str":
        return text
    raise MessageError(f"value type must be one of {VALUE_TYPES}, got {typ!r}")


def _str(d: Mapping[str, Any], key: str, *, max_len: int | None = MAX_TEXT) -> str:
    """A string field within `max_len` characters (None: the core decides, PlanRequest.from_mapping)."""
    v = d.get(key, "")
    if not isinstance(v, str):
        raise MessageError(f"field {key!r} must be a string, got {type(v).__name__}")
    if max_len is not None and len(v) > max_len:
        raise MessageError(f"field {key!r} is longer than {max_len} characters")
    return v


def _float(d: Mapping[str, Any], key: str, default: float = 0.0) -> float:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise MessageError(f"field {key!r} must be a finite number, got {v!r}")
    return float(v)


def _uint(d: Mapping[str, Any], key: str) -> int:
    v = d.get(key, 0)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise MessageError(f"field {key!r} must be an unsigned int, got {v!r}")
    return v


# ----------------------------------------------------------------------------- skill calls


def skill_call_to_fields(c: SkillCall) -> dict[str, Any]:
    texts, types = [], []
    for a in c.args:
        t, ty = value_to_text(a)
        texts.append(t)
        types.append(ty)
    return {"name": c.name, "abbr": c.abbr, "args": texts, "arg_types": types}


def skill_call_from_fields(d: Mapping[str, Any]) -> SkillCall:
    if not isinstance(d, Mapping):
        raise MessageError(f"skill call must be a message, got {type(d).__name__}")
    name, abbr = _str(d, "name", max_len=64), _str(d, "abbr", max_len=64)
    if not name and not abbr:
        raise MessageError("skill call has neither name nor abbr")
    args, types = list(d.get("args", ())), list(d.get("arg_types", ()))
    if len(args) != len(types):
        raise MessageError(f"skill call {abbr or name}: {len(args)} args but {len(types)} arg_types")
    if len(args) > MAX_ARGS:
        raise MessageError(f"skill call {abbr or name}: more than {MAX_ARGS} args")
    return SkillCall(name=name or abbr, abbr=abbr or name,
                     args=tuple(value_from_text(a, t) for a, t in zip(args, types)))


# ----------------------------------------------------------------------------- plan requests


def plan_request_to_fields(r: PlanRequest, stamp: float | None = None) -> dict[str, Any]:
    return _check_nul({
        "stamp": time_fields(stamp),
        "request_id": r.request_id,
        "robot_id": r.robot_id,
        "robot_type": r.robot_type,
        "task": r.task,
        "scene": r.scene,
        "task_type": r.task_type,
        "category": r.category,
        "tuf_ert": float(r.tuf.ert),
        "tuf_alpha": float(r.tuf.alpha),
        "tuf_beta": float(r.tuf.beta),
        "consume_rate": float(r.consume_rate or 0.0),
        "reference_plan": r.reference_plan or "",
    })


def plan_request_mapping(d: Mapping[str, Any]) -> dict[str, Any]:
    """PlanRequest message fields -> the mapping `PlanRequest.from_mapping` validates (TUF
    nested, consume_rate 0 -> unset).

    Only shape errors are raised here (a field of the wrong type); what a valid request is (ids,
    lengths, TUF, rates) is decided in one place, `PlanRequest.from_mapping` (core/types.py).
    """
    if not isinstance(d, Mapping):
        raise MessageError(f"plan request must be a message, got {type(d).__name__}")
    rate = _float(d, "consume_rate")
    m: dict[str, Any] = {
        "request_id": _str(d, "request_id", max_len=None),
        "robot_id": _str(d, "robot_id", max_len=None),
        "robot_type": _str(d, "robot_type", max_len=None),
        "task": _str(d, "task", max_len=None),
        "scene": _str(d, "scene", max_len=None),
        "task_type": _str(d, "task_type", max_len=None),
        "category": _str(d, "category", max_len=None) or "normal",
        "tuf": {"ert": _float(d, "tuf_ert"), "alpha": _float(d, "tuf_alpha"), "beta": _float(d, "tuf_beta")},
        "consume_rate": rate if rate != 0.0 else None,
    }
    plan = _str(d, "reference_plan", max_len=None)
    if plan:
        m["reference_plan"] = plan
    return m


# ----------------------------------------------------------------------------- segments / goals


def segment_to_fields(request_id: str, s: Segment) -> dict[str, Any]:
    return {
        "request_id": request_id,
        "index": int(s.index),
        "text": s.text,
        "calls": [skill_call_to_fields(c) for c in s.calls],
        "blocking": bool(s.blocking),
        "token_count": int(s.token_count),
        "est_exec_s": float(s.est_exec_s),
    }


def segment_goal_to_fields(g: SegmentGoal, *, planner_id: str = "") -> dict[str, Any]:
    """`planner_id`: the sending planner instance (executors supervise its lease)."""
    return _check_nul({
        "request_id": g.request_id,
        "robot_id": g.robot_id,
        "robot_type": g.robot_type,
        "segment_index": int(g.segment_index),
        "text": g.text,
        "calls": [skill_call_to_fields(c) for c in g.calls],
        "est_exec_s": float(g.est_exec_s),
        "blocking": bool(g.blocking),
        "planner_id": planner_id,
    })


def goal_planner_id(d: Mapping[str, Any]) -> str:
    """The ExecuteSegment goal's planner instance ("" = sent by no supervised planner)."""
    return _str(d, "planner_id", max_len=256)


def segment_goal_from_fields(d: Mapping[str, Any]) -> SegmentGoal:
    """Validate an ExecuteSegment goal from the network."""
    if not isinstance(d, Mapping):
        raise MessageError(f"goal must be a message, got {type(d).__name__}")
    calls = d.get("calls", [])
    if not isinstance(calls, (list, tuple)):
        raise MessageError("field 'calls' must be a sequence")
    est = _float(d, "est_exec_s")
    if est < 0:
        raise MessageError(f"field 'est_exec_s' must be >= 0, got {est}")
    blocking = d.get("blocking", False)
    if not isinstance(blocking, bool):
        raise MessageError("field 'blocking' must be a bool")
    return SegmentGoal(
        request_id=_str(d, "request_id", max_len=256), robot_id=_str(d, "robot_id", max_len=256),
        robot_type=_str(d, "robot_type", max_len=256), segment_index=_uint(d, "segment_index"),
        text=_str(d, "text"), calls=tuple(skill_call_from_fields(c) for c in calls),
        est_exec_s=est, blocking=blocking,
    )


def execute_result_fields(*, code: ResultCode, error: str = "", call_durations_s: Iterable[float] = (),
                          calls_done: int = 0, value: Value = None, exec_duration_s: float = 0.0) -> dict[str, Any]:
    """ExecuteSegment result as an executor reports it (durations on the executor's clock)."""
    text, typ = value_to_text(value)
    return {
        "success": code == ResultCode.OK,
        "error_code": int(code),
        "error_message": error,
        "call_durations_s": [float(x) for x in call_durations_s],
        "calls_done": int(calls_done),
        "value": text,
        "value_type": typ,
        "exec_duration_s": float(exec_duration_s),
    }


def segment_result_from_fields(d: Mapping[str, Any], *, request_id: str, segment_index: int,
                               received_at: float) -> SegmentResult:
    """Executor result -> SegmentResult on the planner's clock.

    Executors time on their own clock, so only durations cross the wire: the action is taken to
    have ended when the result arrived (`received_at`, planner clock) and to have started
    `exec_duration_s` earlier.  A malformed result becomes an ABORTED result saying why, so the
    planner always hears back.
    """
    try:
        if not isinstance(d, Mapping):
            raise MessageError(f"result must be a message, got {type(d).__name__}")
        code_raw = _uint(d, "error_code")
        try:
            code = ResultCode(code_raw)
        except ValueError:
            raise MessageError(f"unknown error_code {code_raw}") from None
        if bool(d.get("success", False)) != (code == ResultCode.OK):
            raise MessageError(f"success={d.get('success')!r} contradicts error_code {code.name}")
        durs = [float(x) for x in d.get("call_durations_s", ())]
        if any(not math.isfinite(x) or x < 0 for x in durs):
            raise MessageError("call_durations_s must be finite and >= 0")
        dur = _float(d, "exec_duration_s")
        if dur < 0:
            raise MessageError("exec_duration_s must be >= 0")
        value = value_from_text(d.get("value", ""), d.get("value_type", "none"))
        return SegmentResult(
            request_id=request_id, segment_index=segment_index, code=code,
            exec_start=received_at - dur, exec_end=received_at, call_durations_s=tuple(durs),
            calls_done=_uint(d, "calls_done"), value=value, error=_str(d, "error_message"),
        )
    except (MessageError, TypeError, ValueError) as e:
        return SegmentResult(request_id=request_id, segment_index=segment_index, code=ResultCode.ABORTED,
                             exec_start=received_at, exec_end=received_at,
                             error=f"malformed executor result: {e}")


def feedback_fields(calls_done: int, current_call: str, elapsed_s: float) -> dict[str, Any]:
    return {"calls_done": int(calls_done), "current_call": current_call, "elapsed_s": float(elapsed_s)}


# ----------------------------------------------------------------------------- status


def generation_utility(gen: Generation) -> float:
    """Utility accrued so far by the whole plan (TimelyLLM Eq. 3: TUF0 of the first action's
    response plus TUF1 of each later wait, over the actions that executed; a request that ended
    early is charged the continuation it never got): ``core.metrics.plan_terms``, the one
    implementation."""
    from ..core.metrics import plan_terms

    return plan_terms(gen).accrued


def request_status_fields(gen: Generation, *, stamp: float | None = None) -> dict[str, Any]:
    first = gen.segments[0] if gen.segments else None
    start = None
    if first is not None:
        start = first.exec_start if first.exec_start is not None else first.dispatched_at
    return {
        "stamp": time_fields(stamp),
        "request_id": gen.request.request_id,
        "robot_id": gen.request.robot_id,
        "state": gen.state.value,
        "terminal": gen.state.terminal,
        "segments_dispatched": sum(1 for s in gen.segments if s.dispatched_at is not None),
        "segments_done": sum(1 for s in gen.segments if s.ok is not None),
        "response_time_s": (start - gen.request.arrival) if start is not None else -1.0,
        "utility": generation_utility(gen),
        "reason": gen.reason,
    }



def _since(t: float | None, t0: float) -> float:
    return -1.0 if t is None else t - t0


def segment_status_fields(gen: Generation, seg: Segment, *, now: float, stamp: float | None = None) -> dict[str, Any]:
    """SegmentStatus of one segment: its generation, dispatch and execution times as seconds after
    the request's arrival (planner clock, ``now`` = that clock's present), and the arrival as ROS
    time (``stamp``, default wall time now, minus how long ago it arrived)."""
    wall = _time.time() if stamp is None else float(stamp)
    arrival = gen.request.arrival
    return {
        "stamp": time_fields(wall), "arrival": time_fields(wall - (now - arrival)),
        "request_id": gen.request.request_id, "robot_id": gen.request.robot_id, "index": seg.index,
        "text": seg.text[:MAX_TEXT], "token_count": int(seg.token_count), "est_exec_s": float(seg.est_exec_s),
        "gen_start_s": _since(seg.gen_start, arrival), "gen_end_s": _since(seg.gen_end, arrival),
        "dispatched_s": _since(seg.dispatched_at, arrival), "exec_start_s": _since(seg.exec_start, arrival),
        "exec_end_s": _since(seg.exec_end, arrival), "done": seg.ok is not None, "ok": bool(seg.ok),
        "error": seg.error or "",
    }


def segment_from_status_fields(d: Mapping[str, Any], *, arrival: float) -> Segment:
    """A SegmentStatus -> core Segment on a clock where the request arrived at ``arrival`` (its
    skill calls are not part of the status: ``calls`` is empty)."""
    def at(key: str) -> float | None:
        v = float(d.get(key, -1.0))
        return None if v < 0 else arrival + v

    done = bool(d.get("done", False))
    return Segment(index=int(d.get("index", 0)), text=str(d.get("text", "")), calls=(), blocking=False,
                   token_count=int(d.get("token_count", 0)), gen_start=at("gen_start_s") or arrival,
                   gen_end=at("gen_end_s") or arrival, est_exec_s=float(d.get("est_exec_s", 0.0)),
                   dispatched_at=at("dispatched_s"), exec_start=at("exec_start_s"), exec_end=at("exec_end_s"),
                   ok=bool(d.get("ok", False)) if done else None, error=str(d.get("error", "")))


def rejected_status_fields(request_id: str, robot_id: str, reason: str, *,
                           stamp: float | None = None, state: str = "rejected") -> dict[str, Any]:
    """Terminal status of a request this planner does not run: never admitted (rejected), or
    failed by a restarted planner's recovery (state "failed"). The sender always hears back."""
    return {
        "stamp": time_fields(stamp), "request_id": request_id, "robot_id": robot_id,
        "state": state, "terminal": True, "segments_dispatched": 0, "segments_done": 0,
        "response_time_s": -1.0, "utility": 0.0, "reason": reason,
    }


def _get(obj: Any, key: str, default: Any = 0) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(key, default)
    return getattr(obj, key, default)


def planner_status_fields(status: Any, *, stamp: float | None = None) -> dict[str, Any]:
    """The planner's status (object or mapping) -> PlannerStatus fields.

    Queue lengths may come as `queues`/`queue_lengths` keyed by GenState (or its value) or as one
    attribute per state."""
    queues = _get(status, "queues", None) or _get(status, "queue_lengths", None) or {}
    out: dict[str, Any] = {"stamp": time_fields(stamp)}
    for st in GenState:
        n = queues.get(st, queues.get(st.value)) if queues else None
        if n is None:
            n = _get(status, st.value, 0)
        out[st.value] = int(n or 0)
    out["batch_size"] = int(_get(status, "batch_size", 0) or 0)
    out["kv_usage"] = float(_get(status, "kv_usage", 0.0) or 0.0)
    out["tokens_per_s"] = float(_get(status, "tokens_per_s", 0.0) or 0.0)
    out["accrued_utility"] = float(_get(status, "accrued_utility", 0.0) or 0.0)
    return out

"""Baselines of the paper: segmented FCFS and EDF, and the engine-level vLLM / vLLM-stream; and
vLLM's own priority scheduling (vllm-priority)."""

from __future__ import annotations

import operator

from .base import DispatchMode, Policy, Selection, priority_order


class FCFS(Policy):
    """Segmented first-come first-served; suspended generations keep their initial priority."""

    name = "fcfs"

    def priority(self, g, ctx, now):
        return -g.request.arrival


class EDF(Policy):
    """Segmented earliest-deadline-first, deadline = arrival + ERT (kept for suspended ones)."""

    name = "edf"

    def priority(self, g, ctx, now):
        return -(g.request.arrival + g.request.tuf.ert)


class VLLM(FCFS):
    """vLLM as is: FCFS continuous batching, whole plan generated, then executed."""

    name = "vllm"
    mode = DispatchMode.WHOLE


class VLLMStream(FCFS):
    """vLLM with streaming: each statement is dispatched as soon as generated; never suspends."""

    name = "vllm-stream"
    mode = DispatchMode.STREAM


# vLLM's priority values per request category (lower is served first, as in vLLM).
VLLM_PRIORITIES: dict[str, int] = {"urgent": 0, "normal": 1, "chat": 1}


def parse_priorities(value) -> dict[str, int]:
    """`priorities` of vllm-priority: a mapping category -> int, or its text form
    "urgent=0,normal=1,chat=1"; categories not given keep VLLM_PRIORITIES' value.  ValueError
    names what is wrong."""
    if value is None:
        return dict(VLLM_PRIORITIES)
    if isinstance(value, str):
        items: dict = {}
        for part in value.split(","):
            k, eq, v = part.partition("=")
            if not eq or not k.strip():
                raise ValueError(f"priorities: expected category=int[,category=int...], got {value!r}")
            try:
                items[k.strip()] = int(v.strip())
            except ValueError:
                raise ValueError(f"priorities: {k.strip()!r} needs an integer, got {v.strip()!r}") from None
        value = items
    if not isinstance(value, dict):
        raise ValueError(f"priorities must be a mapping category -> int or 'urgent=0,normal=1', "
                         f"got {type(value).__name__}")
    out = dict(VLLM_PRIORITIES)
    for k, v in value.items():
        if k not in VLLM_PRIORITIES:
            raise ValueError(f"priorities: unknown category {k!r}; categories: {', '.join(VLLM_PRIORITIES)}")
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"priorities: {k!r} needs an integer (vLLM priorities are ints), got {v!r}")
        out[k] = v
    return out


class VLLMPriority(Policy):
    """vLLM's own `scheduling_policy="priority"` as a vLLM user runs it: whole plans generated
    unsegmented and streamed (each statement dispatched as soon as it is generated), the
    request's vLLM priority fixed at add from its category (urgent 0, normal and chat 1; lower
    first; `priorities` for other mappings).

    vLLM 0.32's semantics (vllm/v1/core/sched/scheduler.py, request_queue.py, request.py):
    - waiting requests are a heap ordered by (priority, arrival_time, request_id)
      (`PriorityRequestQueue`, `Request.__lt__`): `select` orders the planner's ready queue so;
    - waiting requests are admitted in that order only while `len(running) < max_num_seqs` and
      blocks allow (`schedule`: break at the first that does not fit): a waiting urgent request
      never displaces a running one (the planner's continuous batching, capped at max_num_seqs);
    - preemption only when a running request cannot get a KV block: the victim is
      max(running, key=(priority, arrival_time)), recomputed on resume: the engine's job, so the
      engines run with priority scheduling (`engine_scheduling`) and get each request's
      priority at add (`engine_priority`).
    """

    name = "vllm-priority"
    mode = DispatchMode.STREAM
    engine_scheduling = "priority"

    def __init__(self, priorities=None) -> None:
        self.priorities = parse_priorities(priorities)

    def engine_priority(self, g) -> int:
        """The vLLM priority of g's request (a category not in the mapping counts as normal)."""
        p = self.priorities
        return p.get(g.request.category, p["normal"])

    def priority(self, g, ctx, now):
        return -float(self.engine_priority(g))

    def select(self, ready, running, ctx, now):
        for g in ready:
            g.priority = -float(self.engine_priority(g))
        return Selection(order=priority_order(ready, _vllm_tie))

    def params(self) -> dict:
        return {"priorities": dict(self.priorities)}


# vLLM's tie-break among equal priorities: arrival, then request id (`Request.__lt__`); a C-level
# key (`priority_order` calls it once per ready generation).
_vllm_tie = operator.attrgetter("request.arrival", "request.request_id")

"""Scheduling policies by name (benchmark CLI, single-process mode, ROS node).

`PolicyName` lists every policy; `policy_factory` is the explicit factory (vLLM v1's
`SchedulingPolicy` + `create_request_queue`): one branch per name, each importing its module
only when asked (the CLI lists names without loading numpy-heavy policies).  A new policy: a
member here and a branch in `policy_factory`.
"""

from __future__ import annotations

import enum
from typing import Callable

from .base import DispatchMode, Policy, PolicyContext, Selection


class PolicyName(enum.Enum):
    """Every policy the CLI, the demo and the ROS node can run, by its command-line name."""

    DEFAULT = "default"
    TIMELYLLM = "timelyllm"
    FCFS = "fcfs"
    EDF = "edf"
    VLLM = "vllm"
    VLLM_STREAM = "vllm-stream"
    VLLM_PRIORITY = "vllm-priority"
    TRAIL = "trail"
    ANDES = "andes"
    LAMPS = "lamps"
    INFERCEPT = "infercept"
    FCFS_PRESERVE = "fcfs-preserve"
    FCFS_DISCARD = "fcfs-discard"
    FCFS_SWAP = "fcfs-swap"
    TIMELYLLM_LAMPS = "timelyllm-lamps"
    HYBRID = "hybrid"

    @classmethod
    def of(cls, name: "str | PolicyName") -> "PolicyName":
        """The member named `name`; ValueError listing the names otherwise."""
        if isinstance(name, cls):
            return name
        try:
            return cls(name)
        except ValueError:
            raise ValueError(f"unknown policy {name!r}; choose one of {policy_names()}") from None


DEFAULT_POLICY = PolicyName.DEFAULT.value  # what bench, demo, serve and the ROS node run when no policy is named


def policy_names() -> list[str]:
    return sorted(p.value for p in PolicyName)


def policy_class(name: "str | PolicyName") -> type[Policy]:
    """The Policy subclass a policy name builds."""
    kind = PolicyName.of(name)
    if kind is PolicyName.DEFAULT:
        from .default import Default
        return Default
    if kind is PolicyName.TIMELYLLM:
        from .timelyllm import TimelyLLM
        return TimelyLLM
    if kind in (PolicyName.FCFS, PolicyName.EDF, PolicyName.VLLM, PolicyName.VLLM_STREAM, PolicyName.VLLM_PRIORITY):
        from . import basic
        return {PolicyName.FCFS: basic.FCFS, PolicyName.EDF: basic.EDF, PolicyName.VLLM: basic.VLLM,
                PolicyName.VLLM_STREAM: basic.VLLMStream, PolicyName.VLLM_PRIORITY: basic.VLLMPriority}[kind]
    if kind is PolicyName.TRAIL:
        from .trail import Trail
        return Trail
    if kind is PolicyName.ANDES:
        from .andes import Andes
        return Andes
    if kind is PolicyName.LAMPS:
        from .lamps import LAMPS
        return LAMPS
    if kind in (PolicyName.INFERCEPT, PolicyName.FCFS_PRESERVE, PolicyName.FCFS_DISCARD, PolicyName.FCFS_SWAP):
        from .lamps import FCFSHandling
        return FCFSHandling
    if kind is PolicyName.TIMELYLLM_LAMPS:
        from .lamps import TimelyLLMLAMPS
        return TimelyLLMLAMPS
    if kind is PolicyName.HYBRID:
        from .hybrid import Hybrid
        return Hybrid
    raise AssertionError(kind)  # every member has a branch (tests/test_policies.py)


_HANDLING = {PolicyName.INFERCEPT: "waste", PolicyName.FCFS_PRESERVE: "preserve",
             PolicyName.FCFS_DISCARD: "discard", PolicyName.FCFS_SWAP: "swap"}


def policy_factory(name: "str | PolicyName") -> Callable[..., Policy]:
    """The factory (class or function) of a policy: what its parameters are.  The FCFS-handling
    variants of LAMPS's module fix `handling` and pass any other keyword on."""
    kind = PolicyName.of(name)
    cls = policy_class(kind)
    handling = _HANDLING.get(kind)
    if handling is None:
        return cls

    def factory(**kw) -> Policy:
        return cls(handling=handling, **kw)
    return factory


def engine_scheduling(name: "str | PolicyName") -> str:
    """How the engines must schedule for this policy (`Policy.engine_scheduling`): "fcfs", or
    "priority" (vLLM's priority scheduling, vllm-priority)."""
    return str(policy_class(name).engine_scheduling)


def make_policy(name: "str | PolicyName", **params) -> Policy:
    factory = policy_factory(name)
    try:
        return factory(**params)
    except TypeError as e:
        raise ValueError(f"bad parameters for policy {name!r}: {e}") from e


__all__ = ["DEFAULT_POLICY", "DispatchMode", "Policy", "PolicyContext", "PolicyName", "Selection", "engine_scheduling",
           "make_policy", "policy_class", "policy_factory", "policy_names"]

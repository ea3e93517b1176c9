"""Scheduling policies by name (benchmark CLI, single-process mode, ROS node)."""

from __future__ import annotations

from typing import Callable

from .base import DispatchMode, Policy, PolicyContext, Selection
from .basic import EDF, FCFS, VLLM, VLLMPriority, VLLMStream
from .timelyllm import TimelyLLM

DEFAULT_POLICY = "default"  # what bench, demo, serve and the ROS node run when no policy is named (default.py)

_REGISTRY: dict[str, Callable[..., Policy]] = {
    "timelyllm": TimelyLLM,
    "fcfs": FCFS,
    "edf": EDF,
    "vllm": VLLM,
    "vllm-stream": VLLMStream,
    "vllm-priority": VLLMPriority,
}


def register(name: str, factory: Callable[..., Policy]) -> None:
    _REGISTRY[name] = factory


def policy_names() -> list[str]:
    _load_optional()
    return sorted(_REGISTRY)


def policy_factory(name: str) -> Callable[..., Policy]:
    """The registered factory (class or function) of a policy: what its parameters are."""
    _load_optional()
    if name not in _REGISTRY:
        raise ValueError(f"unknown policy {name!r}; choose one of {sorted(_REGISTRY)}")
    return _REGISTRY[name]


def engine_scheduling(name: str) -> str:
    """How the engines must schedule for this policy (`Policy.engine_scheduling`): "fcfs", or
    "priority" (vLLM's priority scheduling, vllm-priority)."""
    return str(getattr(policy_factory(name), "engine_scheduling", "fcfs"))


def make_policy(name: str, **params) -> Policy:
    _load_optional()
    if name not in _REGISTRY:
        raise ValueError(f"unknown policy {name!r}; choose one of {sorted(_REGISTRY)}")
    try:
        return _REGISTRY[name](**params)
    except TypeError as e:
        raise ValueError(f"bad parameters for policy {name!r}: {e}") from e


def _load_optional() -> None:
    """Policies of the other seed papers register themselves when their module exists."""
    import importlib

    for mod in ("trail", "andes", "lamps", "hybrid", "default"):
        try:
            importlib.import_module(f"{__name__}.{mod}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{mod}":
                raise


__all__ = ["DEFAULT_POLICY", "DispatchMode", "Policy", "PolicyContext", "Selection", "engine_scheduling", "make_policy",
           "policy_factory",
           "policy_names", "register"]

"""Scheduling policies by name (benchmark CLI, single-process mode, ROS node)."""

from __future__ import annotations

from typing import Callable, Sequence

from .base import DispatchMode, Policy, PolicyContext, Selection
from .basic import EDF, FCFS, VLLM, VLLMStream
from .timelyllm import TimelyLLM

_REGISTRY: dict[str, Callable[..., Policy]] = {
    "timelyllm": TimelyLLM,
    "fcfs": FCFS,
    "edf": EDF,
    "vllm": VLLM,
    "vllm-stream": VLLMStream,
}


def register(name: str, factory: Callable[..., Policy]) -> None:
    _REGISTRY[name] = factory


def policy_names() -> list[str]:
    _load_optional()
    return sorted(_REGISTRY)


def check_names(names: Sequence[str]) -> None:
    """ValueError naming the first unknown or repeated policy of a run."""
    known = policy_names()
    for n in names:
        if n not in known:
            raise ValueError(f"unknown policy {n!r}; choose from {', '.join(known)}")
    dup = sorted({n for n in names if list(names).count(n) > 1})
    if dup:
        raise ValueError(f"policy {dup[0]!r} given twice")


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

    for mod in ("trail", "andes", "lamps", "hybrid"):
        try:
            importlib.import_module(f"{__name__}.{mod}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{mod}":
                raise


__all__ = ["DispatchMode", "Policy", "PolicyContext", "Selection", "check_names", "make_policy", "policy_names",
           "register"]

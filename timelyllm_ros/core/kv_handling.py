"""What to do with a suspended generation's KV while its robot executes: the LAMPS / InferCept
memory-waste model.

A robot executing a skill is LAMPS's "API call": the generation cannot (blocking skill) or need
not (non-blocking skill, resumed just in time) continue until the action is (nearly) done.  Its KV
can be **preserved** (kept resident), **discarded** (recomputed on resume) or **swapped** (copied to
host memory and back).  InferCept's Eqs. (1)-(3), used by LAMPS, price each in memory x time:

    WastePreserve_i = T_INT * C_i * M
    WasteDiscard_i  = T_fwd(C_i) * C_i * M + T_fwd(C_i) * C_other * M
    WasteSwap_i     = 2 * T_swap(C_i) * C_batch * M

T_INT: predicted idle time of the KV (see `predicted_idle`); C_i: the generation's own context
tokens; C_other: context tokens of the other generations in the running batch (they stall while
C_i is recomputed); C_batch = C_i + C_other (a swap stalls the whole batch, out and back in);
M: KV bytes per token (a common factor: it never changes the choice); T_fwd(C) = prefill_base +
prefill_per_token * C; T_swap(C) = swap_per_block * ceil(C / block_size).  The handling with the
least waste wins; ties go to the first of preserve, discard, swap (least work).

C_i counts only the generation's *private* tokens: the robot type's shared prompt prefix stays in
the prefix cache whatever we do (other generations reference it), so it is neither wasted by
preserving nor recomputed after a discard.  The shared length is measured, not configured: the
longest common prefix of the prompts seen per robot type (`SharedPrefix`).  (The engine's
num_cached_tokens is no substitute: after an engine preemption it also counts the generation's own
recomputed tokens.)

Pure: numbers in, a choice out; costs come from a latency profile (`KVCostModel.from_profile`).
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from .latency_profile import LatencyProfile
from .types import Generation, Segment

HANDLINGS = ("preserve", "discard", "swap")
_ID = operator.attrgetter("request.request_id")  # Generation.gen_id without the property call


@dataclass(frozen=True, slots=True)
class KVCostModel:
    """T_fwd and T_swap of the formulas, and M (bytes per KV token, default 1: waste in token-s)."""

    prefill_s_per_token: float
    prefill_base_s: float = 0.0
    swap_s_per_block: float = 0.0
    block_size: int = 16
    bytes_per_token: float = 1.0

    def __post_init__(self) -> None:
        for name in ("prefill_s_per_token", "prefill_base_s", "swap_s_per_block", "bytes_per_token"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"KV cost model: {name} must be a finite number >= 0, got {v!r}")
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"KV cost model: block_size must be a positive int, got {self.block_size!r}")

    @classmethod
    def from_profile(cls, profile: Any, bytes_per_token: float = 1.0) -> "KVCostModel":
        """From a latency profile (core.latency_profile.LatencyProfile or a mapping with its keys)."""
        get = (lambda k, d=0.0: profile.get(k, d)) if isinstance(profile, dict) else (
            lambda k, d=0.0: getattr(profile, k, d))
        return cls(prefill_s_per_token=float(get("prefill_s_per_token")),
                   prefill_base_s=float(get("prefill_base_s")),
                   swap_s_per_block=float(get("swap_s_per_block")),
                   block_size=int(get("kv_block_size", 16)), bytes_per_token=bytes_per_token)

    def t_fwd(self, tokens: float) -> float:
        """Time to recompute `tokens` of context (one prefill)."""
        return self.prefill_base_s + self.prefill_s_per_token * tokens if tokens > 0 else 0.0

    def t_swap(self, tokens: float) -> float:
        """Time to copy the blocks holding `tokens` one way between GPU and host."""
        return self.swap_s_per_block * math.ceil(tokens / self.block_size) if tokens > 0 else 0.0


def _default_cost() -> KVCostModel:
    """The default latency profile's costs (read once, when a policy is built without one)."""
    return KVCostModel.from_profile(LatencyProfile.from_yaml())


def cost_model(cost: Any = None, profile: Any = None) -> KVCostModel:
    """A policy's `cost` / `profile` parameters as a KVCostModel: the model itself or its fields
    (`cost`), else a latency profile (a YAML path or a profile object), else the default profile."""
    if isinstance(cost, KVCostModel):
        return cost
    if isinstance(cost, dict):
        return KVCostModel(**cost)
    if cost is not None:
        raise ValueError(f"cost must be a KVCostModel or a mapping, got {type(cost).__name__}")
    if isinstance(profile, (str, Path)):
        return KVCostModel.from_profile(LatencyProfile.from_yaml(profile))
    if profile is not None:
        return KVCostModel.from_profile(profile)
    return _default_cost()


@dataclass(frozen=True, slots=True)
class Waste:
    """Memory waste (bytes x s) of each handling for one suspension."""

    preserve: float
    discard: float
    swap: float

    def of(self, handling: str) -> float:
        return getattr(self, handling)

    def best(self, allowed: Iterable[str] = HANDLINGS) -> str:
        allowed = [h for h in HANDLINGS if h in set(allowed)]
        if not allowed:
            raise ValueError("no KV handling allowed")
        return min(allowed, key=lambda h: (self.of(h), HANDLINGS.index(h)))


def waste(t_int: float, c_i: float, c_other: float, cost: KVCostModel) -> Waste:
    """InferCept Eqs. (1)-(3)."""
    if t_int < 0 or c_i < 0 or c_other < 0:
        raise ValueError(f"waste needs t_int, c_i, c_other >= 0, got {t_int}, {c_i}, {c_other}")
    m = cost.bytes_per_token
    fwd = cost.t_fwd(c_i)
    return Waste(preserve=t_int * c_i * m,
                 discard=fwd * c_i * m + fwd * c_other * m,
                 swap=2.0 * cost.t_swap(c_i) * (c_i + c_other) * m)


def choose(t_int: float, c_i: float, c_other: float, cost: KVCostModel,
           allowed: Iterable[str] = HANDLINGS) -> tuple[str, Waste]:
    """The minimum-waste handling (and all three wastes, for logging and tests)."""
    w = waste(t_int, c_i, c_other, cost)
    return w.best(allowed), w


class SharedPrefix:
    """Length of the prompt prefix shared by all generations of a robot type, as observed.

    The prefix cache shares full blocks only, so the shared part is the longest common prefix of
    the prompts seen so far, rounded down to a block.  With a single prompt seen nothing is known
    to be shared (0): the conservative choice for memory accounting."""

    def __init__(self, block_size: int = 16) -> None:
        self.block_size = max(1, int(block_size))
        self._ref: dict[str, list[int]] = {}
        self._lcp: dict[str, int] = {}
        self._seen: dict[str, set[str]] = {}
        self._all: set[str] = set()  # gen id of every generation seen (an id names one generation:
        # the planner refuses duplicate request ids, so its robot type is fixed)
        self._sig: tuple[int, tuple] = (-1, ())  # (block size, `signature`) until a new generation is seen

    def seen_all(self, gens: Sequence[Generation]) -> bool:
        """Every one of gens observed already (C-level set operation)."""
        return self._all.issuperset(map(_ID, gens))

    def observe_all(self, gens: Sequence[Generation]) -> None:
        """`observe` each of gens in order.  Policies call this for every ready generation at
        every scheduling point; the usual case, all seen before, is decided with C-level set ops."""
        if self.seen_all(gens):
            return
        for g in gens:
            self.observe(g)

    def observe(self, g: Generation) -> None:
        rt = g.request.robot_type
        seen = self._seen.get(rt)
        if seen is None:
            seen = self._seen[rt] = set()
        elif g.gen_id in seen:  # the common case: no new set built
            return
        seen.add(g.gen_id)
        self._all.add(g.gen_id)
        self._sig = (-1, ())  # what `shared` answers may change
        ref = self._ref.get(rt)
        if ref is None:
            self._ref[rt] = list(g.prompt_ids)
            self._lcp[rt] = len(g.prompt_ids)
            return
        n = min(self._lcp[rt], len(g.prompt_ids))
        if ref[:n] == g.prompt_ids[:n]:  # usual: the whole known shared part matches (C compare)
            self._lcp[rt] = n
            return
        i = 0
        while i < n and ref[i] == g.prompt_ids[i]:
            i += 1
        self._lcp[rt] = i

    def signature(self) -> tuple:
        """The shared length of every robot type seen: equal signatures, equal `shared` answers
        (policies that cache private contexts check it once per scheduling point); kept until
        a generation not seen before is observed (nothing else changes `shared`)."""
        if self._sig[0] != self.block_size:
            self._sig = (self.block_size, tuple((rt, self.shared(rt)) for rt in self._seen))
        return self._sig[1]

    def shared(self, robot_type: str) -> int:
        if len(self._seen.get(robot_type, ())) < 2:
            return 0
        return (self._lcp.get(robot_type, 0) // self.block_size) * self.block_size


def private_context(g: Generation, prefix: SharedPrefix | None = None) -> int:
    """Tokens of g's context that are its own: the context minus the robot type's shared prompt
    prefix (which stays cached whatever happens to g).  Without a tracker: the whole context."""
    total = len(g.prompt_ids) + len(g.output_ids)
    if prefix is None:
        return total
    prefix.observe(g)
    return max(0, total - min(prefix.shared(g.request.robot_type), len(g.prompt_ids)))


def other_context(g: Generation, running: Sequence[Generation], prefix: SharedPrefix | None = None) -> int:
    """C_other: private context tokens of the rest of the running batch."""
    return sum(private_context(o, prefix) for o in running if o.gen_id != g.gen_id)


def predicted_idle(seg: Segment | None, seg_gen_s: float) -> float:
    """T_INT: how long the KV will sit unused after `seg` is dispatched.

    Blocking segment: the generation waits for the result, i.e. the whole estimated execution.
    Non-blocking: the next segment is needed when this action ends, so it is resumed about one
    segment generation time G earlier (just in time): max(0, E - G).  A preemption mid-segment
    (seg None) has no call to wait for: 0 (keep the KV)."""
    if seg is None:
        return 0.0
    est = max(0.0, seg.est_exec_s)
    return est if seg.blocking else max(0.0, est - max(0.0, seg_gen_s))
